import json
from pathlib import Path

import pytest

from specviz.prompts import builtin_set, builtin_sets, parse_prompts, read_prompts
from specviz.spec import SpecError

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def test_plain_text_is_one_prompt_a_line():
    assert parse_prompts("first\n\n  second  \n") == ["first", "second"]


def test_spec_bench_jsonl_uses_the_first_turn(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text("\n".join(json.dumps({"question_id": i, "category": "x", "turns": [f"q{i}", "follow-up"]})
                           for i in range(3)))
    assert read_prompts(f) == ["q0", "q1", "q2"]


def test_the_shared_spec_bench_file_parses():
    prompts = read_prompts(SPEC_BENCH)
    assert len(prompts) == 480 and all(p.strip() for p in prompts)


@pytest.mark.parametrize("text,message", [
    ("", "no prompts found"),
    ('{"turns": ["ok"]}\n{"turns": []}', "line 2: expected a JSON object"),
    ('{"turns": ["ok"]}\nnot json', "line 2"),
    ('{"turns": [""]}', "turns[0] must be a non-empty string"),
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
