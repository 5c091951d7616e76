"""The Gradio page: its layout and its wiring. The Run view's handlers are runview.py's, the Sweep
and Compare tabs sweeptab.py's; every decode, shrink and engine check goes through serving.py.
Gradio is imported by these modules only, and they read traces only.

One focus (a sequence and one of its rounds) links every view; clicks on the
grid, the timeline or the table move it. The page URL always carries the run
spec and the focus (trace/share.py); opening such a link replays the run.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import gradio as gr

from specviz.app import gallery, serving, summary, sweeptab
from specviz.app.controls import engine_controls, run_controls_of
from specviz.app.form import DEFAULTS, ENGINE_DEFAULTS, INPUTS
from specviz.app.glossary import glossary as glossary_text
from specviz.app.pagetext import CLICKS, FULL_URL, GRID_HELP, LEGEND, PAGE_INTRO, UPDATE_URL
from specviz.app.runview import (EXAMPLES, VIEW_NAMES, check_engine, drafter_shows,
                                 engine_head_shows, method_allows, open_link, open_trace, pick,
                                 pick_row, render, render_replayed, replay, run_controls,
                                 shrink_focused)
from specviz.run.settings import Settings
from specviz.spec.drafters import DRAFTER_OPTIONS
from specviz.trace.schema import MAX_TRACE_BYTES


def example_api_name(name: str) -> str:
    """An example's API name: its first word ("bsp-like decay": example_bsp_like; "sampling fault:
    …": example_sampling)."""
    return "example_" + re.sub(r"\W+", "_", name.split()[0]).strip("_")


def build(settings: Settings | None = None) -> gr.Blocks:
    """The page, under `settings` (default: the operator's SPECVIZ_* environment)."""
    settings = settings or Settings.from_env()
    with gr.Blocks(title="specviz") as demo:
        page = Page(demo, settings, trace=gr.State(None), pending=gr.State(None),
                    # sides: the runs shown so far, for the compare tab (label -> Side)
                    sides=gr.State({}))
        gr.Markdown(PAGE_INTRO)
        with gr.Tabs(elem_id="sv-tabs") as page.tabs:
            with gr.Tab("Run view", id="run"), gr.Row():
                with gr.Column(scale=1, min_width=300):
                    page.c, page.e, page.buttons = _run_controls_column(settings)
                with gr.Column(scale=3, elem_id="sv-views"):
                    page.v = _views_column()
            with gr.Tab("Field cases", id="cases", elem_id="sv-cases-tab"):
                gr.Markdown(gallery.CASEBOOK_INTRO)
                page.cards = gr.HTML(gallery.cards_html(), js_on_load=gallery.CARD_CLICKS,
                                     elem_id="sv-cases")
            with gr.Tab("Sweep", id="sweep", elem_id="sv-sweep-tab"):
                page.w = sweeptab.sweep_tab(settings)
            with gr.Tab("Compare two runs", id="compare", elem_id="sv-compare-tab"):
                page.p = sweeptab.compare_tab()
        page.v["link_query"] = gr.Textbox(visible=False)
        page.wire_run_view()
        page.wire_gallery()
        page.wire_sweep_tab()
        page.wire_compare_tab()
    return demo


def _run_controls_column(settings: Settings) -> tuple[dict, dict, dict]:
    """The Run view's left column: the run's controls, the engine check's, and their buttons."""
    buttons = {}
    with gr.Tabs():
        with gr.Tab("Run a method"):
            c = run_controls_of(settings)
            with gr.Row():
                buttons["run"] = gr.Button("Run", variant="primary")
                buttons["stop"] = gr.Button("Stop", variant="stop")
            gr.Markdown("**Examples**")
            buttons["examples"] = {name: gr.Button(name, size="sm") for name in EXAMPLES}
        with gr.Tab("Check an engine", elem_id="sv-check-tab"):
            e = engine_controls(settings)
            buttons["check"] = gr.Button("Check", variant="primary")
    with gr.Accordion("Limits on this server", open=False):
        gr.Markdown(settings.describe())
    with gr.Accordion("Trace files", open=False):
        buttons["download"] = gr.DownloadButton("Download this trace (JSON)", value=None)
        buttons["upload"] = gr.File(label="open a trace (JSON, up to "
                                          f"{MAX_TRACE_BYTES // 2**20} MiB; no model needed)",
                                    file_types=[".json"], type="filepath", elem_id="sv-upload")
    return c, e, buttons


def _views_column() -> dict:
    """The Run view's views, by the names runview.VIEW_NAMES gives render's outputs, and the status
    around them."""
    v = {}
    # Stranger text reaches the status escaped (views.md); no $$ in it may become LaTeX either.
    v["status"] = gr.Markdown("Run something, pick an example, or open a trace file.",
                              elem_id="sv-status", latex_delimiters=[])
    v["link_box"] = gr.Textbox(label="share link (opens this run at this focus)", interactive=False,
                               lines=1, max_lines=1, buttons=["copy"], elem_id="sv-link")
    v["table"] = gr.Dataframe(label="sequences (click one to focus it)", interactive=False,
                              wrap=True, max_height=320,
                              elem_id="sv-table", datatype="str")  # cells as plain text
    with gr.Row():
        v["focus_seq"] = gr.Number(label="focused sequence", precision=0, minimum=0)
        v["focus_round"] = gr.Number(label="focused round", precision=0, minimum=0)
        v["focus_note"] = gr.Markdown()
    gr.Markdown(GRID_HELP)
    with gr.Row():
        v["grid"] = gr.HTML(js_on_load=CLICKS, elem_id="sv-grid", padding=False)
        with gr.Column():
            v["forensics"] = gr.HTML(elem_id="sv-forensics", js_on_load=None)
            with gr.Accordion("The yardstick: where this fork falls on it", open=True,
                              elem_id="sv-yardstick-box"):
                v["yardstick"] = gr.Plot(show_label=False, elem_id="sv-yardstick")
            v["shrink"] = gr.Button("Shrink the focused divergence to a minimal reproducer",
                                    size="sm")
            v["shrink_note"] = gr.Markdown(elem_id="sv-shrink")
    with gr.Accordion("Distribution (sampled runs): are the tokens drawn from the target's "
                      "distribution?", open=True,
                      elem_id="sv-distribution"):
        v["pit_verdict"] = gr.Markdown(summary.distribution_md(None), elem_id="sv-pit-verdict",
                                       latex_delimiters=[])
        v["pit"] = gr.Plot(show_label=False, elem_id="sv-pit")
    gr.Markdown("### Token timeline of the focused sequence (click a round)")
    gr.HTML(LEGEND, js_on_load=None)
    v["timeline"] = gr.HTML(js_on_load=CLICKS, elem_id="sv-timeline")
    gr.Markdown("### Reference and speculative text")
    v["compare"] = gr.HTML(elem_id="sv-compare", js_on_load=None)
    with gr.Tabs(elem_id="sv-view-tabs") as v["view_tabs"]:
        with gr.Tab("KV and padding lanes"):
            v["lanes"] = gr.Plot(show_label=False, elem_id="sv-lanes")
        with gr.Tab("Phase timings"):
            v["phases"] = gr.Plot(show_label=False)
        with gr.Tab("Drafts per slot", id="drafts"):
            v["drafts"] = gr.Plot(show_label=False, elem_id="sv-drafts")
        with gr.Tab("Glossary"):
            v["glossary"] = gr.Markdown(glossary_text(None))
    return v


@dataclass
class Page:
    """The page's components, and the wiring between them."""

    demo: gr.Blocks
    settings: Settings
    trace: gr.State
    pending: gr.State
    sides: gr.State
    tabs: gr.Tabs = None
    c: dict = None  # the run's controls
    e: dict = None  # the engine check's controls
    buttons: dict = None
    v: dict = None  # the Run view's views
    cards: gr.HTML = None  # the Field cases tab's
    w: dict = None  # the Sweep tab
    p: dict = None  # the Compare tab

    @property
    def shown(self) -> list:
        return self.parts(*VIEW_NAMES)

    @property
    def named(self) -> dict:
        """The components a handler's result may name: the run's controls, the Run view's views
        (and its status and tabs), the trace, its download, a link's pending replay
        and the page's tabs."""
        return {**self.c, **self.v, "trace": self.trace, "download": self.buttons["download"],
                "pending": self.pending, "tabs": self.tabs}

    def parts(self, *names: str) -> list:
        """The components `names` name (self.named's), as a handler's inputs or outputs."""
        return [self.named[n] for n in names]

    def keyed(self, fn, named: dict | None = None):
        """`fn`, whose result is keyed by name (`named`'s, else self.named's), as Gradio's handler:
        keyed by component. Gradio reads the handler's parameters (an EventData among them)
        through functools.wraps."""
        named = named or self.named

        @functools.wraps(fn)
        def handler(*args, **kwargs):
            return {named[n]: value for n, value in fn(*args, **kwargs).items()}
        return handler

    @property
    def opened(self) -> list:
        """What a handler that opens a trace sets: the trace, the status, the download and a link's
        pending replay."""
        return [self.trace, self.v["status"], self.buttons["download"], self.pending]

    def show_link(self, event):
        return event.then(None, [self.v["link_query"]], [self.v["link_box"]], js=UPDATE_URL,
                          api_visibility="private")

    def then_show(self, event, fn=render, inputs=None):
        """After `event` opens a trace: every view, the link, and the trace offered
        to the compare tab."""
        shown_run = event.success(self.keyed(fn), inputs or [self.trace], self.shown,
                                  api_visibility="private")
        self.show_link(shown_run)
        shown_run.then(sweeptab.remember_sides, [self.sides, self.trace],
                       [self.sides, self.p["a"], self.p["b"]], api_visibility="private")
        return shown_run

    def wire_run_view(self) -> None:
        c, b, settings = self.c, self.buttons, self.settings
        controls = self.parts(*DEFAULTS)
        run_inputs = {n: c[n] for n in INPUTS}  # by name: the API's parameters bear their names
        run_here = functools.partial(run_controls, settings)
        running = [b["run"].click(run_here, None, self.opened, inputs_kwargs=run_inputs,
                                  api_name="run", concurrency_id="decode")]
        for name, btn in b["examples"].items():
            values = {c[n]: value for n, value in {**DEFAULTS, **EXAMPLES[name]}.items()}
            filled = btn.click(lambda v=values: v, None, controls, api_name=example_api_name(name))
            # The drafter's controls follow before the decode starts (its change event, unqueued,
            # waits on a busy CPU).
            shown = filled.then(drafter_shows, [c["drafter"]],
                                [c["drafter"], *(c[f] for f in DRAFTER_OPTIONS)],
                                api_visibility="private", show_progress="hidden")
            running.append(shown.then(run_here, None, self.opened, inputs_kwargs=run_inputs,
                                      api_visibility="private", concurrency_id="decode"))
        running.append(b["check"].click(functools.partial(check_engine, settings), None,
                                        self.opened,
                                        inputs_kwargs={n: self.e[n] for n in ENGINE_DEFAULTS},
                                        api_name="check_engine", concurrency_id="decode"))
        for event in running:
            self.then_show(event)
        running.append(self.v["shrink"].click(functools.partial(shrink_focused, settings),
                                              [self.trace, self.v["focus_seq"]],
                                              [self.v["shrink_note"]], api_name="shrink",
                                              concurrency_id="decode"))
        b["stop"].click(serving.stop, None, None, cancels=running, api_name="stop")
        self.then_show(b["upload"].upload(open_trace, [b["upload"]], self.opened,
                                          api_name="open_trace"))
        self._wire_focus()
        c["method"].change(method_allows, [c["method"], c["drafter"]],
                           [c["method"], c["faults"], c["drafter"], c["k"]],
                           api_visibility="private", queue=False, show_progress="hidden")
        self.e["engine_drafter"].change(engine_head_shows, [self.e["engine_drafter"]],
                                        [self.e["engine_head"]], api_visibility="private",
                                        queue=False, show_progress="hidden")
        c["drafter"].change(drafter_shows, [c["drafter"]],
                            [c["drafter"], *(c[f] for f in DRAFTER_OPTIONS)],
                            api_visibility="private", queue=False, show_progress="hidden")
        loaded = self.demo.load(self.keyed(open_link), [self.v["link_query"]],
                                self.parts(*DEFAULTS, "trace", "download", "pending", "status"),
                                js="() => location.search", api_name="open_link")
        # the first page's bundled trace (a link's run is shown once replayed)
        self.then_show(loaded)
        replayed = loaded.then(functools.partial(replay, settings), [self.pending], self.opened,
                               api_visibility="private", concurrency_id="decode")
        self.then_show(replayed, fn=render_replayed, inputs=[self.trace, self.pending])

    def wire_gallery(self) -> None:
        """A card's button opens its case's bundled run in the Run view."""
        c = self.c
        opened = self.cards.click(self.keyed(gallery.open_case), None,
                                  self.parts(*DEFAULTS, "trace", "status", "download", "pending",
                                             "tabs", "view_tabs"), api_name="open_case")
        opened.then(drafter_shows, [c["drafter"]], [c["drafter"], *(c[f] for f in DRAFTER_OPTIONS)],
                    api_visibility="private", show_progress="hidden")
        self.then_show(opened)

    def _wire_focus(self) -> None:
        """Clicks on the grid, the timeline and the table, and the focus boxes, move the focus."""
        v = self.v
        picked, shown = self.keyed(pick), self.shown
        self.show_link(v["grid"].click(picked, [self.trace], shown, api_name="pick_cell"))
        self.show_link(v["timeline"].click(picked, [self.trace], shown, api_name="pick_round"))
        self.show_link(v["table"].select(self.keyed(pick_row), [self.trace, v["table"]], shown,
                                         api_name="pick_sequence"))
        for name in ("seq", "round"):
            focus = [self.trace, v["focus_seq"], v["focus_round"]]
            self.show_link(v[f"focus_{name}"].submit(self.keyed(render), focus, shown,
                                                     api_name=f"focus_{name}"))

    def then_show_sweep(self, event) -> None:
        w = self.w
        rendered = self.keyed(functools.partial(sweeptab.render_sweep, self.settings), w)
        shown_sweep = event.success(rendered, [w["report"], w["cell"]],
                                    [w[n] for n in sweeptab.SWEEP_VIEW_NAMES],
                                    api_visibility="private")
        shown_sweep.then(None, [w["link_query"]], [w["link_box"]], js=UPDATE_URL,
                         api_visibility="private")
        shown_sweep.then(sweeptab.remember_sides, [self.sides, w["report"]],
                         [self.sides, self.p["a"], self.p["b"]], api_visibility="private")

    def wire_sweep_tab(self) -> None:
        """Run or open a report, show it, click a cell into the Run view."""
        w, settings = self.w, self.settings
        sweep_controls = {n: w[n] for n in sweeptab.SWEEP_DEFAULTS}
        found_out = [w["report"], w["download"], w["cell"]]
        swept = [w["run"].click(functools.partial(sweeptab.run_sweep, settings), None, found_out,
                                inputs_kwargs=sweep_controls, api_name="sweep",
                                concurrency_id="decode"),
                 w["casebook"].click(functools.partial(sweeptab.run_casebook, settings), None,
                                     found_out, api_name="sweep_casebook", concurrency_id="decode")]
        for event in swept:
            self.then_show_sweep(event)
        w["stop"].click(serving.stop, None, None, cancels=swept, api_visibility="private")
        self.then_show_sweep(w["upload"].upload(sweeptab.open_report, [w["upload"]], found_out,
                                                api_name="open_report"))

        def open_cell_here(found, evt: gr.EventData, progress=gr.Progress(),
                           request: gr.Request = None):
            # gradio finds EventData in no partial
            return sweeptab.open_cell(settings, found, evt, progress, request)

        for heatmap in (w["exact"], w["prefix"]):
            exact = heatmap is w["exact"]
            opened_cell = heatmap.click(open_cell_here, [w["report"]],
                                        [*self.opened, self.tabs, w["cell"], w["status"]],
                                        api_name="open_cell" if exact else None,
                                        api_visibility="public" if exact else "private",
                                        concurrency_id="decode")
            self.then_show(opened_cell)
            opened_cell.success(sweeptab.outline_cell, [w["report"], w["cell"]],
                                [w["exact"], w["prefix"]], api_visibility="private")
        opened_link = self.keyed(sweeptab.open_sweep_link, {**w, "tabs": self.tabs})
        sweep_loaded = self.demo.load(opened_link, [w["link_query"]],
                                      [*sweep_controls.values(), w["pending"], w["status"],
                                       self.tabs],
                                      js="() => location.search", api_name="open_sweep_link")
        self.then_show_sweep(sweep_loaded.then(functools.partial(sweeptab.replay_sweep, settings),
                                               [w["pending"]], [*found_out, w["status"]],
                                               api_visibility="private", concurrency_id="decode"))

    def wire_compare_tab(self) -> None:
        """Any two runs shown so far, side by side, and their link; a compare link replays its two
        runs here."""
        p = self.p
        compared = sweeptab.compare_runs  # on a pick, and once a link's runs are replayed
        inputs, shown = ([self.sides, p["a"], p["b"], p["seq"]],
                         [p["summary"], p["aligned"], p["link_query"]])

        def show_link(event) -> None:
            event.then(None, [p["link_query"]], [p["link_box"]], js=FULL_URL,
                       api_visibility="private")

        for picker in (p["a"], p["b"], p["seq"]):
            show_link(picker.change(compared, inputs, shown, api_visibility="private",
                                    show_progress="hidden"))
        loaded = self.demo.load(sweeptab.open_compare_link, [p["link_query"]],
                                [p["pending"], p["summary"], self.tabs],
                                js="() => location.search", api_name="open_compare_link")
        replayed = loaded.then(functools.partial(sweeptab.replay_compare, self.settings),
                               [p["pending"], self.sides], [self.sides, p["a"], p["b"], p["seq"]],
                               api_visibility="private", concurrency_id="decode")
        show_link(replayed.success(compared, inputs, shown, api_visibility="private"))


def serve(settings: Settings | None = None, **launch_kwargs) -> gr.Blocks:
    """Build the page and serve it: one decode at a time, a bounded queue, uploads capped, the
    page's CSS."""
    settings = settings or Settings.from_env()
    demo = build(settings)
    demo.queue(default_concurrency_limit=1, max_size=settings.queue_size)
    demo.launch(css_paths=[serving.ASSETS / "specviz.css"], max_file_size=MAX_TRACE_BYTES,
                **launch_kwargs)
    return demo
