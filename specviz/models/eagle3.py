"""An EAGLE-3 head as published: the checkpoint layout vLLM and SGLang load (SpecForge's, the EAGLE
authors'), read from its own folder (config.json and safetensors) as vLLM 0.32 reads it
(model_executor/models/llama_eagle3.py).

- It hears several of the target's layers (its aux hidden states): the residual stream after each
  of `eagle_aux_hidden_state_layer_ids` decoder layers (transformers' `hidden_states[i]`), read
  from the config's top level or its `eagle_config`, else the engines' default (2, L/2, L-3) for a
  target of L layers: the fallback vLLM PR #50170 found silent. `fc` maps them, concatenated in
  layer order (vLLM sorts the ids), to one hidden state, once per target slot.
- Its one decoder layer reads 2H: the token's embedding (`input_layernorm`) beside the hidden state
  (`hidden_norm`), whose residual it continues. It feeds itself its output before the final norm.
- Its output head covers a draft vocabulary: draft id i is target id i + d2t[i] (offsets, not
  ids); the other target ids get the lowest logit its dtype holds (vLLM's -inf, kept finite).
- Variants the engines accept: `norm_before_fc`, `fc_norm`, `norm_output`, `norm_before_residual`.
  A head without aux states (`use_aux_hidden_state` false) or with more than one layer is refused.
- The field's wrong ways of feeding it (MISFEEDINGS) are built as heads too (`mistaken`): the head
  faults feed it so, and the acceptance judges replay each to name the one a run's drafts follow.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (LlamaDecoderLayer, LlamaModel,
                                                      LlamaRMSNorm)

from specviz.models.architecture import throughout_float64
from specviz.models.head import PublishedHead
from specviz.models.headfiles import load_weights
from specviz.spec.strict import SpecError

VARIANTS = ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")


# The field's wrong ways of feeding a published EAGLE-3 head, in words (the faults that replay them
# name them: spec/faults.toml's `misfeeds`); `Eagle3Head.mistaken` builds each.
MISFEEDINGS = {
    "aux-one-early": "its aux states one layer early (vLLM PR #43671)",
    "aux-fallback": "the engines' default aux layers 2, L/2, L-3, as if its config named none "
                    "(vLLM PR #50170)",
    "norm-before-fc-flipped": "its features normed before fc where it asks for no norm, or not "
                              "normed where it does (SGLang PR #32334)",
    "d2t-as-ids": "its d2t read as target ids, not offsets (verl-SpeCo PR #67)",
    "d2t-dropped": "its d2t dropped: draft id i read as target id i (Automodel PR #2447)",
}


def _unit_norm(width: int, eps: float, like: torch.Tensor) -> LlamaRMSNorm:
    """An RMS norm of unit weight on `like`'s device and dtype, where a head that asks for none is
    normed anyway."""
    norm = LlamaRMSNorm(width, eps=eps).to(device=like.device, dtype=like.dtype)
    norm.requires_grad_(False)
    return throughout_float64(norm) if like.dtype == torch.float64 else norm


def default_aux_layers(layers: int) -> tuple[int, ...]:
    """The aux layers vLLM and SGLang read when a head's config names none."""
    return (2, layers // 2, layers - 3)


@dataclass(frozen=True)
class Eagle3Config:
    """What the head's config.json says, checked against its target."""
    aux_layers: tuple[int, ...]
    fell_back: bool  # its config names no aux layers: the engines' default
    draft_vocab: int
    variants: tuple[str, ...]  # those of VARIANTS it turns on

    @classmethod
    def read(cls, raw: dict, target_layers: int, where: str) -> Eagle3Config:
        nested = raw.get("eagle_config") or {}
        if not nested.get("use_aux_hidden_state", True):
            raise SpecError(f"the EAGLE-3 head at {where} hears no aux hidden states "
                            "(eagle_config.use_aux_hidden_state false): that variant is not built")
        if raw.get("num_hidden_layers", 1) != 1:
            raise SpecError(f"the EAGLE-3 head at {where} has {raw['num_hidden_layers']} layers; "
                            "specviz reads one-layer heads, as published")
        named = raw.get("eagle_aux_hidden_state_layer_ids") or nested.get(
            "eagle_aux_hidden_state_layer_ids")
        # the engines collect them as the target's layers pass, in order, once each
        aux = tuple(sorted(set(named or default_aux_layers(target_layers))))
        if not all(0 <= i < target_layers for i in aux):
            raise SpecError(f"the EAGLE-3 head at {where} hears layers {list(aux)}, but its "
                            f"target has {target_layers} (ids 0 to {target_layers - 1})")
        on = tuple(v for v in VARIANTS if nested.get(v, raw.get(v, False)))
        return cls(aux, not named, raw.get("draft_vocab_size") or raw["vocab_size"], on)


class _Eagle3Layer(LlamaDecoderLayer):
    """The head's decoder layer: fed [embedding, hidden state] (2H), it attends over both
    normalised and continues the hidden state's residual."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool):
        super().__init__(config, 0)
        H, attn = config.hidden_size, self.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(attn, name)
            setattr(attn, name, torch.nn.Linear(2 * H, old.out_features, bias=old.bias is not None))
        self.hidden_norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None,
                use_cache=False, position_embeddings=None, **kwargs):
        embedded, hidden = hidden_states.chunk(2, -1)
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        mixed = torch.cat([self.input_layernorm(embedded), normed], -1)
        attended, _ = self.self_attn(hidden_states=mixed, attention_mask=attention_mask,
                                     position_ids=position_ids, cache=cache, use_cache=use_cache,
                                     position_embeddings=position_embeddings, **kwargs)
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(PublishedHead):
    """A published EAGLE-3 head over `target`."""

    layout, drafter = "EAGLE-3", "eagle3"

    def __init__(self, target, raw: dict, weights: dict[str, torch.Tensor], where: str):
        super().__init__()
        text = target.config.get_text_config()
        self.config = Eagle3Config.read(raw, text.num_hidden_layers, where)
        self.heard = self.config.aux_layers  # the target's hidden_states it is fed
        config = LlamaConfig(**{k: v for k, v in raw.items() if k != "architectures"})
        config.num_hidden_layers, config.vocab_size = 1, text.vocab_size
        H, Ht = config.hidden_size, getattr(config, "target_hidden_size", None) or text.hidden_size
        if Ht != text.hidden_size:
            raise SpecError(f"the EAGLE-3 head at {where} was made for a target of hidden size "
                            f"{Ht}; this target's is {text.hidden_size}")
        with torch.random.fork_rng():
            body = LlamaModel(config)
        body.embed_tokens = None  # fed embeddings (its own, else the target's)
        body.layers[0] = _Eagle3Layer(config, "norm_before_residual" in self.config.variants)
        self.norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        # it feeds itself its output before the norm, unless norm_output
        body.norm = self.norm if "norm_output" in self.config.variants else torch.nn.Identity()
        self.body = body
        n, fc_in = len(self.heard), len(self.heard) * Ht
        self.fc = torch.nn.Linear(fc_in, H, bias=False)
        self.input_norm = (LlamaRMSNorm(fc_in, eps=config.rms_norm_eps)
                           if "norm_before_fc" in self.config.variants else None)
        self.fc_norm = (torch.nn.ModuleList(LlamaRMSNorm(Ht, eps=config.rms_norm_eps)
                                            for _ in range(n))
                        if "fc_norm" in self.config.variants else None)
        self.lm_head = torch.nn.Linear(H, self.config.draft_vocab, bias=False)
        if "embed_tokens.weight" in weights:  # else the target's is shared
            self.embed_tokens = torch.nn.Embedding(text.vocab_size, H)
        d2t = weights.pop("d2t", torch.zeros(self.config.draft_vocab, dtype=torch.long))
        self.register_buffer("to_target", torch.arange(len(d2t)) + d2t.long())
        if int(self.to_target.min()) < 0 or int(self.to_target.max()) >= text.vocab_size:
            raise SpecError(f"the EAGLE-3 head at {where} maps its draft vocabulary outside the "
                            f"target's {text.vocab_size} ids: is its d2t ids, not offsets?")
        self._load(weights, where)
        self._target = (target,)  # read, not owned

    def _load(self, weights: dict[str, torch.Tensor], where: str) -> None:
        weights.pop("t2d", None)  # the engines ignore it: d2t says it all
        renamed = {(k.replace("midlayer.", "body.layers.0.") if k.startswith("midlayer.")
                    else k.replace("layers.0.", "body.layers.0.") if k.startswith("layers.0.")
                    else k): w for k, w in weights.items()}
        # computed, not shipped: the vocabulary map (from d2t)
        load_weights(self, renamed, f"the EAGLE-3 head at {where}", computed=("to_target",))

    def mistaken(self) -> dict[str, Eagle3Head]:
        """The field's ways of feeding this head wrongly, each as the head so fed, by name
        (MISFEEDINGS): its aux states one layer early; where its config names others, the
        engines' default layers (as many); its features' norm before `fc` flipped; its d2t read
        as ids; and, where it maps a draft vocabulary, that map dropped."""
        layers = self._target[0].config.get_text_config().num_hidden_layers
        out = {"aux-one-early": self._fed(heard=tuple(max(i - 1, 0) for i in self.heard))}
        default = tuple(sorted(set(default_aux_layers(layers))))
        if default != self.heard and len(default) == len(self.heard):
            out["aux-fallback"] = self._fed(heard=default)
        flipped = (None if self.input_norm is not None else
                   _unit_norm(self.fc.in_features, self.norm.variance_epsilon,
                              self.fc.weight))
        out["norm-before-fc-flipped"] = self._fed(input_norm=flipped)
        offsets = self.to_target - torch.arange(len(self.to_target), device=self.to_target.device)
        vocab = self._target[0].config.get_text_config().vocab_size
        out["d2t-as-ids"] = self._fed(to_target=offsets.clamp(0, vocab - 1))
        if bool(offsets.any()):
            out["d2t-dropped"] = self._fed(to_target=offsets.new_tensor(
                range(len(offsets))))
        return out

    def misfed(self, way: str) -> Eagle3Head:
        """The head fed wrong way `way`; a SpecError where that changes nothing."""
        ways = self.mistaken()
        if way not in ways:
            raise SpecError(f"feeding the EAGLE-3 head {MISFEEDINGS[way]} changes nothing: "
                            + ("its config names no aux layers, the engines' default "
                               "ones, or not as many" if way == "aux-fallback"
                               else "it maps no draft vocabulary (its d2t is all 0)"))
        return ways[way]

    def _fed(self, **changed) -> Eagle3Head:
        """The same head, these parts swapped (the weights shared; this head untouched)."""
        fed = copy.copy(self)
        fed._modules, fed._buffers = dict(self._modules), dict(self._buffers)
        for name, value in changed.items():
            setattr(fed, name, value)
        return fed

    def from_target(self, features: torch.Tensor) -> torch.Tensor:
        """(…, H) the hidden state the head drafts from, out of the target's aux states
        concatenated (…, n·H)."""
        if self.input_norm is not None:
            features = self.input_norm(features)
        if self.fc_norm is not None:
            chunks = features.chunk(len(self.fc_norm), -1)
            features = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], -1)
        return self.fc(features)

    def facts(self, written: list[int]) -> dict:
        held = torch.zeros(self._target[0].config.get_text_config().vocab_size, dtype=torch.bool)
        held[self.to_target.cpu()] = True
        c = self.config
        return {"aux_layers": list(c.aux_layers), "fell_back": c.fell_back,
                "draft_vocab": c.draft_vocab, "vocab": len(held), "variants": list(c.variants),
                "coverage": float(held[written].float().mean()) if written else None}

    def inputs(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.embedded(tokens), features], -1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Over the target's vocabulary: the draft vocabulary's at their target ids."""
        normed = hidden if "norm_output" in self.config.variants else self.norm(hidden)
        drafted = self.lm_head(normed)
        full = drafted.new_full((*drafted.shape[:-1], self._target[0].config.get_text_config()
                                 .vocab_size), torch.finfo(drafted.dtype).min)
        full[..., self.to_target] = drafted
        return full
