"""What every engine adapter returns: the engine as it described itself, and its outputs
(trace/records.py keeps both in a trace)."""
from __future__ import annotations

from specviz.spec.drafters import DRAFTERS
from specviz.spec.strict import Many, SpecError
from specviz.trace.records import EngineInfo, EngineOutput, EngineRound


class EngineRun(EngineInfo):
    """An engine's outputs for a list of prompts."""

    outputs: Many[EngineOutput]
    # An engine that reports its rounds in specviz's trace schema (trace.RowRecord,
    # trace.RoundRecord, as dicts) gets every white-box view too.
    rows: list[dict] = []
    rounds: list[dict] = []


def declare_drafter(settings: dict, drafter: str | None, said_by: str) -> dict:
    """`settings` with the drafter the caller declares, one of DRAFTERS (None: as the engine said),
    as `settings["drafter"]`: an engine drafting with "model", the check's draft model, has its
    acceptance judged from its counters (forensics/acceptance.py). Where the engine's own settings
    (`said_by`: e.g. a file's header) name one, the two must agree."""
    if drafter is None:
        return settings
    if drafter not in DRAFTERS:
        raise SpecError(f"the engine's drafter is one of {', '.join(DRAFTERS)}, not {drafter!r}")
    own = settings.get("drafter")
    if own is not None and own != drafter:
        raise SpecError(f"{said_by} says the engine drafts with {own!r}, but it is declared to "
                        f"draft with {drafter!r}: drop one of the two or make them agree")
    return {**settings, "drafter": drafter}


def round_counters(rounds: list[EngineRound]) -> tuple[int | None, int]:
    """The drafts offered and accepted over an output's rounds; the drafts offered are unknown
    (None) where a round does not show them."""
    shown = all(r.shown for r in rounds)
    return (sum(len(r.drafts) for r in rounds) if shown else None,
            sum(r.accepted for r in rounds))


def rounds_seen(chunks: list[int], k: int | None,
                scores: list[float | None] | None = None) -> list[EngineRound] | None:
    """An output's rounds seen from outside: the tokens each engine step added to the request
    (`chunks`, empty ones left out), the first the prefill's token, each later one its accepted
    drafts and the target's own token (`scores`: the sequence's score after each, where reported).
    None where a chunk holds more than one round could (the first more than one token, another
    more than k + 1): steps merged before they were read, as a streaming server does for a client
    that reads behind."""
    steps = [(n, score) for n, score in zip(chunks, scores or [None] * len(chunks)) if n]
    if not steps or steps[0][0] != 1 or (k is not None and any(n > k + 1 for n, _ in steps)):
        return None
    return [EngineRound(drafts=[], accepted=n - 1, shown=i == 0, score=score)
            for i, (n, score) in enumerate(steps)]
