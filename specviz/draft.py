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

Engines that load a draft from disk (vLLM's draft-model speculation) get it
as a folder: `embedded_draft_dir()`.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .models import _atomic_save, cache_dir, embedded_target_dir, layer_subset

NOISE_SCALE = 0.05
SEED = 0


def derive_draft(target) -> tuple[torch.nn.Module, str]:
    """Return (draft model, one-line description of how it was derived)."""
    draft = layer_subset(target, list(range(target.config.num_hidden_layers)))
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in draft.model.layers.parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.add_((noise * p.float().std() * NOISE_SCALE).to(p.dtype))
    return draft, f"target layers + seeded Gaussian noise ({NOISE_SCALE} x each tensor's std, seed {SEED})"


def embedded_draft_dir() -> Path:
    """The embedded draft as a model folder of its own: float32 safetensors (with its own copy of the
    target's embedding and head), config and the target's tokenizer files. Derived once from the cached
    target and cached beside it; the name carries the derivation's noise and seed, so changing either
    never reuses an old folder."""
    dest = cache_dir() / f"smollm2-135m-instruct-draft-noise{NOISE_SCALE}-seed{SEED}"
    if not dest.exists():
        target_dir = embedded_target_dir()
        draft, _ = derive_draft(AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32))

        def save(tmp: Path) -> None:
            draft.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(target_dir).save_pretrained(tmp)

        _atomic_save(dest, save)
    return dest
