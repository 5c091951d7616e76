"""The cost of attribution per forked row (run/attribution.py), and whether it names
the planted mechanism.

An "engine" here is specviz's eqspec with one fault planted (each fault of the catalogue that
changes greedy tokens on this pair), handed to `specviz check` as an engine's ids only, with its
batch size declared. For every forked row the check attributes, it prints the replays run, the
seconds they took, and the mechanism named; then the mean and the worst per forked row over all
faults, all tried. The correct engine is checked too: its rows must not fork, and nothing is named.

    python benchmarks/attribution.py [--pair embedded] [--prompt-set quick] [--k 4] [--batch-size 4]
                                     [--max-new-tokens 32] [--threads 2]
                                     [--out benchmarks/results/attribution.md]
"""
import statistics
import time
from pathlib import Path


from specviz.decoding.eqspec import eqspec
from specviz.engines.base import EngineRun
from specviz.models.pairs import load_pair
from specviz.run import attribution, check
from specviz.run.runner import encode
from specviz.spec.prompts import builtin_sets
from specviz.spec.run import PAIR_PRESETS, RunSpec
from specviz.trace.records import EngineOutput

import options

PLANTED = ("draft-bonus", "bonus-from-another-row", "verify-positions-not-advanced",
           "positions-from-slots", "no-mask", "min-crop", "no-kv-shift")


def main() -> None:
    ap = options.parser(__doc__, prompt_set="quick", k=4, batch_size=4, max_new_tokens=32,
                        threads=2, out=Path("benchmarks/results/attribution.md"))
    ap.add_argument("--pair", default="embedded", choices=list(PAIR_PRESETS))
    args = options.parse(ap)
    target, draft = PAIR_PRESETS[args.pair]
    spec = RunSpec.build(target=target, draft=draft, prompts=tuple(builtin_sets()[args.prompt_set]),
                         method="engine", k=args.k, max_new_tokens=args.max_new_tokens,
                         device="cpu")
    pair = load_pair(target, draft, dtype=spec.dtype, device="cpu")
    ids = encode(spec, pair)
    lines = [f"# Attribution per forked row: {args.pair} pair, {spec.dtype}, {len(ids)} prompts of "
             f"{args.prompt_set!r}, k {args.k}, batch {args.batch_size}, {args.max_new_tokens} "
             f"tokens, {args.threads} threads", "",
             "| planted | forked rows | named right | named wrong | mean replays | mean s/row | "
             "worst s/row |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    costs = []
    for fault in (None, *PLANTED):
        out = eqspec(pair, ids, args.batch_size, args.k, args.max_new_tokens,
                     faults=(fault,) if fault else ())
        engine = EngineRun(name=f"eqspec {fault or 'correct'}", source="callable",
                           settings={"k": args.k, "batch_size": args.batch_size},
                           outputs=[EngineOutput(ids=o.ids) for o in out.outputs])
        start = time.perf_counter()
        trace = check.check(spec, pair, ids, engine)
        judged = time.perf_counter() - start
        found = [s.attribution for s in trace.sequences if s.attribution]
        named = [[h.faults for h in a.hypotheses if h.named] for a in found]
        right = sum(any(fault in f for f in n) for n in named)
        wrong = sum(bool(n) and not any(fault in f for f in n) for n in named)
        seconds = [a.seconds for a in found]
        costs += seconds
        mean = statistics.fmean(seconds) if seconds else 0.0
        lines.append(f"| {fault or 'none (correct)'} | {len(found)} | {right} | {wrong} | "
                     f"{statistics.fmean(a.replays for a in found) if found else 0:.1f} | "
                     f"{mean:.1f} | {max(seconds, default=0.0):.1f} |")
        print(lines[-1], f"(check {judged:.0f} s)", flush=True)
    tried = len(attribution.candidates(
        attribution.Replaying(spec, pair, ids, {}, args.batch_size))[0])
    lines += ["",
              f"All faults: {len(costs)} forked rows, mean {statistics.fmean(costs):.1f} s, worst "
              f"{max(costs):.1f} s per row ({tried} mechanisms tried, each in the engine's batch, "
              "beside the correct engine)."]
    print(lines[-1])
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
