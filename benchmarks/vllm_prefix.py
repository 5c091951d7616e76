"""vLLM with prefix caching on and off, checked by specviz on prompts that share prefixes
(docs/engines.md): vLLM's CPU build serving the embedded pair (its draft-model mode, eager,
float32), asked the shared-prefix set of benchmarks/paged.py in two waves (the first request alone,
then the rest, so that they hit what it left), each output judged against the batch-size-1
reference. For each setting: outputs equal to the reference, the verdicts of those that fork,
vLLM's own prefix cache counters (tokens hit of those queried) and the seconds the requests took.

    python benchmarks/vllm_prefix.py [--k 4] [--max-new-tokens 32] [--out FILE]
"""
from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from paged import shared_prefix_prompts

from specviz.engines.vllm import vllm_server
from specviz.models.pairs import load_pair
from specviz.run import check
from specviz.spec.run import ENGINE, PAIR_PRESETS, RunSpec
from specviz.trace import metrics

import options

HEAD = ("| vLLM prefix caching | equal to reference | forks' verdicts | prefix cache hits "
        "(tokens) | seconds |\n|---|---:|---|---:|---:|")


def main() -> None:
    ap = options.parser(__doc__, k=4, max_new_tokens=32, threads=2, out=None)
    args = options.parse(ap)
    pair = load_pair(*PAIR_PRESETS["embedded"], dtype="float32", device="cpu")
    prompts = shared_prefix_prompts()
    logs = Path(tempfile.mkdtemp(prefix="vllm-prefix-"))
    lines = [f"{len(prompts)} prompts sharing prefixes, k {args.k}, {args.max_new_tokens} new "
             "tokens, float32, draft-model mode, eager", "", HEAD]
    print("\n".join(lines), flush=True)
    for on in (True, False):
        with vllm_server("draft", logs / f"prefix-{on}.log", k=args.k, eager=True,
                         threads=args.threads, prefix_caching=on) as server:
            waves = [trace_of(pair, prompts[:1], server, args),
                     trace_of(pair, prompts[1:], server, args)]
        seqs = [s for t in waves for s in t.sequences]
        equal = sum(bool(s.equivalent) for s in seqs)
        verdicts = Counter(s.forensics.verdict for s in seqs if s.forensics)
        cached = waves[1].manifest.engine.settings.get("prefix_cache") or {}
        hits = (f"{cached['hits']:.0f} of {cached['queries']:.0f}" if cached.get("queries")
                else "-")
        seconds = sum(t.manifest.engine.seconds for t in waves)
        options.add_row(lines, f"| {'on' if on else 'off'} | {equal} of {len(seqs)} | "
                               f"{', '.join(f'{v} x {n}' for v, n in verdicts.items()) or '-'} | "
                               f"{hits} | {seconds:.1f} |")
    options.write_out(args, lines)


def trace_of(pair, prompts: tuple[str, ...], server, args):
    spec = RunSpec.build(prompts=prompts, method=ENGINE, k=args.k,
                         max_new_tokens=args.max_new_tokens, device="cpu")
    trace = check.from_servers(spec, pair, (server.url, server.served_model), None, 8, 300.0)
    assert metrics.equivalence(trace), "the check judged nothing"
    return trace


if __name__ == "__main__":
    main()
