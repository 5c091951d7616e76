"""The page's views, built from a trace alone: focus, chips, grid cells, forensics, lanes."""
import re

import pytest

from specviz import metrics, plots, text, views
from specviz.prompts import builtin_set
from specviz.runner import run
from specviz.spec import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.trace import Trace


def _spec(**kw) -> RunSpec:
    fields = dict(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float64", device="cpu", prompts=tuple(builtin_set("all")[:6]),
                  batch_size=3, k=3, max_new_tokens=16)
    return RunSpec.build(**{**fields, **kw})


@pytest.fixture(scope="module")
def broken(tiny) -> Trace:
    """bsp-like faults: sequences diverge, with sync-bug verdicts."""
    return run(_spec(faults=("bsp-like",)))


@pytest.fixture(scope="module")
def clean(tiny) -> Trace:
    return run(_spec())


def test_default_focus_is_the_first_divergence(broken):
    first = next(s for s in broken.sequences if s.equivalent is False)
    focus, note = views.resolve(broken)
    assert focus.seq == first.seq and note == ""
    rows = views.rows_by_seq(broken)[first.seq]
    emitted_before = 0
    for r in rows:  # the focused round is the one that emitted the first divergent token
        if r.round == focus.round:
            assert emitted_before <= first.first_divergence < emitted_before + len(r.emitted)
        emitted_before += len(r.emitted)


def test_a_focus_outside_the_run_moves_with_a_note(broken):
    focus, note = views.resolve(broken, seq=99)
    assert 0 <= focus.seq < len(broken.sequences) and "not in this run" in note
    other = views.rows_by_seq(broken)[0][0].round
    stranger = next(r.round for r in broken.rows if r.seq != 0 and r.round not in
                    {x.round for x in views.rows_by_seq(broken)[0]})
    focus, note = views.resolve(broken, seq=0, round=stranger)
    assert focus.seq == 0 and focus.round != stranger and "took no part" in note
    assert views.resolve(broken, seq=0, round=other) == (views.Focus(0, other), "")


def test_timeline_marks_the_divergent_token_and_every_token_once(broken):
    focus, _ = views.resolve(broken)
    seq = broken.sequences[focus.seq]
    page = views.timeline_html(broken, focus)
    forks = re.findall(r'class="sv-tok [^"]*sv-fork[^"]*" data-index="(\d+)"', page)
    assert forks == [str(seq.first_divergence)]
    assert len(re.findall(r'data-index="\d+"', page)) == len(seq.output_ids)
    assert page.count("sv-round sv-sel") == 1
    assert len(re.findall(r"sv-tok sv-rejected", page)) == sum(
        len(r.draft_tokens) - r.accepted for r in views.rows_by_seq(broken)[focus.seq])


def test_grid_has_one_cell_per_round_row_and_marks_forks(broken):
    focus, _ = views.resolve(broken)
    page = views.grid_html(broken, focus)
    assert len(re.findall(r'<td class="sv-cell', page)) == len(broken.rows)
    diverged = sum(s.equivalent is False for s in broken.sequences)
    assert len(re.findall(r'class="sv-cell sv-fork', page)) == diverged
    assert page.count("sv-sel") == 1


def test_forensic_panel_follows_the_focused_round(broken):
    focus, _ = views.resolve(broken)
    rounds = [r.round for r in views.rows_by_seq(broken)[focus.seq]]
    a = views.forensics_html(broken, focus)
    b = views.forensics_html(broken, views.Focus(focus.seq, rounds[0] if rounds[0] != focus.round else rounds[1]))
    assert "sync-bug" in a and a != b
    assert "✗" in a  # bsp-like breaks an invariant, and the panel shows which


def test_clean_run_says_equal_and_draws_lanes_and_phases(clean):
    focus, _ = views.resolve(clean)
    assert "equals the reference" in views.forensics_html(clean, focus)
    assert "identical token ids" in views.compare_html(clean, focus)
    assert all(v == "yes" for v in views.summary_frame(clean)["equivalent"])
    lanes = plots.kv_lanes(clean, focus)
    batch = {r.seq for r in clean.rows if r.batch == views.rows_by_seq(clean)[focus.seq][0].batch}
    assert len(lanes.data) == len(plots.LANES) * len(batch)
    assert len(plots.phase_timings(clean).data) == len(metrics.PHASES)


def test_a_trace_reads_without_its_tokenizer(clean, tiny):
    back = Trace.from_json(clean.to_json())
    assert back.vocab == clean.vocab and all(isinstance(i, int) for i in back.vocab)
    for s in back.sequences:  # whole characters, as the tokenizer decodes the sequence
        assert text.joined(s.output_pieces) == tiny.tokenizer.decode(s.output_ids)
    assert "100% of sequences equal" in views.headline(back)
    assert "here" in views.glossary(back)


def test_non_speculative_traces_show_tokens_without_rounds(tiny):
    trace = run(_spec(method="batched-reference"))
    focus, _ = views.resolve(trace)
    assert focus.round is None
    assert views.timeline_html(trace, focus).count("data-index") == len(trace.sequences[focus.seq].output_ids)
    assert "does not speculate" in views.grid_html(trace, focus)


def test_the_forensic_panel_shows_the_evidence_and_the_grid_the_audit(tiny):
    trace = run(_spec(faults=("bsp-like",), audit=3))
    focus, _ = views.resolve(trace)
    panel = views.forensics_html(trace, focus)
    for label in ("noise floor", "state check", "positions fed", "own choice", "audit: first round"):
        assert label in panel, label
    s = trace.sequences[focus.seq]
    assert s.audit_round is not None and s.audit_round <= s.forensics.round
    grid = views.grid_html(trace, focus)
    marked = re.findall(r'class="sv-cell[^"]*sv-audit[^"]*" data-seq="(\d+)" data-round="(\d+)"', grid)
    assert (str(s.seq), str(s.audit_round)) in marked
    assert "noise floor" in views.glossary(trace) and "here **" in views.glossary(trace)
