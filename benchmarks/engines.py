"""specviz, vLLM and llama.cpp on the same pair and prompts, in one run: throughput, draft
acceptance, exact match with specviz's batch-size-1 reference and the verdicts of `specviz check`.

specviz's reference (batch size 1), batched-reference, eqspec and exspec (at --batch-size, k; exspec
refills its batch from a window of twice that, as vLLM keeps its batch full) run in this process on
the embedded pair. vLLM's CPU build (`make vllm`) serves the embedded target in three modes, one
server after the other: no speculation, ngram (prompt lookup, n 2-4) and the embedded draft, k
tokens a draft. llama.cpp's llama-server (`make llama`) serves the same target's Q4_1 GGUF (the file
specviz dequantizes) with --batch-size slots in four modes: no speculation, the embedded draft (as a
float32 GGUF), the target as its own draft, and ngram-simple. Prompts go as token ids, --batch-size
requests in flight, greedy; each mode's outputs are judged as `specviz check --server` judges them,
the speculative modes with their engine's no-speculation run as control. Each row is timed after a
short warm-up; server start and model loading are excluded. Timings on a shared machine are noisy:
compare rows of one run.

    python benchmarks/engines.py [--prompt-set all] [--max-new-tokens 48] [--batch-size 8] [--k 5]
    [--threads 2]
                                 [--dtype float32] [--out benchmarks/results/engines.md]
"""
import tempfile
from pathlib import Path


from specviz.engines import llamacpp, vllm
from specviz.engines.server import from_server
from specviz.models.pairs import load_pair
from specviz.run import check
from specviz.run.runner import decode
from specviz.spec.run import ENGINE, RunSpec
from specviz.trace import metrics

import options


def main() -> None:
    ap = options.parser(__doc__, prompt_set="all", max_new_tokens=48, batch_size=8, k=5, threads=2,
                        dtype="float32", out=None)
    args = options.parse(ap)
    pair = load_pair(dtype=args.dtype, device="cpu")
    prompts, ids = options.prompt_set(pair, args)
    setup = (f"{len(ids)} prompts of the {args.prompt_set!r} set (chat template), "
             f"{args.max_new_tokens} new tokens, {args.dtype}, greedy, batch size "
             f"{args.batch_size}, k {args.k}, {args.threads} threads")
    print(setup)

    def spec(method: str, batch_size: int) -> RunSpec:  # the embedded pair: RunSpec's defaults
        return RunSpec.build(prompts=tuple(prompts), method=method, batch_size=batch_size, k=args.k,
                             max_new_tokens=args.max_new_tokens, device="cpu", dtype=args.dtype)

    def judged_row(engine: str, mode: str, run, control):
        failed = [o.error for o in run.outputs if o.error]
        if failed:
            print(f"{engine} {mode}: {len(failed)} prompts failed, first: {failed[0]}")
        judged = check.check(spec(ENGINE, args.batch_size), pair, ids, run,
                             None if mode == "none" else control)
        verdicts = ", ".join(f"{v} {c}" for v, c in metrics.verdict_counts(judged).items()) or "-"
        config = f"{args.batch_size} in flight" + ("" if mode == "none" else f", k {args.k}")
        counters = run.settings.get("spec_decode") or {}
        acceptance = (counters["accepted_tokens"] / counters["draft_tokens"]
                      if counters.get("draft_tokens") else None)
        return (f"{engine} {run.version} {mode}", config, [o.ids for o in run.outputs],
                run.seconds, acceptance, verdicts)

    # warm-up
    decode(spec("eqspec", 2).model_copy(update={"max_new_tokens": 4}), pair, ids[:2], record=False)
    # (engine, configuration, output ids, seconds, draft acceptance, verdicts); the first
    # is the reference
    rows = []
    for method, bs in (("reference", 1), ("batched-reference", args.batch_size),
                       ("eqspec", args.batch_size), ("exspec", args.batch_size)):
        speculative = method in ("eqspec", "exspec")
        # the records: its acceptance
        result = decode(spec(method, bs), pair, ids, record=speculative)
        accepted = (sum(int(r.ints["accepted"].sum()) for r in result.rounds) if result.rounds
                    else None)
        offered = sum(int(r.ints["drafts"].sum()) for r in result.rounds) if result.rounds else None
        rows.append((f"specviz {method}", f"bs {bs}" + (f", k {args.k}" if speculative else ""),
                     [o.ids for o in result.outputs], result.seconds,
                     accepted / offered if offered else None, "-"))
    servers = {"vLLM": [(mode, lambda log, mode=mode: vllm.vllm_server(
                            mode, log, k=args.k, max_num_seqs=args.batch_size,
                            threads=args.threads, dtype=args.dtype))
                        for mode in vllm.MODES],
               "llama.cpp": [(mode, lambda log, mode=mode: llamacpp.llama_server(
                                 mode, log, slots=args.batch_size, k=args.k, threads=args.threads))
                             for mode in llamacpp.MODES]}
    if args.dtype != "float32":  # llama.cpp serves the Q4_1 file whatever the reference's dtype
        del servers["llama.cpp"]
    with tempfile.TemporaryDirectory() as logs:
        for engine, modes in servers.items():
            runs = {}
            for mode, start in modes:
                with start(Path(logs) / f"{engine}-{mode}.log") as server:
                    from_server(server.url, None, ids[:2], 4)  # warm-up
                    runs[mode] = from_server(server.url, None, ids, args.max_new_tokens,
                                             concurrency=args.batch_size, tokenizer=pair.tokenizer,
                                             launch=server.launch)
            rows += [judged_row(engine, mode, run, runs["none"]) for mode, run in runs.items()]

    reference = rows[0][2]
    table = ["| engine | configuration | equal to reference | tokens | seconds | tok/s | draft "
             "tokens accepted | verdicts |",
             "|---|---|---|---|---|---|---|---|"]
    for name, config, outs, seconds, acceptance, verdicts in rows:
        equal = sum(o == r for o, r in zip(outs, reference))
        tokens = sum(map(len, outs))
        accepted = "-" if acceptance is None else f"{acceptance:.0%}"
        table.append(f"| {name} | {config} | {equal}/{len(outs)} | {tokens} | {seconds:.1f} | "
                     f"{tokens / seconds:.1f} | {accepted} | {verdicts} |")
    print("\n" + "\n".join(table))
    if args.out:
        args.out.write_text(f"{setup}.\n\n" + "\n".join(table) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
