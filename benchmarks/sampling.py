"""Speculative sampling under the PIT verdict (distribution.py), on the embedded pair:

- the correct eqspec and exspec samplers over many seeds: how often is a correct sampler rejected?
- every sampling fault: rejected, and after how many tokens (the smallest budget
  of a doubling series)?

    python benchmarks/sampling.py --seeds 20 --out benchmarks/results/sampling.md

Prints a markdown report; every figure comes from this run.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from specviz.run.runner import run
from specviz.spec.faults import of_kind
from specviz.spec.prompts import builtin_set
from specviz.spec.run import RunSpec

SETTINGS = {"temperature": 0.8, "batch_size": 4, "k": 5, "device": "cpu"}


def _run(prompts, top_p, method="eqspec", faults=(), seed=0, max_new_tokens=32):
    start = time.perf_counter()
    trace = run(RunSpec.build(prompts=tuple(prompts), method=method, faults=faults, seed=seed,
                              top_p=top_p, max_new_tokens=max_new_tokens, **SETTINGS))
    return trace, time.perf_counter() - start


def _row(label, trace, seconds):
    d, dec = trace.distribution, trace.decisions
    worst = min(d.splits, key=lambda s: s.p, default=None)
    return (f"| {label} | {d.tokens} | {d.verdict} | {d.p:.2g} | {d.failing or '—'} | "
            f"{worst.name if worst else '—'} ({worst.p:.2g}) | {d.impossible} | "
            f"{dec.mismatches if dec else '—'} | {seconds:.0f} s |")


HEADER = ("| run | tokens | verdict | p (Bonferroni) | failing split | worst split (p) | "
          "impossible | decision mismatches | time |\n|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20, help="seeds per correct sampler")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--methods", default="eqspec,exspec",
                    help="the correct samplers to run over seeds")
    ap.add_argument("--prompt-set", default="all")
    ap.add_argument("--prompts", type=int, help="only the first N prompts of the set")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--top-p", type=float, default=0.95,
                    help="1: off (then no token is impossible)")
    ap.add_argument("--faults", default=",".join([*of_kind("sampling"), "draft-bonus"]))
    ap.add_argument("--skip-correct", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    prompts = builtin_set(args.prompt_set)[: args.prompts]
    lines = [(f"Embedded pair, float32, this CPU; the first {len(prompts)} prompts of "
              f"`{args.prompt_set}`; temperature 0.8, top-p {args.top_p}, batch size 4, k 5, "
              f"{args.max_new_tokens} new tokens a prompt. Verdicts at alpha 0.001."), ""]

    if not args.skip_correct:
        lines += ["## The correct samplers over seeds", "", HEADER]
        rejected = {}
        for method in args.methods.split(","):
            rejected[method] = 0
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                trace, seconds = _run(prompts, args.top_p, method, seed=seed,
                                      max_new_tokens=args.max_new_tokens)
                rejected[method] += trace.distribution.verdict != "consistent"
                lines.append(_row(f"{method}, seed {seed}", trace, seconds))
                print(lines[-1], flush=True)
        lines += ["", "False positives: "
                  + ", ".join(f"{m} {r} of {args.seeds} seeds" for m, r in rejected.items()), ""]

    lines += ["## Each sampling fault: the smallest prompt count (doubling) that rejects it", "",
              HEADER]
    for fault in filter(None, args.faults.split(",")):
        n = 2
        while True:
            same = fault == "shared-stream"  # shows when rows see the same prompt
            chosen = [prompts[0]] * n if same else (prompts * (1 + n // len(prompts)))[:n]
            trace, seconds = _run(chosen, args.top_p, faults=(fault,),
                                  max_new_tokens=args.max_new_tokens)
            if (trace.distribution.verdict == "not the target's distribution"
                    or n >= 4 * len(prompts)):
                lines.append(_row(f"{fault}, {n} prompts"
                                  + (" (one prompt, repeated)" if same else ""), trace, seconds))
                print(lines[-1], flush=True)
                break
            n *= 2
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
