"""The page's Sweep tab (a table of runs: run it, or open a `specviz verify --json` report) and its
Compare tab (any two runs shown so far, token by token), their controls and their handlers. page.py
wires them.
"""
from __future__ import annotations

import hashlib

import gradio as gr

from specviz.app import serving, sidebyside, sweepviews, views
from specviz.app.controls import UPLOAD_HEIGHT
from specviz.app.form import by_name, filled
from specviz.run.settings import Settings
from specviz.spec.casebook import BASE_RUN, CASES
from specviz.spec.defaults import DEFAULT_PAIR, default_of
from specviz.spec.drafters import DRAFTERS
from specviz.spec.faults import FAULTS
from specviz.spec.faults import FAULT_PRESETS
from specviz.spec.methods import METHODS
from specviz.spec.prompts import DEFAULT_SET, builtin_sets
from specviz.spec.run import DTYPES, PAIR_PRESETS, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import share
from specviz.trace.schema import Trace
from specviz.trace.sweep import NO_FAULTS, Sweep, SweepReport, report, run_name

# The Sweep tab's controls, by name: RunSpec's defaults, but for the sweep's own lists and length.
SWEEP_DEFAULTS = {"pair": DEFAULT_PAIR, "prompt_set": DEFAULT_SET, "max_new_tokens": 32,
                  "dtype": default_of("dtype"), "methods": [default_of("method")],
                  "drafters": [default_of("drafter")],
                  "fault_sets": [NO_FAULTS, "bsp-like", "dsd-like"], "batch_sizes": [1, 4, 8],
                  "ks": [default_of("k")], "temperatures": [0]}
SWEEP_BATCH_SIZES = (1, 2, 3, 4, 8, 16, 32, 64)
SWEEP_KS = (1, 2, 3, 4, 5, 6, 8, 12, 16)
SWEEP_TEMPERATURES = (0, 0.3, 0.6, 0.8, 1, 1.5)


def sweep_from_controls(**controls) -> Sweep:
    """The sweep the Sweep tab's controls (SWEEP_DEFAULTS' names; those left out at their defaults)
    describe: each fault set is one fault or preset (or none)."""
    c = filled(SWEEP_DEFAULTS, controls)
    lists = {"methods": "a method", "drafters": "a drafter", "fault_sets": "a fault set",
             "batch_sizes": "a batch size", "ks": "a k", "temperatures": "a temperature"}
    if missing := [what for name, what in lists.items() if not c[name]]:
        raise SpecError("pick at least " + ", ".join(missing))
    target, draft = PAIR_PRESETS[c["pair"]]
    temperatures = tuple(sorted(float(t) for t in c["temperatures"]))
    base = RunSpec.build(target=target, draft=draft, prompts=tuple(builtin_sets()[c["prompt_set"]]),
                         max_new_tokens=int(c["max_new_tokens"]), dtype=c["dtype"],
                         temperature=temperatures[-1])
    return Sweep.build(base=base, methods=tuple(c["methods"]), drafters=tuple(c["drafters"]),
                       fault_sets=tuple(() if f == NO_FAULTS else (f,) for f in c["fault_sets"]),
                       batch_sizes=tuple(sorted(int(b) for b in c["batch_sizes"])),
                       ks=tuple(sorted(int(k) for k in c["ks"])), temperatures=temperatures)


def casebook_sweep() -> Sweep:
    """The field casebook as one listed sweep: every case's replica, in the casebook's order (each
    run's fields those of its case beyond the casebook's common run)."""
    return Sweep.listed(RunSpec.build(**BASE_RUN), [
        {name: value for name, value in case.spec_fields().items()
         if name not in BASE_RUN or BASE_RUN[name] != value}
        for case in CASES])


def _sweep_controls_of(sweep: Sweep) -> dict:
    """The Sweep tab's control values for `sweep` (a link's), by name; a control that cannot hold
    it (prompts not a built-in set, a fault set of several faults, a listed sweep's runs) is left
    out and keeps its value, and the sweep runs as the link says."""
    if sweep.runs:
        return {}
    b = sweep.base
    preset = next((name for name, ids in PAIR_PRESETS.items() if ids == (b.target, b.draft)), None)
    named = next((name for name, ps in builtin_sets().items() if tuple(ps) == b.prompts), None)
    values = {"pair": preset, "prompt_set": named, "max_new_tokens": b.max_new_tokens,
              "dtype": b.dtype, "methods": list(sweep.methods), "drafters": list(sweep.drafters),
              "fault_sets": [NO_FAULTS if not f else f[0] for f in sweep.fault_sets]
              if all(len(f) <= 1 for f in sweep.fault_sets) else None,
              "batch_sizes": list(sweep.batch_sizes), "ks": list(sweep.ks),
              "temperatures": list(sweep.temperatures)
              if set(sweep.temperatures) <= set(SWEEP_TEMPERATURES) else None}
    return {n: value for n, value in values.items() if value is not None}


class _RunOf:
    """_decode's progress for run i of n in a sweep: the whole sweep's fraction, and which run
    it is on."""

    def __init__(self, progress, i: int, n: int, label: str):
        self.progress, self.i, self.n, self.label = progress, i, n, label

    def __call__(self, fraction: float, desc: str = "") -> None:
        self.progress((self.i + fraction) / self.n,
                      desc=f"run {self.i + 1} of {self.n} ({self.label}): {desc}")


def _sweep_traces(sweep: Sweep, settings: Settings, progress, session: str) -> list[Trace]:
    """Every run of `sweep`, each through serving.served_trace (its cache, the bundle, else
    decoded): refused whole, before any work, when the server does not allow it."""
    specs = sweep.specs()
    settings.check_sweep(specs)
    return [serving.served_trace(spec, settings, _RunOf(progress, i, len(specs), run_name(spec)),
                                 session)[0]
            for i, spec in enumerate(specs)]


@by_name(SWEEP_DEFAULTS)
def run_sweep(settings: Settings, progress=gr.Progress(), request: gr.Request = None, **controls):
    """The Sweep tab's Run button (sweep_from_controls' controls): every run of the sweep, then
    its report."""
    with serving.as_page_errors():
        sweep = sweep_from_controls(**controls)
    return _run(settings, sweep, progress, request)


def run_casebook(settings: Settings, progress=gr.Progress(), request: gr.Request = None):
    """The Sweep tab's "Run the field casebook": every case's replica as one sweep (served
    from the bundle)."""
    return _run(settings, casebook_sweep(), progress, request)


def _run(settings: Settings, sweep: Sweep, progress, request: gr.Request | None):
    """Every run of `sweep`, then its report, the report to download, and no cell picked."""
    session = request.session_hash if request else ""
    with serving.as_page_errors(stopped="the runs finished so far stay cached, so running the "
                                        "sweep again resumes"):
        found = report(sweep, _sweep_traces(sweep, settings, progress, session))
    return found, _save_report(found), None


def open_report(path: str | None):
    """Upload: a `specviz verify --json` report, shown without running anything."""
    found = serving.uploaded(path, SweepReport.from_json)
    return found, _save_report(found), None


def _save_report(found: SweepReport) -> str:
    """The report as a file to download, named after its content's hash (as serving.save
    names traces)."""
    text = found.to_json()
    return serving.write_once(f"sweep-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json", text)


def render_sweep(settings: Settings, found: SweepReport | None, cell=None) -> dict:
    """Every view of the Sweep tab, and the sweep's share link (or, in the summary, why it has
    none), by name (SWEEP_VIEW_NAMES)."""
    if found is None:
        return dict.fromkeys(SWEEP_VIEW_NAMES, gr.skip())
    try:
        settings.check_sweep(found.sweep.specs())
        link = share.encode_sweep(found.sweep, None if cell is None else int(cell))
        note = ""
    except SpecError as e:
        link, note = "", (f"**No share link:** {views.md(str(e))}: a visitor's link could not "
                          "replay it here. "
                          "Share the report file instead (Download the report below).")
    selected = None if cell is None else int(cell)
    return {"summary": sweepviews.sweep_summary_md(found) + ("\n\n" + note if note else ""),
            "exact": sweepviews.heatmap_html(found, "exact_pct", selected),
            "prefix": sweepviews.heatmap_html(found, "prefix_pct", selected),
            "verdicts": sweepviews.verdict_bars(found),
            "divergence": sweepviews.divergence_histogram(found),
            "accept_lengths": sweepviews.accept_length_histogram(found),
            "acceptance": sweepviews.acceptance_curves(found), "link_query": link}


# render_sweep's views, in the order of the page's API outputs.
SWEEP_VIEW_NAMES = ("summary", "exact", "prefix", "verdicts", "divergence", "accept_lengths",
                    "acceptance", "link_query")


def open_cell(settings: Settings, found: SweepReport | None, evt: gr.EventData,
              progress=gr.Progress(), request: gr.Request = None):
    """A click on a heatmap cell: that run's trace in the run view, at its first divergence (decoded
    unless this process has it)."""
    data = evt._data or {}
    run = data.get("run")
    if found is None or not isinstance(run, int) or not 0 <= run < len(found.rows):
        raise gr.Error("that cell is not a run of this sweep")
    session = request.session_hash if request else ""
    with serving.as_page_errors("this run cannot be opened here: "):
        trace, timing = serving.served_trace(found.spec_of(run), settings, progress, session)
    where = f"run {run + 1} of the sweep: {found.rows[run].name()}"
    return (trace, serving.served_headline(trace, timing, f" ({where})"), serving.save(trace), None,
            gr.Tabs(selected="run"), run,
            # the Sweep tab's status: a decode's progress shows there too
            f"Opened {where} in the Run view.")


def outline_cell(found: SweepReport, cell: int):
    """The heatmaps with the opened run's cell outlined (the rest of the tab stays as it is)."""
    return tuple(sweepviews.heatmap_html(found, metric, cell)
                 for metric in ("exact_pct", "prefix_pct"))


def open_sweep_link(query: str) -> dict:
    """Page load, by name (SWEEP_DEFAULTS' controls, "pending", "status" and "tabs"): a sweep's link
    fills the Sweep tab and opens it, to be replayed; anything else leaves it be."""
    try:
        found = share.decode_sweep(query or "")
    except SpecError as e:
        return {"pending": None,
                "status": f"**That sweep link could not be used:** {views.md(str(e))}."}
    if found is None:
        return {"pending": None}
    sweep, cell = found
    pending = {"sweep": sweep.model_dump_json(), "cell": cell}
    return {**_sweep_controls_of(sweep), "pending": pending,
            "status": "Replaying the shared sweep…", "tabs": gr.Tabs(selected="sweep")}


def replay_sweep(settings: Settings, pending: dict | None, progress=gr.Progress(),
                 request: gr.Request = None):
    """Run a linked sweep, when this server allows it; otherwise say why and what to ask
    for instead."""
    if not pending:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    session = request.session_hash if request else ""
    with serving.as_page_errors("the shared sweep cannot be replayed here: ",
                                then=". Ask whoever shared it for its report file "
                                     "(the Sweep tab's download, or specviz verify --json) "
                                     "and open that instead"):
        sweep = Sweep.model_validate_json(pending["sweep"])
        found = report(sweep, _sweep_traces(sweep, settings, progress, session))
    return (found, _save_report(found), pending.get("cell"),
            "The shared sweep, replayed on this server.")


MAX_SIDES = 48  # runs a session keeps to compare (the oldest go first)


def remember_sides(sides: dict | None, *found) -> tuple:
    """Add the runs just shown (a trace, or a sweep report's runs) to the compare tab's pickers. A
    fresh pick goes to B, and A keeps the run before it, so the last two runs shown are compared (a
    sweep: its first run and its last)."""
    sides = dict(sides or {})
    new = []
    for f in found:
        if isinstance(f, Trace):
            new.append(sidebyside.side_of_trace(f))
        elif isinstance(f, SweepReport):
            new += [sidebyside.side_of_report(f, i) for i in range(len(f.rows))]
    for side in new:
        sides.pop(side.label, None)
        sides[side.label] = side
    while len(sides) > MAX_SIDES:
        sides.pop(next(iter(sides)))
    labels = list(sides)
    if not new:
        return sides, gr.skip(), gr.skip()
    # a sweep larger than MAX_SIDES keeps its last runs
    kept = [side.label for side in new if side.label in sides]
    a = kept[0] if len(kept) > 1 else labels[-2] if len(labels) > 1 else labels[-1]
    return sides, gr.update(choices=labels, value=a), gr.update(choices=labels, value=labels[-1])


def compare_runs(sides: dict | None, a: str | None, b: str | None, seq):
    """The compare tab: where runs A and B first part on sequence `seq`, their aligned tokens, and
    the link that opens this comparison ("" for an engine check, which no link replays)."""
    sides = sides or {}
    if a not in sides or b not in sides:
        return ("Pick two runs: every run this page has shown you (the run view's, a sweep's) is "
                "listed.", "", "")
    seq = int(seq or 0)
    return (sidebyside.compare_summary_md(sides[a], sides[b], seq),
            sidebyside.aligned_html(sides[a], sides[b], seq),
            sidebyside.link(sides[a], sides[b], seq))


def open_compare_link(query: str):
    """Page load: a compare link opens the Compare tab, its two runs to be replayed; anything else
    leaves it be."""
    try:
        found = share.decode_compare(query or "")
    except SpecError as e:
        return None, f"**That compare link could not be used:** {views.md(str(e))}.", gr.skip()
    if found is None:
        return None, gr.skip(), gr.skip()
    a, b, seq = found
    return ({"a": a.canonical_json(), "b": b.canonical_json(), "seq": seq or 0},
            "Replaying the two shared runs…", gr.Tabs(selected="compare"))


def replay_compare(settings: Settings, pending: dict | None, sides: dict | None,
                   progress=gr.Progress(), request: gr.Request = None):
    """Decode a compare link's two runs (each from the cache, the bundle, else decoded)
    and pick them."""
    if not pending:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    session = request.session_hash if request else ""
    with serving.as_page_errors("the shared runs cannot be replayed here: "):
        traces = [serving.served_trace(RunSpec.model_validate_json(pending[x]), settings, progress,
                                       session)[0] for x in "ab"]
    sides, _, _ = remember_sides(sides, *traces)
    labels = list(sides)
    a, b = (sidebyside.side_of_trace(t).label for t in traces)
    return (sides, gr.update(choices=labels, value=a), gr.update(choices=labels, value=b),
            pending["seq"])


# A sweep's heatmap cell: open its run.
CELL_CLICKS = """
element.addEventListener('click', (e) => {
  const c = e.target.closest('[data-run]');
  if (c) trigger('click', {run: Number(c.dataset.run)});
});
"""


def sweep_tab(settings: Settings) -> dict:
    """The Sweep tab's controls and views, by name (SWEEP_DEFAULTS, SWEEP_VIEW_NAMES
    and the rest)."""
    w = {"report": gr.State(None), "cell": gr.State(None), "pending": gr.State(None),
         "link_query": gr.Textbox(visible=False)}
    d = SWEEP_DEFAULTS
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            gr.Markdown("Every run of a table of methods × fault sets × batch sizes × k × "
                        "temperatures: greedy runs checked token by token against the batch-size-1 "
                        "reference, sampled ones by their distribution. Or open a `specviz verify "
                        "--json` report.")
            w["pair"] = gr.Dropdown(list(PAIR_PRESETS), value=d["pair"], label="model pair",
                                    elem_id="sv-sweep-pair")
            w["prompt_set"] = gr.Dropdown(list(builtin_sets()), value=d["prompt_set"],
                                          label="built-in prompts")
            with gr.Row():
                w["max_new_tokens"] = gr.Slider(1, settings.max_new_tokens,
                                                value=d["max_new_tokens"], step=1,
                                                label="max new tokens")
                w["dtype"] = gr.Dropdown(list(DTYPES), value=d["dtype"], label="dtype",
                                         elem_id="sv-sweep-dtype")
            w["methods"] = gr.CheckboxGroup(list(METHODS), value=d["methods"], label="methods",
                                            elem_id="sv-sweep-methods")
            w["drafters"] = gr.CheckboxGroup(list(DRAFTERS), value=d["drafters"], label="drafters")
            w["fault_sets"] = gr.CheckboxGroup(
                [NO_FAULTS, *FAULTS, *FAULT_PRESETS], value=d["fault_sets"],
                label="faults: one run for each (the methods that take faults)",
                elem_id="sv-sweep-faults")
            w["batch_sizes"] = gr.CheckboxGroup([b for b in SWEEP_BATCH_SIZES
                                                 if b <= settings.max_batch_size],
                                                value=d["batch_sizes"], label="batch sizes",
                                                elem_id="sv-sweep-bs")
            w["ks"] = gr.CheckboxGroup([k for k in SWEEP_KS if k <= settings.max_k], value=d["ks"],
                                       label="k (drafts a round)", elem_id="sv-sweep-k")
            w["temperatures"] = gr.CheckboxGroup(list(SWEEP_TEMPERATURES), value=d["temperatures"],
                                                 label="temperatures (0: greedy, judged token by "
                                                       "token; above 0: by the distribution)",
                                                 elem_id="sv-sweep-temperatures")
            with gr.Row():
                w["run"] = gr.Button("Run the sweep", variant="primary", elem_id="sv-sweep-run")
                w["stop"] = gr.Button("Stop", variant="stop")
            w["casebook"] = gr.Button(f"Run the field casebook ({len(CASES)} cases, one run each)",
                                      elem_id="sv-sweep-casebook")
            w["upload"] = gr.File(label="or open a report (specviz verify --json)",
                                  file_types=[".json"], type="filepath", elem_id="sv-sweep-upload",
                                  height=UPLOAD_HEIGHT)
            w["download"] = gr.DownloadButton("Download the report (JSON)", value=None,
                                              elem_id="sv-sweep-download")
        with gr.Column(scale=3, elem_id="sv-sweep-views"):
            w["status"] = gr.Markdown("", elem_id="sv-sweep-status", latex_delimiters=[])
            w["summary"] = gr.Markdown("Run a sweep or open a report.", elem_id="sv-sweep-summary",
                                       latex_delimiters=[])
            w["link_box"] = gr.Textbox(label="share link (replays this sweep)", interactive=False,
                                       lines=1, max_lines=1, buttons=["copy"],
                                       elem_id="sv-sweep-link")
            gr.Markdown("### Equivalence — sequences equal to the reference (click a cell to open "
                        "its run)")
            with gr.Row():
                w["exact"] = gr.HTML(js_on_load=CELL_CLICKS, elem_id="sv-sweep-exact")
                w["prefix"] = gr.HTML(js_on_load=CELL_CLICKS, elem_id="sv-sweep-prefix")
            with gr.Row():
                w["verdicts"] = gr.Plot(show_label=False, elem_id="sv-sweep-verdicts")
                w["divergence"] = gr.Plot(show_label=False, elem_id="sv-sweep-divergence")
            with gr.Row():
                w["accept_lengths"] = gr.Plot(show_label=False, elem_id="sv-sweep-accept")
                w["acceptance"] = gr.Plot(show_label=False, elem_id="sv-sweep-acceptance")
    return w


def compare_tab() -> dict:
    p = {}
    gr.Markdown("Two runs of the same prompts, token by token under the reference's: a bar where a "
                "round starts, pink where a run departs from the reference, red at the first token "
                "where the two runs part. The pickers list every run this page has shown you (the "
                "run view's and a sweep's).")
    with gr.Row():
        p["a"] = gr.Dropdown([], label="run A", elem_id="sv-compare-a")
        p["b"] = gr.Dropdown([], label="run B", elem_id="sv-compare-b")
        p["seq"] = gr.Number(value=0, precision=0, minimum=0, label="sequence",
                             elem_id="sv-compare-seq")
    p["summary"] = gr.Markdown("Pick two runs.", elem_id="sv-compare-summary", latex_delimiters=[])
    p["aligned"] = gr.HTML(elem_id="sv-compare-aligned", js_on_load=None)
    p["link_box"] = gr.Textbox(label="share link (opens these two runs here, at this sequence)",
                               interactive=False, lines=1, max_lines=1, elem_id="sv-compare-link",
                               buttons=["copy"])
    p["link_query"], p["pending"] = gr.Textbox(visible=False), gr.State(None)
    return p
