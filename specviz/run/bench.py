"""`specviz bench`: every method on the same prompts, side by side in one run.

Throughput, tokens per round, acceptance, and where eqspec's decode time goes.
Timings on a shared machine are noisy: compare the ratios within one run.
"""
from __future__ import annotations

import sys
import time

import plotly.graph_objects as go
from tqdm import tqdm

from specviz.decoding.recording import build_trace
from specviz.models.pairs import Placement, pair_for
from specviz.run.runner import decode, encode
from specviz.spec.drafters import DEFAULT_DRAFTER, DRAFTERS
from specviz.spec.methods import METHODS, grid
from specviz.spec.run import RunSpec
from specviz.trace import metrics


def configs(args, faults: tuple[str, ...] = ()) -> list[dict]:
    """The runs (methods.grid) at one k, as spec fields: `faults` in the methods that take faults,
    batched-reference only where it differs from reference; exspec once per max-wait."""
    out = []
    for c in grid(args.methods, args.drafter, args.batch_sizes, [args.k], [faults],
                  [args.temperature]):
        if c["method"] == "batched-reference" and c["batch_size"] == 1:
            continue
        waits = args.max_waits if c["method"] == "exspec" and args.max_waits else [None]
        out += [dict(c, **({} if w is None else {"max_wait": w})) for w in waits]
    return out


def bench(args, specs: list[RunSpec], placement: Placement) -> list[dict]:
    """Each of `specs` (the CLI builds them from configs(args)) on the same prompts and pair,
    in turn."""
    base = specs[0]
    pair = pair_for(base, args.trust_remote_code, placement)
    prompt_ids = encode(base, pair)
    # Warm-up: the first forward passes pay one-off costs that are nobody's fault.
    decode(base.model_copy(update={"prompts": base.prompts[:2], "max_new_tokens": 4}), pair,
           prompt_ids[:2])

    rows = []
    for spec in tqdm(specs, desc="bench", disable=not sys.stderr.isatty()):
        method, bs = spec.method, spec.batch_size
        result = decode(spec, pair, prompt_ids, record=True)
        t = time.perf_counter()
        trace = build_trace(spec, pair, prompt_ids, result)
        build = time.perf_counter() - t
        row = {"method": f"{method} max-wait {spec.max_wait}" if method == "exspec"
               and args.max_waits else method,
               "drafter": spec.drafter if METHODS[method].speculative else "-", "batch_size": bs,
               "tokens": result.new_tokens, "seconds": result.seconds,
               "tokens_per_s": result.new_tokens / result.seconds}
        if trace.rows:
            phases = metrics.phase_seconds(trace)
            row.update(acceptance=metrics.acceptance_rate(trace),
                       tokens_per_round=metrics.tokens_per_round(trace), build_seconds=build,
                       **{f"{p}_share": s / result.seconds for p, s in phases.items()})
        row.update(group_rate=metrics.group_rate(trace), **metrics.completion_percentiles(trace))
        rows.append(row)
        tqdm.write(_line(row))
    base_row = next((r for r in rows if r["method"] == "reference"), rows[0])
    for r in rows:
        r["vs_base"] = r["tokens_per_s"] / base_row["tokens_per_s"]
    # its note names their options
    _write_rows(args, next((s for s in specs if DRAFTERS[s.drafter].options), base), rows)
    return rows


def _line(r: dict) -> str:
    s = (f"{r['method']:<18} {r['drafter']:<6} bs {r['batch_size']:>2}: {r['tokens_per_s']:7.1f} "
         "tok/s")
    if "acceptance" in r:
        s += (f"  acc {r['acceptance']:.2f}  {r['tokens_per_round']:.2f} tok/round  draft "
              f"{r['draft_share']:.0%}  verify {r['verify_share']:.0%}  realign "
              f"{r['realign_share']:.1%}  trace {r['trace_share']:.1%}")
    return s


def _fmt(v, pct=False):
    if v is None:
        return "-"
    return f"{v:.1%}" if pct else f"{v:.2f}"


def _write_rows(args, spec: RunSpec, rows: list[dict]) -> None:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    base = (rows[0]["method"] if rows[0]["method"] == "reference"
            else f"{rows[0]['method']} bs {rows[0]['batch_size']}")
    head = (f"| method | drafter | bs | tok/s | vs {base} | acceptance | tokens/round | draft | "
            "verify | realign | trace | group rate | P50 s | P90 s | P99 s |\n"
            "|---|---|" + "---:|" * 13 + "\n")
    body = "".join(
        f"| {r['method']} | {r['drafter']} | {r['batch_size']} | {r['tokens_per_s']:.1f} | "
        f"{r['vs_base']:.2f}x | {_fmt(r.get('acceptance'))} | {_fmt(r.get('tokens_per_round'))} | "
        f"{_fmt(r.get('draft_share'), True)} | {_fmt(r.get('verify_share'), True)} | "
        f"{_fmt(r.get('realign_share'), True)} | {_fmt(r.get('trace_share'), True)} | "
        f"{_fmt(r.get('group_rate'), True)} | {_fmt(r.get('p50'))} | {_fmt(r.get('p90'))} | "
        f"{_fmt(r.get('p99'))} |\n"
        for r in rows
    )
    command = "specviz bench " + " ".join(sys.argv[2:])
    kind = DRAFTERS[spec.drafter]
    options = f", {kind.name} {kind.setting(spec)}" if kind.setting else ""
    note = (f"\n{len(spec.prompts)} prompts, {spec.max_new_tokens} new tokens, "
            f"k={spec.k}{options}, {spec.dtype}, pair {spec.target} / {spec.draft}. Made by "
            f"`{command}`.\n")
    (out / f"{args.name}.md").write_text(head + body + note)
    fig = go.Figure(go.Bar(
        x=[f"{r['method']}{'' if r['drafter'] in ('-', DEFAULT_DRAFTER) else ' ' + r['drafter']} "
           f"bs{r['batch_size']}" for r in rows],
        y=[r["tokens_per_s"] for r in rows],
        text=[f"{r['tokens_per_s']:.0f}" for r in rows], marker_color=[
            "#888" if "reference" in r["method"] else "#c66" if r["method"] == "hf-assisted"
            else "#36c" for r in rows],
    ))
    fig.update_layout(title="Throughput, side by side in one run",
                      yaxis_title="generated tokens / s")
    fig.write_html(out / f"{args.name}.html", include_plotlyjs="cdn")
    print(f"wrote {out / (args.name + '.md')} and {out / (args.name + '.html')}")
