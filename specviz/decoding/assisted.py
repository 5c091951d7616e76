"""`hf-assisted`: transformers' own assisted generation, as an external
cross-check. Batch size 1 only (transformers refuses more), constant k, no
confidence cut-off, plain argmax."""
from __future__ import annotations

import copy
import time

import torch
from transformers import GenerationConfig

from ..models import ModelPair
from .result import DecodeResult, Progress, SequenceOutput


@torch.inference_mode()
def hf_assisted(pair: ModelPair, prompts: list[list[int]], k: int, max_new_tokens: int,
                progress: Progress | None = None) -> DecodeResult:
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=list(pair.eos_ids), pad_token_id=pair.eos_ids[0],
    )
    # The assistant reads its schedule from its own generation config: set it for this call only.
    saved = pair.draft.generation_config
    pair.draft.generation_config = copy.deepcopy(saved)
    pair.draft.generation_config.num_assistant_tokens = k
    pair.draft.generation_config.num_assistant_tokens_schedule = "constant"
    pair.draft.generation_config.assistant_confidence_threshold = 0.0
    outputs, start = [], time.perf_counter()
    try:
        for ids in prompts:
            x = torch.tensor([ids], device=pair.device)
            out = pair.target.generate(x, attention_mask=torch.ones_like(x), generation_config=config,
                                       assistant_model=pair.draft)
            outputs.append(SequenceOutput(out[0, len(ids):].tolist()))
            if progress:
                progress(len(outputs[-1].ids))
    finally:
        pair.draft.generation_config = saved
    return DecodeResult(outputs, time.perf_counter() - start)
