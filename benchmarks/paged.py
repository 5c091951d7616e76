"""Paged KV against the contiguous layout, side by side in one run (docs/paged.md): eqspec and
exspec on the embedded pair, float32, over prompts that share prefixes (the built-in set `all`'s
chats, which share the chat template's system prompt, and the same chats after one long shared
passage). For each method and layout: tokens per second (each configuration timed --repeats
times in rotation, the median kept), the blocks each pool handed out, the prefix cache's hit rate
(full prompt blocks found of those looked up), and whether every output equals the batch-size-1
reference.

    python benchmarks/paged.py [--block-size 16] [--repeats 3] [--out benchmarks/results/paged.md]
"""
from __future__ import annotations

import statistics

from specviz.models.pairs import load_pair
from specviz.run.runner import decode
from specviz.spec.prompts import builtin_set
from specviz.spec.run import PAIR_PRESETS, RunSpec

import options

HEAD = ("| method | layout | tokens/s | blocks (target, draft) | prefix cache hits | "
        "equal to reference |\n|---|---|---:|---|---:|---|")


def shared_prefix_prompts() -> tuple[str, ...]:
    chats = builtin_set("all")[:8]
    passage = max(builtin_set("all"), key=len)[:1500]
    return tuple(chats + [f"{passage}\n\n{c}" for c in chats])


def main() -> None:
    ap = options.parser(__doc__, k=4, batch_size=4, max_new_tokens=32, threads=2, out=None)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = options.parse(ap)
    target, draft = PAIR_PRESETS["embedded"]
    pair = load_pair(target, draft, dtype="float32", device="cpu")
    prompts = shared_prefix_prompts()
    ids = pair.encode(prompts)
    truth = [o.ids for o in decode(RunSpec.build(prompts=prompts, method="reference",
                                                 max_new_tokens=args.max_new_tokens),
                                   pair, ids).outputs]
    layouts = {"contiguous": {}, f"paged, blocks of {args.block_size}": dict(
        kv_block_size=args.block_size), f"paged, blocks of {args.block_size}, prefix caching": dict(
        kv_block_size=args.block_size, prefix_caching=True)}
    specs = {(method, name): RunSpec.build(prompts=prompts, method=method, k=args.k,
                                          batch_size=args.batch_size,
                                          max_new_tokens=args.max_new_tokens, **fields)
             for method in ("eqspec", "exspec") for name, fields in layouts.items()}
    lines = [f"{len(prompts)} prompts sharing prefixes ({sum(map(len, ids))} prompt tokens), "
             f"k {args.k}, batch size {args.batch_size}, {args.max_new_tokens} new tokens, "
             f"float32, {args.threads} threads, median of {args.repeats}", "", HEAD]
    print("\n".join(lines), flush=True)
    rates = {key: [] for key in specs}
    last = {}
    for _ in range(args.repeats):  # in rotation: the machine's drift falls on every layout alike
        for key, spec in specs.items():
            result = decode(spec, pair, ids, record=False)
            rates[key].append(result.new_tokens / result.seconds)
            last[key] = result
    for (method, name), result in last.items():
        pools = (result.paging or {}).get("pools", [])
        blocks = ", ".join(str(p["blocks"]) for p in pools) or "-"
        target = next((p for p in pools if p["model"] == "target"), None)
        hits = (f"{target['hits'] / target['lookups']:.0%} ({target['hits']} of "
                f"{target['lookups']})" if target and target["lookups"] else "-")
        equal = [o.ids for o in result.outputs] == truth
        options.add_row(lines, f"| {method} | {name} | "
                               f"{statistics.median(rates[(method, name)]):.1f} | {blocks} | "
                               f"{hits} | {equal} |")
    options.write_out(args, lines)


if __name__ == "__main__":
    main()
