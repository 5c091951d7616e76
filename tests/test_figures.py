"""Every figure of the page, built as plotly would validate it: the page builds them without
validation (for speed), so a property plotly refuses would vanish there without a word. Here
`plots.figure` validates, and each figure function runs on the bundled traces, a run with prompt
lookup, a sampled run, an engine check and a sweep report."""
import inspect
from pathlib import Path

import plotly.graph_objects as go
import pytest

from specviz.app import plots, sweepviews, views
from specviz.cli import main as cli
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.trace.schema import Trace
from specviz.trace.sweep import SweepReport

BUNDLED = sorted((Path(__file__).resolve().parent.parent / "assets" / "traces").glob("*.json"))


@pytest.fixture(autouse=True)
def validating(monkeypatch):
    monkeypatch.setattr(plots, "figure", lambda data, layout: go.Figure(data=data, layout=layout))


def _tiny(**kw) -> Trace:
    return run(RunSpec.build(**{**dict(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float64",
                                       device="cpu", prompts=tuple(builtin_set("quick")),
                                       batch_size=3, k=3, max_new_tokens=12), **kw}))


@pytest.fixture(scope="module")
def traces(tiny, tmp_path_factory) -> dict[str, Trace]:
    out = {p.stem: Trace.from_json(p.read_text()) for p in BUNDLED}
    out["lookup"] = _tiny(drafter="lookup", ngram_min=1)
    out["sampled"] = _tiny(temperature=0.8, seed=3)
    out["one short"] = _tiny(faults=("accept-count-one-short",))
    check = tmp_path_factory.mktemp("check") / "check.json"
    assert cli.main(["check", "--pair", "tiny", "--dtype", "float32", "--device", "cpu",
                     "--prompt-set", "quick", "--max-new-tokens", "12", "--trace", str(check),
                     "--engine", "test_check:bsp_like",
                     "--control-engine", "test_check:no_speculation"]) == 0
    out["check"] = Trace.from_json(check.read_text())
    return out


@pytest.fixture(scope="module")
def report(tiny, tmp_path_factory) -> SweepReport:
    path = tmp_path_factory.mktemp("sweep") / "sweep.json"
    assert cli.main(["verify", "--pair", "tiny", "--dtype", "float64", "--device", "cpu",
                     "--prompt-set", "quick", "--max-new-tokens", "12", "--k", "3", "--methods",
                     "eqspec", "--fault-sets", "none", "bsp-like",
                     "--batch-sizes", "1,3", "--temperatures", "0,0.8", "--json", str(path),
                     "--allow-divergence"]) == 0
    return SweepReport.from_json(path.read_bytes())


TRACE_FIGURES = {
    "kv_lanes": lambda t: plots.kv_lanes(t, views.resolve(t)[0]),
    "phase_timings": plots.phase_timings,
    "draft_slots": plots.draft_slots,
    "pit_histograms": plots.pit_histograms,
    "yardstick": lambda t: plots.yardstick(t, views.resolve(t)[0]),
    "pit_figure": lambda t: plots.pit_figure(t.distribution) if t.distribution
    else plots.empty("greedy"),
    "empty": lambda t: plots.empty(f"{t.manifest.spec.method}: nothing to show"),
}
REPORT_FIGURES = {name: getattr(sweepviews, name)
                  for name in ("verdict_bars", "divergence_histogram", "accept_length_histogram",
                               "acceptance_curves")}


def test_every_figure_function_of_the_page_is_built_here():
    returns_figure = {f"{module.__name__}.{name}" for module in (plots, sweepviews)
                      for name, fn in inspect.getmembers(module, inspect.isfunction)
                      if fn.__module__ == module.__name__
                      and fn.__annotations__.get("return") == "go.Figure"
                      and not name.startswith("_") and name != "figure"}
    assert returns_figure == {*(f"specviz.app.plots.{n}" for n in TRACE_FIGURES),
                              *(f"specviz.app.sweepviews.{n}" for n in REPORT_FIGURES)}


@pytest.mark.parametrize("name", TRACE_FIGURES)
def test_each_trace_figure_holds_only_properties_plotly_accepts(name, traces):
    for label, trace in traces.items():
        # validating: a refused property raises
        assert isinstance(TRACE_FIGURES[name](trace), go.Figure), label


@pytest.mark.parametrize("name", REPORT_FIGURES)
def test_each_sweep_figure_holds_only_properties_plotly_accepts(name, report):
    assert isinstance(REPORT_FIGURES[name](report), go.Figure)


def test_the_lanes_stack_without_overlapping_whatever_their_number(traces):
    """Six lanes (a draft model) and five (prompt lookup keeps no draft cache): each y axis in its
    own band of the figure, top to bottom, and each lane's title at the top of its own band."""
    for label, n in (("bsp-like-decay", 6), ("lookup", 5)):
        trace = traces[label]
        fig = plots.kv_lanes(trace, views.resolve(trace)[0])
        domains = [fig.layout[f"yaxis{i + 1 if i else ''}"].domain for i in range(n)]
        assert all(0 <= lo < hi <= 1 for lo, hi in domains), domains
        assert all(below[1] < above[0] for above, below in zip(domains, domains[1:])), domains
        assert [a.y for a in fig.layout.annotations] == [hi for _, hi in domains]


def test_a_paged_runs_lanes_end_with_the_focused_rows_block_map(traces):
    """The prefix-cache case: the forked row's block table over the rounds, the blocks it shares
    with the prefix cache marked, and the fork's slot crossed in its own table entry."""
    trace = traces["case-lookahead-into-shared-block"]
    focus = views.resolve(trace)[0]
    fig = plots.kv_lanes(trace, focus)
    heatmap, fork = fig.data[-2:]
    assert heatmap.type == "heatmap" and fork.name == "the fork's slot"
    assert any("(shared)" in cell for column in heatmap.text for cell in column)
    s, size = trace.sequences[focus.seq], trace.manifest.paging.block_size
    assert list(fork.y) == [(len(trace.prompts[s.seq].ids) + s.forensics.fork) // size]
    assert fig.layout.annotations[-1].text.startswith(f"seq {focus.seq}'s block table")
    # a contiguous run has no such lane
    assert all(t.type != "heatmap" for t in plots.kv_lanes(traces["lookup"], focus).data)


def test_the_drafts_figure_sets_a_heads_drafts_beside_the_heads_own(traces):
    """Whose own proposals the run's drafts are set beside: the drafter's, a head's here."""
    fig = plots.draft_slots(traces["case-head-aux-one-early"])
    assert {t.name for t in fig.data} == {"the run's drafts", "an EAGLE-3 head's own"}
    assert "draft-bug:features" in fig.layout.title.text


def test_the_drafts_figure_shows_acceptance_by_context_length_and_the_decisions(traces):
    """A windowed drafter run as full attention (its bundled case): the drafts per slot, and beside
    them per band of context length, the run's beside the draft model's own; a run that refused
    drafts the target chose names its decisions in the title."""
    window = plots.draft_slots(traces["case-draft-window-as-full"])
    beside = [t for t in window.data if t.xaxis == "x2"]
    bands = traces["case-draft-window-as-full"].acceptance.by_context
    assert len(beside) == 2 and list(beside[0].x) == [f"{b.start}–{b.end - 1}" for b in bands]
    assert list(beside[0].y) == [b.accepted / b.offered for b in bands]
    assert "draft-bug:window" in window.layout.title.text
    short = plots.draft_slots(traces["one short"])
    assert "decisions decision-bug:reject" in short.layout.title.text
