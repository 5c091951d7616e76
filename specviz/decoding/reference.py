"""Reference decoders: the target alone, greedy. `reference` (batch size 1,
through transformers' own `generate`) is the ground truth every other method
is compared with; `batched-reference` runs the same greedy decoding on the
left-padded batch, to separate batching noise from speculation bugs."""
from __future__ import annotations

import time

import torch
from transformers import GenerationConfig

from .. import kvcache
from ..models import ModelPair
from .batch import forward, left_pad
from .result import DecodeResult, Progress, SequenceOutput, chunks, top2_margin


@torch.inference_mode()
def reference(pair: ModelPair, prompts: list[list[int]], max_new_tokens: int, progress: Progress | None = None) -> DecodeResult:
    # A bare config: plain argmax, whatever sampling defaults the model ships with.
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=list(pair.eos_ids),
        pad_token_id=pair.eos_ids[0],
        return_dict_in_generate=True,
        output_logits=True,
    )
    outputs, start = [], time.perf_counter()
    for ids in prompts:
        x = torch.tensor([ids], device=pair.device)
        out = pair.target.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
        new = out.sequences[0, len(ids):].tolist()
        margins = top2_margin(torch.cat(out.logits)[:, : pair.vocab_size].double()).tolist()
        outputs.append(SequenceOutput(new, margins[: len(new)]))
        if progress:
            progress(len(new))
    return DecodeResult(outputs, time.perf_counter() - start)


@torch.inference_mode()
def batched_reference(pair: ModelPair, prompts: list[list[int]], batch_size: int, max_new_tokens: int,
                      progress: Progress | None = None, watch=None) -> DecodeResult:
    outputs, start = [None] * len(prompts), time.perf_counter()
    eos = torch.tensor(pair.eos_ids, device=pair.device)
    for chunk in chunks(len(prompts), batch_size):
        tokens, valid = left_pad([prompts[i] for i in chunk], pair.device)
        seqs = list(chunk)
        gen = {i: SequenceOutput([]) for i in seqs}
        cache = kvcache.new(pair.target)
        q_start = 0
        while seqs:
            if watch:
                watch.start()
            logits = forward(pair.target, tokens, valid, q_start, cache, pair.vocab_size, keep=1)[:, -1]
            nxt = logits.argmax(-1)
            margins = top2_margin(logits).tolist()
            for r, (i, t) in enumerate(zip(seqs, nxt.tolist())):
                gen[i].ids.append(t)
                gen[i].margins.append(margins[r])
            if watch:
                watch.end(seqs, gen)
            done = torch.isin(nxt, eos) | torch.tensor([len(gen[i].ids) >= max_new_tokens for i in seqs], device=pair.device)
            if progress:
                progress(len(seqs))
            q_start = tokens.shape[1]
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            valid = torch.cat([valid, torch.ones_like(valid[:, :1])], dim=1)
            if done.any():  # finished rows leave the batch
                keep = (~done).nonzero().flatten()
                seqs = [seqs[r] for r in keep.tolist()]
                tokens, valid = tokens[keep], valid[keep]
                kvcache.select_rows(cache, keep)
        for i in chunk:
            outputs[i] = gen[i]
    return DecodeResult(outputs, time.perf_counter() - start)
