"""The page's Sweep and Compare tabs, through their handlers: a sweep run on the tiny pair, its
share link, the server's limit on sweeps, a click into the run view, and two runs compared token
by token."""
import json

import gradio as gr
import pytest

from specviz.app import runview as ui
from specviz.app import sidebyside, sweeptab
from specviz.run.settings import Settings
from specviz.spec.run import RunSpec
from specviz.trace import share
from specviz.trace.sweep import Sweep

# eqspec with no fault and with bsp-like, at batch sizes 1 and 4, k 5, on the tiny pair's
# quick prompts.
CONTROLS = {"pair": "tiny", "prompt_set": "quick", "max_new_tokens": 16, "dtype": "float32",
            "methods": ["eqspec"], "drafters": ["model"], "fault_sets": ["none", "bsp-like"],
            "batch_sizes": [1, 4], "ks": [5], "temperatures": [0]}


class Click:
    """What a click on a heatmap cell sends (CELL_CLICKS)."""

    def __init__(self, run):
        self._data = {"run": run}


@pytest.fixture(scope="module")
def swept():
    found, download, cell = sweeptab.run_sweep(Settings(), **CONTROLS)
    return found, download, cell


def test_a_sweep_runs_each_configuration_and_its_link_replays_it(swept):
    found, download, cell = swept
    # the report, ready to download
    assert cell is None and open(download).read() == found.to_json()
    assert [(r.label(), r.batch_size, r.exact_pct) for r in found.rows] == [
        ("eqspec", 1, 100.0), ("eqspec", 4, 100.0),
        ("eqspec · bsp-like", 1, found.rows[2].exact_pct),
        ("eqspec · bsp-like", 4, found.rows[3].exact_pct)]
    assert found.rows[3].exact_pct < 100 and found.rows[3].verdicts
    views = sweeptab.render_sweep(Settings(), found, 3)
    assert (views["exact"].count('class="sv-hcell') == 4
            and 'class="sv-hcell sv-sel" data-run="3"' in views["exact"])
    assert "4 runs" in views["summary"] and "No share link" not in views["summary"]
    sweep, cell = share.decode_sweep(views["link_query"])
    assert sweep == found.sweep and cell == 3
    # Opening the link fills the tab's controls and opens it; the replay serves the runs from this
    # process's cache.
    opened = sweeptab.open_sweep_link(views["link_query"])
    pending, status, tabs = opened["pending"], opened["status"], opened["tabs"]
    assert {n: opened[n] for n in sweeptab.SWEEP_DEFAULTS} == CONTROLS
    assert status == "Replaying the shared sweep…" and tabs.selected == "sweep"
    replayed, _, cell, said = sweeptab.replay_sweep(Settings(), pending)
    assert replayed.to_json() == found.to_json() and cell == 3 and "replayed" in said


def test_a_sweep_over_the_servers_limit_is_refused_and_its_report_offered_instead(swept):
    found, _, _ = swept
    small = Settings(max_sweep_runs=3)
    with pytest.raises(gr.Error,
                       match="4 runs, over this server's limit of 3 \\(SPECVIZ_MAX_SWEEP_RUNS\\)"):
        sweeptab.run_sweep(small, **CONTROLS)
    views = sweeptab.render_sweep(small, found)
    assert views["link_query"] == "" and "No share link" in views["summary"]
    assert "report file" in views["summary"]
    pending = {"sweep": found.sweep.model_dump_json(), "cell": None}
    with pytest.raises(gr.Error, match="report file"):
        sweeptab.replay_sweep(small, pending)
    # A run the server refuses (a batch size over its limit) refuses the whole sweep before
    # any work.
    with pytest.raises(gr.Error, match="batch size 4 is over this server's limit of 2"):
        sweeptab.run_sweep(Settings(max_batch_size=2), **CONTROLS)


def test_bad_sweep_links_and_controls_get_a_message(swept):
    opened = sweeptab.open_sweep_link("?sweep=@@@@")
    assert (opened["pending"] is None and "could not be used" in opened["status"]
            and "damaged" in opened["status"])
    good = share.encode_sweep(swept[0].sweep)
    opened = sweeptab.open_sweep_link(good[:60])
    assert opened["pending"] is None and "could not be used" in opened["status"]
    opened = sweeptab.open_sweep_link("?run=abc")  # a run's link: not the Sweep tab's business
    assert opened["pending"] is None and "tabs" not in opened  # the tabs left out: as they were
    with pytest.raises(gr.Error, match="pick at least a batch size"):
        sweeptab.run_sweep(Settings(), **{**CONTROLS, "batch_sizes": []})
    with pytest.raises(gr.Error, match="pick at least a temperature"):
        sweeptab.run_sweep(Settings(), **{**CONTROLS, "temperatures": []})


def test_a_temperature_axis_runs_sampled_cells_beside_greedy_ones_and_its_link_keeps_it():
    controls = {**CONTROLS, "fault_sets": ["none", "accept-q-over-p"], "batch_sizes": [4],
                "temperatures": [0, 0.8]}
    found, _, _ = sweeptab.run_sweep(Settings(), **controls)
    assert ([(r.faults, r.temperature) for r in found.rows]
            == [("", 0), ("", 0.8), ("accept-q-over-p", 0.8)])
    assert found.rows[2].sampled_verdict == "sampler-bug:decisions"
    views = sweeptab.render_sweep(Settings(), found)
    assert "bs 4 · k 5 · T 0.8" in views["exact"] and "✗" in views["exact"]
    assert "temperatures 0, 0.8" in views["summary"]
    opened = sweeptab.open_sweep_link(views["link_query"])
    pending = opened["pending"]
    assert (opened["temperatures"] == [0, 0.8]
            and Sweep.model_validate_json(pending["sweep"]) == found.sweep)
    # A link made before the axis carries none: every run samples at its base's temperature, as it
    # did then.
    fields = found.sweep.model_dump(mode="json", include={"methods", "drafters", "fault_sets",
                                                          "batch_sizes", "ks"})
    old = share._query("sweep", {"base": json.loads(found.sweep.base.canonical_json()), **fields},
                       (), "", "")
    assert share.decode_sweep(old)[0].temperatures == (0.8,)


def test_a_cell_opens_its_run_in_the_run_view_at_its_fork_and_compare_marks_where_two_runs_part(
        swept):
    found, _, _ = swept
    trace, status, _, pending, tabs, cell, said = sweeptab.open_cell(Settings(), found, Click(3))
    assert said == "Opened run 4 of the sweep: eqspec · bsp-like · bs 4 · k 5 in the Run view."
    assert trace.manifest.spec == found.spec_of(3) and pending is None and cell == 3
    assert tabs.selected == "run" and "run 4 of the sweep: eqspec · bsp-like · bs 4 · k 5" in status
    views = ui.render(trace)
    first = next(s for s in trace.sequences if s.equivalent is False)
    assert views["focus_seq"] == first.seq and "sv-fork sv-sel" in views["grid"]
    with pytest.raises(gr.Error, match="not a run of this sweep"):
        sweeptab.open_cell(Settings(), found, Click(99))

    sides, a, b = sweeptab.remember_sides({}, found)
    assert (a["value"], b["value"]) == ("eqspec · bs 1 · k 5 · sweep",
                                        "eqspec · bsp-like · bs 4 · k 5 · sweep")
    sides, a, b = sweeptab.remember_sides(sides, trace)  # the run view's run joins them, as B
    assert b["value"].startswith("eqspec · bsp-like · bs 4 · k 5 · ") and len(sides) == 5
    summary, aligned, link = sweeptab.compare_runs(sides, "eqspec · bs 4 · k 5 · sweep", b["value"],
                                                   first.seq)
    fork = first.first_divergence
    assert f"first differ at token {fork}:" in summary and f'data-first="{fork}"' in aligned
    assert aligned.count(f'sv-first" data-index="{fork}"') + aligned.count(
        f'sv-first sv-rstart" data-index="{fork}"') \
        == 3  # outlined in the reference's row, A's and B's
    # The report's run and the run view's trace of the same spec are the same tokens.
    summary_b, aligned_b, _ = sweeptab.compare_runs(sides, "eqspec · bsp-like · bs 4 · k 5 · sweep",
                                                    b["value"], first.seq)
    assert "write the same" in summary_b and 'data-first=""' in aligned_b

    # The comparison's link opens the Compare tab on the same two runs (replayed from the cache) at
    # the same sequence.
    pending, said, tabs = sweeptab.open_compare_link(link)
    assert said == "Replaying the two shared runs…" and tabs.selected == "compare"
    replayed, a, b, seq = sweeptab.replay_compare(Settings(), pending, {},
                                                  progress=lambda *_, **__: None)
    assert seq == first.seq and len(replayed) == 2
    again = sweeptab.compare_runs(replayed, a["value"], b["value"], seq)
    assert (f"first differ at token {fork}:" in again[0] and f'data-first="{fork}"' in again[1]
            and again[2] == link)
    assert ui.open_link(link)["status"] == "This link compares two runs: see the Compare tab."


def _side(label, ids, prompts=("p",), rounds=((),), reference=None):
    pieces = tuple(tuple(f"<{i}>" for i in s) for s in ids)
    return sidebyside.Side(label, prompts, ids, pieces, rounds, reference or (None,) * len(ids),
                           tuple(None if r is None else tuple(f"<{i}>" for i in r)
                                 for r in (reference or (None,))))


def test_compare_links_round_trip_and_bad_ones_get_a_message():
    a, b = (RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", prompts=("one", "two"),
                          method="eqspec", faults=faults) for faults in ((), ("bsp-like",)))
    assert share.decode_compare(share.encode_compare(a, b, 1)) == (a, b, 1)
    assert (share.other_tab(share.encode_compare(a, b)) == "compare"
            and share.decode_link(share.encode_compare(a, b)) is None)
    for bad, said in (("?compare=%%%", "damaged"),
                      ("?compare=" + share.encode_compare(a, b)[9:40], "damaged")):
        pending, status, _ = sweeptab.open_compare_link(bad)
        assert (pending is None and status.startswith("**That compare link could not be used:**")
                and said in status)
    assert sweeptab.open_compare_link("?run=x")[0] is None  # another tab's link: left alone


def test_compare_marks_rounds_a_run_that_ends_early_and_refuses_other_prompts():
    ref = ((1, 2, 3, 4, 5),)
    a = _side("A <b>bold</b>", ((1, 2, 3, 4, 5),), rounds=((2, 3),), reference=ref)
    b = _side("B", ((1, 2, 3),), rounds=((1, 2),), reference=ref)
    html = sidebyside.aligned_html(a, b, 0)
    # a label is a stranger's text, and so is
    assert 'data-first="3"' in html and "<b>bold</b>" not in html
    assert "<1>" not in html and "&lt;1&gt;" in html  # every token's text
    assert html.count("sv-rstart") == 4  # A's rounds start at 0 and 2, B's at 0 and 1
    assert html.count('class="sv-sbs-end"') == 2  # B ended: its tokens 3 and 4 are empty cells
    assert "B wrote nothing (it had ended)" in sidebyside.compare_summary_md(a, b, 0)
    other = _side("C", ((1, 2, 3),), prompts=("q",))
    assert "different prompts" in sidebyside.compare_summary_md(a, other, 0)
    assert "no sequence 4" in sidebyside.compare_summary_md(a, b, 4)


def test_a_sweep_link_names_its_runs_not_its_decode():
    base = RunSpec.build(prompts=("Hi",))
    sweep = Sweep.build(base=base, methods=("eqspec", "reference"), fault_sets=((), ("bsp-like",)),
                        batch_sizes=(1, 2), ks=(3,))
    assert share.decode_sweep(share.encode_sweep(sweep)) == (sweep, None)
    # a run link's decoder leaves it to the Sweep tab
    assert share.decode_link(share.encode_sweep(sweep)) is None
