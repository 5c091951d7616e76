"""An OpenAI-compatible completions server as an engine (docs/engines.md).

Each prompt goes out as token ids (the caller applied the chat template) to
/v1/completions, greedy (temperature 0) or, for a sampled check, with the
check's temperature, top-p and top-k, every other sampling knob neutral, and a
seed of its own per prompt (request_seed: the check's seed and the prompt's
index, so a run repeats), with the check's token budget and `concurrency`
requests in flight so that the server batches them. We ask for
the generated ids (`return_token_ids`) and for the logprob of each chosen
token with its top alternatives keyed by id (`return_tokens_as_token_ids`):
vLLM honours both. A server that ignores them returns text only; that text is
re-tokenized with the pair's tokenizer and the ids are marked approximate.

A prompt that fails (timeout, dropped connection, HTTP error) gets `error` and
the others keep their outputs; only a server that does not answer at all, or
does not serve the asked model, stops the run.
"""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from ..spec import SpecError
from .base import EngineOutput, EngineRun

TOKEN_ID = re.compile(r"token_id:(\d+)")
# vLLM's Prometheus counters of speculative decoding, e.g. `vllm:spec_decode_num_drafts_total{...} 12.0`.
SPEC_COUNTER = re.compile(r"^vllm:spec_decode_num_(\w+?)_total(?:\{([^}]*)\})? (\S+)$", re.MULTILINE)
SEEDS_PER_RUN = 4096  # a request's seed: the run's seed x this + the prompt's index (at most spec.MAX_PROMPTS)
# The sampling knobs a sampled request sets to "off", so that a server's or a model's defaults (vLLM takes them
# from the checkpoint's generation_config) cannot change the distribution behind the check's back.
NEUTRAL = {"min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def request_seed(seed: int, index: int) -> int:
    """The seed of prompt `index`'s request in a sampled run seeded `seed`: one stream per prompt, the same
    streams every time the run is repeated."""
    return seed * SEEDS_PER_RUN + index


def sampling_request(temperature: float, top_p: float = 1.0, top_k: int = 0) -> dict:
    """The sampling fields of a completions request: temperature 0 alone for greedy (as always); else the
    temperature, top-p, top-k (-1 when off: vLLM 0.32 takes 0 or -1 for off, older versions and SGLang only
    -1) and every other knob neutral."""
    if temperature == 0:
        return {"temperature": 0}
    return {"temperature": temperature, "top_p": top_p, "top_k": top_k or -1, **NEUTRAL}


def from_server(url: str, served_model: str | None, prompt_ids: list[list[int]], max_new_tokens: int,
                concurrency: int = 8, timeout: float = 300.0, top_logprobs: int = 5, tokenizer=None,
                launch: dict | None = None, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                seed: int = 0) -> EngineRun:
    """Completions of `prompt_ids` from the server at `url` (given with or without /v1): greedy, or sampled
    at `temperature` > 0 with `top_p`, `top_k` (0: off) and prompt i's request seeded request_seed(seed, i).

    `served_model` None takes the one model the server serves. `timeout` (seconds) bounds each request's
    wait for its answer. `tokenizer` (the pair's) re-tokenizes text-only answers; without one they are
    errors. `launch` is how the server was started, where the caller knows it: recorded as given.
    """
    base = url.rstrip("/").removesuffix("/v1")
    with httpx.Client(base_url=base, timeout=timeout) as client:
        card = _model_card(client, base, served_model)
        version = (_get_json(client, "/version") or {}).get("version")
        before = _spec_counters(client)
        sampled = sampling_request(temperature, top_p, top_k)
        request = {"model": card["id"], "max_tokens": max_new_tokens, **sampled,
                   "logprobs": top_logprobs or None, "return_token_ids": True, "return_tokens_as_token_ids": True}

        def complete(i: int) -> tuple[EngineOutput, str | None]:
            ids = prompt_ids[i]
            sent = {**request, "prompt": ids, **({"seed": request_seed(seed, i)} if temperature else {})}
            try:
                r = client.post("/v1/completions", json=sent)
            except httpx.TimeoutException:
                return EngineOutput(error=f"no answer from {base} within {timeout:g} s"), None
            except httpx.TransportError as e:
                return EngineOutput(error=f"{base} stopped answering: {e!r}"), None
            if r.status_code != 200:
                return EngineOutput(error=f"{base} answered HTTP {r.status_code}: {r.text[:300]}"), None
            try:
                body = r.json()
                choice = body["choices"][0]
            except (ValueError, KeyError, IndexError, TypeError):
                return EngineOutput(error=f"{base} answered without a completion: {r.text[:300]}"), None
            return read_choice(choice, ids, max_new_tokens, tokenizer), body.get("system_fingerprint")

        start = time.perf_counter()
        with ThreadPoolExecutor(max(1, concurrency)) as pool:
            answers = list(pool.map(complete, range(len(prompt_ids))))
        seconds = time.perf_counter() - start
        after = _spec_counters(client)
    settings = {"served_model": card["id"], "model_root": card.get("root"), "max_model_len": card.get("max_model_len"),
                "system_fingerprint": next((fp for _, fp in answers if fp), None)}
    if before is not None and after:
        settings["spec_decode"] = {name: after[name] - before.get(name, 0) for name in after}
    if temperature:
        settings["sampling"] = {**sampled, "seed": seed, "request_seed": f"seed x {SEEDS_PER_RUN} + prompt index"}
    if launch:
        settings["launch"] = launch
    return EngineRun(name=card.get("owned_by") or "openai-compatible", version=version, source="server",
                     settings=settings, outputs=[out for out, _ in answers], seconds=seconds)


def read_choice(choice: dict, prompt: list[int], max_new_tokens: int, tokenizer=None) -> EngineOutput:
    """One completion choice as an EngineOutput: its ids (or its text re-tokenized), logprobs where given,
    and what looks wrong with it."""
    finish = choice.get("finish_reason")
    ids, approximate = choice.get("token_ids"), False
    if ids is None:
        if tokenizer is None:
            return EngineOutput(finish_reason=finish, error="the server returned text only, and no tokenizer "
                                "was given to re-tokenize it")
        ids, approximate = tokenizer(choice.get("text") or "", add_special_tokens=False)["input_ids"], True
        if finish == "stop" and tokenizer.eos_token_id is not None:
            ids.append(tokenizer.eos_token_id)  # we send no stop strings: "stop" is the EOS, which the text omits
    out = EngineOutput(ids=ids, approximate=approximate, finish_reason=finish)
    if not approximate:  # logprobs follow the server's tokens, which re-tokenized text need not match
        out.logprobs, out.top_logprobs = _read_logprobs(choice.get("logprobs"), len(ids))
    seen = choice.get("prompt_token_ids")
    if seen is not None and list(seen) != list(prompt):
        out.error = f"the server decoded a different prompt ({len(seen)} tokens) from the one sent ({len(prompt)})"
    elif len(ids) < max_new_tokens and finish != "stop":
        out.warning = (f"{len(ids)} of {max_new_tokens} tokens with finish reason {finish!r}: "
                       "the server cut this output short")
    return out


def _read_logprobs(logprobs: dict | None, n: int) -> tuple[list[float] | None, list[dict[int, float]] | None]:
    """The OpenAI completions logprobs block: per token its logprob, and its top alternatives when keyed by
    id ("token_id:N"); None for what is missing, partial or keyed by text."""
    if not logprobs:
        return None, None
    chosen = logprobs.get("token_logprobs") or []
    chosen = chosen if len(chosen) == n and None not in chosen else None
    top = logprobs.get("top_logprobs") or []
    try:
        top = [{int(TOKEN_ID.fullmatch(k)[1]): v for k, v in alts.items()} for alts in top] if len(top) == n else None
    except (TypeError, AttributeError):  # a missing step, or alternatives keyed by text
        top = None
    return chosen, top


def _get_json(client: httpx.Client, path: str) -> dict | None:
    """GET path as JSON; None when the server has no such endpoint or answers anything else."""
    try:
        r = client.get(path)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _model_card(client: httpx.Client, base: str, served_model: str | None) -> dict:
    """The served model's entry in /v1/models; a clear error when nothing answers or the model is not served."""
    try:
        r = client.get("/v1/models")
    except httpx.HTTPError as e:
        raise SpecError(f"no OpenAI-compatible server answers at {base}: {e!r}. Is it running, "
                        "and is that its address and port?") from None
    try:
        cards = r.json()["data"] if r.status_code == 200 else None
    except (ValueError, KeyError, TypeError):
        cards = None
    if not cards:
        raise SpecError(f"{base}/v1/models answered HTTP {r.status_code} without a model list: {r.text[:200]}; "
                        "is this an OpenAI-compatible server?")
    names = [c.get("id") for c in cards]
    if served_model is None and len(cards) == 1:
        return cards[0]
    if served_model in names:
        return cards[names.index(served_model)]
    raise SpecError(f"{base} serves {', '.join(map(str, names))}; name one as the served model"
                    + (f" (not {served_model!r})" if served_model else ""))


def _spec_counters(client: httpx.Client) -> dict[str, float] | None:
    """vLLM's speculative-decoding counters from /metrics, summed over engines: drafts, draft_tokens,
    accepted_tokens and accepted_tokens_per_pos_<i>. Empty without speculation; None without /metrics."""
    try:
        r = client.get("/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    counters: dict[str, float] = {}
    for name, labels, value in SPEC_COUNTER.findall(r.text):
        pos = re.search(r'position="(\d+)"', labels or "")
        key = f"{name}_{pos[1]}" if pos else name
        counters[key] = counters.get(key, 0.0) + float(value)
    return counters
