"""The fault catalogue: every fault's name, kind and description, the presets, and the state each breaking
fault puts out of step. Plain data, kept apart from the engine's side of the faults (decoding/faults.py, torch): a
RunSpec checks its fault names here, so specs and trace files validate without torch.
"""
from __future__ import annotations

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
    # Breaking on a hybrid's recurrent states (Gated DeltaNet, Mamba, short convolutions); nothing on other models.
    "state-not-rolled-back": ("recurrent", "a recurrent state is not rolled back after rejected drafts: every drafted "
                                           "token stays in it (mlx-lm PR #1109: a rollback that was a no-op)"),
    "state-after-zero-draft": ("recurrent", "a row offered no drafts reads its recurrent state from before the last "
                                            "round's accepted drafts (vLLM #39273: the decode path's stale column)"),
    "conv-state-off-by-one": ("recurrent", "a recurrent layer's convolution state is rolled back one position late: "
                                           "a rejected draft stays in its window; the scan's state is right"),
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
    "state-not-rolled-back": "recurrent",
    "state-after-zero-draft": "recurrent",
    "conv-state-off-by-one": "recurrent",
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
