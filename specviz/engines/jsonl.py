"""An engine's outputs from a file: one JSON object a line (JSONL), as any engine can write them.

    {"engine": {"name": "vllm", "version": "0.32.0", "settings": {"speculative": "ngram", "k": 5}}}   optional, first
    {"prompt_ids": [1, 9690, ...], "output_ids": [504, 3458, ...], "logprobs": [-0.01, ...]}
    {"prompt": "What is the capital of France?", "output_ids": [...]}
    {"prompt": "...", "output_text": "Paris is ..."}

Each prompt line gives the prompt as token ids (`prompt_ids`, exactly what the engine was fed) or as text
(`prompt`: specviz applies the pair's tokenizer and chat template, as for any run), and the output as token
ids (`output_ids`) or, failing that, text (`output_text`: re-tokenized, and marked approximate).
Optional: `logprobs` (the engine's log-probability of each output token), `top_logprobs` (per token, its
top alternatives as {"id": logprob}), `finish_reason`, and `error` (this prompt failed). The JSON Schema is
docs/engine-outputs.schema.json (`specviz schema --outputs`).
"""
from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ..spec import MAX_PROMPTS, SpecError, describe_validation_error
from .base import EngineOutput, EngineRun

MAX_FILE_BYTES = 64 * 2**20


class Header(BaseModel):
    """The optional first line: what the engine says about itself."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: str | None = None
    settings: dict = {}


class OutputLine(BaseModel):
    """One prompt and the engine's answer."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = None
    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None
    output_text: str | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _one_of_each(self) -> OutputLine:
        if (self.prompt is None) == (self.prompt_ids is None):
            raise ValueError("give the prompt as `prompt` (text) or `prompt_ids`, exactly one")
        if self.error is None and (self.output_ids is None) == (self.output_text is None):
            raise ValueError("give the output as `output_ids` or `output_text`, exactly one")
        if self.prompt_ids == []:
            raise ValueError("prompt_ids is empty")
        return self


def schema() -> dict:
    return {"title": "specviz engine outputs (JSONL: one object a line)",
            "oneOf": [{"type": "object", "properties": {"engine": Header.model_json_schema()},
                       "required": ["engine"], "additionalProperties": False},
                      OutputLine.model_json_schema()]}


def parse(text: str | bytes, name: str) -> tuple[Header | None, list[OutputLine]]:
    """The header and the lines of an outputs file; every problem is one SpecError naming the file and line."""
    if len(text) > MAX_FILE_BYTES:
        raise SpecError(f"{name} is {len(text) / 2**20:.1f} MiB; the limit is {MAX_FILE_BYTES // 2**20} MiB")
    try:
        text = text.decode("utf-8") if isinstance(text, bytes) else text
    except UnicodeDecodeError:
        raise SpecError(f"{name} is not UTF-8 text") from None
    header, lines = None, []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            if n == 1 and isinstance(obj, dict) and "engine" in obj:
                if set(obj) != {"engine"}:
                    raise ValueError("the header line holds only `engine`")
                header = Header.model_validate(obj["engine"])
            else:
                lines.append(OutputLine.model_validate(obj))
        except ValidationError as e:
            raise SpecError(f"{name}, line {n}: {describe_validation_error(e)}") from None
        except (ValueError, RecursionError) as e:
            raise SpecError(f"{name}, line {n}: not a JSON object of the outputs format ({e})") from None
        if len(lines) > MAX_PROMPTS:
            raise SpecError(f"{name} holds more than {MAX_PROMPTS} prompts")
    if not lines:
        raise SpecError(f"{name}: no output lines")
    return header, lines


def from_lines(header: Header | None, lines: list[OutputLine], tokenizer, name: str) -> EngineRun:
    """The engine run a file describes; text outputs are re-tokenized (without special tokens) and marked approximate."""
    outputs = []
    for line in lines:
        if line.error is not None:
            outputs.append(EngineOutput(error=line.error))
            continue
        approximate = line.output_ids is None
        ids = tokenizer(line.output_text, add_special_tokens=False)["input_ids"] if approximate else line.output_ids
        outputs.append(EngineOutput(ids=ids, logprobs=line.logprobs, top_logprobs=line.top_logprobs,
                                    approximate=approximate, finish_reason=line.finish_reason))
    info = header or Header(name=name)
    return EngineRun(name=info.name, version=info.version, settings=info.settings, source="file", outputs=outputs)
