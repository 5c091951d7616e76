"""Structured output under speculation (decoding/grammar.py): every verify slot masked by the
grammar's state after the drafts before it, the grammar advanced over the kept tokens only. A
correct engine writes the batch-size-1 reference's tokens under the same grammar, chains and trees,
eqspec and exspec; each grammar fault of the field (N-14, N-16) is named `decision-bug:grammar`.

The answers are checked as JSON by Python's own parser, apart from the grammar engine."""
import json

import pytest

from specviz.app.tokens import timeline_html
from specviz.app.views import Focus
from specviz.run.runner import run
from specviz.spec.casebook import BY_FAULT, PERSON_SCHEMA
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError

SCHEMA = PERSON_SCHEMA
ASKED = BY_FAULT["grammar-advanced-over-rejected"].run["prompts"]
# a reasoning model's thinking, its end a newline: the embedded model writes one before its JSON
THINKING = BY_FAULT["grammar-unmasked-past-reasoning-end"].run["prompts"]
# prompt lookup drafts the chat template's end-of-turn after the quoted JSON's closing brace; the
# first prompt's answer is whole before the round that aborts it
QUOTED = (('Repeat this JSON exactly: {"name":"Bob","age":30,"city":"Rome"}',)
          + BY_FAULT["grammar-mask-after-terminated"].run["prompts"][:3])


def traced(prompts=ASKED, **fields):
    spec = RunSpec.build(prompts=prompts, json_schema=SCHEMA, batch_size=4,
                         **{"method": "eqspec", "max_new_tokens": 48, **fields})
    return run(spec)


def answer(piece_list: list[str | None], thinking: bool = False) -> dict:
    """An output's answer, parsed by Python's JSON parser: the text after its end-of-turn, and after
    its first newline where it thought first."""
    text = "".join(p or "" for p in piece_list).removesuffix("<|im_end|>")
    return json.loads(text.split("\n", 1)[1] if thinking else text)


def fits(record: dict) -> bool:
    return (set(record) == {"name", "age", "city"} and isinstance(record["age"], int)
            and all(isinstance(record[k], str) and len(record[k]) <= 20 for k in ("name", "city")))


@pytest.mark.parametrize("method,tree_width", [("eqspec", 1), ("eqspec", 2), ("exspec", 1),
                                               ("exspec", 2)])
def test_speculation_under_a_schema_writes_the_reference_tokens(method, tree_width):
    trace = traced(method=method, tree_width=tree_width)
    for s in trace.sequences:
        assert s.equivalent and s.output_ids == s.reference_ids and s.forensics is None, s.seq
        assert fits(answer(s.output_pieces)), s.output_pieces
        assert 0 not in s.grammar_allowed and 1 in s.grammar_allowed  # forced tokens marked
    assert trace.rejections.verdict is None and trace.acceptance.verdict is None


def test_the_batched_reference_under_a_schema_is_the_reference():
    trace = traced(method="batched-reference")
    assert all(s.equivalent for s in trace.sequences)


def test_a_reasoning_end_frees_the_thinking_and_the_grammar_starts_after_it():
    trace = traced(THINKING, reasoning_end="\n", max_new_tokens=64)
    thought = 0
    for s in trace.sequences:
        assert s.equivalent and s.forensics is None, s.seq
        if "\n" in "".join(p or "" for p in s.output_pieces):
            thought += 1
            assert fits(answer(s.output_pieces, thinking=True)), s.output_pieces
            free = s.grammar_allowed.count(-1)
            assert s.output_pieces[free - 1] == "\n" and -1 not in s.grammar_allowed[free:]
    assert thought >= 2


def test_a_mask_left_free_past_a_reasoning_end_mid_block_is_named():
    trace = traced(THINKING, reasoning_end="\n", max_new_tokens=64,
                   faults=("grammar-unmasked-past-reasoning-end",))
    named = [s for s in trace.sequences if s.forensics is not None]
    assert named and all(s.forensics.verdict == "decision-bug:grammar" for s in named)
    for s in named:
        broke = s.grammar_allowed.index(0)  # the first token the grammar forbids
        assert s.forensics.fork == min(s.first_divergence, broke) and s.equivalent is False
        assert f"Token {broke} " in s.forensics.explanation and "forbids" in s.forensics.explanation
        # the page's timeline marks the token the grammar forbids, and the thinking before it
        page = timeline_html(trace, Focus(s.seq, None))
        assert page.count("FORBIDDEN here") == 1 and "sv-g-free" in page
        assert f'sv-g-broken" data-index="{broke}"' in page


def test_a_grammar_advanced_over_rejected_drafts_is_named():
    trace = traced(faults=("grammar-advanced-over-rejected",))
    forked = [s for s in trace.sequences if not s.equivalent]
    assert forked and all(s.forensics.verdict == "decision-bug:grammar" for s in forked)
    assert any(0 in s.grammar_allowed for s in forked)


def test_a_matcher_asked_after_it_terminated_aborts_and_is_named():
    correct = traced(QUOTED, drafter="lookup")
    assert all(s.equivalent and s.forensics is None for s in correct.sequences)
    trace = traced(QUOTED, drafter="lookup", faults=("grammar-mask-after-terminated",))
    cut = [s for s in trace.sequences if len(s.output_ids) < len(s.reference_ids)]
    assert cut and all(s.reference_ids[:len(s.output_ids)] == s.output_ids for s in cut)
    unfinished = 0
    for s in cut:  # cut mid-answer, or after a whole one (then only its end-of-turn is missing)
        try:
            answer(s.output_pieces)
            assert s.forensics.verdict == "decision-bug:stop", s.seq
        except json.JSONDecodeError:
            unfinished += 1
            assert s.forensics.verdict == "decision-bug:grammar", s.seq
            assert "unfinished" in s.forensics.explanation
    assert unfinished


@pytest.mark.parametrize("fields,said", [
    (dict(json_schema='{"type": "nonsense"}'), "does not compile"),
    (dict(json_schema="{"), "does not compile"),
    (dict(reasoning_end="</think>"), "set a JSON schema too"),
    (dict(faults=("grammar-advanced-over-rejected",)), "needs a JSON schema"),
    (dict(json_schema=SCHEMA, faults=("grammar-unmasked-past-reasoning-end",)),
     "needs a reasoning end"),
    (dict(json_schema=SCHEMA, temperature=0.7), "temperature 0"),
    (dict(json_schema=SCHEMA, method="hf-assisted", batch_size=1), "takes no grammar"),
])
def test_a_grammar_the_run_cannot_apply_is_refused_with_its_reason(fields, said):
    with pytest.raises(SpecError, match=said):
        RunSpec.build(prompts=("Hi",), **{"method": "eqspec", **fields})


def test_a_grammar_run_keeps_its_schema_through_the_page_form():
    """A share link fills the page's controls from its spec: the run they make is the same."""
    from specviz.app.form import controls_of, spec_from_controls
    spec = RunSpec.build(prompts=THINKING, json_schema=SCHEMA, reasoning_end="</think>")
    assert spec_from_controls(**controls_of(spec)) == spec
