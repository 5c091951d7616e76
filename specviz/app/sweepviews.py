"""The Sweep tab's pictures, from a SweepReport alone: where equivalence breaks (the heatmap), how
(verdicts), how early (first divergences), and what the drafts were worth (accept lengths,
per-position acceptance).

Every string in a report may be a stranger's: HTML escapes it, and so do plotly's texts, which read
tags such as <a href> (plotly turns the entities back into plain characters). Figures are built from
plain dicts without plotly's per-property validation, as plots.kv_lanes does: a 64-run sweep's four
figures in milliseconds.
"""
from __future__ import annotations

import html
from collections import Counter, defaultdict
from operator import attrgetter

import plotly.graph_objects as go

from specviz.app import plots
from specviz.app.plots import COLOURS, empty
from specviz.app.views import md
from specviz.spec.verdicts import state_bug, verdict
from specviz.trace.sweep import NO_FAULTS, RunRow, SweepReport

METRICS = {
    "exact_pct": "exact match: % of sequences whose tokens equal the batch-size-1 reference's",
    "prefix_pct": "prefix match: mean % of the reference's tokens produced before the first "
                  "divergence",
}
EQUIVALENT = "equivalent"
OUTCOME_COLOURS = {EQUIVALENT: "#59a14f", "numerics": "#edc948", "unexplained": "#7f0000",
                   "kernel-bug": "#8c2d7a", "divergent, no verdict": "#bab0ac",
                   "sampled: no token reference": "#d9d9d9"}
# equivalent, but a bug beside the tokens (wasted drafts, log-probabilities): a paler green
BESIDE_RIGHT = "#9fd08f"
# a state's, or a decision's
SYNC_BUG_COLOURS = ("#e15759", "#ff9d9a", "#b6452c", "#f28e2b", "#d37295")
LAYOUT = {"height": 340, "margin": {"t": 40, "b": 40, "l": 50, "r": 10},
          "legend": {"orientation": "h", "y": -0.3}}


# px a legend entry may need, by trace type (a line's marker stands taller): a long run name takes a
# line of its own
LEGEND_LINE = {"bar": 20, "scatter": 30}
# more entries than this: the figure grows to hold its legend below it, never a scrolled one
LEGEND_BELOW = 4


def _figure(data: list[dict], **layout) -> go.Figure:
    shown = [d for d in data if d.get("showlegend", True)]
    if len(shown) > LEGEND_BELOW:
        legend = sum(LEGEND_LINE[d["type"]] for d in shown)
        layout = {"legend": {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom",
                             "maxheight": legend + 20},  # (plotly's default: half the figure)
                  **layout,
                  "height": layout.get("height", LAYOUT["height"]) + legend,
                  "margin": {**LAYOUT["margin"], "b": LAYOUT["margin"]["b"] + 20 + legend}}
    return plots.figure(data, {**LAYOUT, **layout})


# ---------------------------------------------------------------- heatmap


def _percent(value: float) -> str:
    """A cell's text: rounded, but 100 and 0 only when exactly so (99.6% of sequences equal
    is not 100)."""
    return f"{value:.0f}" if value in (0, 100) else str(min(99, max(1, round(value))))


# A sampled run's cell: its verdict's mark and colour (any other verdict names a fault: ✗, red).
SAMPLED_CELLS = {"consistent": ("✓", "hsl(120,65%,72%)"), "too few tokens": ("?", "#e4e4e4"),
                 "not judged": ("—", "#e4e4e4")}


def _metric_cell(run: int, row: RunRow, metric: str, selected: int | None) -> str:
    cls = "sv-hcell" + (" sv-sel" if run == selected else "")
    value = getattr(row, metric)
    # sampled: judged by its distribution (and, ours, its audits), not token by token
    if value is None:
        said = row.sampled_verdict or (row.distribution.verdict if row.distribution
                                       else "not judged")
        text, colour = SAMPLED_CELLS.get(said, ("✗", "hsl(0,65%,72%)"))
        tip = f"{row.name()} · sampled, no token reference · {said}"
    else:
        verdicts = ", ".join(f"{v} {c}" for v, c in row.verdicts.items())
        tip = (f"{row.name()} · {value:.1f}% of {row.n} sequences"
               + (f" · {verdicts}" if verdicts else ""))
        # red (0%) to green (100%), as the grid
        text, colour = _percent(value), f"hsl({1.2 * value:.0f},65%,72%)"
        if row.drafts_verdict:  # its drafts were not the drafter's own
            accepted, fresh = row.drafts_accepted
            tip += (f" · drafts: {row.drafts_verdict}, {accepted} accepted; the drafter's own "
                    f"would have had {fresh}")
        if row.rejections_verdict:  # it refused drafts the target chose
            accepted, kept = row.rejections_kept
            tip += (f" · decisions: {row.rejections_verdict}, {accepted} accepted; the target's "
                    f"own choices keep {kept}")
        if row.exact_pct == 100 and (row.drafts_verdict or row.rejections_verdict
                                     or any(verdict(v).bug for v in row.verdicts)):
            # every token right, and a bug beside them (drafts, log-probabilities): ⚠, by the CSS
            cls += " sv-flag"
    return (f'<td class="{cls}" data-run="{run}" style="background-color:{colour}" '
            f'title="{html.escape(tip)}">{text}</td>')


def _grid(report: SweepReport) -> tuple[list[str], list[tuple[str, list[int | None]]]]:
    """The heatmap's column heads, and its rows: (label, the run of each column, None where none
    ran). A sweep's rows are its run labels and its columns their places (batch size, k,
    temperature); a list of runs that are each a label of their own (the casebook) is one column, a
    run in another place than most named so."""
    place = attrgetter("batch_size", "k", "temperature")
    labels = list(dict.fromkeys(r.label() for r in report.rows))
    if len(labels) == len(report.rows) and len({place(r) for r in report.rows}) > 1:
        most = Counter(r.column() for r in report.rows).most_common(1)[0][0]
        return [most], [(" · ".join([r.label(), *(p for p in r.column().split(" · ")
                                                  if p not in most.split(" · "))]), [i])
                        for i, r in enumerate(report.rows)]
    columns = {place(r): r.column() for r in sorted(report.rows, key=place)}
    runs = {(r.label(), *place(r)): i for i, r in enumerate(report.rows)}
    return list(columns.values()), [(label, [runs.get((label, *c)) for c in columns])
                                    for label in labels]


def heatmap_html(report: SweepReport, metric: str = "exact_pct",
                 selected: int | None = None) -> str:
    """Run labels (method · drafter · faults) × (batch size, k), each cell its run's `metric`; a
    click on a cell names its run in data-run."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}")
    heads, lines = _grid(report)
    # The caption sits above the scrolling box, not in the table: a table wider than its column
    # scrolls, and its caption would scroll (and be cut) with it.
    out = [f'<p class="sv-heat-caption">{html.escape(METRICS[metric])}; hover a cell for its '
           'verdicts, click it to open its run</p><div class="sv-heat-wrap"><table '
           f'class="sv-heat" data-metric="{metric}">',
           "<thead><tr><th></th>", *(f"<th>{html.escape(c)}</th>" for c in heads),
           "</tr></thead><tbody>"]
    for label, runs in lines:
        out.append(f'<tr><th class="sv-hlabel">{html.escape(label)}</th>')
        out += ["<td></td>" if run is None
                else _metric_cell(run, report.rows[run], metric, selected) for run in runs]
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


# ---------------------------------------------------------------- figures


def _outcome(s, row: RunRow) -> str:
    if s.equivalent is None:
        return "sampled: no token reference"
    # right tokens; a bug beside them is named: its log-probabilities', or its run's drafts'
    if s.equivalent:
        beside = (s.forensics.verdict if s.forensics and verdict(s.forensics.verdict).bug else
                  row.drafts_verdict and f"drafts {row.drafts_verdict}"
                  or row.rejections_verdict and f"decisions {row.rejections_verdict}")
        return f"{EQUIVALENT}, {beside}" if beside else EQUIVALENT
    return s.forensics.verdict if s.forensics else "divergent, no verdict"


def _outcome_colour(name: str, sync_bugs: list[str]) -> str:
    if name.startswith(f"{EQUIVALENT}, "):
        return BESIDE_RIGHT
    if state_bug(name):
        return SYNC_BUG_COLOURS[sync_bugs.index(name) % len(SYNC_BUG_COLOURS)]
    return OUTCOME_COLOURS.get(name, "#9d9d9d")


def verdict_bars(report: SweepReport) -> go.Figure:
    """Each run's sequences, stacked by outcome: equivalent, then each forensic verdict. One bar a
    run, laid sideways so that run names read across, however many runs there are."""
    counts = [Counter() for _ in report.rows]
    for s in report.sequences:
        counts[s.run][_outcome(s, report.rows[s.run])] += 1
    names = sorted(set().union(*counts), key=lambda n: (n != EQUIVALENT, n))
    sync_bugs = [n for n in names if state_bug(n)]
    runs = [html.escape(r.name()) for r in report.rows]
    data = [{"type": "bar", "orientation": "h", "name": html.escape(n), "y": runs,
             "x": [c[n] for c in counts], "marker": {"color": _outcome_colour(n, sync_bugs)},
             "hovertemplate": f"%{{y}}<br>{html.escape(n)}: %{{x}}<extra></extra>"}
            for n in names]
    return _figure(data, barmode="stack", title="outcome of every sequence, per run",
                   xaxis={"title": {"text": "sequences"}},
                   # every run named: plotly would skip some when dense
                   yaxis={"autorange": "reversed", "automargin": True, "tickmode": "array",
                          "tickvals": runs, "ticktext": runs},
                   height=160 + 22 * len(runs))


def _by_label(report: SweepReport) -> dict[str, list[int]]:
    """Run indices per row label, in first-seen order."""
    out: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(report.rows):
        out[r.label()].append(i)
    return out


def divergence_histogram(report: SweepReport) -> go.Figure:
    """Where divergent sequences first differ from the reference, one colour per row label:
    immediate collapse (index 0-2), gradual decay and late numerics flips read apart."""
    forks: dict[str, Counter] = defaultdict(Counter)
    for s in report.sequences:
        if s.equivalent is False:
            forks[report.rows[s.run].label()][s.first_divergence] += 1
    if not forks:
        return empty("No divergent sequences: every run equals the reference token for token.")
    data = []
    for c, label in enumerate(label for label in _by_label(report) if label in forks):
        at = sorted(forks[label])
        data.append({"type": "bar", "name": html.escape(label), "x": at,
                     "y": [forks[label][i] for i in at],
                     "marker": {"color": COLOURS[c % len(COLOURS)]},
                     "hovertemplate": f"{html.escape(label)}<br>token %{{x}}: %{{y}} "
                                      "sequences<extra></extra>"})
    return _figure(data, barmode="stack", title="where sequences first diverge",
                   xaxis={"title": {"text": "first divergent token index"}},
                   yaxis={"title": {"text": "sequences"}})


def accept_length_histogram(report: SweepReport) -> go.Figure:
    """The share of (round, row) records that accepted 0, 1, 2, … drafts, per row label over
    its columns."""
    data = []
    for c, (label, runs) in enumerate(_by_label(report).items()):
        lengths = [report.rows[i].accept_lengths for i in runs if report.rows[i].accept_lengths]
        total = sum(map(sum, lengths))
        if not total:
            continue
        summed = [sum(ls[j] for ls in lengths if j < len(ls))
                  for j in range(max(map(len, lengths)))]
        data.append({"type": "bar", "name": html.escape(label), "x": list(range(len(summed))),
                     "y": [n / total for n in summed],
                     "marker": {"color": COLOURS[c % len(COLOURS)]},
                     "hovertemplate": f"{html.escape(label)}<br>%{{x}} accepted: "
                                      "%{y:.1%}<extra></extra>"})
    if not data:
        return empty("No rounds recorded: no run here speculates, or its rounds were not recorded.")
    return _figure(data, barmode="group", title="drafts accepted per round and row",
                   xaxis={"title": {"text": "drafts accepted"}, "dtick": 1},
                   yaxis={"title": {"text": "share of (round, row) records"}, "tickformat": ".0%"})


def acceptance_curves(report: SweepReport) -> go.Figure:
    """Per run, the share of records offered a draft at each position that accepted it; one colour
    per row label."""
    data = []
    for c, (label, runs) in enumerate(_by_label(report).items()):
        first = True
        for i in runs:
            r = report.rows[i]
            if not any(r.offered):
                continue
            data.append({"type": "scatter", "mode": "lines+markers", "name": html.escape(label),
                         "legendgroup": html.escape(label),
                         "showlegend": first, "x": list(range(1, len(r.offered) + 1)),
                         "y": [a / o if o else None for a, o in zip(r.accepted, r.offered)],
                         "line": {"color": COLOURS[c % len(COLOURS)], "width": 1.5},
                         "hovertemplate": f"{html.escape(r.name())}<br>draft %{{x}}: %{{y:.0%}} "
                                          "accepted<extra></extra>"})
            first = False
    if not data:
        return empty("No drafts offered: no run here speculates, or its rounds were not recorded.")
    return _figure(data, title="acceptance by draft position",
                   xaxis={"title": {"text": "draft position"}, "dtick": 1},
                   yaxis={"title": {"text": "accepted / offered"}, "tickformat": ".0%",
                          "range": [0, 1.05]})


# ---------------------------------------------------------------- summary


def sweep_summary_md(report: SweepReport) -> str:
    """What was swept, in two Markdown lines."""
    sweep, base = report.sweep, report.sweep.base
    tokens = sum(len(s.output_ids) for s in report.sequences)
    greedy = [r for r in report.rows if r.exact_pct is not None]
    temperatures = [t for t in sweep.temperatures if t]
    sampled = (f", sampled at temperature {', '.join(f'{t:g}' for t in temperatures)}"
               if temperatures else "")
    equal = (f"; {sum(r.exact_pct == 100 for r in greedy)} of {len(greedy)} greedy runs equal the "
             "reference" if greedy else "")
    faults = ", ".join(md(",".join(f) or NO_FAULTS) for f in sweep.fault_sets)
    pairs = ", ".join(dict.fromkeys(f"{md(s.target)} / {md(s.draft)}" for s in sweep.specs()))
    return (f"**{sweep.size()} runs** of {pairs} on {len(base.prompts)} prompts, up to "
            f"{base.max_new_tokens} new tokens each, {base.dtype}{sampled}: {tokens} tokens "
            f"decoded{equal}.  \n"
            + ("the runs listed, not every combination of: " if sweep.runs else "")
            + f"methods {md(', '.join(sweep.methods))} · "
              f"drafters {md(', '.join(sweep.drafters))} · fault sets {faults} · "
              f"batch sizes {', '.join(map(str, sweep.batch_sizes))} · "
              f"k {', '.join(map(str, sweep.ks))} · "
              f"temperatures {', '.join(f'{t:g}' for t in sweep.temperatures)}")
