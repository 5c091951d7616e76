"""Plotly figures from a Trace: KV and padding lanes, phase timings, a sampled run's
PIT histograms."""
from __future__ import annotations

import html
import math

import plotly.express as px
import plotly.graph_objects as go
from scipy import stats

from specviz.app import engineviews
from specviz.app.views import Focus, no_rounds, rows_by_seq
from specviz.spec.drafters import DRAFTERS
from specviz.spec.verdicts import OWN_DRAFTS
from specviz.trace.evidence import Distribution
from specviz.trace.metrics import PHASES, sampled
from specviz.trace.schema import Trace

LANES = (("pad", "padding"), ("content", "content length"), ("target_kv", "target KV length"),
         ("draft_kv", "draft KV length"),
         ("target_state", "target recurrent state (tokens it holds; -1: not the row's)"),
         ("draft_state", "draft recurrent state (tokens it holds)"), ("delta", "KV shift (delta)"),
         ("drafts", "drafts offered (the row's own k)"))
STATES = ("target_state", "draft_state")  # only a hybrid model's rows record them


def lanes(trace: Trace) -> tuple[tuple[str, str], ...]:
    """The lanes a run has: prompt lookup keeps no draft cache (its draft KV lane would be all 0); a
    model without recurrent layers has no recurrent state."""
    def has(field: str) -> bool:
        if field == "draft_kv":
            return DRAFTERS[trace.manifest.spec.drafter].cache
        return field not in STATES or any(getattr(r, f"{field}_before") is not None
                                          for r in trace.rows)
    return tuple(lane for lane in LANES if has(lane[0]))


def _lane_value(r, field: str) -> int:
    if field == "delta":
        return r.delta
    if field == "drafts":
        return len(r.draft_tokens)
    return getattr(r, f"{field}_before")


COLOURS = px.colors.qualitative.D3
PIT_PANELS = 12  # histograms in the PIT figure: the pooled split and the worst others
PIT_COLUMNS = 4
OK, WARN = "#4c78a8", "#e45756"
PHASE_COLOURS = {"draft": "#4c78a8", "verify": "#f58518", "realign": "#e45756", "trace": "#9d9d9d",
                 "watch": "#b279a2"}


def figure(data: list[dict], layout: dict) -> go.Figure:
    """A figure from plain dicts, without plotly's per-property validation (10x faster: 0.3 s ->
    0.03 s for eight rows' lanes). A property plotly would refuse is then dropped silently, so
    tests/test_figures.py builds every figure of the page through a validating `figure` instead."""
    return go.Figure(data=data, layout=layout, skip_invalid=True)


def stacked(n: int, gap: float) -> list[list[float]]:
    """`n` equal domains of [0, 1], the first at the top, `gap` apart. Edges are counted from 0 and
    clamped to 1, so rounding never leaves [0, 1]: plotly refuses such a domain (a lane's axis then
    spans the figure)."""
    size = (1 - gap * (n - 1)) / n
    return [[(n - 1 - i) * (size + gap), min(1.0, (n - 1 - i) * (size + gap) + size)]
            for i in range(n)]


def empty(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font={"size": 14})
    fig.update_layout(xaxis_visible=False, yaxis_visible=False, height=160,
                      margin={"t": 10, "b": 10})
    return fig


def kv_lanes(trace: Trace, focus: Focus) -> go.Figure:
    """Per row of the focused sequence's batch: padding, content, target and draft KV, delta, and
    the drafts each row was offered, over the rounds; a paged run's last lane, the focused row's
    block map.

    A static batch (eqspec) shows all its rows; exspec shows the sequences that shared
    the focused round.
    """
    by_seq = rows_by_seq(trace)
    mine = by_seq.get(focus.seq, [])
    if not mine:
        return empty(no_rounds(trace))
    here = next((r for r in mine if r.round == focus.round), mine[0])
    if here.batch >= 0:
        seqs = sorted({r.seq for r in trace.rows if r.batch == here.batch})
    else:
        seqs = next(rd.seqs for rd in trace.rounds if rd.round == here.round)
    # One shared x axis and a y axis per lane, stacked top to bottom.
    shown = lanes(trace)
    paged = [r for r in mine if r.block_table is not None]
    n = len(shown) + bool(paged)
    layout = {"height": 150 * n, "margin": {"t": 30, "b": 30, "l": 40, "r": 10},
              "hovermode": "closest", "legend": {"orientation": "h", "y": -0.06},
              "xaxis": {"title": {"text": "round (start of)"}, "anchor": f"y{n}"},
              "shapes": [{"type": "line", "xref": "x", "yref": "paper", "x0": here.round,
                          "x1": here.round, "y0": 0, "y1": 1,
                          "line": {"dash": "dot", "color": "#c00"}}], "annotations": []}
    data = []
    for i, ((field, title), (bottom, top)) in enumerate(zip(shown, stacked(n, 0.04))):
        axis = "y" if i == 0 else f"y{i + 1}"
        layout["yaxis" if i == 0 else f"yaxis{i + 1}"] = {"domain": [bottom, top], "anchor": "x"}
        layout["annotations"].append({"text": title, "xref": "paper", "yref": "paper", "x": 0,
                                      "xanchor": "left", "y": top, "yanchor": "bottom",
                                      "showarrow": False})
        for c, seq in enumerate(seqs):
            rows = by_seq[seq]
            focused = seq == focus.seq
            colour = COLOURS[c % len(COLOURS)]
            data.append({
                "type": "scatter", "xaxis": "x", "yaxis": axis, "mode": "lines+markers",
                "name": f"seq {seq}", "legendgroup": f"seq {seq}", "showlegend": i == 0,
                "opacity": 1 if focused else 0.55, "x": [r.round for r in rows],
                "y": [_lane_value(r, field) for r in rows],
                "line": {"width": 3 if focused else 1.2, "color": colour},
                "marker": {"size": 5 if focused else 3, "color": colour},
                "hovertemplate": f"seq {seq} · round %{{x}}<br>{title} %{{y}}<extra></extra>",
            })
    if paged:
        _block_map(trace, focus, paged, n, stacked(n, 0.04)[-1], data, layout)
    return figure(data, layout)


def _block_map(trace: Trace, focus: Focus, rows, n: int, domain, data: list, layout: dict) -> None:
    """The focused row's block table in the target's pool over the rounds, as the last lane: a cell
    per table entry and round, shared blocks marked; the fork's slot crossed."""
    depth = max(len(r.block_table.blocks) for r in rows)
    z = [[None] * len(rows) for _ in range(depth)]
    text = [[""] * len(rows) for _ in range(depth)]
    for c, r in enumerate(rows):
        for b, (block, shared) in enumerate(zip(r.block_table.blocks, r.block_table.shared)):
            z[b][c], text[b][c] = int(shared), f"block {block}" + (" (shared)" if shared else "")
    axis = f"y{n}"
    title = (f"seq {focus.seq}'s block table by entry (orange: shared with another request or "
             "kept by the prefix cache)")
    layout[f"yaxis{n}"] = {"domain": domain, "anchor": "x", "autorange": "reversed"}
    layout["annotations"].append({"text": title, "xref": "paper", "yref": "paper", "x": 0,
                                  "xanchor": "left", "y": domain[1], "yanchor": "bottom",
                                  "showarrow": False})
    x = [r.round for r in rows]
    data.append({"type": "heatmap", "x": x, "y": list(range(depth)), "z": z, "text": text,
                 "xaxis": "x", "yaxis": axis, "zmin": 0, "zmax": 1, "showscale": False,
                 "colorscale": [[0, OK], [1, "#f58518"]], "xgap": 1, "ygap": 1,
                 "hovertemplate": "round %{x} · entry %{y}<br>%{text}<extra></extra>"})
    s, size = trace.sequences[focus.seq], trace.manifest.paging.block_size
    f = s.forensics
    if f is not None and f.round is not None:
        at = len(trace.prompts[s.seq].ids) + f.fork
        data.append({"type": "scatter", "mode": "markers", "xaxis": "x", "yaxis": axis,
                     "x": [f.round], "y": [at // size], "name": "the fork's slot",
                     "marker": {"symbol": "x", "size": 12, "color": WARN},
                     "hovertemplate": f"the fork: position {at}, slot {at % size} of table entry "
                                      f"{at // size}<extra></extra>"})


def phase_timings(trace: Trace) -> go.Figure:
    """Seconds per round spent drafting, verifying, realigning and tracing, stacked."""
    if not trace.rounds:
        return empty(no_rounds(trace))
    x = [rd.round for rd in trace.rounds]
    total = trace.manifest.decode_seconds
    fig = go.Figure()
    for p in PHASES:
        ys = [1000 * rd.timings.get(p, 0.0) for rd in trace.rounds]
        share = f" {sum(ys) / 1000 / total:.1%}" if total else ""  # 0: the decode time is not known
        fig.add_trace(go.Bar(x=x, y=ys, name=p + share, marker_color=PHASE_COLOURS[p],
                             hovertemplate=f"round %{{x}}<br>{p} %{{y:.1f}} ms<extra></extra>"))
    fig.update_layout(barmode="stack", height=300, margin={"t": 40, "b": 30, "l": 40, "r": 10},
                      title=f"time per round (share of {total:.1f} s decode time in the legend)",
                      yaxis_title="ms", xaxis_title="round",
                      legend={"orientation": "h", "y": -0.25})
    return fig


def draft_slots(trace: Trace) -> go.Figure:
    """Per draft slot, the run's (or an engine's) acceptance beside what its drafter's own proposals
    would have had (the acceptance judges'): a lossless draft bug shows as the gap between them.
    Beside it, where the rounds began at more than one band of context length, the same by context
    length: a drafter that loses its way past a length shows as a cliff there."""
    a = trace.acceptance
    if a is None and engineviews.reports_rounds(trace):
        return _engine_slots(trace)
    if a is None:
        return empty("The drafts are judged on greedy runs with a draft model or a head: each "
                     "round's drafts against the drafter's own,<br>replayed fresh on the committed "
                     "tokens. This run has no such judgement.")
    x = list(range(len(a.per_position)))
    whose = DRAFTERS[trace.manifest.spec.drafter].noun
    series = (("the engine's drafts" if trace.manifest.engine else "the run's drafts", COLOURS[0]),
              (f"{whose}'s own", COLOURS[2]))
    data = [{"type": "bar", "x": x, "y": ys, "name": name, "marker": {"color": colour},
             "hovertemplate": f"draft slot %{{x}}<br>{name}: %{{y:.0%}}<extra></extra>"}
            for ys, (name, colour) in zip((a.per_position, a.per_position_fresh), series)]
    layout = {"yaxis": {"title": {"text": "accepted"}, "tickformat": ".0%", "range": [0, 1.05]},
              "xaxis": {"title": {"text": "draft slot"}, "dtick": 1}}
    if len(a.by_context) > 1:
        bands = [f"{b.start}–{b.end - 1}" for b in a.by_context]
        data += [{"type": "bar", "x": bands, "y": [n(b) / max(b.offered, 1) for b in a.by_context],
                  "name": name, "marker": {"color": colour}, "showlegend": False,
                  "xaxis": "x2", "yaxis": "y2",
                  "hovertemplate": f"context %{{x}} tokens<br>{name}: %{{y:.0%}}<extra></extra>"}
                 for n, (name, colour) in zip((lambda b: b.accepted, lambda b: b.accepted_fresh),
                                              series)]
        layout = {"xaxis": {**layout["xaxis"], "domain": [0, 0.55]}, "yaxis": layout["yaxis"],
                  "xaxis2": {"domain": [0.65, 1], "anchor": "y2",
                             "title": {"text": "context length at the round's start"}},
                  "yaxis2": {"anchor": "x2", "tickformat": ".0%", "range": [0, 1.05],
                             "title": {"text": "of the drafts offered"}}}
    verdicts = [html.escape(a.verdict or OWN_DRAFTS)]
    if trace.rejections and trace.rejections.verdict:
        verdicts.append(f"decisions {html.escape(trace.rejections.verdict)}")
    return figure(data, {
        **layout, "barmode": "group", "height": 300,
        "margin": {"t": 40, "b": 30, "l": 50, "r": 10},
        "title": {"text": "acceptance per draft slot, of the rounds that reached it: "
                          + "; ".join(verdicts)},
        "legend": {"orientation": "h", "y": -0.25}})


def _engine_slots(trace: Trace) -> go.Figure:
    """Per draft slot, the share of an engine's reported rounds that accepted a draft there."""
    shares, rounds = engineviews.per_slot(trace)
    return figure([{"type": "bar", "x": list(range(len(shares))), "y": shares,
                    "name": "the engine's rounds", "marker": {"color": COLOURS[0]},
                    "hovertemplate": "draft slot %{x}<br>accepted in %{y:.0%} of rounds"
                                     "<extra></extra>"}], {
        "yaxis": {"title": {"text": "rounds accepting it"}, "tickformat": ".0%",
                  "range": [0, 1.05]},
        "xaxis": {"title": {"text": "draft slot"}, "dtick": 1}, "height": 300,
        "margin": {"t": 40, "b": 30, "l": 50, "r": 10},
        "title": {"text": f"acceptance per draft slot over the engine's {rounds} rounds, as it "
                          "reported them"}})


def pit_histograms(trace: Trace | None) -> go.Figure:
    """A sampled run's PIT histograms (pit_figure), one panel per split; an explanatory empty
    figure otherwise.

    Split names come from the trace (a stranger's text): plotly reads tags such as <a href> in its
    texts, so they are escaped here (plotly turns the entities back into plain characters).
    """
    if trace is None or not sampled(trace):
        return empty("Greedy run: checked token by token against the reference.<br>"
                     "PIT histograms are drawn for sampled runs (temperature above 0).")
    dist = trace.distribution
    if dist is None:
        return empty("This sampled run was not judged: its trace holds no distribution test.")
    splits = [s.model_copy(update={"name": html.escape(s.name)}) for s in dist.splits]
    return pit_figure(dist.model_copy(update={"splits": splits}))


def yardstick(trace: Trace | None, focus: Focus | None) -> go.Figure:
    """Where the focused fork falls on the yardstick that judged it: the target's rounding (a
    white-box run) or the engine's own, from its control run (an engine check), on a log axis
    of logits."""
    ys = trace.manifest.yardstick if trace else None
    if ys is None or (ys.target is None and ys.engine is None):
        return empty("No yardstick: no reference was decoded beside this run.")
    seq = trace.sequences[focus.seq] if focus is not None else None
    f = seq.forensics if seq is not None else None
    return (_engine_yardstick(ys.engine, seq, f) if ys.engine is not None
            else _rounding_yardstick(ys.target, f))


def _marks(fig: go.Figure, marks: list[tuple[str, float | None, str]]) -> None:
    """Vertical lines at the evidence's values, each named (values at or below 0 have no place on a
    log axis)."""
    for name, x, colour in marks:
        if x is not None and x > 0:
            fig.add_vline(x=x,
                          line={"color": colour, "dash": "dot" if colour == "#c00" else "solid",
                                "width": 2})
            fig.add_trace(go.Scatter(x=[x], y=[1.02], mode="markers",
                                     marker={"color": colour, "size": 9, "symbol": "triangle-down"},
                                     name=f"{name}: {x:.3g}",
                                     hovertemplate=f"{name}: {x:.3g}<extra></extra>"))


def _rounding_yardstick(r, f) -> go.Figure:
    fig = go.Figure(go.Scatter(x=[max(q, 1e-300) for q in r.quantiles], y=r.levels, mode="lines",
                               name="rounding per position", line={"color": "#4c78a8", "width": 3},
                               hovertemplate="%{y:.0%} of positions round within %{x:.3g} of "
                                             "float64<extra></extra>"))
    marks = [("tolerance" + ("" if r.alpha is None else f" (α {r.alpha:.2g})"), r.tolerance,
              "#c00")]
    if f is not None:
        gap = None if f.margin_float64 is None else abs(f.margin_float64)
        marks += [("state check", f.state_diff, "#f58518"),
                  ("|float64 gap| at the fork", gap, "#54a24b"),
                  ("rebuilt from correct inputs", f.kernel_diff, "#b279a2"),
                  ("float64 tolerance",
                   f.kernel_diff_float64 is not None and r.float64_tolerance or None, "#9d9d9d"),
                  ("rebuilt in float64", f.kernel_diff_float64, "#e45756")]
    _marks(fig, marks)
    fig.update_layout(height=300, margin={"t": 40, "b": 40, "l": 50, "r": 10},
                      legend={"orientation": "h", "y": -0.35},
                      title=f"the target's rounding in {html.escape(r.dtype)} "
                            f"({r.positions} positions)",
                      xaxis={"type": "log", "title": {"text": "logits"}},
                      yaxis={"title": {"text": "share of positions"}, "range": [0, 1.08]})
    return fig


def _engine_yardstick(noise, seq, f) -> go.Figure:
    fig = go.Figure()
    if noise.departures:
        fig.add_trace(go.Histogram(x=noise.departures, name="control's departures (float64 gaps)",
                                   marker_color="#4c78a8", histnorm="probability",
                                   hovertemplate="%{y:.0%} of departures near %{x:.3g}"
                                                 "<extra></extra>"))
    marks = [("engine tolerance" + f" (α {noise.alpha:g})", noise.tolerance, "#c00"),
             ("transformers' rounding", noise.rounding, "#9d9d9d")]
    if f is not None:
        marks += [("gap at the fork", seq.gaps[f.fork] if f.fork < len(seq.gaps) else None,
                   "#54a24b"),
                  ("first gap beyond", seq.gaps[f.first_bad] if f.first_bad is not None else None,
                   "#e45756")]
    _marks(fig, marks)
    where = ({"none": "no control run",
              "unbounded": f"its control's {noise.tokens} tokens bound none of it"}
             .get(noise.source, f"its control's {noise.tokens} tokens"))
    fig.update_layout(height=300, margin={"t": 40, "b": 40, "l": 50, "r": 10},
                      legend={"orientation": "h", "y": -0.35},
                      title=f"the engine's rounding ({where})",
                      xaxis={"type": "log", "title": {"text": "logits (float64 gap)"}},
                      yaxis={"title": {"text": "share of departures"}})
    return fig


def band(n: int, k: int, alpha: float) -> tuple[int, int]:
    """The counts one of k equal bins holds under uniformity with probability 1 - alpha / k at least
    (Bonferroni over the panel's bins): a bar outside says, alone, that the panel is not uniform
    at alpha."""
    q = alpha / k / 2
    return int(stats.binom.ppf(q, n, 1 / k)), int(stats.binom.ppf(1 - q, n, 1 / k))


def pit_figure(dist: Distribution) -> go.Figure:
    """PIT histograms as small multiples: the pooled split, then the splits with the smallest p.

    Bars are counts over the expected count (1 under uniformity); the grey band holds each bar with
    probability 1 - alpha at least. A split in the warning colour fails alone after Bonferroni
    across the tested splits.
    """
    if not dist.splits:
        fig = go.Figure()
        fig.add_annotation(text=f"No PIT histogram: {dist.verdict}.", showarrow=False,
                           font={"size": 14})
        fig.update_layout(xaxis_visible=False, yaxis_visible=False, height=160,
                          margin={"t": 10, "b": 10})
        return fig
    shown = dist.splits[:1] + sorted(dist.splits[1:], key=lambda s: s.p)[:PIT_PANELS - 1]
    rows = math.ceil(len(shown) / PIT_COLUMNS)
    columns, heights = stacked(PIT_COLUMNS, 0.04)[::-1], stacked(rows, 0.3 / rows)
    layout = {"height": 60 + 200 * rows, "margin": {"t": 50, "b": 30, "l": 40, "r": 10},
              "bargap": 0, "showlegend": False, "hovermode": "closest", "annotations": [],
              "title": {"text": "PIT histograms: count / expected; grey band: "
                                f"{1 - dist.alpha:.3g} per panel, Bonferroni over its bins; red: "
                                f"p below {dist.alpha:g} / {len(dist.splits)} splits",
                        "font": {"size": 13}}}
    data = []
    for i, s in enumerate(shown):
        r, c = divmod(i, PIT_COLUMNS)
        (x0, x1), (y0, y1) = columns[c], heights[r]
        ax = "" if i == 0 else str(i + 1)
        layout[f"xaxis{ax}"] = {"domain": [x0, x1], "anchor": f"y{ax}", "range": [0, 1]}
        layout[f"yaxis{ax}"] = {"domain": [y0, y1], "anchor": f"x{ax}", "rangemode": "tozero"}
        fails = s.p * len(dist.splits) < dist.alpha
        layout["annotations"].append({"text": f"{s.name} · n={s.n} · p={s.p:.2g}",
                                      "x": (x0 + x1) / 2, "y": y1, "xref": "paper", "yref": "paper",
                                      "xanchor": "center", "yanchor": "bottom", "showarrow": False,
                                      "font": {"size": 11, "color": WARN if fails else "#333"}})
        k = len(s.counts)
        expected = s.n / k
        lo, hi = band(s.n, k, dist.alpha)
        axes = {"xaxis": f"x{ax}", "yaxis": f"y{ax}"}
        data.append({"type": "scatter", **axes, "name": "band", "x": [0, 1, 1, 0, 0],
                     "y": [lo / expected, lo / expected, hi / expected, hi / expected,
                           lo / expected],
                     "fill": "toself", "fillcolor": "rgba(0,0,0,0.1)", "line": {"width": 0},
                     "mode": "lines", "hoverinfo": "text",
                     "text": f"{1 - dist.alpha:.3g} band per bin (Bonferroni over {k} bins): "
                             f"{lo}-{hi} values"})
        data.append({"type": "bar", **axes, "name": s.name, "x": [(j + 0.5) / k for j in range(k)],
                     "y": [v / expected for v in s.counts], "width": 1 / k, "customdata": s.counts,
                     "marker": {"color": WARN if fails else OK},
                     "hovertemplate": f"u %{{x:.3f}}: %{{customdata}} values, {expected:.1f} "
                                      "expected<extra></extra>"})
        data.append({"type": "scatter", **axes, "name": "expected", "x": [0, 1], "y": [1, 1],
                     "mode": "lines", "line": {"color": "#333", "width": 1, "dash": "dot"},
                     "hoverinfo": "skip"})
    return figure(data, layout)
