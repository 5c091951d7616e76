"""`specviz check`: did speculative decoding change an engine's outputs, and is each difference numerics or a bug?

The engine (a file of its outputs, an OpenAI-compatible server, a Python callable; engines/) answers the
prompts; specviz decodes the batch-size-1 reference of the same target weights beside it, measures its own
noise floor (noise.py), and judges every difference from outside (forensics.judge_engine). A control run of
the same engine without speculation, when given, separates "speculation changed it" from "this engine
differs from transformers anyway". The result is a trace like any other, of method `engine`.
"""
from __future__ import annotations

from pydantic import ValidationError

from . import metrics
from .decoding.result import DecodeResult, SequenceOutput
from .engines.base import EngineInfo, EngineRun
from .engines.jsonl import OutputLine
from .forensics import judge_engine
from .models import ModelPair
from .runner import floors_for, reference_for
from .spec import RunSpec, SpecError, describe_validation_error
from .trace import RoundRecord, RowRecord, Trace, build_trace


def prompts_of(lines: list[OutputLine], pair: ModelPair, chat_template: bool) -> tuple[list[str], list[list[int]]]:
    """The prompts of an outputs file, as text and as ids: ids as given, text through the tokenizer (and the chat
    template, as for any run)."""
    ids = [line.prompt_ids or pair.encode([line.prompt], chat_template)[0] for line in lines]
    texts = [line.prompt if line.prompt is not None else pair.tokenizer.decode(line.prompt_ids) for line in lines]
    return texts, ids


def check(spec: RunSpec, pair: ModelPair, prompt_ids: list[list[int]], engine: EngineRun,
          control: EngineRun | None = None) -> Trace:
    """The trace of `engine`'s outputs for `prompt_ids`, judged against the reference (`spec`: method engine)."""
    for run, role in ((engine, "engine"), (control, "control run")):
        if run is not None and len(run.outputs) != len(prompt_ids):
            raise SpecError(f"the {role} answered {len(run.outputs)} prompts of {len(prompt_ids)}")
    ref = reference_for(pair, prompt_ids, spec.max_new_tokens)
    answered = DecodeResult([SequenceOutput(o.ids) for o in engine.outputs], engine.seconds or 0.0)
    trace = build_trace(spec, pair, prompt_ids, answered, ref, floors_for(spec, pair, prompt_ids, ref))
    trace.manifest.engine = _info(engine)
    if control is not None:
        trace.manifest.control = _info(control)
    try:  # an engine that reports its rounds in our schema gets the white-box views too
        trace.rows = [RowRecord.model_validate(r) for r in engine.rows]
        trace.rounds = [RoundRecord.model_validate(r) for r in engine.rounds]
    except ValidationError as e:
        raise SpecError(f"the engine's rounds are not in specviz's trace schema: {describe_validation_error(e)}") from None
    for s in trace.sequences:
        s.engine = engine.outputs[s.seq]
        s.control = control.outputs[s.seq] if control else None
        if s.engine.error:  # no answer: nothing to compare
            s.equivalent = s.first_divergence = None
        elif s.engine.approximate and pair.tokenizer.decode(s.output_ids) == pair.tokenizer.decode(s.reference_ids):
            s.equivalent, s.first_divergence = True, None  # re-tokenized text: the same text is the same answer
    judge_engine(trace, pair)
    return trace


def summary(trace: Trace) -> list[dict]:
    """Table-1 rows of an engine check: the engine, then its control run when given."""
    rows = []
    for role, info in (("engine", trace.manifest.engine), ("control", trace.manifest.control)):
        if info is None:
            continue
        answers = [(getattr(s, role), s) for s in trace.sequences]
        answered = [(o, s) for o, s in answers if not o.error]
        if role == "engine":
            exact = [bool(s.equivalent) for _, s in answered]
            prefix = [1.0 if s.equivalent else metrics.prefix_match(o.ids, s.reference_ids) for o, s in answered]
        else:
            exact = [o.ids == s.reference_ids for o, s in answered]
            prefix = [metrics.prefix_match(o.ids, s.reference_ids) for o, s in answered]
        tokens = sum(len(o.ids) for o, _ in answered)
        rows.append({
            "engine": " ".join(x for x in (info.name, info.version, "(control, no speculation)" * (role == "control")) if x),
            "role": role, "n": len(answered), "errors": len(answers) - len(answered),
            "exact_pct": 100 * sum(exact) / len(exact) if exact else 0.0,
            "prefix_pct": 100 * sum(prefix) / len(prefix) if prefix else 0.0,
            "tokens_per_second": tokens / info.seconds if info.seconds else None,
            "verdicts": metrics.verdict_counts(trace) if role == "engine" else {},
        })
    return rows


def _info(run: EngineRun) -> EngineInfo:
    return EngineInfo(**run.model_dump(include=set(EngineInfo.model_fields)))
