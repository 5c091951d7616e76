"""A Python callable as the engine: `--engine module:function`, for a researcher's
own implementation.

The function is called once with every prompt's token ids (chat template applied) and the settings
of the check (max_new_tokens, k, dtype, device, eos_ids: the reference's; stop, where the check sets
stop strings), and returns either the output ids, one list per prompt, or a dict:

    {"outputs": [[ids], ...],         # required
     "name": "...", "version": "...", "settings": {...},
                                      # optional: what the engine says about itself
     "rows": [...], "rounds": [...]}  # optional: its rounds in specviz's trace schema (RowRecord,
                                      # RoundRecord): every white-box view then applies
"""
from __future__ import annotations

import importlib
import time

from pydantic import ValidationError

from specviz.engines.base import EngineRun, declare_drafter
from specviz.spec.strict import SpecError, describe_validation_error
from specviz.trace.records import EngineOutput


def load(target: str):
    """The function named by "module:function" (the module importable from here)."""
    module, _, name = target.partition(":")
    if not module or not name:
        raise SpecError(f"--engine {target!r}: expected module:function, e.g. "
                        "mypackage.decode:generate")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise SpecError(f"--engine {target!r}: cannot import {module!r} ({e})") from None
    except AttributeError:
        raise SpecError(f"--engine {target!r}: {module!r} has no {name!r}") from None
    if not callable(fn):
        raise SpecError(f"--engine {target!r}: {name!r} is not callable")
    return fn


def from_callable(target: str, prompt_ids: list[list[int]], settings: dict,
                  drafter: str | None = None) -> EngineRun:
    """What `target` answers for `prompt_ids`, told the check's `settings`. `drafter`: what the
    caller declares the engine drafts with, where the settings it returns do not say otherwise."""
    fn = load(target)
    start = time.perf_counter()
    answer = fn([list(p) for p in prompt_ids], dict(settings))
    seconds = time.perf_counter() - start
    if not isinstance(answer, dict):
        answer = {"outputs": answer}
    try:
        return EngineRun(
            name=answer.get("name", target), version=answer.get("version"), source="callable",
            seconds=seconds,
            settings=declare_drafter(answer.get("settings", settings), drafter,
                                     f"--engine {target!r}"),
            outputs=[EngineOutput(ids=ids) for ids in answer["outputs"]],
            rows=answer.get("rows", []), rounds=answer.get("rounds", []),
        )
    except (KeyError, TypeError, ValidationError) as e:
        why = describe_validation_error(e) if isinstance(e, ValidationError) else repr(e)
        raise SpecError(f"--engine {target!r} returned something else than output ids "
                        f"per prompt: {why}") from None
