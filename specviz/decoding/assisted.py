"""`hf-assisted`: transformers' own assisted generation, as an external
cross-check. Batch size 1 only (transformers refuses more), constant k, no
confidence cut-off, plain argmax over the pair's shared vocabulary. Each drafter
(drafters.py) says how transformers drafts as it does: transformers' prompt
lookup (`prompt_lookup_num_tokens`) is the anchor our own lookup drafter is held to."""
from __future__ import annotations

import contextlib
import time

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from specviz.decoding.result import DecodeResult, Progress, SequenceOutput
from specviz.models.pairs import ModelPair


class SharedVocabulary(LogitsProcessor):
    """Rule out ids at or past `size`: an output head padded beyond the tokenizer's vocabulary
    must not win the argmax here when the engine and the reference never see those ids."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return torch.cat([scores[:, : self.size],
                          torch.full_like(scores[:, self.size:], -torch.inf)], dim=1)


@contextlib.contextmanager
def bare_generation_configs(pair: ModelPair, k: int):
    """For the call, both models' own generation_config is a bare one: transformers 5 fills every
    unset field from it, so a checkpoint's repetition penalty, suppressed tokens or minimum length
    would apply. The draft's carries the assistant's schedule (transformers reads it from there)."""
    saved = pair.target.generation_config, pair.draft.generation_config
    pair.target.generation_config = GenerationConfig()
    pair.draft.generation_config = GenerationConfig(num_assistant_tokens=k,
                                                    num_assistant_tokens_schedule="constant",
                                                    assistant_confidence_threshold=0.0)
    try:
        yield
    finally:
        pair.target.generation_config, pair.draft.generation_config = saved


@torch.inference_mode()
def hf_assisted(pair: ModelPair, prompts: list[list[int]], k: int, max_new_tokens: int,
                progress: Progress | None = None, repetition_penalty: float = 1.0,
                assistance: dict | None = None) -> DecodeResult:
    """`assistance`: how transformers drafts (a drafter's `assisted`): `generate`'s assistant model,
    or prompt lookup's generation settings; the pair's draft model by default. `repetition_penalty`:
    transformers' own, on each candidate's logits with the candidates before it counted."""
    assistance = assistance or {"assistant_model": pair.draft}
    settings = {n: v for n, v in assistance.items() if n != "assistant_model"}
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, repetition_penalty=repetition_penalty,
        eos_token_id=list(pair.eos_ids), pad_token_id=pair.eos_ids[0], **settings,
    )
    vocabulary = LogitsProcessorList([SharedVocabulary(pair.vocab_size)])
    outputs, start = [], time.perf_counter()
    with bare_generation_configs(pair, k):
        for ids in prompts:
            x = torch.tensor([ids], device=pair.device)
            out = pair.target.generate(x, attention_mask=torch.ones_like(x),
                                       generation_config=config,
                                       assistant_model=assistance.get("assistant_model"),
                                       logits_processor=vocabulary)
            outputs.append(SequenceOutput(out[0, len(ids):].tolist()))
            if progress:
                progress(len(outputs[-1].ids))
    return DecodeResult(outputs, time.perf_counter() - start)
