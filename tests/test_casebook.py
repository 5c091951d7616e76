"""The field casebook (spec/casebook.py): every bug that hit a real engine, replayed by its fault,
forks (or, where it is lossless, shows its acceptance shortfall) and is named by its mechanism,
never `numerics`.

Each case runs as it is declared, on the tiny pair where the embedded one is only its default (the
tiny pair shows the same mechanisms in seconds: its draft agrees with it about half the time), and
on the embedded pair where the case needs what only a trained model does: write an end-of-sequence
token, repeat itself."""
import pytest

from specviz.app.sweepviews import heatmap_html
from specviz.run.runner import run
from specviz.spec.casebook import BY_FAULT, CASES, PROMPTS
from specviz.spec.faults import FAULTS
from specviz.spec.run import EMBEDDED_DRAFT, EMBEDDED_TARGET, TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.spec.strict import SpecError
from specviz.spec.verdicts import VERDICTS
from specviz.trace import metrics
from specviz.trace.sweep import Sweep
from specviz.trace.sweep import report as sweep_report

TINY = {EMBEDDED_TARGET: TINY_TARGET, EMBEDDED_DRAFT: TINY_DRAFT}
# A random model never writes its end-of-sequence token, its sharp logits keep their argmax under a
# repetition penalty of 1.3, and its logits are too small for bfloat16 to move a draw: the embedded
# pair repeats itself where a lost penalty shows. On it, the stop and penalty cases run on one of
# its prompts, whose bundled run forks early (stop: token 8 of "What is the capital of France?";
# penalty: token 14 of the prime number's sentence), within a shorter budget: a minute less of the
# suite.
ON_THE_EMBEDDED_PAIR = {"stop-at-last-token": dict(prompts=PROMPTS[:1], max_new_tokens=16),
                        "cap-before-stop": dict(prompts=PROMPTS[:1]),
                        "counted-before-stop-trim": dict(prompts=PROMPTS[:1], max_new_tokens=16),
                        "penalty-history-last-token": dict(prompts=PROMPTS[3:], max_new_tokens=20),
                        "draft-drawn-in-bfloat16": {},
                        # a random model writes no JSON of its own, nor the thinking's end
                        "grammar-unmasked-past-reasoning-end": {},
                        "grammar-advanced-over-rejected": {}, "grammar-mask-after-terminated": {},
                        # the tiny target's three layers are the engines' default aux layers
                        "head-aux-fallback": {}}


def _replica(case) -> RunSpec:
    fields = {**case.spec_fields(), **ON_THE_EMBEDDED_PAIR.get(case.fault, {})}
    if case.fault not in ON_THE_EMBEDDED_PAIR:
        fields.update(target=TINY.get(fields.get("target", EMBEDDED_TARGET), fields.get("target")),
                      draft=TINY.get(fields.get("draft", EMBEDDED_DRAFT), fields.get("draft")))
    return RunSpec.build(**fields)


def test_the_casebook_replays_sixteen_field_cases_each_cited_and_named():
    assert len(CASES) >= 16 and len(BY_FAULT) == len(CASES)
    for case in CASES:
        assert case.fault in FAULTS and case.threads and case.mechanism.count("\n") == 1, case.fault
        assert case.expected in VERDICTS, case.fault
        assert all(t.url.startswith("https://github.com/") for t in case.threads)


@pytest.mark.parametrize("case", CASES, ids=[c.fault for c in CASES])
def test_every_case_shows_and_is_named_by_its_mechanism(case):
    spec = _replica(case)
    trace = run(spec)
    verdicts = [s.forensics.verdict for s in trace.sequences if s.forensics]
    assert "numerics" not in verdicts
    if case.lossless:  # the output is the reference's; the drafts it wasted are named
        assert metrics.equivalence(trace)["exact"] == 1
        a = trace.acceptance
        assert a.verdict == case.expected and a.accepted < a.accepted_fresh, a.explanation
        # In a sweep its run is no plain "equivalent": its cell and its bar say the drafts
        # were wasted.
        sweep = Sweep(base=spec, methods=(spec.method,), drafters=(spec.drafter,),
                      fault_sets=(spec.faults,), batch_sizes=(spec.batch_size,), ks=(spec.k,))
        report = sweep_report(sweep, [trace])
        assert report.rows[0].drafts_verdict == case.expected
        assert "sv-flag" in heatmap_html(report) and case.expected in heatmap_html(report)
    # sampled: no token reference; the run's verdict names the decision or the rule
    elif not spec.greedy:
        assert metrics.sampled_verdict(trace)[0] == case.expected, metrics.sampled_verdict(trace)
    else:  # it forks; a wrong log-probability keeps the tokens and is named on them
        tokens_kept = FAULTS[case.fault].kind in ("logprobs", "counters")
        assert (metrics.equivalence(trace)["exact"] == 1) == tokens_kept, "the replica must fork"
        assert verdicts and set(verdicts) == {case.expected}, [s.forensics.explanation
                                                               for s in trace.sequences
                                                               if s.forensics]
        assert FAULTS[case.fault].verdict == case.expected


# The built-in pairs a case needs a feature of (a hybrid's recurrent state, a sliding window):
# without the fault, the same run is the reference's, so every fork of the case is the fault's.
OWN_PAIRS = sorted({(c.run["target"], c.run["draft"], c.run.get("drafter", "model")) for c in CASES
                    if c.run.get("target", EMBEDDED_TARGET) not in (EMBEDDED_TARGET, TINY_TARGET)})


@pytest.mark.parametrize("target, draft, drafter", OWN_PAIRS)
def test_the_correct_engine_on_a_cases_own_pair_is_the_reference(target, draft, drafter):
    case = next(c for c in CASES
                if (c.run.get("target"), c.run.get("draft"), c.run.get("drafter", "model"))
                == (target, draft, drafter))
    trace = run(RunSpec.build(**{**case.spec_fields(), "faults": ()}))
    assert metrics.equivalence(trace)["exact"] == 1
    assert not trace.acceptance or trace.acceptance.verdict is None


def test_a_case_that_needs_ragged_drafts_stays_correct_where_every_row_is_offered_k():
    """The draft list of a draft model is every row's own: the oversized rollback erases nothing."""
    fields = {**_replica(BY_FAULT["rollback-by-draft-list"]).model_dump(), "drafter": "model",
              "ngram_min": 1, "ngram_max": 3}
    trace = run(RunSpec.build(**fields))
    assert metrics.equivalence(trace)["exact"] == 1


def test_a_correct_run_counts_only_the_tokens_its_output_holds():
    """The counters case without its fault: a stop still lands inside an accepted block, and each
    sequence's rounds count what its output holds, none named."""
    fields = {**_replica(BY_FAULT["counted-before-stop-trim"]).model_dump(), "faults": ()}
    trace = run(RunSpec.build(**fields))
    assert any(len(r.emitted) < r.accepted + 1 for r in trace.rows), "no stop inside a block"
    for s in trace.sequences:
        assert s.forensics is None
        assert sum(r.counted for r in trace.rows if r.seq == s.seq) == len(s.output_ids)


def test_a_greedy_rule_is_refused_when_sampling():
    with pytest.raises(ValueError, match="needs temperature 0"):
        RunSpec.build(prompts=("Hi",), temperature=0.8, faults=("accept-on-raw-softmax",))


def test_the_fitted_head_drafts_its_targets_text_and_a_correct_run_is_never_flagged():
    """specviz's fitted EAGLE-3 head (the head cases' drafter), fed right, in float64: the run is
    the reference's, its drafts are the head's own, and it drafts the target's text on the cases'
    prompts."""
    case = BY_FAULT["head-aux-one-early"]
    fields = {**_replica(case).model_dump(), "faults": (), "dtype": "float64"}
    for method in ("eqspec", "exspec"):
        trace = run(RunSpec.build(**{**fields, "method": method}))
        assert metrics.equivalence(trace)["exact"] == 1
        a = trace.acceptance
        assert a.verdict is None and a.accepted == a.accepted_fresh, a.explanation
        offered = sum(len(r.draft_tokens) for r in trace.rows)
        assert a.accepted >= 0.8 * offered, (a.accepted, offered)


def test_a_head_fault_acts_only_on_a_published_eagle3_head_and_says_where_it_cannot():
    with pytest.raises(ValueError, match="misfeed a published head: choose drafter eagle1 or"):
        RunSpec.build(prompts=("Hi",), faults=("head-vocab-as-ids",))
    # the tiny target has three layers: its fitted head hears two, the engines' default three
    spec = _replica(BY_FAULT["head-aux-fallback"]).model_copy(
        update={"target": TINY_TARGET, "draft": TINY_DRAFT})
    with pytest.raises(SpecError, match="changes nothing: its config names no aux layers"):
        run(spec)
