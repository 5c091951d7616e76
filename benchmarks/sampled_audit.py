"""The state audit at temperature > 0 on the embedded pair: every catalogued synchronization fault
named by its state, in a round at or before the first token the target could not have drawn; every
sampling fault named a sampler fault with its states clean; correct samplers (eqspec and exspec)
over many seeds without a false alarm.

Each fault runs eqspec at --temperature on the built-in prompts (--prompt-set), batch --batch-size,
k --k, every row audited, and each state bug planted in the engine's source by tests/test_mutants.py
(--planted). Per fault and bug: the verdicts the audit names, how many sequences it names, how many
sequences hold a token the target gives probability 0 and whether each of those was named at or
before that token, and the distribution verdict beside it, and the run's sampled verdict
(metrics.sampled_verdict). shared-stream runs one prompt in 16 rows (rows that share a stream show
only on the same prompt). Then eqspec and exspec without faults, --seeds seeds each: sequences
named, audited rounds beyond the yardstick, impossible tokens.

    python benchmarks/sampled_audit.py [--prompt-set quick] [--max-new-tokens 24] [--top-p 0.5]
    [--faults F …]
                                       [--planted BUG …] [--seeds 20]
                                       [--out benchmarks/results/sampled-audit.md]
"""
import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from specviz.run.runner import run
from specviz.spec.faults import FAULTS, FAULT_PRESETS, needing
from specviz.spec.prompts import builtin_set
from specviz.spec.run import RunSpec
from specviz.trace import metrics
from publish import publish

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_mutants import MUTANTS, plant  # noqa: E402  the state bugs the suite plants, planted here the same way

STATE_BUGS = ["layout-off-by-one", "rows-interfere", "positions-off-by-one", "mask-leaks-a-pad"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-set", default="quick")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.5,
                    help="below 1, tokens outside the nucleus are impossible")
    alone = [f for f in FAULTS if f not in needing("rows")]  # a batch of one request's settings
    ap.add_argument("--faults", nargs="*", default=[*alone, *FAULT_PRESETS],
                    help="default: every fault and preset but those of per-request settings")
    ap.add_argument("--planted", nargs="*", default=STATE_BUGS, choices=list(MUTANTS),
                    help="state bugs planted in the engine's source (tests/test_mutants.py)")
    ap.add_argument("--seeds", type=int, default=20, help="0: the faults alone")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prompts = tuple(builtin_set(args.prompt_set))

    def sampled(method: str, faults=(), seed: int = 0):
        # Rows that share a stream show only on the same prompt, and only in numbers: 16 rows,
        # as tests/test_sampling.py.
        shown_on = prompts[:1] * 16 if faults == ("shared-stream",) else prompts
        return run(RunSpec.build(prompts=shown_on, method=method, faults=faults,
                                 batch_size=args.batch_size, k=args.k,
                                 max_new_tokens=args.max_new_tokens, device="cpu",
                                 audit=args.batch_size, temperature=args.temperature,
                                 top_p=args.top_p, seed=seed))

    lines = ["# The state audit at temperature > 0\n",
             (f"Embedded pair, float32, {len(prompts)} prompts of {args.prompt_set!r}, "
              f"{args.max_new_tokens} new tokens, temperature {args.temperature}, top-p "
              f"{args.top_p}, batch size {args.batch_size}, k {args.k}, every row audited.\n"),
             ("| fault | named | verdicts | sequences with an impossible token "
              "| named at or before it | distribution | run verdict | seconds |"),
             "|---|---:|---|---:|---:|---|---|---:|"]

    def row(name: str, trace, start: float) -> None:
        named = [s for s in trace.sequences if s.forensics]
        bad = [(s, next(i for i, u in enumerate(s.pit) if u is None)) for s in trace.sequences
               if metrics.impossible(s)]
        before = sum(s.forensics is not None and s.forensics.fork <= i for s, i in bad)
        verdicts = ", ".join(f"{v} {c}"
                             for v, c in Counter(s.forensics.verdict for s in named).items()) or "-"
        lines.append(f"| {name} | {len(named)} of {len(trace.sequences)} | {verdicts} | {len(bad)} "
                     f"| {before} of {len(bad)} | {trace.distribution.verdict} | "
                     f"{metrics.sampled_verdict(trace)[0]} | {time.perf_counter() - start:.0f} |")
        print(lines[-1], flush=True)

    for fault in args.faults:
        start = time.perf_counter()
        row(fault, sampled("eqspec", (fault,)), start)
    for bug in args.planted:
        start = time.perf_counter()
        *where, method = MUTANTS[bug]
        with pytest.MonkeyPatch.context() as patch:
            plant(patch, *where)
            row(f"planted: {bug} ({method})", sampled(method), start)
    if args.seeds:
        lines += ["", "| sampler | seeds | sequences | named | audited rows beyond the yardstick "
                      "| impossible tokens |",
                  "|---|---:|---:|---:|---:|---:|"]
    for method in ("eqspec", "exspec") if args.seeds else ():
        traces = [sampled(method, seed=seed) for seed in range(args.seeds)]
        sequences = [s for t in traces for s in t.sequences]
        beyond = sum(r.audit is not None and r.audit > t.manifest.yardstick.target.tolerance
                     for t in traces for r in t.rows)
        lines.append(f"| {method} | {args.seeds} | {len(sequences)} | "
                     f"{sum(s.forensics is not None for s in sequences)} | {beyond} of "
                     f"{sum(len(t.rows) for t in traces)} | "
                     f"{sum(metrics.impossible(s) for s in sequences)} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    publish(text, args.out)


if __name__ == "__main__":
    main()
