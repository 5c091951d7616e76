"""Stop strings in a server check: ids past the stop are not output.

A server sent the check's stop strings ends its answer at the token whose text completes one, and
reports `finish_reason` "stop": vLLM's ids keep that token and nothing after it, as a token-by-token
decode's do (decoding/stops.py). Under speculation the stop can complete inside an accepted block,
and an engine that trims the text there but not the block's later ids returns ids past its stop
(vLLM PR #47616). Those ids are flagged on the answer and cut off: what is judged is the output up
to its stop, never what the engine wrote past it."""
from __future__ import annotations

from specviz.decoding.stops import Stops
from specviz.engines.base import EngineRun
from specviz.trace.records import EngineOutput


def past_stops_cut(run: EngineRun, stops: Stops) -> EngineRun:
    """`run` with every answer that stopped at a stop cut at its first stop, and flagged where it
    held ids past it."""
    if not stops.strings:
        return run
    return run.model_copy(update={"outputs": [_cut(out, stops) for out in run.outputs]})


def _cut(out: EngineOutput, stops: Stops) -> EngineOutput:
    end = None if out.error or out.approximate else stops.end(out.ids)
    if out.finish_reason != "stop" or end is None or end == len(out.ids):
        return out
    past = len(out.ids) - end
    flag = (f"{past} token id{'s' if past > 1 else ''} past its stop at token {end - 1} (ids "
            f"{out.ids[end:end + 8]}{'...' if past > 8 else ''}): cut off, not judged (an "
            "accepted block trimmed in its text but not its ids, vLLM PR #47616)")
    kept = {"ids": out.ids[:end], "warning": " ".join(filter(None, (out.warning, flag))),
            "rounds": None, "drafts": None, "accepted": None}
    for field in ("logprobs", "top_logprobs"):
        if getattr(out, field) is not None:
            kept[field] = getattr(out, field)[:end]
    return out.model_copy(update=kept)
