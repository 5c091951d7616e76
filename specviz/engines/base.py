"""What every engine adapter returns, and what a trace keeps of it."""
from __future__ import annotations

from ..spec import Many, Map, Strict


class EngineOutput(Strict):
    """One prompt's answer from the engine."""

    ids: Many[int] = []  # output token ids, as the engine produced them
    logprobs: Many[float] | None = None  # the engine's log-probability of each output token, where given
    top_logprobs: Many[Map[int, float]] | None = None  # per output token: the engine's top alternatives, where given
    approximate: bool = False  # the engine gave text only: ids re-tokenized by specviz, so not exact
    finish_reason: str | None = None  # as reported ("stop", "length", ...)
    warning: str | None = None  # the output is kept but suspect (e.g. fewer tokens than asked, no stop reason)
    error: str | None = None  # this prompt failed (the server stopped answering, timed out, ...): the rest is kept


class EngineInfo(Strict):
    """What the engine said about itself."""

    name: str  # e.g. "vllm", or module:function
    version: str | None = None
    source: str  # "file", "server" or "callable"
    settings: dict = {}  # its configuration as it reports it (speculative method, k, dtype, ...)
    seconds: float | None = None  # wall time it took for all prompts, where known


class EngineRun(EngineInfo):
    """An engine's outputs for a list of prompts."""

    outputs: Many[EngineOutput]
    # An engine that reports its rounds in specviz's trace schema (trace.RowRecord, trace.RoundRecord, as dicts)
    # gets every white-box view too.
    rows: list[dict] = []
    rounds: list[dict] = []
