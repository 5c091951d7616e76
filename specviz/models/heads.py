"""Draft heads: modules that draft from the target's own hidden states instead of a model of their own (EAGLE,
MTP), and so need no draft model.

An EAGLE-style head is a decoder layer (or a few) fed, at each slot, the token there (the target's embedding of it) and the
target's last hidden state at the slot before, mixed by one linear map; the target's output head reads the
layer's output as the next token's logits, and the output is the head's guess of the target's next hidden state,
which it feeds itself to draft further.

specviz's heads are untrained so far: copies of the target's first attention layers, with a mix that passes the
embedding plus a small share of the hidden state. Their drafts depend on the target's hidden states (a head fed the
wrong ones drafts differently) and are sometimes right: they show how a head's state is kept, not the speed-up a
trained head brings. Only the tiny pair has one: two of its layers and a share of 0.01 accept about one draft in
five (measured: 537 of 2779 on the built-in prompts, k 4); a one-layer copy, or a larger share, almost none.
"""
from __future__ import annotations

import copy
import weakref

import torch

from specviz.models.architecture import attention_layers_only, in_float64
from specviz.spec.run import TINY_TARGET, SpecError

SHAPES = {TINY_TARGET: (2, 0.01)}  # target -> its head's layers, and the share of the hidden state in its input
_HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class EagleHead(torch.nn.Module):
    def __init__(self, target, layers: int, share: float):
        super().__init__()
        indices, decoder = attention_layers_only(target)[:layers], target.model
        config = copy.deepcopy(target.config.get_text_config())
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = [config.layer_types[i] for i in indices]
        with torch.random.fork_rng():  # a fixed module without disturbing the caller's RNG
            body = type(decoder)(config)
        body.embed_tokens = None  # it is fed the target's embeddings
        for mine, theirs in zip(body.layers, indices):
            mine.load_state_dict(decoder.layers[theirs].state_dict())
        body.norm.load_state_dict(decoder.norm.state_dict())
        H = config.hidden_size
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(torch.cat([torch.eye(H), share * torch.eye(H)], 1))
        self.body = body
        self.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
        if target.dtype == torch.float64:  # as the target computes: no norm narrowed to float32
            in_float64(body)
        self._target = (target,)  # read, not owned: a tuple keeps it out of this module's parameters

    @classmethod
    def of(cls, target, name: str) -> EagleHead:
        """The head of `target`, whose id is `name`, made once."""
        if name not in SHAPES:
            raise SpecError(f"specviz has no EAGLE-style head for {name} yet: it has one for "
                            f"{', '.join(SHAPES)} only; draft with the draft model or prompt lookup")
        if target not in _HEADS:
            _HEADS[target] = cls(target, *SHAPES[name])
        return _HEADS[target]

    def inputs(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """The layer's input at each slot: the token's embedding mixed with the hidden state it is fed."""
        return self.fc(torch.cat([self._target[0].get_input_embeddings()(tokens), features], -1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._target[0].get_output_embeddings()(hidden)

