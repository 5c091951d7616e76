"""An engine's outputs from a file: one JSON object a line (JSONL), as any engine can write them.

    {"engine": {"name": "vllm", "version": "0.32.0", "settings": {"speculative": "ngram", "k": 5}}}
        optional, first
    {"prompt_ids": [1, 9690, ...], "output_ids": [504, 3458, ...], "logprobs": [-0.01, ...]}
    {"prompt": "What is the capital of France?", "output_ids": [...]}
    {"prompt": "...", "output_text": "Paris is ..."}

Each prompt line gives the prompt as token ids (`prompt_ids`, exactly what the engine was fed) or as
text (`prompt`: specviz applies the pair's tokenizer and chat template, as for any run), and the
output as token ids (`output_ids`) or, failing that, text (`output_text`: re-tokenized, and marked
approximate). Optional: `logprobs` (the engine's log-probability of each output token),
`top_logprobs` (per token, its top alternatives as {"id": logprob}), `finish_reason`, and `error`
(this prompt failed). The JSON Schema is docs/engine-outputs.schema.json (`specviz schema
--outputs`). Optional too: `drafts` and `accepted` (the draft tokens the engine offered for this
prompt and accepted, where it counts them), and `rounds`: the output ids cut into the engine's
rounds, each as {"drafts": [ids offered], "accepted": n} (a round emits its accepted drafts and one
token of the target's; the first token, written by the prefill, is a round with no drafts; the
counters follow from them where absent; a round seen from outside, whose drafts are not shown, is
{"drafts": [], "accepted": n, "shown": false}). An engine's rounds let specviz judge its decisions
(forensics/rejections.py). `score`: the sequence's cumulative log-probability as the engine reports
it (and a round's `score`, after that round), judged against its tokens' log-probabilities
(forensics/scores.py).

Files as users have them: fields this format does not name are ignored and listed
(`EngineInfo.ignored`), not refused. A line may also be a server's raw answer: `{"request": {...},
"response": {...}}` as sent to and answered by an OpenAI-compatible `/v1/completions` or llama.cpp's
`/completion` (dialects.py reads the answer; the prompt comes from the request), or a bare
OpenAI-compatible answer that carries its prompt's ids (vLLM's `prompt_token_ids`).
"""
from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from specviz.engines.base import EngineRun, declare_drafter, round_counters
from specviz.engines.dialects import read_choice, read_llamacpp
from specviz.spec.run import MAX_PROMPTS
from specviz.spec.strict import SpecError, describe_validation_error
from specviz.trace.records import EngineOutput, EngineRound

MAX_FILE_BYTES = 64 * 2**20
MAX_IGNORED = 32  # ignored field names listed, at most


class Header(BaseModel):
    """The optional first line: what the engine says about itself."""

    model_config = ConfigDict(extra="ignore")

    name: str
    version: str | None = None
    settings: dict = {}


class OutputLine(BaseModel):
    """One prompt and the engine's answer."""

    model_config = ConfigDict(extra="ignore")

    prompt: str | None = None
    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None
    output_text: str | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None
    drafts: int | None = None
    accepted: int | None = None
    rounds: list[EngineRound] | None = None
    score: float | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _one_of_each(self) -> OutputLine:
        if (self.prompt is None) == (self.prompt_ids is None):
            raise ValueError("give the prompt as `prompt` (text) or `prompt_ids`, exactly one")
        if self.error is None and (self.output_ids is None) == (self.output_text is None):
            raise ValueError("give the output as `output_ids` or `output_text`, exactly one")
        if self.prompt_ids == []:
            raise ValueError("prompt_ids is empty")
        if self.rounds is not None and self.output_ids is None:
            raise ValueError("`rounds` cut the output's token ids: give `output_ids` with them")
        return self


def outputs_schema() -> dict:
    return {"title": "specviz engine outputs (JSONL: one object a line)",
            "oneOf": [{"type": "object", "properties": {"engine": Header.model_json_schema()},
                       "required": ["engine"], "additionalProperties": False},
                      OutputLine.model_json_schema()]}


def parse(text: str | bytes, name: str) -> tuple[Header | None, list[OutputLine], list[str]]:
    """The header, the lines of an outputs file and the fields it holds that this format does not
    name; every problem is one SpecError naming the file and line."""
    if len(text) > MAX_FILE_BYTES:
        raise SpecError(f"{name} is {len(text) / 2**20:.1f} MiB; the limit is "
                        f"{MAX_FILE_BYTES // 2**20} MiB")
    try:
        text = text.decode("utf-8") if isinstance(text, bytes) else text
    except UnicodeDecodeError:
        raise SpecError(f"{name} is not UTF-8 text") from None
    header, lines, ignored = None, [], set()
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            if n == 1 and isinstance(obj, dict) and "engine" in obj:
                if set(obj) != {"engine"}:
                    raise ValueError("the header line holds only `engine`")
                header = Header.model_validate(obj["engine"])
                if isinstance(obj["engine"], dict):
                    ignored.update(f"engine.{k}" for k in obj["engine"]
                                   if k not in Header.model_fields)
            else:
                fields = _as_output_line(obj)
                ignored.update(k for k in fields if k not in OutputLine.model_fields)
                lines.append(OutputLine.model_validate(fields))
        except ValidationError as e:
            raise SpecError(f"{name}, line {n}: {describe_validation_error(e)}") from None
        except (ValueError, RecursionError) as e:
            raise SpecError(f"{name}, line {n}: not a JSON object of the outputs "
                            f"format ({e})") from None
        if len(lines) > MAX_PROMPTS:
            raise SpecError(f"{name} holds more than {MAX_PROMPTS} prompts")
    if not lines:
        raise SpecError(f"{name}: no output lines")
    return header, lines, sorted(ignored)[:MAX_IGNORED]


def _as_output_line(obj: object) -> dict:
    """A line's fields in this format's terms: as they are, or read off a server's raw answer."""
    if not isinstance(obj, dict):
        raise ValueError(f"a line is a JSON object, not {type(obj).__name__}")
    if "request" in obj and "response" in obj:
        request, response = obj["request"], obj["response"]
        if not isinstance(request, dict) or not isinstance(response, dict):
            raise ValueError("`request` and `response` are the JSON objects sent to and answered "
                             "by the server")
        prompt = request.get("prompt")
        key = "prompt_ids" if isinstance(prompt, list) else "prompt"
        # listed as ignored, if unknown
        rest = {k: v for k, v in obj.items() if k not in ("request", "response")}
        return {**rest, key: prompt, **_answer(response, prompt if key == "prompt_ids" else None)}
    if "choices" in obj:
        try:
            prompt = obj["choices"][0]["prompt_token_ids"]
        except (KeyError, IndexError, TypeError):
            raise ValueError("a bare server answer names no prompt ids (`prompt_token_ids`): give "
                             'each line as {"request": ..., "response": ...}') from None
        return {"prompt_ids": prompt, **_answer(obj, prompt)}
    return obj


def _answer(response: dict, prompt: list | None) -> dict:
    """The output fields of a raw OpenAI-compatible or llama.cpp answer."""
    if "choices" in response:
        choice = response["choices"][0]
        # text only: re-tokenized by from_lines, marked approximate
        if choice.get("token_ids") is None:
            return {"output_text": choice.get("text") or "",
                    "finish_reason": choice.get("finish_reason")}
        out = read_choice(choice, None, 0)
    elif "tokens" in response or "stop_type" in response:
        out = read_llamacpp(response, None, 0)
    else:
        raise ValueError("`response` is neither an OpenAI-compatible completion (`choices`) nor "
                         "llama.cpp's (`tokens`)")
    if out.error:
        return {"error": out.error}
    return {"output_ids": out.ids, "logprobs": out.logprobs, "top_logprobs": out.top_logprobs,
            "finish_reason": out.finish_reason, "drafts": out.drafts, "accepted": out.accepted}


def from_lines(header: Header | None, lines: list[OutputLine], tokenizer, name: str,
               ignored: list[str] = (), drafter: str | None = None) -> EngineRun:
    """The engine run a file describes; text outputs are re-tokenized (without special tokens) and
    marked approximate. `ignored`: the file's fields this format does not name, recorded. `drafter`:
    what the caller declares the engine drafts with, where the header does not say otherwise."""
    outputs = []
    for n, line in enumerate(lines):
        if line.error is not None:
            outputs.append(EngineOutput(error=line.error))
            continue
        approximate = line.output_ids is None
        ids = (tokenizer(line.output_text, add_special_tokens=False)["input_ids"] if approximate
               else line.output_ids)
        drafts, accepted = line.drafts, line.accepted
        if line.rounds and drafts is None and accepted is None:  # its counters, from its rounds
            drafts, accepted = round_counters(line.rounds)
        try:
            outputs.append(EngineOutput(
                ids=ids, logprobs=line.logprobs, top_logprobs=line.top_logprobs,
                approximate=approximate, finish_reason=line.finish_reason, drafts=drafts,
                accepted=accepted, rounds=line.rounds, score=line.score))
        except ValidationError as e:
            raise SpecError(f"{name}, prompt {n}: {describe_validation_error(e)}") from None
    info = header or Header(name=name)
    return EngineRun(name=info.name, version=info.version, source="file", outputs=outputs,
                     ignored=list(ignored),
                     settings=declare_drafter(info.settings, drafter, f"{name}'s header"))
