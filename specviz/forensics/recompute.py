"""Independent recomputation: one sequence alone, no cache, nothing of the engine's
layout; in the run's dtype, or in float64 as the truth that rounding departs from."""
from __future__ import annotations

import copy
import weakref

import torch

from specviz.decoding import kvcache
from specviz.models.architecture import ATTENTION, declares_layer_types, in_float64

# A float64 copy of a model lives in CPU memory; past this size forensics do without it
# (and then have no yardstick for rounding, so never call a fork numerics).
ARBITER_MAX_PARAMS = 1_500_000_000
# model -> {dtype: its copy (or None)}
_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@torch.inference_mode()
def fresh_logits(model, ids: list[int], last: int, vocab: int, shift: int = 0,
                 shift_from: int = 0, windowed: bool = True) -> torch.Tensor:
    """Logits of the last `last` positions of `ids`: one sequence, no cache, the model's own dtype;
    (last, vocab) float64. `shift`: the position ids of the tokens from index `shift_from` on moved
    by it (a hypothesis about an engine's positions). `windowed`: False runs the model's
    sliding-window layers as full attention (a hypothesis about an engine's drafter)."""
    device = model.get_input_embeddings().weight.device
    index = torch.arange(len(ids), device=device)
    given = {"position_ids": (index + shift * (index >= shift_from))[None]} if shift else {}
    if not windowed:
        given["attention_mask"] = _unwindowed(model, len(ids), device)
    out = model(input_ids=torch.tensor([ids], device=device), logits_to_keep=last, **given)
    return out.logits[0, :, :vocab].double().cpu()


def _unwindowed(model, n: int, device):
    """A causal mask over n tokens that no window narrows, as the model takes its masks."""
    bias = torch.full((n, n), torch.finfo(model.dtype).min, dtype=model.dtype,
                      device=device).triu(1)[None, None]
    return dict.fromkeys(ATTENTION, bias) if declares_layer_types(model) else bias


@torch.inference_mode()
def decoded_logits(model, ids: list[int], last: int, vocab: int) -> torch.Tensor:
    """The same logits as `fresh_logits`, computed as a model decodes: the tokens before the last
    `last` positions in one pass, then a token a pass over its own fresh cache. A hybrid's recurrent
    layers run their chunked algorithm on the first and their recurrent (decode) one on the rest:
    (last, vocab) float64."""
    device = model.get_input_embeddings().weight.device
    cache, first = kvcache.new(model), len(ids) - last + 1
    rows = []
    for lo, hi in [(0, first), *((j, j + 1) for j in range(first, len(ids)))]:
        out = model(input_ids=torch.tensor([ids[lo:hi]], device=device), cache=cache,
                    logits_to_keep=1, position_ids=torch.arange(lo, hi, device=device)[None])
        rows.append(out.logits[0, -1, :vocab].double().cpu())
    return torch.stack(rows)


def copy_in(model, dtype: torch.dtype):
    """`model` in `dtype` on the CPU (the model itself when it already is), made once per model;
    None when it is too large to copy or spread over devices."""
    if model.dtype == dtype and model.get_input_embeddings().weight.device.type == "cpu":
        return model
    copies = _COPIES.setdefault(model, {})
    if dtype not in copies:
        copies[dtype] = copy.deepcopy(model).to("cpu", dtype).eval() if copyable(model) else None
        if dtype == torch.float64 and copies[dtype] is not None:
            in_float64(copies[dtype])
    return copies[dtype]


def copyable(model) -> bool:
    """Whether `copy_in` makes copies of `model`: small enough, and on one device."""
    params = sum(p.numel() for p in model.parameters())
    return params <= ARBITER_MAX_PARAMS and not hasattr(model, "hf_device_map")


def float64_target(pair):
    """The pair's target in float64 on the CPU: the truth its rounding is measured from (None:
    too large)."""
    return copy_in(pair.target, torch.float64)


def float64_logits(pair, ids: list[int]) -> torch.Tensor | None:
    """The target's float64 logits for the token after `ids` (vocab,), or None without
    a float64 target."""
    model = float64_target(pair)
    return None if model is None else fresh_logits(model, ids, 1, pair.vocab_size)[0]
