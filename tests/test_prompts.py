import json

import pytest

from specviz.spec.prompts import (SPEC_BENCH_FILE, builtin_set, builtin_sets, parse_prompts,
                                  read_prompts)
from specviz.spec.strict import SpecError


def test_plain_text_is_one_prompt_a_line():
    assert parse_prompts("first\n\n  second  \n") == ["first", "second"]


def test_spec_bench_jsonl_uses_the_first_turn(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text("\n".join(json.dumps({"question_id": i, "category": "x",
                                       "turns": [f"q{i}", "follow-up"]})
                           for i in range(3)))
    assert read_prompts(f) == ["q0", "q1", "q2"]


def test_the_carried_spec_bench_slice_is_the_first_64_questions_and_a_builtin_set():
    records = [json.loads(ln) for ln in SPEC_BENCH_FILE.read_text(encoding="utf-8").splitlines()]
    # Spec-Bench's first 64, in order
    assert [r["question_id"] for r in records] == list(range(81, 145))
    prompts = read_prompts(SPEC_BENCH_FILE)
    assert prompts == [r["turns"][0] for r in records] and all(p.strip() for p in prompts)
    assert builtin_set("spec-bench") == prompts
    assert (SPEC_BENCH_FILE.parent
            / "LICENSE-spec-bench.txt").read_text().lstrip().startswith("Apache License")


@pytest.mark.parametrize("text,message", [
    ("", "no prompts found"),
    ('{"turns": ["ok"]}\n{"turns": []}', "line 2: expected a JSON object"),
    ('{"turns": ["ok"]}\nnot json', "line 2"),
    ('{"turns": [""]}', "turns[0] must be a non-empty string"),
    # Python's json raised RecursionError
    ('{"turns": ' + "[" * 100_000, "line 1: expected a JSON object"),
])
def test_bad_prompt_files_say_what_is_wrong(text, message):
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_prompts(text)


def test_builtin_sets_are_varied():
    sets = builtin_sets()
    assert len(sets["all"]) >= 24 and len(sets["quick"]) == 4
    assert {"chat", "code", "lists", "summarize"} <= set(sets)
    lengths = sorted(len(p) for p in sets["all"])
    assert lengths[0] < 10 and lengths[-1] > 1500  # a one-word greeting and a long passage
    with pytest.raises(SpecError, match="unknown prompt set"):
        builtin_set("nope")
