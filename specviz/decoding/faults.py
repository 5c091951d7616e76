"""The failure-mode catalogue: each fault swaps one decision of the correct
engine, faithful to what the paper found in published batch implementations.

The engine asks a `Policy` at each decision point; with no faults the policy
is the correct engine. Faults compose: any set can be asked for.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .batch import positions as mask_positions
from .sampling import Sampler, inverse_cdf

# name -> (kind, what it does)
FAULTS = {
    "positions-from-slots": ("breaking", "position ids from the slot index, counting pads and stale slots"),
    "no-mask": ("breaking", "no padding mask: pads and stale slots are attended"),
    "draft-bonus": ("breaking", "the correction/bonus token comes from the draft, not the target"),
    "no-kv-shift": ("breaking", "tokens are realigned but the KV cache is not moved when a row's padding changes"),
    "min-crop": ("breaking", "every row's cache is cropped to the batch-minimum accepted length; tokens are kept"),
    "keep-rejected-kv": ("wasteful", "rejected drafts stay in the cache as masked stale slots"),
    "growing-padding": ("wasteful", "padding is only ever added, never removed"),
    "right-padding": ("wasteful", "prompts are padded on the right (the pad block sits after the prompt)"),
    # Sampling faults (temperature > 0): the text stays fluent, only the distribution is wrong.
    "residual-from-draft": ("sampling", "after a rejection the token is drawn from the draft's q, not the residual"),
    "residual-unclamped": ("sampling", "the residual is p - q without max(0, .)"),
    "residual-unnormalised": ("sampling", "the residual max(0, p - q) is drawn from without renormalising it"),
    "accept-q-over-p": ("sampling", "a draft is accepted with probability min(1, q/p) instead of min(1, p/q)"),
    "temperature-draft-only": ("sampling", "temperature is applied to the draft only: the target verifies at 1"),
    "top-p-not-in-residual": ("sampling", "top-k and top-p truncate p for acceptance but not in the residual"),
    "shared-stream": ("sampling", "every row draws the same random numbers (one stream for the batch)"),
}
SAMPLING = tuple(f for f, (kind, _) in FAULTS.items() if kind == "sampling")
PRESETS = {
    "bsp-like": ("positions-from-slots", "keep-rejected-kv", "right-padding"),
    "dsd-like": ("no-mask", "growing-padding", "draft-bonus"),
}
# The state each breaking fault puts out of step, as forensics names it.
STATE_OF = {
    "positions-from-slots": "positions",
    "no-mask": "mask",
    "draft-bonus": "bonus",
    "no-kv-shift": "kv",
    "min-crop": "kv",
}


def expand(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Presets expanded, duplicates removed, in catalogue order; unknown names raise ValueError."""
    out = set()
    for n in names:
        if n in PRESETS:
            out.update(PRESETS[n])
        elif n in FAULTS:
            out.add(n)
        else:
            raise ValueError(f"unknown fault {n!r}; choose from {', '.join([*FAULTS, *PRESETS])}")
    return tuple(f for f in FAULTS if f in out)


@dataclass(frozen=True)
class Policy:
    """The engine's swappable decisions. `Policy(())` is the correct engine."""

    faults: tuple[str, ...] = ()

    def has(self, fault: str) -> bool:
        return fault in self.faults

    def positions(self, valid: torch.Tensor, stale: torch.Tensor) -> torch.Tensor:
        """Position ids for every slot of the layout.

        From slots, a position counts every slot the row occupies before it:
        with left padding the pads too; with right padding (the row's storage
        starts at slot 0 and its pads lie beyond) only real and stale slots."""
        if not self.has("positions-from-slots"):
            return mask_positions(valid)
        if self.has("right-padding"):
            return mask_positions(valid | stale)
        return torch.arange(valid.shape[1], device=valid.device).expand_as(valid)

    def seen(self, valid: torch.Tensor) -> torch.Tensor:
        """The slots the attention mask lets through."""
        return torch.ones_like(valid) if self.has("no-mask") else valid

    def draft_steps(self, k: int) -> int:
        """A draft that supplies the bonus token must propose one more."""
        return k + 1 if self.has("draft-bonus") else k

    @property
    def compact(self) -> bool:
        """Whether realignment removes stale slots (else rejected drafts stay in place)."""
        return not self.has("keep-rejected-kv")

    @property
    def move_kv(self) -> bool:
        return not self.has("no-kv-shift")

    # -- speculative sampling (Leviathan et al.; Chen et al.)

    def target_sampler(self, sampler: Sampler) -> Sampler:
        return replace(sampler, temperature=1.0) if self.has("temperature-draft-only") else sampler

    def stream(self, seqs: torch.Tensor) -> torch.Tensor:
        """The random stream each row draws from: its own sequence's."""
        return torch.zeros_like(seqs) if self.has("shared-stream") else seqs

    def accept(self, p: torch.Tensor, q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Accept a draft with probability min(1, p/q): u < p/q, written without dividing."""
        return u * p < q if self.has("accept-q-over-p") else u * q < p

    def residual(self, sampler: Sampler, logits: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                 u: torch.Tensor) -> torch.Tensor:
        """The token after a rejection: a draw from max(0, p - q), normalised (p = sampler.probs(logits))."""
        if self.has("residual-from-draft"):
            return inverse_cdf(q, u)
        if self.has("top-p-not-in-residual"):
            p = sampler.probs(logits, truncate=False)
        diff = p - q
        if self.has("residual-unclamped"):
            return inverse_cdf(diff, u)
        return inverse_cdf(diff.clamp(min=0), u, normalised=not self.has("residual-unnormalised"))
