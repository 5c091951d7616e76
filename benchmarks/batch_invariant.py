"""What batch-invariant mode (specviz/models/invariant.py) costs, per method, against the default
kernels, side by side in one run on the embedded pair; and, with --forks, how many outputs of a
correct run fork from the batch-size-1 reference in each mode, over the given prompt sets.

Each method decodes the same prompts twice, with the stock pair and with the invariant one (both
loaded before timing, each after a short warm-up); the reference is each mode's own batch-size-1
decode. Model loading, the yardstick and the forensics are excluded. Timings on a shared machine
are noisy: quote the ratios of one run.

    python benchmarks/batch_invariant.py [--prompt-set all] [--max-new-tokens 32] [--batch-size 4]
        [--k 5] [--threads 2] [--dtype bfloat16] [--forks quick,all,spec-bench]
        [--out benchmarks/results/batch-invariant.md]
"""
import torch

from specviz.models.pairs import load_pair
from specviz.run.runner import decode, reference_for
from specviz.spec.prompts import builtin_set
from specviz.spec.run import RunSpec

import options

# (method, drafter, tree width)
METHODS = [("reference", "model", 1), ("batched-reference", "model", 1), ("eqspec", "model", 1),
           ("eqspec", "lookup", 1), ("exspec", "model", 1), ("exspec", "model", 2)]


def forks(pair, prompts: list[str], args, invariant: bool) -> int:
    """How many of eqspec's outputs on `prompts` fork from the pair's batch-size-1 reference."""
    ids = pair.encode(prompts)
    spec = RunSpec.build(prompts=tuple(prompts), batch_size=args.batch_size, k=args.k,
                         max_new_tokens=args.max_new_tokens, device="cpu", dtype=args.dtype,
                         batch_invariant=invariant)
    ref = reference_for(pair, ids, args.max_new_tokens)
    run = decode(spec, pair, ids, record=False)
    return sum(a.ids != b.ids for a, b in zip(run.outputs, ref.outputs))


def main() -> None:
    ap = options.parser(__doc__, prompt_set="all", max_new_tokens=32, batch_size=4, k=5,
                        threads=2, dtype="bfloat16", out=None)
    ap.add_argument("--forks", default="", help="comma-separated prompt sets to count forks on")
    args = options.parse(ap)
    pairs = {mode: load_pair(dtype=args.dtype, device="cpu", batch_invariant=mode)
             for mode in (False, True)}
    prompts, ids = options.prompt_set(pairs[False], args)
    setup = (f"{len(ids)} prompts of the {args.prompt_set!r} set, {args.max_new_tokens} new "
             f"tokens, batch size {args.batch_size}, k {args.k}, embedded pair in {args.dtype}, "
             f"greedy, {args.threads} threads, torch {torch.__version__}")
    print(setup)
    lines = [f"# Batch-invariant mode: its cost\n\n{setup}.\n",
             "| method | drafter | tree | default tok/s | invariant tok/s | cost |",
             "|---|---|---:|---:|---:|---:|"]
    print("\n".join(lines[1:]))

    def spec(method: str, drafter: str, width: int, invariant: bool, **update) -> RunSpec:
        fields = dict(prompts=tuple(prompts), method=method, drafter=drafter, tree_width=width,
                      batch_size=args.batch_size, k=args.k, max_new_tokens=args.max_new_tokens,
                      device="cpu", dtype=args.dtype, batch_invariant=invariant)
        return RunSpec.build(**{**fields, **update})

    for method, drafter, width in METHODS:
        rates = []
        for invariant, pair in pairs.items():
            warm = spec(method, drafter, width, invariant, max_new_tokens=4)
            decode(warm, pair, ids[:2], record=False)
            result = decode(spec(method, drafter, width, invariant), pair, ids, record=False)
            rates.append(sum(len(o.ids) for o in result.outputs) / result.seconds)
        options.add_row(lines, f"| {method} | {drafter if method.endswith('spec') else ''} | "
                               f"{width} | {rates[0]:.1f} | {rates[1]:.1f} | "
                               f"{rates[0] / rates[1]:.2f}x |")
    if args.forks:
        lines += ["", "| prompt set | prompts | mode | eqspec outputs forking from the reference |",
                  "|---|---:|---|---:|"]
        print("\n".join(lines[-3:]))
        for name in args.forks.split(","):
            for invariant, pair in pairs.items():
                options.add_row(lines, f"| {name} | {len(builtin_set(name))} | "
                                       f"{'invariant' if invariant else 'default'} | "
                                       f"{forks(pair, builtin_set(name), args, invariant)} |")
    options.write_out(args, lines)


if __name__ == "__main__":
    main()
