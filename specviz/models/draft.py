"""The embedded draft, derived deterministically from SmolLM2-135M-Instruct.

A copy of the target's 30 decoder layers whose every weight tensor gets seeded
Gaussian noise of 0.05 x that tensor's standard deviation; the embedding,
final norm and head are the target's own (shared, not copied). It agrees with
the target often but not always: greedy acceptance about 0.55 at k = 5 on the
built-in prompts, ragged across rows, which is what a forensic tool needs.

What was tried and dropped (measured here, k = 5, built-in prompts):
- layer-skip copies (first a + last b layers, or every other layer): acceptance
  0.00-0.12; SmolLM2 was not trained for early exit;
- a 6-layer skip copy distilled from the target's logits with LoRA (10 minutes
  on 2 cores, fixed steps): acceptance 0.04.
So this draft costs as much as the target: on this pair speculative decoding
is about correctness, not speed (the Hub presets pair real small drafts).

`layer_subset` also builds the tiny test pair's draft (models.py). Engines
that load a draft from disk (vLLM's draft-model speculation) get this one as
a folder: `checkpoints.embedded_draft_dir()`.
"""
from __future__ import annotations

import copy

import torch
from transformers import LlamaForCausalLM

NOISE_SCALE = 0.05
SEED = 0


def layer_subset(model: LlamaForCausalLM, keep: list[int]) -> LlamaForCausalLM:
    """A model of `model`'s class (a Llama, or a Mistral: the same layers) made of some of its
    layers (copied), sharing its embedding, rotary table and head (not copied: they are most of a
    small model)."""
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = len(keep)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in keep]
    with torch.device("meta"):
        sub = type(model)(config)
    layers = []
    for new_idx, old_idx in enumerate(keep):
        layer = copy.deepcopy(model.model.layers[old_idx])
        layer.self_attn.layer_idx = new_idx  # indexes the draft's own cache
        layers.append(layer)
    sub.model.layers = torch.nn.ModuleList(layers)
    sub.model.embed_tokens = model.model.embed_tokens
    sub.model.rotary_emb = model.model.rotary_emb
    sub.model.norm = copy.deepcopy(model.model.norm)
    sub.lm_head = model.lm_head
    sub.generation_config = copy.deepcopy(model.generation_config)
    return sub.eval()


def derive_draft(target) -> tuple[torch.nn.Module, str]:
    """Return (draft model, one-line description of how it was derived)."""
    draft = layer_subset(target, list(range(target.config.num_hidden_layers)))
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in draft.model.layers.parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.add_((noise * p.float().std() * NOISE_SCALE).to(p.dtype))
    return (draft, f"target layers + seeded Gaussian noise ({NOISE_SCALE} x each tensor's std, "
                   f"seed {SEED})")
