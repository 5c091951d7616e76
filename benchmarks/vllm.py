"""vLLM beside specviz's own decoders: throughput and exact match with specviz's batch-size-1 reference, on
the same prompts in one run.

vLLM's CPU build (`make vllm`) serves the embedded target in float32 in three modes, one server after the
other: no speculation, ngram (prompt lookup, n 2-4) and the embedded draft, k tokens a draft. Its prompts go
as token ids, --batch-size requests in flight, greedy. specviz's reference (batch size 1), batched-reference
and eqspec (at --batch-size, k) run in this process on the embedded pair in float32. Each row is timed after
a short warm-up; server start and model loading are excluded. Timings on a shared machine are noisy.

    python benchmarks/vllm.py [--prompt-set all] [--max-new-tokens 48] [--batch-size 8] [--k 5] [--threads 2]
"""
import argparse
import tempfile
from pathlib import Path

import torch

from specviz.engines.server import from_server
from specviz.engines.vllm import MODES, vllm_server
from specviz.models import load_pair
from specviz.prompts import builtin_set
from specviz.runner import decode
from specviz.spec import RunSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-set", default="all")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads, for vLLM's workers and specviz's torch")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(dtype="float32", device="cpu")
    prompts = builtin_set(args.prompt_set)
    ids = pair.encode(prompts)
    print(f"{len(ids)} prompts of the {args.prompt_set!r} set (chat template), {args.max_new_tokens} new tokens, "
          f"float32, greedy, batch size {args.batch_size}, k {args.k}, {args.threads} threads")

    def spec(method: str, batch_size: int) -> RunSpec:  # the embedded pair, float32: RunSpec's defaults
        return RunSpec.build(prompts=tuple(prompts), method=method, batch_size=batch_size, k=args.k,
                             max_new_tokens=args.max_new_tokens, device="cpu")

    decode(spec("eqspec", 2).model_copy(update={"max_new_tokens": 4}), pair, ids[:2], record=False)  # warm-up
    rows = []  # (engine, configuration, output ids, seconds, draft acceptance); the first is the reference
    for method, bs in (("reference", 1), ("batched-reference", args.batch_size), ("eqspec", args.batch_size)):
        result = decode(spec(method, bs), pair, ids, record=False)
        rows.append((f"specviz {method}", f"bs {bs}" + (f", k {args.k}" if method == "eqspec" else ""),
                     [o.ids for o in result.outputs], result.seconds, None))
    with tempfile.TemporaryDirectory() as logs:
        for mode in MODES:
            with vllm_server(mode, Path(logs) / f"{mode}.log", k=args.k, max_num_seqs=args.batch_size,
                             threads=args.threads) as server:
                from_server(server.url, server.served_model, ids[:2], 4)  # warm-up
                run = from_server(server.url, server.served_model, ids, args.max_new_tokens,
                                  concurrency=args.batch_size, tokenizer=pair.tokenizer)
            failed = [o.error for o in run.outputs if o.error]
            if failed:
                print(f"vLLM {mode}: {len(failed)} prompts failed, first: {failed[0]}")
            config = f"{args.batch_size} in flight" + ("" if mode == "none" else f", k {args.k}")
            counters = run.settings.get("spec_decode")
            acceptance = counters["accepted_tokens"] / counters["draft_tokens"] if counters else None
            rows.append((f"vLLM {run.version} {mode}", config, [o.ids for o in run.outputs], run.seconds, acceptance))

    reference = rows[0][2]
    print("\n| engine | configuration | equal to reference | tokens | seconds | tok/s | draft tokens accepted |")
    print("|---|---|---|---|---|---|---|")
    for name, config, outs, seconds, acceptance in rows:
        equal = sum(o == r for o, r in zip(outs, reference))
        tokens = sum(map(len, outs))
        accepted = "-" if acceptance is None else f"{acceptance:.0%}"
        print(f"| {name} | {config} | {equal}/{len(outs)} | {tokens} | {seconds:.1f} | {tokens / seconds:.1f} | {accepted} |")


if __name__ == "__main__":
    main()
