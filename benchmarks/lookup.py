"""Prompt lookup against plain decoding on the embedded pair, on this machine, side by side
in one run.

For each subset of the built-in prompts (`summarize+code`: answers that draw on their own prompt;
`all`; and, at batch size 1, each category alone):
- batch size 1: the reference, prompt-lookup eqspec, transformers' prompt lookup (hf-assisted, the
  same n and k) and draft-model eqspec;
- batch size --batch-size: batched-reference, prompt-lookup eqspec and exspec, and draft-model
  eqspec;
- vLLM (its CPU build, `make vllm`): no speculation and ngram with the same k and n-grams, 1 and
  --batch-size requests in flight.
Each speed-up is against the row's own baseline in the same run: reference, batched-reference, vLLM
without speculation. Every output is compared with the batch-size-1 reference. Batch-size-1 rows run
one category at a time (a subset's figures are sums over its categories: at batch size 1 a prompt's
work does not depend on the others); batched rows and vLLM run each subset whole. Model loading and
server start are excluded; a short warm-up precedes each engine. Timings on a shared machine are
noisy: quote the ratios of one run.

    python benchmarks/lookup.py [--k 5] [--ngram-min 2] [--ngram-max 3] [--max-new-tokens 48]
    [--batch-size 8]
                                [--threads 2] [--no-vllm] [--out benchmarks/results/lookup.md]
"""
import tempfile
from pathlib import Path


from specviz.decoding.recording import build_trace
from specviz.engines.server import from_server
from specviz.engines.vllm import vllm_server
from specviz.models.pairs import load_pair
from specviz.run.runner import decode
from specviz.spec.prompts import builtin_records, builtin_sets
from specviz.spec.run import RunSpec
from specviz.trace import metrics

import options

SUBSETS = ("summarize+code", "all")


def main() -> None:
    ap = options.parser(__doc__, k=5, max_new_tokens=48, batch_size=8, threads=2, out=None)
    ap.add_argument("--ngram-min", type=int, default=2)
    ap.add_argument("--ngram-max", type=int, default=3)
    ap.add_argument("--no-vllm", action="store_true", help="leave vLLM out")
    args = options.parse(ap)
    pair = load_pair(dtype="float32", device="cpu")
    sets = builtin_sets()
    categories = sorted({r["category"] for r in builtin_records()})
    ids = {name: pair.encode(sets[name]) for name in ("quick", *SUBSETS, *categories)}
    lookup = {"drafter": "lookup", "ngram_min": args.ngram_min, "ngram_max": args.ngram_max}

    def spec(name: str, method: str, batch_size: int, **fields) -> RunSpec:
        return RunSpec.build(prompts=tuple(sets[name]), method=method, batch_size=batch_size,
                             k=args.k, max_new_tokens=args.max_new_tokens, device="cpu", **fields)

    def measure(name: str, method: str, batch_size: int, **fields) -> dict:
        s = spec(name, method, batch_size, **fields)
        result = decode(s, pair, ids[name], record=True)
        trace = build_trace(s, pair, ids[name], result)
        return {"ids": [o.ids for o in result.outputs], "seconds": result.seconds, "trace": trace}

    warm = spec("quick", "eqspec", 2, **lookup).model_copy(update={"max_new_tokens": 4})
    # the first passes pay one-off costs that are nobody's fault
    decode(warm, pair, ids["quick"][:2])
    one = [("reference", {}), ("eqspec", lookup), ("hf-assisted", {**lookup, "ngram_min": 1}),
           ("eqspec", {})]
    batched = [("batched-reference", {}), ("eqspec", lookup), ("exspec", lookup), ("eqspec", {})]
    runs = {}  # (subset or category, method, drafter, batch size) -> measured
    for c in categories:
        for method, fields in one:
            runs[(c, method, fields.get("drafter", "model"), 1)] = measure(c, method, 1, **fields)
            print(_line(c, method, fields, 1, runs))
    for name in SUBSETS:
        for method, fields in batched:
            runs[(name, method, fields.get("drafter", "model"), args.batch_size)] = measure(
                name, method, args.batch_size, **fields)
            print(_line(name, method, fields, args.batch_size, runs))
    vllm = {} if args.no_vllm else _vllm(args, pair, ids)

    by_text = {text: out for c in categories
               for text, out in zip(sets[c], runs[(c, "reference", "model", 1)]["ids"])}
    reference = {name: [by_text[text] for text in sets[name]] for name in SUBSETS}
    tables = [_table(args, name, _categories_of(name, categories, sets), runs, vllm, reference)
              for name in SUBSETS]
    tables.append(_category_table(categories, runs))
    setup = (f"Embedded pair (SmolLM2-135M-Instruct, float32), this CPU, {args.threads} threads, "
             f"{args.max_new_tokens} new tokens, greedy, k {args.k}, prompt lookup n-grams "
             f"{args.ngram_min}-{args.ngram_max} (transformers' own always matches down to 1), "
             f"batch size 1 and {args.batch_size}.")
    text = setup + "\n\n" + "\n\n".join(tables) + "\n"
    print("\n" + text)
    if args.out:
        args.out.write_text(text + "\nMade by `python benchmarks/lookup.py" + _flags(args) + "`.\n")
        print(f"wrote {args.out}")


def _categories_of(name: str, categories: list[str], sets: dict) -> list[str]:
    members = set(sets[name])
    return [c for c in categories if set(sets[c]) <= members]


def _line(name, method, fields, bs, runs) -> str:
    r = runs[(name, method, fields.get("drafter", "model"), bs)]
    tokens = sum(map(len, r["ids"]))
    return (f"{name:<15} {method:<18} {fields.get('drafter', '-'):<7} bs {bs}: "
            f"{tokens / r['seconds']:6.1f} tok/s")


def _sum(parts: list[dict]) -> dict:
    """Batch-size-1 runs of several categories as one: their ids, seconds and traces'
    rows together."""
    return {"ids": [i for p in parts for i in p["ids"]],
            "seconds": sum(p["seconds"] for p in parts), "traces": [p["trace"] for p in parts]}


def _stats(run: dict) -> dict:
    # vLLM's runs have none
    traces = run.get("traces") or ([run["trace"]] if "trace" in run else [])
    rows = [r for t in traces for r in t.rows]
    out = {"tokens": sum(map(len, run["ids"])), "seconds": run["seconds"]}
    if rows:
        offered = sum(len(r.draft_tokens) for r in rows)
        out["acceptance"] = sum(r.accepted for r in rows) / offered if offered else None
        out["per_round"] = sum(len(r.emitted) for r in rows) / len(rows)
        out["no_drafts"] = sum(not r.draft_tokens for r in rows) / len(rows)
        phases = [metrics.phase_seconds(t) for t in traces]
        out["draft"] = sum(p["draft"] for p in phases) / run["seconds"]
        out["realign"] = sum(p["realign"] for p in phases) / run["seconds"]
    return out


def _fmt(v, pct=False) -> str:
    if v is None:
        return "-"
    return f"{v:.0%}" if pct else f"{v:.2f}"


HEAD = ("| engine | drafter | batch | tok/s | speed-up | equal to reference | acceptance | "
        "tokens/row/round | rows with no drafts | draft share | realign share "
        "|\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def _row(engine: str, drafter: str, batch: str, stats: dict, base: dict | None, equal: str) -> str:
    speed = stats["tokens"] / stats["seconds"]
    vs = f"**{speed / (base['tokens'] / base['seconds']):.2f}x**" if base else "1.00x"
    return (f"| {engine} | {drafter} | {batch} | {speed:.1f} | {vs} | {equal} | "
            f"{_fmt(stats.get('acceptance'), True)} | {_fmt(stats.get('per_round'))} | "
            f"{_fmt(stats.get('no_drafts'), True)} | {_fmt(stats.get('draft'), True)} | "
            f"{_fmt(stats.get('realign'), True)} |")


def _equal(got: list[list[int]], want: list[list[int]]) -> str:
    return f"{sum(g == w for g, w in zip(got, want))}/{len(want)}"


def _table(args, name: str, members: list[str], runs: dict, vllm: dict, reference: dict) -> str:
    """One subset: batch-size-1 rows summed over its categories, then its batched and vLLM rows."""
    bs = args.batch_size
    want = [ids for c in members for ids in runs[(c, "reference", "model", 1)]["ids"]]
    ref = _stats(_sum([runs[(c, "reference", "model", 1)] for c in members]))
    lines = [f"### `{name}` ({len(want)} prompts)", "", HEAD,
             _row("specviz reference", "-", "1", ref, None, _equal(want, want))]
    for method, drafter, label in (("eqspec", "lookup", "specviz eqspec"),
                                   ("hf-assisted", "lookup",
                                    "transformers prompt lookup (hf-assisted)"),
                                   ("eqspec", "model", "specviz eqspec")):
        run = _sum([runs[(c, method, drafter, 1)] for c in members])
        lines.append(_row(label, drafter, "1", _stats(run), ref, _equal(run["ids"], want)))
    want = reference[name]  # the batched rows and vLLM ran the subset whole, in its own order
    base = _stats(runs[(name, "batched-reference", "model", bs)])
    lines.append(_row("specviz batched-reference", "-", str(bs), base, None,
                      _equal(runs[(name, "batched-reference", "model", bs)]["ids"], want)))
    for method, drafter in (("eqspec", "lookup"), ("exspec", "lookup"), ("eqspec", "model")):
        run = runs[(name, method, drafter, bs)]
        lines.append(_row(f"specviz {method}", drafter, str(bs), _stats(run), base,
                          _equal(run["ids"], want)))
    for flight in (1, bs):
        if ("none", name, flight) in vllm:
            none, ngram = vllm[("none", name, flight)], vllm[("ngram", name, flight)]
            lines.append(_row(f"vLLM {none['version']}", "-", f"{flight} in flight", _stats(none),
                              None, _equal(none["ids"], want)))
            lines.append(_row(f"vLLM {ngram['version']} ngram", "lookup", f"{flight} in flight",
                              _stats(ngram), _stats(none), _equal(ngram["ids"], want)))
    return "\n".join(lines)


def _category_table(categories: list[str], runs: dict) -> str:
    """Batch size 1, each category alone: where lookup pays and where it does not."""
    head = ("| category | prompts | reference tok/s | lookup eqspec tok/s | speed-up | acceptance "
            "| tokens/row/round | rows with no drafts |")
    lines = ["### Batch size 1, by category", "", head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in categories:
        ref, got = (_stats(runs[(c, "reference", "model", 1)]),
                    _stats(runs[(c, "eqspec", "lookup", 1)]))
        r, g = ref["tokens"] / ref["seconds"], got["tokens"] / got["seconds"]
        lines.append(f"| {c} | {len(runs[(c, 'reference', 'model', 1)]['ids'])} | {r:.1f} | "
                     f"{g:.1f} | {g / r:.2f}x | {_fmt(got['acceptance'], True)} | "
                     f"{_fmt(got['per_round'])} | {_fmt(got['no_drafts'], True)} |")
    return "\n".join(lines)


def _vllm(args, pair, ids: dict) -> dict:
    """vLLM without speculation, then with ngram (the same k and n-grams): each subset at 1 and
    --batch-size requests in flight."""
    out = {}
    with tempfile.TemporaryDirectory() as logs:
        for mode in ("none", "ngram"):
            with vllm_server(mode, Path(logs) / f"{mode}.log", k=args.k,
                             max_num_seqs=args.batch_size, threads=args.threads,
                             ngram=(args.ngram_min, args.ngram_max)) as server:
                from_server(server.url, server.served_model, ids["quick"][:2], 4)  # warm-up
                for name in SUBSETS:
                    for flight in (1, args.batch_size):
                        run = from_server(server.url, server.served_model, ids[name],
                                          args.max_new_tokens, concurrency=flight,
                                          tokenizer=pair.tokenizer, launch=server.launch)
                        failed = [o.error for o in run.outputs if o.error]
                        if failed:
                            raise SystemExit(f"vLLM {mode}: {len(failed)} prompts failed, first: "
                                             f"{failed[0]}")
                        out[(mode, name, flight)] = {"ids": [o.ids for o in run.outputs],
                                                     "seconds": run.seconds, "version": run.version}
                        rate = sum(map(len, out[(mode, name, flight)]["ids"])) / run.seconds
                        print(f"vLLM {mode:<6} {name:<15} {flight} in flight: {rate:6.1f} tok/s")
    return out


def _flags(args) -> str:
    flags = [f"--k {args.k}", f"--ngram-min {args.ngram_min}", f"--ngram-max {args.ngram_max}",
             f"--max-new-tokens {args.max_new_tokens}", f"--batch-size {args.batch_size}",
             f"--threads {args.threads}"]
    return " " + " ".join(flags + (["--no-vllm"] if args.no_vllm else [])
                          + (["--out", str(args.out)] if args.out else []))


if __name__ == "__main__":
    main()
