"""The embedded draft: derived deterministically from SmolLM2-135M-Instruct."""
from __future__ import annotations

from pathlib import Path

from .models import layer_subset

KEEP = [0, 1, 2, 3, 4, 5, 26, 27, 28, 29]


def derive_draft(target, adapter: Path):
    """Return (draft model, one-line description of how it was derived)."""
    return layer_subset(target, KEEP), f"layers {KEEP} of the target"
