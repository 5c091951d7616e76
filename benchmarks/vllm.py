"""vLLM beside specviz's own decoders: throughput, exact match with specviz's batch-size-1 reference and
the verdicts of `specviz check`, on the same prompts in one run.

vLLM's CPU build (`make vllm`) serves the embedded target in three modes, one server after the other: no
speculation, ngram (prompt lookup, n 2-4) and the embedded draft, k tokens a draft. Its prompts go as token
ids, --batch-size requests in flight, greedy; each mode's outputs are judged as `specviz check --server`
judges them, the speculative modes with the no-speculation run as their control. specviz's reference (batch
size 1), batched-reference and eqspec (at --batch-size, k) run in this process on the embedded pair. Each row
is timed after a short warm-up; server start and model loading are excluded. Timings on a shared machine
are noisy.

    python benchmarks/vllm.py [--prompt-set all] [--max-new-tokens 48] [--batch-size 8] [--k 5] [--threads 2]
                              [--dtype float32] [--out benchmarks/results/vllm.md]
"""
import argparse
import tempfile
from pathlib import Path

import torch

from specviz import check, metrics
from specviz.engines.server import from_server
from specviz.engines.vllm import MODES, vllm_server
from specviz.models import load_pair
from specviz.prompts import builtin_set
from specviz.runner import decode
from specviz.spec import ENGINE, RunSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-set", default="all")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads, for vLLM's workers and specviz's torch")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(dtype=args.dtype, device="cpu")
    prompts = builtin_set(args.prompt_set)
    ids = pair.encode(prompts)
    setup = (f"{len(ids)} prompts of the {args.prompt_set!r} set (chat template), {args.max_new_tokens} new tokens, "
             f"{args.dtype}, greedy, batch size {args.batch_size}, k {args.k}, {args.threads} threads")
    print(setup)

    def spec(method: str, batch_size: int) -> RunSpec:  # the embedded pair: RunSpec's defaults
        return RunSpec.build(prompts=tuple(prompts), method=method, batch_size=batch_size, k=args.k,
                             max_new_tokens=args.max_new_tokens, device="cpu", dtype=args.dtype)

    decode(spec("eqspec", 2).model_copy(update={"max_new_tokens": 4}), pair, ids[:2], record=False)  # warm-up
    rows = []  # (engine, configuration, output ids, seconds, draft acceptance, verdicts); the first is the reference
    for method, bs in (("reference", 1), ("batched-reference", args.batch_size), ("eqspec", args.batch_size)):
        result = decode(spec(method, bs), pair, ids, record=False)
        rows.append((f"specviz {method}", f"bs {bs}" + (f", k {args.k}" if method == "eqspec" else ""),
                     [o.ids for o in result.outputs], result.seconds, None, "-"))
    runs = {}
    with tempfile.TemporaryDirectory() as logs:
        for mode in MODES:
            with vllm_server(mode, Path(logs) / f"{mode}.log", k=args.k, max_num_seqs=args.batch_size,
                             threads=args.threads, dtype=args.dtype) as server:
                from_server(server.url, server.served_model, ids[:2], 4)  # warm-up
                runs[mode] = from_server(server.url, server.served_model, ids, args.max_new_tokens,
                                         concurrency=args.batch_size, tokenizer=pair.tokenizer, launch=server.launch)
    for mode, run in runs.items():
        failed = [o.error for o in run.outputs if o.error]
        if failed:
            print(f"vLLM {mode}: {len(failed)} prompts failed, first: {failed[0]}")
        judged = check.check(spec(ENGINE, args.batch_size), pair, ids, run, None if mode == "none" else runs["none"])
        verdicts = ", ".join(f"{v} {c}" for v, c in metrics.verdict_counts(judged).items()) or "-"
        config = f"{args.batch_size} in flight" + ("" if mode == "none" else f", k {args.k}")
        counters = run.settings.get("spec_decode")
        acceptance = counters["accepted_tokens"] / counters["draft_tokens"] if counters else None
        rows.append((f"vLLM {run.version} {mode}", config, [o.ids for o in run.outputs], run.seconds, acceptance,
                     verdicts))

    reference = rows[0][2]
    table = ["| engine | configuration | equal to reference | tokens | seconds | tok/s | draft tokens accepted | verdicts |",
             "|---|---|---|---|---|---|---|---|"]
    for name, config, outs, seconds, acceptance, verdicts in rows:
        equal = sum(o == r for o, r in zip(outs, reference))
        tokens = sum(map(len, outs))
        accepted = "-" if acceptance is None else f"{acceptance:.0%}"
        table.append(f"| {name} | {config} | {equal}/{len(outs)} | {tokens} | {seconds:.1f} | {tokens / seconds:.1f} | "
                     f"{accepted} | {verdicts} |")
    print("\n" + "\n".join(table))
    if args.out:
        args.out.write_text(f"{setup}.\n\n" + "\n".join(table) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
