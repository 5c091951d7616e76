"""What every engine adapter returns."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineOutput(_Strict):
    """One prompt's answer from the engine."""

    ids: list[int] = []  # output token ids, as the engine produced them
    logprobs: list[float] | None = None  # the engine's log-probability of each output token, where given
    top_logprobs: list[dict[int, float]] | None = None  # per output token: the engine's top alternatives, where given
    approximate: bool = False  # the engine gave text only: ids re-tokenized by specviz, so not exact
    finish_reason: str | None = None  # as reported ("stop", "length", ...)
    warning: str | None = None  # the output is kept but suspect (e.g. fewer tokens than asked, no stop reason)
    error: str | None = None  # this prompt failed (the server stopped answering, timed out, ...): the rest is kept


class EngineRun(_Strict):
    """An engine's outputs for a list of prompts, and what it said about itself."""

    name: str  # e.g. "vllm", or module:function
    version: str | None = None
    source: str  # "file", "server" or "callable"
    settings: dict = {}  # the engine's configuration as it reports it (speculative method, k, dtype, ...)
    outputs: list[EngineOutput]
    seconds: float | None = None  # wall time the engine took for all prompts, where known
