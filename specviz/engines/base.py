"""What every engine adapter returns: the engine as it described itself, and its outputs (trace/records.py
keeps both in a trace)."""
from __future__ import annotations

from specviz.spec.run import Many
from specviz.trace.records import EngineInfo, EngineOutput


class EngineRun(EngineInfo):
    """An engine's outputs for a list of prompts."""

    outputs: Many[EngineOutput]
    # An engine that reports its rounds in specviz's trace schema (trace.RowRecord, trace.RoundRecord, as dicts)
    # gets every white-box view too.
    rows: list[dict] = []
    rounds: list[dict] = []
