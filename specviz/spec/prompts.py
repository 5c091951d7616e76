"""Prompt sources: plain text (one prompt a line), Spec-Bench JSONL, built-in sets."""
from __future__ import annotations

import json
from pathlib import Path

from specviz.spec.strict import SpecError
from specviz.spec.untrusted import parse_json

ASSETS = Path(__file__).resolve().parents[2] / "assets"
BUILTIN_FILE = ASSETS / "prompts" / "builtin.jsonl"
# The first 64 Spec-Bench questions (Apache-2.0, see assets/prompts/README.md): the tests' and
# benchmarks' data.
SPEC_BENCH_FILE = ASSETS / "prompts" / "spec_bench_slice.jsonl"
# The default set for the app and quick runs: short, mixed, a few seconds on a CPU.
QUICK_IDS = (1, 7, 12, 19)
DEFAULT_SET = "quick"  # what the page and the CLI decode unless told otherwise


def parse_prompts(text: str, name: str = "prompts") -> list[str]:
    """Prompts from file contents: Spec-Bench JSONL (`turns[0]`) if the first
    non-blank line is a JSON object, else one prompt per non-blank line."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise SpecError(f"{name}: no prompts found (the file is empty)")
    if not lines[0].lstrip().startswith("{"):
        return [ln.strip() for ln in lines]
    prompts = []
    for n, ln in enumerate(lines, 1):
        try:
            obj = parse_json(ln)
            turn = obj["turns"][0]
        except (SpecError, KeyError, IndexError, TypeError):
            raise SpecError(
                f"{name}, line {n}: expected a JSON object with a non-empty list 'turns' "
                "(Spec-Bench format), or use plain text with one prompt a line"
            ) from None
        if not isinstance(turn, str) or not turn.strip():
            raise SpecError(f"{name}, line {n}: turns[0] must be a non-empty string")
        prompts.append(turn)
    return prompts


def read_prompts(path: str | Path) -> list[str]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read prompts from {path}: {e}") from None
    return parse_prompts(text, path.name)


def builtin_records() -> list[dict]:
    return [json.loads(ln) for ln in BUILTIN_FILE.read_text(encoding="utf-8").splitlines()
            if ln.strip()]


def builtin_sets() -> dict[str, list[str]]:
    """Named built-in sets: `quick`, `all`, `spec-bench`, one per category of our own prompts,
    and `summarize+code`."""
    records = builtin_records()
    sets = {
        "quick": [r["turns"][0] for r in records if r["question_id"] in QUICK_IDS],
        "all": [r["turns"][0] for r in records],
        "spec-bench": read_prompts(SPEC_BENCH_FILE),
    }
    for r in records:
        sets.setdefault(r["category"], []).append(r["turns"][0])
    # Answers that draw on their own prompt (summaries, code, code edits): where prompt lookup pays.
    sets["summarize+code"] = sets["summarize"] + sets["code"]
    return sets


def builtin_set(name: str) -> list[str]:
    sets = builtin_sets()
    if name not in sets:
        raise SpecError(f"unknown prompt set {name!r}; choose one of {', '.join(sets)}")
    return sets[name]
