"""What every draft head has (models/heads.py's, models/eagle3.py's published EAGLE-3): a shallow
decoder `body` (a transformers decoder model fed embeddings, with its own cache), `inputs(tokens,
features)` that mix each slot's token with the hidden state it is fed, `logits(hidden)` over the
target's vocabulary, `heard` (the target's hidden states it is fed: indices into transformers'
`hidden_states`) and `from_target(features)` (those states, as the head takes them)."""
from __future__ import annotations

import copy
import weakref

import torch

from specviz.models.architecture import in_float64, throughout_float64
from specviz.models.headfiles import head_files
from specviz.models.invariant import is_invariant, make_invariant
from specviz.spec.strict import SpecError


class Head(torch.nn.Module):
    heard: tuple[int, ...] = (-1,)  # the target's last hidden state

    def from_target(self, features: torch.Tensor) -> torch.Tensor:
        return features

    def mistaken(self) -> dict[str, Head]:
        """The field's known ways of feeding it wrongly, each as the head so fed (none known)."""
        return {}

    def misfed(self, way: str) -> Head:
        """The head fed wrong way `way` (a name of models/eagle3.py's MISFEEDINGS)."""
        raise SpecError(f"a {type(self).__name__} is not fed wrong way {way!r}: its faults "
                        "misfeed a published EAGLE-3 head")

    def facts(self, written: list[int]) -> dict | None:
        """What a run should record of it, having written the token ids `written` (None: nothing
        beyond the run's settings)."""
        return None

    def fresh(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """(T, H) the body's last hidden states over one whole sequence from scratch (no cache):
        `tokens` (T,), each slot fed `features` (T, H) as from_target gives them."""
        return self.body(inputs_embeds=self.inputs(tokens[None], features[None]), use_cache=False,
                         position_ids=torch.arange(len(tokens),
                                                   device=tokens.device)[None]).last_hidden_state[0]


class PublishedHead(Head):
    """A head as published (models/eagle1.py, eagle3.py), built from its folder's files by
    `cls(target, config, weights, where)`, once per target and folder. `layout`: its kind in
    words ("EAGLE-3"); `drafter`: the drafter that drafts with it."""

    layout: str
    drafter: str

    def embedded(self, tokens: torch.Tensor) -> torch.Tensor:
        """The tokens' embedding: its own where it ships `embed_tokens`, else the target's."""
        own = getattr(self, "embed_tokens", None)
        return (self._target[0].get_input_embeddings() if own is None else own)(tokens)

    @classmethod
    def of(cls, target, source: str | None) -> PublishedHead:
        if not source:
            raise SpecError(f"the {cls.drafter} drafter drafts with a published {cls.layout} "
                            "head: give its folder (head)")
        heads = _PUBLISHED.setdefault(target, {})
        if (cls, source) not in heads:
            folder, raw, weights = head_files(source, cls.layout)
            heads[cls, source] = settle(cls(target, raw, weights, str(folder)), target)
        return heads[cls, source]


# target -> {(class, folder): its published head}, each loaded once
_PUBLISHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def heard_states(hidden_states: tuple[torch.Tensor, ...], heard: tuple[int, ...]) -> torch.Tensor:
    """The target's hidden states a head hears, concatenated: (…, len(heard)·H)."""
    return torch.cat([hidden_states[i] for i in heard], -1)


def one_layer_body(target, config, layer_type: str | None = None):
    """A decoder of `target`'s kind with one layer, by `config` (copied; its per-layer types cut to
    the first, or its layer of `layer_type`), fed embeddings (no embedding of its own), built
    without disturbing the caller's RNG: an MTP head's body, its layer then replaced or loaded."""
    config = copy.deepcopy(config)
    config.num_hidden_layers = 1
    for field in ("layer_types", "mlp_layer_types"):
        if getattr(config, field, None) is not None:
            setattr(config, field, getattr(config, field)[:1])
    if layer_type is not None:
        config.layer_types = [layer_type]
    with torch.random.fork_rng():
        body = type(target.get_decoder())(config)
    body.embed_tokens = None
    return body


def settle(head: torch.nn.Module, target) -> torch.nn.Module:
    """`head` on the target's device and in its dtype, for inference; in float64 throughout where
    the target is, batch-invariant where it is."""
    head.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
    if is_invariant(target):
        make_invariant(head)
    if target.dtype == torch.float64:  # as the target computes: no norm narrowed to float32
        in_float64(head.body)
        for part in head.children():
            throughout_float64(part)
    return head
