"""Independent recomputation: one sequence alone, no cache, nothing of the engine's
layout; in the run's dtype, or in float64 to arbitrate a near-tie."""
from __future__ import annotations

import copy
import weakref

import torch

# A float64 copy of the target lives in CPU memory; past this size forensics do without it
# (and then never call a fork numerics).
ARBITER_MAX_PARAMS = 1_500_000_000
_ARBITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # pair -> its float64 target (or None)


@torch.inference_mode()
def fresh_logits(model, ids: list[int], last: int, vocab: int) -> torch.Tensor:
    """Logits of the last `last` positions of `ids`: one sequence, no cache, the model's own dtype; (last, vocab) float64."""
    device = model.get_input_embeddings().weight.device
    out = model(input_ids=torch.tensor([ids], device=device), logits_to_keep=last)
    return out.logits[0, :, :vocab].double().cpu()


def float64_target(pair):
    """The pair's target in float64 on the CPU (the target itself when it runs in float64), made once per pair;
    None when it is too large to copy."""
    if pair.dtype == torch.float64:
        return pair.target
    if pair not in _ARBITERS:
        params = sum(p.numel() for p in pair.target.parameters())
        _ARBITERS[pair] = (copy.deepcopy(pair.target).to("cpu", torch.float64).eval()
                           if params <= ARBITER_MAX_PARAMS and not hasattr(pair.target, "hf_device_map") else None)
    return _ARBITERS[pair]


def float64_logits(pair, ids: list[int]) -> torch.Tensor | None:
    """The target's float64 logits for the token after `ids` (vocab,), or None without a float64 target."""
    model = float64_target(pair)
    return None if model is None else fresh_logits(model, ids, 1, pair.vocab_size)[0]
