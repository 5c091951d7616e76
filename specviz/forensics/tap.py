"""Model calls seen from outside the engine.

A `Tap` hooks a model's forward pass and keeps what each call was given (token
ids, position ids, attention mask, the cache as it stood) and what it returned
(logits). Forensics judge an engine by what actually reached the model, never by
what the engine says it did: a bug anywhere between the engine's bookkeeping
and the model call shows up here as it is.

K/V are not copied: the tap keeps references, valid because every forward pass replaces a cache's
K/V tensors instead of writing into them (kvcache.layers_kv). A hybrid's recurrent states are
written in place: those are copied before the call.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Self

import torch

from specviz.decoding import kvcache


@dataclass
class Call:
    """One forward pass of the tapped model."""

    input_ids: torch.Tensor  # (B, q)
    position_ids: torch.Tensor | None  # (B, q) as given; None when the model derived its own
    mask: torch.Tensor | None  # as given: a 4D additive bias (B, 1, q, kv) or a 2D 0/1 mask (B, kv)
    # per attention layer, before the call
    past: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    # per recurrent layer, its states before the call (kvcache.State)
    states: list = field(default_factory=list)
    logits: torch.Tensor | None = None  # (B, keep, V) as returned

    def visible(self, row: int, last: int) -> torch.Tensor | None:
        """(last, kv) booleans: which key slots each of the row's `last` query slots could
        attend to."""
        mask = self.mask
        # one mask per layer type: a full layer's shows the row's whole context
        if isinstance(mask, dict):
            mask = mask.get("full_attention", mask.get("sliding_attention"))
        if mask is None:
            return None
        q = self.input_ids.shape[1]
        if mask.dim() == 4:
            bias = mask[row, 0, q - last:]
            return bias > torch.finfo(bias.dtype).min / 2
        keys = mask[row].bool()  # 2D: padding mask over all slots; causal within the pass
        kv = keys.shape[0]
        causal = (torch.arange(kv, device=keys.device)[None]
                  <= (kv - q + torch.arange(q - last, q, device=keys.device))[:, None])
        return causal & keys[None]


class Tap:
    """Records every forward call of `model` while in a `with` block; `clear()` forgets them."""

    def __init__(self, model: torch.nn.Module, keep_cache: bool):
        self.model = model
        self.keep_cache = keep_cache
        self.calls: list[Call] = []
        self.enabled = True
        self._hooks = []

    def __enter__(self) -> Self:
        self._hooks = [self.model.register_forward_pre_hook(self._before, with_kwargs=True),
                       self.model.register_forward_hook(self._after, with_kwargs=True)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.calls = []

    def clear(self) -> None:
        self.calls = []

    @contextlib.contextmanager
    def off(self):
        """Calls made inside are not recorded (the watcher's own recomputations)."""
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True

    def _before(self, module, args, kwargs) -> None:
        if not self.enabled:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache") if self.keep_cache else None
        self.calls.append(Call(ids, kwargs.get("position_ids"), kwargs.get("attention_mask"),
                               kvcache.layers_kv(cache), kvcache.layers_states(cache)))

    def _after(self, module, args, kwargs, output) -> None:
        if self.enabled:
            self.calls[-1].logits = output.logits
