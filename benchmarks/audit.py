"""What --audit costs: eqspec with and without it, side by side on the same prompts, at batch sizes
1 and 8.

An audited row costs one fresh batch-size-1 pass of the target (its real tokens, no cache) and one
of the draft per round, so the audit's share grows with the prompt length and the number of rows.
Each pair of runs is timed back to back, plain first, after a warm-up; the table reports decode
seconds (the watch's own seconds are inside them) and their ratio.

    python benchmarks/audit.py [--pair embedded] [--prompt-set quick] [--max-new-tokens 32]
"""
import argparse
import time

from specviz.models.pairs import pair_for
from specviz.run.runner import decode, encode, reference_for
from specviz.spec.prompts import builtin_set
from specviz.spec.run import PAIR_PRESETS, RunSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=sorted(PAIR_PRESETS), default="embedded")
    ap.add_argument("--prompt-set", default="quick")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    target, draft = PAIR_PRESETS[args.pair]
    prompts = tuple(builtin_set(args.prompt_set))
    print(f"{len(prompts)} prompts of the {args.prompt_set!r} set, {args.max_new_tokens} new "
          f"tokens, k {args.k}, pair {args.pair}, {args.device}")
    print(f"{'bs':>3} {'plain s':>9} {'audit s':>9} {'ratio':>6} {'watch s':>8} "
          f"{'audited rows':>13}")
    for bs in (1, 8):
        spec = RunSpec.build(target=target, draft=draft, prompts=prompts, batch_size=bs, k=args.k,
                             max_new_tokens=args.max_new_tokens, device=args.device)
        pair = pair_for(spec)
        ids = encode(spec, pair)
        ref = reference_for(pair, ids, spec.max_new_tokens)
        decode(spec, pair, ids[:1], reference=ref)  # warm-up
        times = {}
        for audit in (0, bs):
            run_spec = spec.model_copy(update={"audit": audit})
            start = time.perf_counter()
            result = decode(run_spec, pair, ids, reference=ref)
            times[audit] = (time.perf_counter() - start, result)
        (plain, _), (audited, result) = times[0], times[bs]
        watch = sum(rd.timings.get("watch", 0.0) for rd in result.rounds)
        print(f"{bs:>3} {plain:>9.2f} {audited:>9.2f} {audited / plain:>5.2f}x {watch:>8.2f} "
              f"{len(result.audit):>13}")


if __name__ == "__main__":
    main()
