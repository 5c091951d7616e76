"""Batch-invariant computation: a row's logits are the same bits in any batch, padding, verify
width, tree or neighbours (docs/batch_invariant.md).

Measured on this CPU (torch 2.13, MKL and oneDNN): a GEMM gives a row bits that depend on how many
rows the call has and on its operands' strides, never on the row's place or its neighbours;
scaled-dot-product attention gives a query bits that depend on how many queries and which mask
share its call; and an elementwise transcendental map computes a strided tensor, and a contiguous
one's tail, with scalar code that rounds otherwise than its vector code. So here:
- every linear map runs in contiguous tiles of exactly TILE rows, the last padded with zeros;
- attention runs one query a call, over exactly the keys it sees, in order, with no mask;
- transcendental maps run on a contiguous copy padded to whole vectors;
- a recurrent layer (a hybrid's) steps one token a call from an exact zero state, even in a
  prefill, and a pad's step leaves the row's state as it was (models/recurrent.py).
Everything else a decoder does (norms, rotary embeddings, elementwise arithmetic) is computed row
by row, or exactly.

With these, a fork between a batched speculative run and its batch-size-1 reference cannot be
rounding: the state check's tolerance is zero (forensics/whitebox.py). The invariance is a property
of the build, not a promise of it, so each model is self-tested when it loads (`departure`), and
a model that fails is refused with what departed. float64 copies (forensics' truth) compute as they
always do.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from transformers import AttentionInterface, DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from specviz.models import kernels
from specviz.models.recurrent import STEPPED

TILE = 16  # rows per GEMM call
NAME = "specviz_batch_invariant"  # the attention implementation transformers is told of
# what the mode costs, in words (docs/batch_invariant.md measures it)
WHAT = (f"linear maps in tiles of {TILE} rows, attention one query a call over exactly its keys, "
        "recurrent layers one token a step")


def in_tiles(x: torch.Tensor, out_features: int, linear) -> torch.Tensor:
    """`linear(x)` (a linear map of x's last dimension), every call on exactly TILE rows."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()  # the kernels' bits depend on the strides too
    n = flat.shape[0]
    if n % TILE:
        flat = torch.cat([flat, flat.new_zeros(TILE - n % TILE, flat.shape[-1])])
    out = torch.cat([linear(tile) for tile in flat.split(TILE)])
    return out[:n].reshape(*x.shape[:-1], out_features)


def tiled_linear(x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` in tiles."""
    return in_tiles(x, weight.shape[0], lambda tile: F.linear(tile, weight, bias))


# Elementwise maps that torch computes with vector code in whole vectors and with scalar code on the
# tail of a tensor (or of each thread's share of it): the two round differently, so an element's
# bits would depend on where the batch's shape puts it.
_TRANSCENDENTAL = {
    torch.exp, torch.log, torch.log1p, torch.expm1, torch.sigmoid, torch.tanh, torch.erf,
    torch.sin, torch.cos, F.silu, F.gelu, F.softplus, F.sigmoid, F.tanh, F.mish, F.elu,
    torch.Tensor.exp, torch.Tensor.log, torch.Tensor.log1p, torch.Tensor.expm1,
    torch.Tensor.sigmoid, torch.Tensor.tanh, torch.Tensor.erf, torch.Tensor.sin,
    torch.Tensor.cos}
VECTORS = 64  # elements: a multiple of every vector width, float32 to bfloat16


def whole_vectors(func, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """`func(x, ...)` elementwise with no element on a scalar tail: `x` flattened and padded with
    zeros to whole vectors in every thread's share."""
    flat = x.reshape(-1).contiguous()  # a strided tensor takes the scalar code throughout
    step = VECTORS * torch.get_num_threads()
    if flat.numel() % step:
        flat = torch.cat([flat, flat.new_zeros(step - flat.numel() % step)])
    return func(flat, *args, **kwargs)[: x.numel()].reshape(x.shape)


class InvariantOps(TorchFunctionMode):
    """Inside, `F.linear` (every `nn.Linear`, and experts that call it) runs in tiles, and the
    transcendental elementwise maps in whole vectors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            return tiled_linear(*args, **kwargs)
        if func in _TRANSCENDENTAL and isinstance(args[0], torch.Tensor) \
                and args[0].is_floating_point():
            return whole_vectors(func, *args, **kwargs)
        return func(*args, **kwargs)


def _visible(mask: torch.Tensor | None, b: int, q: int, kv: int) -> torch.Tensor:
    """(q, kv) bool: the keys each of row b's queries sees. No mask: causal, the queries the last q
    of the keys; a float mask: its finite entries above the dtype's lowest (specviz's biases)."""
    if mask is None:
        return (torch.arange(kv)[None, :] <= torch.arange(kv - q, kv)[:, None])
    m = mask[b if mask.shape[0] > 1 else 0, 0]
    if m.dtype != torch.bool:
        m = m > torch.finfo(m.dtype).min / 2
    return m.cpu()


def attention(module, query, key, value, attention_mask, dropout: float = 0.0,
              scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' attention interface (as its sdpa one): each query alone over its own keys."""
    if query.dtype == torch.float64:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling,
                                      is_causal, **kwargs)
    for name in ("softcap", "s_aux", "sinks", "position_bias"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"batch-invariant attention does not cover {name}")
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    B, _, q, _ = query.shape
    out = query.new_zeros(B, q, query.shape[1], value.shape[-1])
    # nothing in here needs InvariantOps, whose every-op hook would cost more than the attention
    with torch._C.DisableTorchFunction():
        for b in range(B):
            seen = _visible(attention_mask, b, q, key.shape[2])
            for i in range(q):
                at = seen[i].nonzero()[:, 0]
                if not len(at):  # a pad's query in transformers' own masks: it sees nothing
                    continue
                lo, hi = int(at[0]), int(at[-1]) + 1
                keys = slice(lo, hi) if hi - lo == len(at) else at.to(key.device)
                # contiguous: the kernel's bits depend on the strides, which the batch's shape sets
                out[b, i] = F.scaled_dot_product_attention(
                    query[b:b + 1, :, i:i + 1].contiguous(), key[b:b + 1, :, keys].contiguous(),
                    value[b:b + 1, :, keys].contiguous(), scale=scaling)[0, :, 0]
    return out, None


AttentionInterface.register(NAME, attention)
# transformers builds the masks it passes this function as it builds sdpa's: without a registered
# mask function, a padded batch's mask would arrive as None
AttentionMaskInterface.register(NAME, sdpa_mask)


class TiledLinear(kernels.PackedLinear):
    """A linear layer in tiles on its packed kernel (models/kernels.py), wherever it is called
    from (a head calls the target's output layer outside any model's forward)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float64:
            return super().forward(x)
        if not torch.backends.mkldnn.is_available():
            return tiled_linear(x, self.weight, self.bias)
        return in_tiles(x, self.out_features, super().forward)


def _enter(module, args) -> None:
    mode = None if _truth(module) else InvariantOps()
    if mode is not None:
        mode.__enter__()
    module.__dict__.setdefault("_specviz_tiles", []).append(mode)


def _leave(module, args, output) -> None:
    mode = module.__dict__["_specviz_tiles"].pop()
    if mode is not None:
        mode.__exit__(None, None, None)


def _truth(module: torch.nn.Module) -> bool:
    """A float64 copy (forensics' truth, recompute.py) computes as it always does: rounding is
    measured from it, and it needs no invariance."""
    return next(module.parameters()).dtype == torch.float64


def _outermost_models(module: torch.nn.Module):
    """The transformers models in `module`, none inside another."""
    if isinstance(module, PreTrainedModel):
        yield module
        return
    for child in module.children():
        yield from _outermost_models(child)


def make_invariant(module: torch.nn.Module) -> torch.nn.Module:
    """`module` (a model, or a head) computing batch-invariantly from now on (copies keep it): its
    linear layers in tiles, its attention one query a call, its recurrent layers stepped one token
    a call (models/recurrent.py)."""
    if is_invariant(module):
        return module
    for linear in module.modules():
        if type(linear) in (torch.nn.Linear, kernels.PackedLinear):
            linear.__class__ = TiledLinear
    for model in _outermost_models(module):
        model.set_experts_implementation("eager")  # a loop over experts, each through `F.linear`
        model.set_attn_implementation(NAME)
        for part in model.modules():  # layers taken from another model keep its config
            if isinstance(getattr(part, "config", None), PretrainedConfig):
                part.config._attn_implementation = NAME
        model.register_forward_pre_hook(_enter)
        model.register_forward_hook(_leave, always_call=True)
        STEPPED.swap(model)
    module._specviz_invariant = True
    return module


def is_invariant(module: torch.nn.Module) -> bool:
    return getattr(module, "_specviz_invariant", False)


PREFIX, VERIFY = 12, 5  # the self-test's tokens: a prompt, then a verify pass over its cache


@torch.inference_mode()
def departure(model, vocab: int) -> str | None:
    """The self-test of an invariant model, in transformers' own batching (a 2D padding mask, its
    cache): a row's logits over PREFIX + VERIFY fixed tokens alone in one pass without a cache,
    against the same row left-padded among four others in a prefill and then a verify pass of
    VERIFY tokens over the cache, and against single steps alone over a cache. None when every
    logit is the same bits; else what departed."""
    device = model.get_input_embeddings().weight.device
    n = PREFIX + VERIFY
    rows = [[(a * i + b) % vocab for i in range(n + d)]
            for a, b, d in ((37, 11, 0), (13, 5, 4), (7, 3, 2), (11, 2, 1), (5, 9, 3))]
    alone = model(input_ids=torch.tensor([rows[0]], device=device)).logits[0, -VERIFY - 1:, :vocab]
    # row 0 second, fewest tokens, so most padded: five rows, the number of a row's neighbours
    # moves a kernel's bits more often than three
    batch = [rows[1], rows[0], *rows[2:]]
    width = max(map(len, batch))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in batch], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in batch], device=device)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache, split = DynamicCache(config=model.config), width - VERIFY
    model(input_ids=ids[:, :split], attention_mask=mask[:, :split],
          position_ids=positions[:, :split], cache=cache, use_cache=True)
    verified = model(input_ids=ids[:, split:], attention_mask=mask, cache=cache, use_cache=True,
                     position_ids=positions[:, split:]).logits[1, :, :vocab]
    cache, stepped = DynamicCache(config=model.config), []
    for lo, hi in [(0, n - VERIFY), *((j, j + 1) for j in range(n - VERIFY, n))]:
        stepped.append(model(input_ids=torch.tensor([rows[0][lo:hi]], device=device), cache=cache,
                             use_cache=True, position_ids=torch.arange(lo, hi, device=device)[None])
                       .logits[0, -1:, :vocab])
    found = []
    for name, logits in (("in a padded batch of five, verified over a cache", verified),
                         ("one token a pass over a cache", torch.cat(stepped)[1:])):
        gap = (logits - alone[1:]).abs()
        if bool(gap.any()):
            found.append(f"{name}, its logits depart from one pass alone by up to "
                         f"{float(gap.max()):.3g} at {int(gap.amax(-1).gt(0).sum())} of {VERIFY} "
                         "positions")
    return "; ".join(found) or None
