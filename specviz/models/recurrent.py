"""A recurrent layer's state in transformers' cache (Gated DeltaNet, Mamba, a short convolution):
read, set, and stepped one token a call (the batch-invariant mode's, models/invariant.py).
decoding/kvcache.py lays these states out per row and position for the engine."""
from __future__ import annotations

import torch
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from specviz.models.architecture import recurrent_mixers

# ("conv" or "recurrent", index within the layer) -> (rows, ...)
State = dict[tuple[str, int], torch.Tensor]
KINDS = ("conv", "recurrent")


def holds_state(layer) -> bool:
    """The cache layer carries a recurrent state."""
    return isinstance(layer, LinearAttentionCacheLayerMixin)


def states(layer) -> State:
    """A recurrent layer's states as they are now (references; the layer updates them in place)."""
    if not holds_state(layer):
        return {}
    out = {}
    for i in range(layer.number_of_states):
        for kind in KINDS:
            if getattr(layer, f"is_{kind}_states_initialized")[i]:
                out[(kind, i)] = getattr(layer, f"{kind}_states")[i]
    return out


def put_states(layer, new: State) -> None:
    """Set a recurrent layer's states (the prefill is then behind it)."""
    for (kind, i), t in new.items():
        getattr(layer, f"{kind}_states")[i] = t
        getattr(layer, f"is_{kind}_states_initialized")[i] = True
        layer.has_previous_state[i] = True
        if kind == "conv":
            layer.conv_kernel_size[i] = t.shape[-1]
        layer.device, layer.dtype = t.device, t.dtype


def where_rows(rows: torch.Tensor, chosen: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """A state whose rows marked in `rows` (B,) are `chosen`'s, the rest `other`'s."""
    return torch.where(rows.to(other.device).view(-1, *[1] * (other.dim() - 1)), chosen, other)


class Wrapped:
    """Subclasses of recurrent mixers' classes whose forward wraps the class's own, one per class,
    swapped in for each mixer of a model (as models/kernels.py swaps linear layers: copies of the
    model keep them). `forward_of(cls)` is the wrapping forward of class `cls`."""

    def __init__(self, prefix: str, forward_of):
        self.prefix, self.forward_of = prefix, forward_of
        self._made: dict[type, type] = {}

    def swap(self, model) -> None:
        for mixer in recurrent_mixers(model):
            cls = type(mixer)
            if cls not in self._made.values():
                mixer.__class__ = self._made.setdefault(cls, type(
                    f"{self.prefix}{cls.__name__}", (cls,), {"forward": self.forward_of(cls)}))


def _stepped(cls: type):
    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        """One token a call, every one through the mixer's decode algorithm from an exact zero
        state (a first call, through its prefill algorithm on a zero input, only lays the state
        out), so that a row's state is the same bits whether its tokens came in a prefill or one by
        one, alone or padded in a batch. A pad's step leaves its row's state as it was and outputs
        zeros."""
        if hidden_states.dtype == torch.float64:  # the truth, as it always computes (invariant.py)
            return cls.forward(self, hidden_states, cache=cache, attention_mask=attention_mask,
                               **kwargs)
        if cache is None:
            raise NotImplementedError("a batch-invariant recurrent layer steps over a cache")
        layer, outs = cache.layers[self.layer_idx], []
        for t in range(hidden_states.shape[1]):
            if not all(layer.has_previous_state.values()):
                cls.forward(self, torch.zeros_like(hidden_states[:, :1]), cache=cache,
                            attention_mask=None, **kwargs)
                put_states(layer, {key: torch.zeros_like(s) for key, s in states(layer).items()})
            pads = (None if attention_mask is None or bool(attention_mask[:, t].all())
                    else attention_mask[:, t] == 0)
            before = pads is not None and {key: s.clone() for key, s in states(layer).items()}
            out = cls.forward(self, hidden_states[:, t: t + 1], cache=cache, attention_mask=None,
                              **kwargs)
            if pads is not None:
                put_states(layer, {key: where_rows(pads, before[key], s)
                                   for key, s in states(layer).items()})
                out = out.masked_fill(pads.to(out.device)[:, None, None], 0)
            outs.append(out)
        return torch.cat(outs, 1)
    return forward


# Each recurrent mixer of a batch-invariant model steps one token a call (`_stepped`).
STEPPED = Wrapped("Stepped", _stepped)
