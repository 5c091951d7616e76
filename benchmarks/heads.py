"""The embedded target's EAGLE-3 heads against the draft model and prompt lookup, chains and trees,
side by side in one run (docs/benchmarks.md): the head trained on this machine (`specviz train-head
--eagle3`, on the built-in set spec-bench) and the fitted one (models/builtinheads.py), on prompts
neither learned from (the built-in set `all` without the page's default prompts and the casebook's,
which the fitted head was fitted on). For each drafter and tree width: the acceptance at each draft
position (of the drafts that reached it), drafts accepted and tokens written per row and round,
and whether every output equals the batch-size-1 reference. With --vllm, the trained head is also
served to vLLM's eagle3 mode on the same prompts (chains, eager, float32), and its acceptance per
position by /metrics is set beside specviz's replay of the same head on vLLM's outputs.

    python benchmarks/heads.py [--k 4] [--widths 2] [--batch-size 4] [--max-new-tokens 48] [--vllm]
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from specviz.decoding.recording import build_trace
from specviz.forensics.acceptance import shown_rates
from specviz.models.builtinheads import head_folder
from specviz.models.pairs import load_pair
from specviz.run.runner import decode
from specviz.spec.casebook import PROMPTS as CASEBOOK
from specviz.spec.prompts import DEFAULT_SET, builtin_set
from specviz.spec.run import ENGINE, FITTED_HEAD, PAIR_PRESETS, TRAINED_HEAD, RunSpec
from specviz.trace import metrics

import options

HEAD = ("| drafter | tree width | acceptance by draft position | drafts accepted/row/round | "
        "tokens/row/round | equal to reference |\n|---|---:|---|---:|---:|---|")
DRAFTERS = (("draft model", dict(drafter="model")), ("prompt lookup", dict(drafter="lookup")),
            ("EAGLE-3, trained", dict(drafter="eagle3", head=TRAINED_HEAD)),
            ("EAGLE-3, fitted", dict(drafter="eagle3", head=FITTED_HEAD)))


def main() -> None:
    ap = options.parser(__doc__, k=4, batch_size=4, max_new_tokens=48, threads=2, out=None)
    ap.add_argument("--widths", default="2")
    ap.add_argument("--vllm", action="store_true")
    args = options.parse(ap)
    target, draft = PAIR_PRESETS["embedded"]
    pair = load_pair(target, draft, dtype="float32", device="cpu")
    learned = {*builtin_set(DEFAULT_SET), *CASEBOOK}
    prompts = tuple(p for p in builtin_set("all") if p not in learned)
    ids = pair.encode(prompts)
    reference = decode(RunSpec.build(prompts=prompts, method="reference",
                                     max_new_tokens=args.max_new_tokens), pair, ids)
    lines = [f"{len(prompts)} prompts of the built-in set `all`, k {args.k}, batch size "
             f"{args.batch_size}, {args.max_new_tokens} new tokens, float32", "", HEAD]
    print("\n".join(lines), flush=True)
    for name, fields in DRAFTERS:
        for width in (1, *map(int, args.widths.split(","))):
            spec = RunSpec.build(prompts=prompts, method="eqspec", k=args.k,
                                 batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                                 tree_width=width, **fields)
            result = decode(spec, pair, ids)
            trace = build_trace(spec, pair, ids, result)
            # a position no round reached: nan
            positions = [None if p != p else p for p in metrics.per_position_acceptance(trace)]
            equal = [o.ids for o in result.outputs] == [o.ids for o in reference.outputs]
            options.add_row(lines, f"| {name} | {width} | {shown_rates(positions)} | "
                                   f"{sum(r.accepted for r in trace.rows) / len(trace.rows):.2f}"
                                   f" | {metrics.tokens_per_round(trace):.2f} | {equal} |")
    if args.vllm:
        options.add_row(lines, "")
        options.add_row(lines, _served_to_vllm(pair, prompts, args))
    options.write_out(args, lines)


def _served_to_vllm(pair, prompts: tuple[str, ...], args) -> str:
    """The trained head in vLLM's eagle3 mode: its acceptance per position by /metrics beside
    specviz's replay of the head on vLLM's outputs."""
    from specviz.engines.vllm import vllm_server
    from specviz.run import check

    folder = Path(head_folder(TRAINED_HEAD, pair.target, PAIR_PRESETS["embedded"][0]))
    spec = RunSpec.build(prompts=prompts, method=ENGINE, k=args.k,
                         max_new_tokens=args.max_new_tokens, drafter="eagle3", head=TRAINED_HEAD)
    log = Path(tempfile.mkdtemp(prefix="heads-vllm-")) / "vllm.log"
    with vllm_server("eagle3", log, k=args.k, eager=True, head=folder) as server:
        trace = check.from_servers(spec, pair, (server.url, server.served_model), None, 8, 300.0,
                                   drafter="eagle3")
    return f"vLLM, eagle3 mode, the trained head: {trace.acceptance.explanation}"


if __name__ == "__main__":
    main()
