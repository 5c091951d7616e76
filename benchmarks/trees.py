"""Chains against token trees, on this machine, side by side in one run.

For each drafter that grows trees on the pair (the draft model, prompt lookup, and the EAGLE-style
head where the pair has one: the embedded pair's once `specviz train-head` has trained it, the tiny
pair's untrained; the model's own MTP layer where its checkpoint ships one), at batch size 1 and
--batch-size: eqspec with a chain (tree width 1) and with trees of each --widths, beside the
reference (batch size 1) and batched-reference (the wider batch). It prints and writes tokens per
row and round, the drafts accepted and the drafts verified per row and round (a tree's nodes),
tokens/s and the speed-up over the baseline in the same run, and whether every output equals the
batch-size-1 reference. A tree verifies more slots per pass to accept more per round: on a CPU that
pass costs nearly its width, on a GPU almost nothing until the batch fills it; the table says which
this machine is. Timings on a shared machine are noisy: quote the ratios of one run.

    python benchmarks/trees.py [--pair embedded] [--prompt-set all] [--k 5] [--widths 2,4]
    [--batch-size 8]
                               [--max-new-tokens 48] [--threads 2] [--out
                               benchmarks/results/trees.md]
"""


from specviz.decoding.recording import build_trace
from specviz.models.pairs import load_pair
from specviz.run.runner import decode
from specviz.spec.drafters import DRAFTERS
from specviz.spec.prompts import builtin_sets
from specviz.spec.run import PAIR_PRESETS, RunSpec
from specviz.spec.strict import SpecError

import options

HEAD = ("| drafter | batch | tree width | tok/s | speed-up | tokens/row/round | drafts "
        "accepted/row/round | drafts verified/row/round | equal to reference "
        "|\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def main() -> None:
    ap = options.parser(__doc__, prompt_set="all", k=5, batch_size=8, max_new_tokens=48, threads=2,
                        out=None)
    ap.add_argument("--pair", default="embedded", choices=list(PAIR_PRESETS))
    ap.add_argument("--widths", default="2,4")
    args = options.parse(ap)
    target, draft = PAIR_PRESETS[args.pair]
    pair = load_pair(target, draft, dtype="float32", device="cpu")
    prompts = builtin_sets()[args.prompt_set]
    ids = pair.encode(prompts)
    widths = [1, *map(int, args.widths.split(","))]

    def measure(method: str, batch_size: int, **fields) -> dict:
        spec = RunSpec.build(target=target, draft=draft, prompts=tuple(prompts), method=method,
                             batch_size=batch_size, k=args.k, max_new_tokens=args.max_new_tokens,
                             device="cpu", **fields)
        result = decode(spec, pair, ids)
        trace = build_trace(spec, pair, ids, result)
        rows = trace.rows
        return {"ids": [o.ids for o in result.outputs], "seconds": result.seconds,
                "tokens": sum(len(o.ids) for o in result.outputs), "rows": len(rows),
                "per_round": sum(len(r.emitted) for r in rows) / len(rows) if rows else 1.0,
                "verified": sum(len(r.tree.tokens) if r.tree else len(r.draft_tokens)
                                for r in rows) / len(rows) if rows else 0.0,
                "accepted": sum(r.accepted for r in rows) / len(rows) if rows else 0.0}

    decode(RunSpec.build(target=target, draft=draft, prompts=tuple(prompts[:2]), max_new_tokens=4,
                         device="cpu"),
           pair, ids[:2])  # the first passes pay one-off costs that are nobody's fault
    reference = measure("reference", 1)
    baselines = {1: reference, args.batch_size: measure("batched-reference", args.batch_size)}
    lines = [HEAD, _row("reference", 1, "—", reference, reference, reference)]
    if args.batch_size != 1:
        lines.append(_row("batched-reference", args.batch_size, "—", baselines[args.batch_size],
                          baselines[args.batch_size], reference))
    for name, kind in DRAFTERS.items():
        if not kind.trees:
            continue
        for bs in (1, args.batch_size):
            for width in widths:
                try:
                    got = measure("eqspec", bs, drafter=name, tree_width=width)
                except SpecError as e:  # a drafter this pair cannot run (no head, no MTP layer)
                    print(f"{name}: {e}")
                    break
                lines.append(_row(name, bs, width, got, baselines[bs], reference))
                print(lines[-1], flush=True)
    setup = (f"{args.pair} pair, float32, this CPU ({args.threads} threads), greedy, "
             f"{args.prompt_set} prompts ({len(prompts)}), {args.max_new_tokens} new tokens, "
             f"eqspec, k {args.k} (a tree's depth), tree width 1 is a chain. Speed-up: against the "
             "reference at batch size 1, batched-reference at the wider batch, both in this run.")
    text = setup + "\n\n" + "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        args.out.write_text(
            text + f"\nMade by `python benchmarks/trees.py --pair {args.pair} --prompt-set "
                   f"{args.prompt_set} --k {args.k} --widths {args.widths} --batch-size "
                   f"{args.batch_size} --max-new-tokens {args.max_new_tokens} "
                   f"--threads {args.threads}`.\n")
        print(f"wrote {args.out}")


def _row(drafter: str, bs: int, width, got: dict, base: dict, reference: dict) -> str:
    speed, base_speed = got["tokens"] / got["seconds"], base["tokens"] / base["seconds"]
    equal = sum(a == b for a, b in zip(got["ids"], reference["ids"]))
    return (f"| {drafter} | {bs} | {width} | {speed:.1f} | {speed / base_speed:.2f}x | "
            f"{got['per_round']:.2f} | {got['accepted']:.2f} | {got['verified']:.1f} | "
            f"{equal}/{len(reference['ids'])} |")


if __name__ == "__main__":
    main()
