"""The MTP layers transformers does not read, read from their checkpoints as vLLM reads them:

- MiMo's (Xiaomi MiMo, vLLM's mimo_mtp.py): transformers loads a MiMo checkpoint as the Qwen2 model
  it is and leaves its `model.mtp_layers.{i}.` aside. The layer is
  `final_layernorm(block(input_proj([hidden_layernorm(h), token_layernorm(e)])))`, the block one of
  the model's own decoder layers.
- Qwen3.5's and Qwen3-Next's (vLLM's qwen3_5_mtp.py, qwen3_next_mtp.py): transformers 5.24 loads
  the model and leaves its `mtp.` aside (it reads the same layout for Mellum only: models/heads.py).
  The layer is `norm(layers.0(fc([pre_fc_norm_embedding(e), pre_fc_norm_hidden(h)])))`, the block
  a full-attention decoder layer of the model's kind, though most of the model's are linear.

Either drafts through the target's own embedding and output head."""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from specviz.models.head import Head, one_layer_body, settle
from specviz.models.headfiles import head_files, load_weights
from specviz.spec.strict import SpecError

ARCHITECTURE = "MiMoForCausalLM"


@dataclass(frozen=True)
class Layout:
    kind: str  # in words
    prefix: str  # its MTP layers' names' start (without `model.`)
    # its first layer's names (after the prefix) -> the head's
    names: dict[str, str]
    block: str | None  # where the rest of its first layer's names are its block's (None: none)
    hidden_first: bool  # the hidden state before the embedding in the projection's input
    layer_type: str | None = None  # its block's, in a model that mixes several


MIMO = Layout("MiMo", "mtp_layers.0.",
              {"token_layernorm.": "token_norm.", "hidden_layernorm.": "hidden_norm.",
               "input_proj.": "input_proj.", "final_layernorm.": "body.norm."},
              "body.layers.0.", True)
QWEN = Layout("Qwen3.5", "mtp.",
              {"pre_fc_norm_embedding.": "token_norm.", "pre_fc_norm_hidden.": "hidden_norm.",
               "fc.": "input_proj.", "norm.": "body.norm.", "layers.0.": "body.layers.0."},
              None, False, "full_attention")
QWEN_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")


def layout_of(target) -> Layout | None:
    """The layout of `target`'s MTP layers where transformers does not read them."""
    if ARCHITECTURE in (target.config.architectures or []):
        return MIMO
    return QWEN if target.config.get_text_config().model_type in QWEN_TYPES else None


def _named(layout: Layout, rest: str) -> str | None:
    """A checkpoint's weight name (after the layout's prefix), as the head names it (None: not
    its first layer's)."""
    return next((mine + rest[len(theirs):] for theirs, mine in layout.names.items()
                 if rest.startswith(theirs)), layout.block and layout.block + rest)


class LayoutHead(Head):
    made = weakref.WeakKeyDictionary()  # target -> its head, loaded once

    def __init__(self, target, layout: Layout, weights: dict[str, torch.Tensor], which: str):
        super().__init__()
        config = target.config.get_text_config()
        self.body = one_layer_body(target, config, layout.layer_type)
        H, norm, eps = config.hidden_size, type(target.get_decoder().norm), config.rms_norm_eps
        with torch.random.fork_rng():  # (all loaded below)
            self.token_norm, self.hidden_norm = norm(H, eps=eps), norm(H, eps=eps)
            self.input_proj = torch.nn.Linear(2 * H, H, bias=False)
        load_weights(self, weights, which)
        self.hidden_first = layout.hidden_first
        self._target = (target,)  # read, not owned: its embedding and output head
        settle(self, target)

    @classmethod
    def of(cls, target, name: str) -> LayoutHead:
        """The first MTP layer of `target`'s checkpoint `name` (of a layout_of), loaded once."""
        if target not in cls.made:
            layout, source = layout_of(target), target.config.name_or_path
            # (a model built here, not read from a checkpoint, ships none)
            folder, _, weights = head_files(source, layout.kind) if source else (None, {}, {})
            named = {_named(layout, k[len(layout.prefix):]): w for k, w in weights.items()
                     if k.startswith(layout.prefix)}
            named.pop(None, None)
            if not named:
                raise SpecError(f"{name} is a {layout.kind} model without MTP layers (no "
                                f"{layout.prefix}* weights): draft with the draft model or "
                                "prompt lookup")
            cls.made[target] = cls(target, layout, named, f"{name}'s MTP layer (in {folder})")
        return cls.made[target]

    def inputs(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        parts = [self.token_norm(self._target[0].get_input_embeddings()(tokens)),
                 self.hidden_norm(features)]
        return self.input_proj(torch.cat(parts[::-1] if self.hidden_first else parts, -1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._target[0].get_output_embeddings()(hidden)
