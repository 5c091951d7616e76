"""Bugs that keep the output right and waste the drafts (forensics/acceptance.py). The target
verifies every draft, so a drafter fed wrong positions, or one that drafts before it has seen the
target's last token, writes the reference all the same: only its acceptance shows it. Each round's
drafts are compared with a fresh pass of the draft model on the committed tokens; a correct run's
drafts are the draft model's own."""
import pytest

from specviz.decoding import drafters
from specviz.run.runner import run
from specviz.spec.faults import FAULTS, needing
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, TINY_WINDOW, TINY_WINDOW_SIZE, RunSpec
from specviz.trace import metrics


def _run(draft=TINY_DRAFT, faults=(), method="eqspec"):
    return run(RunSpec.build(target=TINY_TARGET, draft=draft, dtype="float32", device="cpu",
                             method=method, prompts=tuple(builtin_set("all")[:8]), batch_size=4,
                             k=4, max_new_tokens=24, faults=faults))


@pytest.mark.parametrize("draft", [TINY_DRAFT, TINY_TARGET], ids=["draft", "draft=target"])
@pytest.mark.parametrize("method", ["eqspec", "exspec"])
def test_a_correct_runs_drafts_are_the_draft_models_own(draft, method, tiny):
    trace = _run(draft, method=method)
    a = trace.acceptance
    assert a.verdict is None and a.beyond == 0 and a.compared > 0, a.explanation
    assert a.accepted == sum(r.accepted for r in trace.rows)
    # the target drafting for itself: every draft is accepted but where rounding tips one
    if draft == TINY_TARGET:
        assert a.accepted_fresh >= 0.97 * a.compared
        assert min(p for p in a.per_position_fresh if p is not None) >= 0.95


# (a head's: tests/test_heads.py, a published head's: tests/test_casebook.py; a windowed drafter's
# below)
LOSSLESS = [f for f, r in FAULTS.items() if r.acceptance and f not in needing("hidden")
            + needing("published-head") + needing("draft-window")]


@pytest.mark.parametrize("fault", LOSSLESS)
def test_a_lossless_draft_bug_keeps_the_output_and_is_named_by_its_side(fault, tiny):
    trace = _run(TINY_TARGET, (fault,))
    assert metrics.equivalence(trace)["exact"] == 1  # lossless: every output is the reference
    a = trace.acceptance
    assert a.verdict == FAULTS[fault].acceptance, a.explanation
    # With the target as its own draft every correct draft is accepted: the bug's cost
    # is the whole shortfall.
    assert a.accepted < 0.8 * a.accepted_fresh and a.beyond > 0 and a.first is not None
    assert "the drafts are wasted" in a.explanation


def test_a_draft_bug_outside_the_catalogue_is_the_drafters_state(monkeypatch, tiny):
    """Planted here: the draft model's first pass of each round is fed the token before its last one
    in place of it, a stale slot. Neither hypothesis gives those drafts."""
    real = drafters.run_model

    def stale_feed(pair, policy, role, tok, *args, **kw):
        if role == "draft" and tok.shape[1] > 2:  # a drafting pass
            tok = tok.clone()
            tok[:, -1] = tok[:, -3]
        return real(pair, policy, role, tok, *args, **kw)

    monkeypatch.setattr(drafters, "run_model", stale_feed)
    trace = _run(TINY_TARGET)
    assert metrics.equivalence(trace)["exact"] == 1
    assert trace.acceptance.verdict == "draft-bug:cache", trace.acceptance.explanation


@pytest.mark.parametrize("fault", [(), ("draft-window-as-full",)], ids=["correct", "full"])
def test_a_windowed_drafter_run_as_full_attention_shows_by_context_length(fault):
    """The built-in windowed pair (a 48-token window) drafting for itself: correct, every band of
    context length accepts what the fresh proposals do; with its window dropped the drafts part
    from its own past the window, and the later band falls further than the first."""
    trace = run(RunSpec.build(target=TINY_WINDOW, draft=TINY_WINDOW, dtype="float32",
                              device="cpu", method="eqspec", prompts=tuple(builtin_set("all")[:8]),
                              batch_size=4, k=4, max_new_tokens=32, faults=fault))
    assert metrics.equivalence(trace)["exact"] == 1
    a = trace.acceptance
    bands = a.by_context
    assert len(bands) >= 2 and bands[0].start < TINY_WINDOW_SIZE < bands[-1].end
    assert sum(b.accepted for b in bands) == a.accepted
    assert sum(b.accepted_fresh for b in bands) == a.accepted_fresh
    if not fault:
        assert a.verdict is None and all(b.accepted == b.accepted_fresh for b in bands)
        return
    assert a.verdict == "draft-bug:window", a.explanation
    rate = [b.accepted / max(b.offered, 1) for b in bands]
    assert rate[-1] < rate[0] and "By context length" in a.explanation
