"""An engine behind an HTTP server: OpenAI-compatible completions (vLLM and others), or llama.cpp's
own (docs/engines.md). Which one is read off /v1/models (llama.cpp's cards are owned by "llamacpp");
what each is sent and how its answers are read is dialects.py's.

Each prompt goes out as token ids (the caller applied the chat template), greedy or, for a sampled
check, with the check's temperature, top-p and top-k and a seed of its own per prompt (request_seed:
the check's seed and the prompt's index, so a run repeats), with the check's token budget and
`concurrency` requests in flight so that the server batches them. The server's speculative-decoding
counters (/metrics, where it has them) are read before and after.

A prompt that fails (timeout, dropped connection, HTTP error) gets `error` and the others keep their
outputs; only a server that does not answer at all, or does not serve the asked model, stops
the run.
"""
from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from specviz.engines.base import EngineRun, declare_drafter, round_counters, rounds_seen
from specviz.engines.dialects import LlamaCpp, OpenAI, joined_chunks, read_choice
from specviz.spec.strict import SpecError
from specviz.trace.records import EngineOutput

# Speculative-decoding counters, e.g. `vllm:spec_decode_num_drafts_total{...} 12.0` (llama.cpp names
# them alike).
SPEC_COUNTER = re.compile(r"^(?:vllm|llamacpp):spec_decode_num_(\w+?)_total(?:\{([^}]*)\})? (\S+)$",
                          re.MULTILINE)
# vLLM's prefix cache counters, in tokens: `vllm:prefix_cache_hits_total{...} 96.0`, and queries.
PREFIX_COUNTER = re.compile(r"^vllm:prefix_cache_(queries|hits)_total(?:\{[^}]*\})? (\S+)$",
                            re.MULTILINE)
# a request's seed: the run's seed x this + the prompt's index (at most spec.MAX_PROMPTS)
SEEDS_PER_RUN = 4096


def request_seed(seed: int, index: int) -> int:
    """The seed of prompt `index`'s request in a sampled run seeded `seed`: one stream per prompt,
    the same streams every time the run is repeated."""
    return seed * SEEDS_PER_RUN + index


def from_server(url: str, served_model: str | None, prompt_ids: list[list[int]],
                max_new_tokens: int, concurrency: int = 8, timeout: float = 300.0,
                top_logprobs: int = 5, tokenizer=None,
                launch: dict | None = None, temperature: float = 0.0, top_p: float = 1.0,
                top_k: int = 0, seed: int = 0, order: list[int] | None = None,
                drafter: str | None = None, stream: bool = False,
                k: int | None = None, stop: tuple[str, ...] = ()) -> EngineRun:
    """Completions of `prompt_ids` from the server at `url` (given with or without /v1): greedy, or
    sampled at `temperature` > 0 with `top_p`, `top_k` (0: off) and prompt i's request seeded
    request_seed(seed, i).

    `served_model` None takes the one model the server serves. `timeout` (seconds) bounds each
    request's wait for its answer. `tokenizer` (the pair's) re-tokenizes text-only answers; without
    one they are errors. `launch` is how the server was started, where the caller knows it: recorded
    as given. `order`: the order the prompts are sent in (each still answered as prompt i, with its
    own seed); default, as given. `drafter`: what the caller knows the server drafts with
    (spec/drafters.DRAFTERS), recorded in its settings; a server does not say. `stream`: an
    OpenAI-compatible server streams each answer, and its chunks are the request's rounds, seen
    from outside (`k`: the engine's draft length; a chunk longer than a round can be drops them).
    `stop`: stop strings, sent to the server (vLLM's and llama.cpp's ids end at the token that
    completes one: run/stopped.py reads them so).
    """
    base = url.rstrip("/").removesuffix("/v1")
    with httpx.Client(base_url=base, timeout=timeout) as client:
        card = _model_card(client, base, served_model)
        llama = card.get("owned_by") == "llamacpp"
        if llama and stream:
            raise SpecError("llama.cpp streams its tokens one at a time, whatever a step accepted: "
                            "its rounds are not seen in its stream (its answers count their "
                            "drafts). Check it without --stream")
        dialect = (LlamaCpp(card["id"], max_new_tokens, temperature, top_p, top_k, top_logprobs,
                            stop)
                   if llama else OpenAI(card["id"], max_new_tokens, temperature, top_p, top_k,
                                        top_logprobs, stream, stop))
        name, version = _describe(client, card, llama)
        before = _counters(client)

        def complete(i: int) -> tuple[EngineOutput, str | None]:
            ids = prompt_ids[i]
            asked = dialect.request(ids, request_seed(seed, i) if temperature else None)
            if stream:
                return _streamed(client, base, dialect, asked, ids, k, tokenizer, timeout)
            try:
                r = client.post(dialect.path, json=asked)
            except httpx.TimeoutException:
                return EngineOutput(error=f"no answer from {base} within {timeout:g} s"), None
            except httpx.TransportError as e:
                return EngineOutput(error=f"{base} stopped answering: {e!r}"), None
            if r.status_code != 200:
                return (EngineOutput(error=f"{base} answered HTTP {r.status_code}: {r.text[:300]}"),
                        None)
            try:
                body = r.json()
                return (dialect.read(body, ids, max_new_tokens, tokenizer),
                        body.get("system_fingerprint"))
            except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                return (EngineOutput(error=f"{base} answered without a completion: {r.text[:300]}"),
                        None)

        start = time.perf_counter()
        sent = list(range(len(prompt_ids))) if order is None else list(order)
        with ThreadPoolExecutor(max(1, concurrency)) as pool:
            answered = dict(zip(sent, pool.map(complete, sent)))
        answers = [answered[i] for i in range(len(prompt_ids))]
        seconds = time.perf_counter() - start
        after = _counters(client)
    settings = {"served_model": card["id"], "model_root": card.get("root"),
                "max_model_len": card.get("max_model_len"),
                "system_fingerprint": next((fp for _, fp in answers if fp), None),
                "api": dialect.name}
    for group, counted in (after or {}).items():  # what these requests added to each
        if before is not None and counted:
            settings[group] = {name: counted[name] - before[group].get(name, 0)
                               for name in counted}
    if temperature:
        settings["sampling"] = {**dialect.sampling, "seed": seed,
                                "request_seed": f"seed x {SEEDS_PER_RUN} + prompt index"}
    if launch:
        settings["launch"] = launch
    return EngineRun(name=name, version=version, source="server",
                     settings=declare_drafter(settings, drafter, base),
                     outputs=[out for out, _ in answers], seconds=seconds)


def _streamed(client: httpx.Client, base: str, dialect: OpenAI, asked: dict, ids: list[int],
              k: int | None, tokenizer, timeout: float) -> tuple[EngineOutput, str | None]:
    """One streamed completion: its server-sent chunks joined into one answer, cut into the rounds
    they show."""
    chunks = []
    try:
        with client.stream("POST", dialect.path, json=asked) as r:
            if r.status_code != 200:
                r.read()
                return (EngineOutput(error=f"{base} answered HTTP {r.status_code}: "
                                           f"{r.text[:300]}"), None)
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[len("data: "):]))
    except httpx.TimeoutException:
        return EngineOutput(error=f"no answer from {base} within {timeout:g} s"), None
    except httpx.TransportError as e:
        return EngineOutput(error=f"{base} stopped answering: {e!r}"), None
    except ValueError:
        return EngineOutput(error=f"{base} streamed a chunk that is not JSON"), None
    joined, sizes = joined_chunks(chunks)
    try:
        out = read_choice(joined, ids, dialect.base["max_tokens"], tokenizer)
    except (KeyError, TypeError, AttributeError):
        return EngineOutput(error=f"{base} streamed no completion"), None
    if not out.approximate and not out.error:
        out.rounds = rounds_seen(sizes, k)
        if out.rounds is None:
            out.warning = " ".join(filter(None, (
                out.warning, "its streamed chunks hold more than one round could (the server "
                             "merged steps the client read late): its rounds are not kept")))
        else:
            out.accepted = round_counters(out.rounds)[1]
    fingerprint = next((c.get("system_fingerprint") for c in chunks if c.get("system_fingerprint")),
                       None)
    return out, fingerprint


def _describe(client: httpx.Client, card: dict, llama: bool) -> tuple[str, str | None]:
    """The engine's name and version: llama.cpp's build from /props, vLLM's from /version."""
    if llama:
        return "llama.cpp", (_get_json(client, "/props") or {}).get("build_info")
    return card.get("owned_by") or "openai-compatible", (_get_json(client, "/version")
                                                         or {}).get("version")


def _get_json(client: httpx.Client, path: str) -> dict | None:
    """GET path as JSON; None when the server has no such endpoint or answers anything else."""
    try:
        r = client.get(path)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _model_card(client: httpx.Client, base: str, served_model: str | None) -> dict:
    """The served model's entry in /v1/models; a clear error when nothing answers or the model is
    not served."""
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
        raise SpecError(f"{base}/v1/models answered HTTP {r.status_code} without a model list: "
                        f"{r.text[:200]}; is this an OpenAI-compatible server?")
    names = [c.get("id") for c in cards]
    if served_model is None and len(cards) == 1:
        return cards[0]
    if served_model in names:
        return cards[names.index(served_model)]
    raise SpecError(f"{base} serves {', '.join(map(str, names))}; name one as the served model"
                    + (f" (not {served_model!r})" if served_model else ""))


def _counters(client: httpx.Client) -> dict[str, dict[str, float]] | None:
    """The server's counters from /metrics, summed over engines: `spec_decode` (drafts,
    draft_tokens, accepted_tokens and accepted_tokens_per_pos_<i>; empty without speculation) and
    vLLM's `prefix_cache` (queries and hits, in tokens; empty without). None without /metrics."""
    try:
        r = client.get("/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    spec: dict[str, float] = {}
    for name, labels, value in SPEC_COUNTER.findall(r.text):
        pos = re.search(r'position="(\d+)"', labels or "")
        key = f"{name}_{pos[1]}" if pos else name
        spec[key] = spec.get(key, 0.0) + float(value)
    prefix: dict[str, float] = {}
    for name, value in PREFIX_COUNTER.findall(r.text):
        prefix[name] = prefix.get(name, 0.0) + float(value)
    return {"spec_decode": spec, "prefix_cache": prefix}
