"""What a completion request says, and what its answer means, in each server's own terms.

- OpenAI-compatible `/v1/completions` (vLLM, SGLang, ...): the prompt as token ids, and vLLM's
  extras for the generated ids (`return_token_ids`) and each token's top alternatives keyed by id
  (`return_tokens_as_token_ids`). A server that ignores them returns text only: re-tokenized with
  the pair's tokenizer, the ids are marked approximate. Streamed, the answer comes in chunks, one
  per engine step that added tokens to the request: its rounds, seen from outside.
- llama.cpp's native `/completion` (its OpenAI endpoint returns text only): the prompt as token ids
  (no BOS is added to an id array), the ids back with `return_tokens`, the top alternatives with
  `n_probs`, no prompt cache (a cached prefix is computed by another batch shape), and per request
  the drafts it offered and accepted (`timings`).

Greedy requests say temperature 0 alone. Sampled requests set temperature, top-p and top-k (off: -1
for vLLM, 0 for llama.cpp) in specviz's order (temperature, then top-k, then top-p) and every other
knob off, so that a server's or a model's defaults (vLLM reads them from the checkpoint, llama.cpp
has top-k 40 and min-p 0.05) cannot change the distribution behind the check's back; each prompt
gets a seed of its own.
"""
from __future__ import annotations

import re

from specviz.trace.records import EngineOutput

TOKEN_ID = re.compile(r"token_id:(\d+)")
# The sampling knobs a sampled OpenAI-compatible request sets to "off".
NEUTRAL = {"min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
           "frequency_penalty": 0.0}
# The same for llama.cpp, whose sampler chain also holds typical-p, XTC, DRY, top-n-sigma
# and mirostat.
LLAMA_NEUTRAL = {"min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                 "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
                 "top_n_sigma": -1.0, "mirostat": 0, "dynatemp_range": 0.0,
                 "samplers": ["temperature", "top_k", "top_p"]}
LLAMA_FINISH = {"eos": "stop", "word": "stop", "limit": "length"}


def sampling_request(temperature: float, top_p: float = 1.0, top_k: int = 0) -> dict:
    """The sampling fields of an OpenAI-compatible request: temperature 0 alone for greedy; else the
    temperature, top-p, top-k (-1 when off: vLLM 0.32 takes 0 or -1 for off, older versions and
    SGLang only -1) and every other knob neutral."""
    if temperature == 0:
        return {"temperature": 0}
    return {"temperature": temperature, "top_p": top_p, "top_k": top_k or -1, **NEUTRAL}


class Dialect:
    """A server's request format: `base` holds every field but the prompt and its seed."""

    base: dict

    def request(self, prompt: list[int], seed: int | None) -> dict:
        return {**self.base, "prompt": prompt, **({"seed": seed} if seed is not None else {})}


class OpenAI(Dialect):
    """OpenAI-compatible completions, with vLLM's extras."""

    name = "openai-compatible"
    path = "/v1/completions"

    def __init__(self, model: str, max_new_tokens: int, temperature: float, top_p: float,
                 top_k: int, top_logprobs: int, stream: bool = False, stop: tuple[str, ...] = ()):
        self.sampling = sampling_request(temperature, top_p, top_k)
        self.stream = stream
        self.base = {"model": model, "max_tokens": max_new_tokens, **self.sampling,
                     "logprobs": top_logprobs or None, "return_token_ids": True,
                     "return_tokens_as_token_ids": True, **({"stream": True} if stream else {}),
                     **({"stop": list(stop)} if stop else {})}

    @staticmethod
    def read(body: dict, prompt: list[int] | None, max_new_tokens: int,
             tokenizer=None) -> EngineOutput:
        return read_choice(body["choices"][0], prompt, max_new_tokens, tokenizer)


class LlamaCpp(Dialect):
    """llama.cpp's native completion endpoint."""

    name = "llama.cpp"
    path = "/completion"

    def __init__(self, model: str, max_new_tokens: int, temperature: float, top_p: float,
                 top_k: int, top_logprobs: int, stop: tuple[str, ...] = ()):
        self.sampling = ({"temperature": 0} if temperature == 0 else
                         {"temperature": temperature, "top_p": top_p, "top_k": top_k,
                          **LLAMA_NEUTRAL})
        self.base = {"n_predict": max_new_tokens, **self.sampling, "return_tokens": True,
                     "n_probs": top_logprobs, "cache_prompt": False,
                     **({"stop": list(stop)} if stop else {})}

    @staticmethod
    def read(body: dict, prompt: list[int] | None, max_new_tokens: int,
             tokenizer=None) -> EngineOutput:
        return read_llamacpp(body, prompt, max_new_tokens)


def read_choice(choice: dict, prompt: list[int] | None, max_new_tokens: int,
                tokenizer=None) -> EngineOutput:
    """One OpenAI completion choice as an EngineOutput: its ids (or its text re-tokenized), logprobs
    where given, and what looks wrong with it."""
    finish = choice.get("finish_reason")
    ids, approximate = choice.get("token_ids"), False
    if ids is None:
        if tokenizer is None:
            return EngineOutput(finish_reason=finish,
                                error="the server returned text only, and no tokenizer was given "
                                      "to re-tokenize it")
        ids, approximate = tokenizer(choice.get("text") or "",
                                     add_special_tokens=False)["input_ids"], True
        if finish == "stop" and tokenizer.eos_token_id is not None:
            # we send no stop strings: "stop" is the EOS, which the text omits
            ids.append(tokenizer.eos_token_id)
    out = EngineOutput(ids=ids, approximate=approximate, finish_reason=finish)
    # logprobs follow the server's tokens, which re-tokenized text need not match
    if not approximate:
        out.logprobs, out.top_logprobs = _openai_logprobs(choice.get("logprobs"), len(ids))
    seen = choice.get("prompt_token_ids")
    differs = (len(seen) if seen is not None and prompt is not None and list(seen) != list(prompt)
               else None)
    return _checked(out, prompt, differs, max_new_tokens, cut=finish != "stop")


def joined_chunks(chunks: list[dict]) -> tuple[dict, list[int]]:
    """A streamed completion's chunks (server-sent events, each a completion with one choice) as
    one choice, and the number of token ids each chunk added (0: a chunk with none)."""
    choices = [c["choices"][0] for c in chunks if c.get("choices")]
    joined: dict = {"token_ids": [], "text": "", "finish_reason": None}
    logprobs = {"token_logprobs": [], "top_logprobs": []}
    for c in choices:
        joined["token_ids"] += c.get("token_ids") or []
        joined["text"] += c.get("text") or ""
        joined["finish_reason"] = c.get("finish_reason") or joined["finish_reason"]
        joined.setdefault("prompt_token_ids", c.get("prompt_token_ids"))
        for field in logprobs:
            logprobs[field] += (c.get("logprobs") or {}).get(field) or []
    joined["logprobs"] = logprobs if any(logprobs.values()) else None
    return joined, [len(c.get("token_ids") or []) for c in choices]


def read_llamacpp(body: dict, prompt: list[int] | None, max_new_tokens: int) -> EngineOutput:
    """One llama.cpp /completion answer as an EngineOutput: `tokens`, the log-probabilities of
    `completion_probabilities`, the drafts of `timings`."""
    ids = body.get("tokens")
    finish = LLAMA_FINISH.get(body.get("stop_type"), body.get("stop_type"))
    if not isinstance(ids, list):
        return EngineOutput(finish_reason=finish,
                            error="llama.cpp answered without token ids (`tokens`): was the "
                                  "request sent with return_tokens?")
    timings = body.get("timings") if isinstance(body.get("timings"), dict) else {}
    out = EngineOutput(ids=ids, finish_reason=finish, drafts=timings.get("draft_n"),
                       accepted=timings.get("draft_n_accepted"))
    out.logprobs, out.top_logprobs = _llamacpp_logprobs(body.get("completion_probabilities"),
                                                        len(ids))
    evaluated = body.get("tokens_evaluated")  # with no prompt cache, every prompt token
    differs = evaluated if prompt is not None and evaluated not in (None, len(prompt)) else None
    return _checked(out, prompt, differs, max_new_tokens, cut=finish != "stop")


def _checked(out: EngineOutput, prompt: list[int] | None, differs: int | None, max_new_tokens: int,
             cut: bool) -> EngineOutput:
    """Flag an answer to another prompt than the one sent (`differs`: the length of the one the
    server decoded; an error), or one cut short (a warning)."""
    if differs is not None:
        out.error = (f"the server decoded a different prompt ({differs} tokens) from the one sent "
                     f"({len(prompt)})")
    elif len(out.ids) < max_new_tokens and cut:
        out.warning = (f"{len(out.ids)} of {max_new_tokens} tokens with finish reason "
                       f"{out.finish_reason!r}: the server cut this output short")
    return out


def _openai_logprobs(logprobs: dict | None,
                     n: int) -> tuple[list[float] | None, list[dict[int, float]] | None]:
    """The OpenAI completions logprobs block: per token its logprob, and its top alternatives when
    keyed by id ("token_id:N"); None for what is missing, partial or keyed by text."""
    if not logprobs:
        return None, None
    chosen = logprobs.get("token_logprobs") or []
    chosen = chosen if len(chosen) == n and None not in chosen else None
    top = logprobs.get("top_logprobs") or []
    try:
        top = ([{int(TOKEN_ID.fullmatch(k)[1]): v for k, v in alts.items()} for alts in top]
               if len(top) == n else None)
    except (TypeError, AttributeError):  # a missing step, or alternatives keyed by text
        top = None
    return chosen, top


def _llamacpp_logprobs(probs: list | None,
                       n: int) -> tuple[list[float] | None, list[dict[int, float]] | None]:
    """llama.cpp's completion_probabilities: per token {"id", "logprob", "top_logprobs": [{"id",
    "logprob"}]}; None for what is missing or partial. Under speculation llama.cpp computes them for
    a request's first round only: the others come with no alternatives and a placeholder logprob of
    0, which is no measurement."""
    if not isinstance(probs, list) or len(probs) != n:
        return None, None
    try:
        chosen = [float(p["logprob"]) for p in probs]
        top = [{int(a["id"]): float(a["logprob"]) for a in p["top_logprobs"]} for p in probs]
    except (TypeError, KeyError, ValueError):
        return None, None
    if not all(top):
        return None, None
    return chosen, top
