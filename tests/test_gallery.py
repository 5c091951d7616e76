"""The Field cases tab and the casebook's bundled runs: every case (spec/casebook.py) has its
recorded run in assets/traces, of its own spec and with the verdict its mechanism gets; a card opens
it in the Run view at its fork (a lossless case on its drafts), its share link replays it from the
bundle, and the Sweep tab runs the whole casebook as one sweep. Nothing here decodes:
tests/test_casebook.py re-runs the cases."""
import html
import json
import re

import gradio as gr
import pytest

from specviz.app import form, gallery, serving, sweeptab, sweepviews
from specviz.app import runview as ui
from specviz.app.views import md
from specviz.run.settings import Settings
from specviz.spec.casebook import BY_FAULT, CASES, PROMPTS
from specviz.spec.faults import FAULTS
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics, share
from specviz.trace.migrations import SCHEMA_VERSION
from specviz.trace.sweep import Sweep


class Click:
    """What a card's button sends (gallery.CARD_CLICKS)."""

    def __init__(self, **data):
        self._data = data


def first_forked(trace):
    """The sequence the Run view opens on (views.resolve): the first that parts
    from the reference."""
    return next((s for s in trace.sequences if s.equivalent is False), None)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.fault)
def test_every_case_has_its_bundled_run_of_its_spec_with_the_verdict_its_mechanism_gets(case):
    path = serving.ASSETS / "traces" / case.trace
    assert path.exists(), f"the case {case.fault} has no bundled run {path.name}: run `make traces`"
    assert (json.loads(path.read_text())["schema_version"]
            == SCHEMA_VERSION), "the schema moved on: run `make traces`"
    trace = serving.bundled_case(case.fault)
    assert (trace.manifest.spec.key()
            == RunSpec.build(**case.spec_fields()).key()), "the case changed: `make traces`"
    assert serving.bundled_for(trace.manifest.spec) is trace  # its spec opens without decoding
    # sampled: the run's verdict, from its audit and distribution test
    if not trace.manifest.spec.greedy:
        assert metrics.sampled_verdict(trace)[0] == case.expected
    elif case.lossless:  # the output stays right; the drafts show the shortfall
        assert all(s.equivalent for s in trace.sequences)
        assert trace.acceptance.verdict == case.expected
        assert trace.acceptance.accepted < trace.acceptance.accepted_fresh
    else:  # (a wrong log-probability keeps the tokens: its verdict is on an equal sequence)
        assert next(s for s in trace.sequences if s.forensics).forensics.verdict == case.expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.fault)
def test_a_card_opens_its_case_at_its_fork_and_its_share_link_replays_it_from_the_bundle(case):
    opened = gallery.open_case(Click(case=case.fault))
    trace, status, download, pending, tabs, view_tabs = (
        opened[n] for n in ("trace", "status", "download", "pending", "tabs", "view_tabs"))
    assert (trace is serving.bundled_case(case.fault)
            and json.loads(open(download).read()) == json.loads(trace.to_json()))
    # The Run controls are set to the case's run: Run decodes it again.
    values = {n: opened[n] for n in form.DEFAULTS}
    assert form.spec_from_controls(**values) == trace.manifest.spec, values
    assert pending is None and tabs.selected == "run"
    assert status.startswith(f"**Field case: {case.title}**") and "bundled with specviz" in status
    assert all(t.url in status for t in case.threads)
    views = ui.render(trace)
    if case.lossless:  # no fork: the drafts per slot, and the status names the shortfall
        assert view_tabs.selected == "drafts" and f"**Drafts: {md(case.expected)}.**" in status
    else:
        assert view_tabs == gr.skip()  # the views' tab stays as it was
    forked = first_forked(trace)
    if forked is not None:  # focused on its first fork, with its verdict
        assert views["focus_seq"] == forked.seq and views["focus_round"] == forked.forensics.round
        assert re.search(r'class="sv-cell sv-fork sv-sel[^"]*" '
                         rf'data-seq="{forked.seq}" data-round="{views["focus_round"]}"',
                         views["grid"])
        assert html.escape(case.expected) in views["forensics"]
    # Its share link replays it in any process: from the bundle, not from this process's cache
    # of runs.
    serving.TRACES.clear()
    pending, note = (ui.open_link(views["link_query"])[n] for n in ("pending", "status"))
    replayed, report, _, _ = ui.replay(Settings(), pending)
    assert note == "Replaying the shared run…" and replayed is trace
    assert "matched the shared run exactly" in report and "bundled with specviz" in report


def test_the_cards_say_each_case_and_link_its_threads_in_a_new_tab():
    cards = gallery.cards_html()
    assert (cards.count('<article class="sv-case') == cards.count("Open this case</button>")
            == len(CASES))
    for case in CASES:
        assert f'data-case="{case.fault}"' in cards and html.escape(case.title) in cards
        for t in case.threads:
            assert (f'<a href="{t.url}" target="_blank" rel="noopener noreferrer">{t.label}</a>'
                    in cards)
        assert html.escape(gallery.expected(case)[0]) in cards
    with pytest.raises(gr.Error, match="not a case"):
        gallery.open_case(Click(case="<img src=x>"))


def test_the_sweep_tab_runs_the_whole_casebook_as_one_sweep_and_its_link_replays_it():
    # every run from the bundle: no decode
    found, download, cell = sweeptab.run_casebook(Settings())
    assert cell is None and open(download).read() == found.to_json()
    assert [r.faults for r in found.rows] == [c.fault for c in CASES]
    assert [s.key() for s in found.sweep.specs()] == [RunSpec.build(**c.spec_fields()).key()
                                                      for c in CASES]
    for case, row in zip(CASES, found.rows):
        if row.sampled_verdict is not None:  # sampled: the run's verdict
            assert row.sampled_verdict == case.expected, case.fault
        elif not case.lossless:
            assert case.expected in row.verdicts, (case.fault, row.verdicts)
    views = sweeptab.render_sweep(Settings(), found, 2)
    # a cell each, in one column: none left empty
    assert views["exact"].count('class="sv-hcell') == len(CASES)
    assert (views["exact"].split("<tbody>")[0].count("<th>") == 2
            and "<td></td>" not in views["exact"])
    # a run at another place than most is named with it (the sampled cases' temperatures)
    for row in found.rows:
        assert html.escape(row.label()) in views["exact"]
    assert "shared-stream · T 0.8</th>" in views["exact"]
    # Every token right and a bug beside them (wasted drafts, wrong log-probabilities): the cell
    # says so (⚠).
    flagged = {int(i)
               for i in re.findall(r'class="sv-hcell[^"]*sv-flag[^"]*" data-run="(\d+)"',
                                   views["exact"])}
    assert flagged == {i for i, c in enumerate(CASES)
                       if c.lossless or FAULTS[c.fault].kind in ("logprobs", "counters")}
    bars = {d.name: list(d.x) for d in sweepviews.verdict_bars(found).data}
    assert (bars["equivalent, decision-bug:logprobs"][CASES.index(BY_FAULT["logprobs-from-draft"])]
            == len(PROMPTS))
    # every run named, and the legend below the bars, not scrolled
    bars = sweepviews.verdict_bars(found)
    assert list(bars.layout.yaxis.ticktext) == [r.name() for r in found.rows]
    assert (bars.layout.legend.yref == "container"
            and bars.layout.height > 22 * len(found.rows) + 20 * len(bars.data))
    assert bars.layout.legend.maxheight >= 20 * len(bars.data)
    assert f"{len(CASES)} runs" in views["summary"] and "the runs listed" in views["summary"]
    # every pair
    assert f"{md('specviz:tiny-hybrid')} / {md('specviz:tiny-hybrid-draft')}" in views["summary"]
    sweep, picked = share.decode_sweep(views["link_query"])
    assert sweep == found.sweep and picked == 2
    opened = sweeptab.open_sweep_link(views["link_query"])
    pending = opened["pending"]
    assert not set(opened) & set(sweeptab.SWEEP_DEFAULTS)  # no control holds a listed sweep: kept
    replayed, _, cell, said = sweeptab.replay_sweep(Settings(), pending)
    assert replayed.to_json() == found.to_json() and cell == 2 and "replayed" in said


def test_a_listed_sweep_asks_as_many_prompts_in_each_run_and_gives_each_run_a_cell_of_its_own():
    base = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", prompts=("Hi",),
                         max_new_tokens=4)
    with pytest.raises(SpecError, match="run 1 asks 2 prompts and its base 1"):
        Sweep.listed(base, [{"k": 2}, {"prompts": ("Hello", "Hi")}])
    with pytest.raises(SpecError, match="two runs at method 'eqspec'"):
        Sweep.listed(base, [{"k": 2}, {"k": 2, "seed": 1}])
    with pytest.raises(SpecError, match="run 0's k 3 is not on the sweep's ks"):
        Sweep.build(base=base, methods=("eqspec",), batch_sizes=(4,), ks=(2,), runs=({"k": 3},))
