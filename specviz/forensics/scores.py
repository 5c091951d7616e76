"""The score judge: a sequence's reported score against its tokens' log-probabilities.

Engines that report a sequence's cumulative log-probability (OpenVINO GenAI's `score`) add each
emitted token's log-probability to it, and under speculation must take back what a rejected draft
added. That bookkeeping can go wrong while the tokens and each token's log-probability stay right
(OpenVINO GenAI 2026.4: a score that is not the sum of the log-probabilities it reports beside it).
So the score after each round is judged against the sum of the engine's own log-probabilities of
the tokens so far: the same numbers, only added up, so no rounding of the model's excuses a
difference; adding n of them in float32 moves the sum by at most n x 2^-24 of their total size.
The first round past that bound is a `decision-bug:score` at that round's first token, with the
target's float64 sum beside it. Only sequences whose tokens no other verdict named, and whose
engine reported log-probabilities as well as its score, are judged.
"""
from __future__ import annotations

from specviz.forensics.enginenoise import Forced
from specviz.trace.evidence import EngineForensics
from specviz.trace.findings import Findings
from specviz.trace.records import EngineOutput
from specviz.trace.schema import Trace

FLOAT32_STEP = 2.0**-24  # float32's relative rounding of one addition
FLOOR = 1e-6  # the reported numbers' own float32 resolution near zero


def judge_scores(trace: Trace, forced: dict[tuple[str, int], Forced]) -> Findings:
    """`forensics` of every sequence whose reported score departs from the sum of its reported
    log-probabilities; `forced`: (role, seq) -> the outputs teacher-forced through the target."""
    found = Findings()
    for s in trace.sequences:
        out = s.engine
        if (out is None or out.error or out.score is None or out.logprobs is None
                or s.forensics is not None or not out.ids):
            continue
        truth = forced.get(("engine", s.seq))
        if (hit := _first_wrong(out)) is not None:
            found.of(s.seq)["forensics"] = _finding(out, truth, *hit)
    return found


def bound(logprobs: list[float]) -> float:
    """How far adding `logprobs` up in float32 can move their sum."""
    return len(logprobs) * FLOAT32_STEP * sum(map(abs, logprobs)) + FLOOR


def _checkpoints(out: EngineOutput) -> list[tuple[int | None, int, float]]:
    """(round, tokens emitted through it, score reported after it): per round where the engine
    reported a score there, else the sequence's final score alone."""
    rounds = out.rounds or []
    if rounds and all(r.score is not None for r in rounds):
        return [(n, end, r.score) for n, (r, (_, end)) in enumerate(zip(rounds, out.spans()))]
    return [(None, len(out.ids), out.score)]


def _first_wrong(out: EngineOutput) -> tuple[int | None, int, int, float] | None:
    """The first checkpoint past the bound: (round, its first token, tokens through it, score)."""
    start = 0
    for n, end, score in _checkpoints(out):
        if abs(score - sum(out.logprobs[:end])) > bound(out.logprobs[:end]):
            return n, start if n is not None else 0, end, score
        start = end
    return None


def _finding(out: EngineOutput, truth: Forced | None, n: int | None, fork: int, end: int,
             score: float) -> EngineForensics:
    own = sum(out.logprobs[:end])
    accepted = n is not None and out.rounds[n].accepted
    where = (f"after round {n} (tokens {fork} to {end - 1}, {accepted} "
             f"draft{'' if accepted == 1 else 's'} accepted)" if n is not None
             else f"for its {end} tokens")
    target = ("" if truth is None else
              f" The target's float64 log-probabilities of the same tokens sum to "
              f"{sum(truth.logprobs[:end]):.6g}.")
    return EngineForensics(
        verdict="decision-bug:score", fork=fork, output_token=out.ids[fork], score=score,
        score_expected=own, tolerance=bound(out.logprobs[:end]),
        explanation=(f"The tokens are right, but the score the engine reports {where} is "
                     f"{score:.6g} where its own log-probabilities of those tokens sum to "
                     f"{own:.6g}: {abs(score - own):.3g} apart, where adding them in float32 "
                     f"moves the sum by at most {bound(out.logprobs[:end]):.2g}.{target}"))
