"""MiMo's MTP layer (Xiaomi MiMo), read from its checkpoint as vLLM reads it (mimo_mtp.py):
transformers loads a MiMo checkpoint as the Qwen2 model it is (its config's `model_type`) and
leaves its `model.mtp_layers.{i}.` aside, which its `MtpModel` does not read. The layer is
`final_layernorm(block(input_proj([hidden_layernorm(h), token_layernorm(e)])))`, the block one of
the target's own decoder layers, read by the target's own output head."""
from __future__ import annotations

import weakref

import torch

from specviz.models.head import Head, one_layer_body, settle
from specviz.models.headfiles import head_files, load_weights
from specviz.spec.strict import SpecError

ARCHITECTURE = "MiMoForCausalLM"
LAYER = "mtp_layers.0."  # its first MTP layer's names (without `model.`), the one it drafts with
# the checkpoint's names -> the head's (the rest are the block's: its decoder layer's own)
NAMES = {"token_layernorm.": "token_norm.", "hidden_layernorm.": "hidden_norm.",
         "input_proj.": "input_proj.", "final_layernorm.": "body.norm."}


def is_mimo(target) -> bool:
    return ARCHITECTURE in (target.config.architectures or [])


class MimoHead(Head):
    made = weakref.WeakKeyDictionary()  # target -> its head, loaded once

    def __init__(self, target, weights: dict[str, torch.Tensor], which: str):
        super().__init__()
        config = target.config.get_text_config()
        self.body = one_layer_body(target, config)
        H, norm, eps = config.hidden_size, type(target.get_decoder().norm), config.rms_norm_eps
        with torch.random.fork_rng():  # (all loaded below)
            self.token_norm, self.hidden_norm = norm(H, eps=eps), norm(H, eps=eps)
            self.input_proj = torch.nn.Linear(2 * H, H, bias=False)
        load_weights(self, {_named(k[len(LAYER):]): w for k, w in weights.items()}, which)
        self._target = (target,)  # read, not owned: its embedding and output head
        settle(self, target)

    @classmethod
    def of(cls, target, name: str) -> MimoHead:
        """The first MTP layer of `target`'s MiMo checkpoint `name`, loaded once."""
        if target not in cls.made:
            folder, _, weights = head_files(target.config.name_or_path, "MiMo")
            layer = {k: w for k, w in weights.items() if k.startswith(LAYER)}
            if not layer:
                raise SpecError(f"{name} is a MiMo model without MTP layers (no "
                                f"model.{LAYER}*): draft with the draft model or prompt lookup")
            cls.made[target] = cls(target, layer, f"{name}'s MTP layer (in {folder})")
        return cls.made[target]

    def inputs(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        embedded = self._target[0].get_input_embeddings()(tokens)
        return self.input_proj(torch.cat([self.hidden_norm(features),
                                           self.token_norm(embedded)], -1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._target[0].get_output_embeddings()(hidden)


def _named(rest: str) -> str:
    """A MiMo MTP layer's weight name (after `model.mtp_layers.0.`), as the head names it."""
    return next((mine + rest[len(theirs):] for theirs, mine in NAMES.items()
                 if rest.startswith(theirs)), "body.layers.0." + rest)
