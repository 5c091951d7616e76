"""The noise floor: how far two correct computations of the same logits drift apart
on this pair, dtype and device, measured with no speculation and none of the
engine's code involved.

Forensics call a row's state clean only if its logits are within a few floors
of a fresh batch-size-1 recomputation, and a fork numerics only if its float64
margin is within the floor's scale. A floor taken from the run being judged
would rise with its bugs, so it comes from elsewhere: the reference's own
continuations, teacher-forced two ways.

- batched: the longest references' prompts left-padded into one batch, with
  transformers' own 2D attention mask and a plain DynamicCache, their
  continuations fed in chunks of k + 1 tokens (the shape of a verify pass);
- fresh: each sequence alone, no cache, one pass over prompt and continuation.

The floor is the largest absolute logit difference between the two, over the
whole (shared) vocabulary and every compared position.
"""
from __future__ import annotations

import torch

from . import kvcache
from .recompute import fresh_logits
from .trace import Floor

SEQUENCES = 8  # the longest references, at most this many
METHOD = ("teacher-forced on the batch-size-1 reference's continuations: a left-padded batch with transformers' "
          "own attention mask and cache, fed in chunks of k + 1 tokens, against each sequence alone with no cache; "
          "the largest |logit difference| over the vocabulary and every position, at least the dtype's resolution "
          "at the largest logit")


@torch.inference_mode()
def measure(model, prompts: list[list[int]], continuations: list[list[int]], chunk: int, vocab: int) -> Floor | None:
    """The floor of `model` on these prompts and their reference continuations (None when nothing can be compared)."""
    order = sorted(range(len(prompts)), key=lambda i: -len(continuations[i]))[:SEQUENCES]
    length = min((len(continuations[i]) for i in order), default=0)
    if length == 0:
        return None
    rows = [prompts[i] + continuations[i][: length - 1] for i in order]
    device = model.get_input_embeddings().weight.device
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, width - len(row):] = torch.tensor(row)
        mask[r, width - len(row):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache = kvcache.new(model)
    start = width - length  # the last prompt token of every row
    if start:
        model(input_ids=ids[:, :start], attention_mask=mask[:, :start], position_ids=positions[:, :start], cache=cache)
    batched = []
    while start < width:
        end = min(start + chunk, width)
        out = model(input_ids=ids[:, start:end], attention_mask=mask[:, :end], position_ids=positions[:, start:end],
                    cache=cache)
        batched.append(out.logits[..., :vocab].double().cpu())
        start = end
    batched = torch.cat(batched, 1)  # (rows, length, vocab)
    per_position = torch.cat([(batched[r] - fresh_logits(model, row, length, vocab)).abs().amax(-1)
                              for r, row in enumerate(rows)])
    # Two computations can agree to the last bit (float64 often does); a floor of zero would call the
    # last bit of a correct engine's rounding a bug. Nothing is measured finer than the dtype resolves.
    resolution = torch.finfo(model.dtype).eps * float(batched.abs().max())
    return Floor(value=max(float(per_position.max()), resolution), median=float(per_position.median()),
                 resolution=resolution, positions=per_position.numel(), sequences=len(rows), chunk=chunk,
                 method=METHOD)
