"""One model's state over a padded batch (batch.py): its cache, the position each cache slot was
computed at, and the row's tokens its recurrent state holds.

The target's and the drafter's states differ only in how far their caches lag the layout: the
target's holds every slot but the last (fed again by the verify pass); a draft model's one slot
fewer (its first pass re-feeds the last two). Every rearrangement of the batch (a realignment, a row
leaving, a row split off or stacked in) is given once, in the layout's slot coordinates, and each
state takes its own share of it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.decoding import kvcache


@dataclass
class ModelState:
    cache: object  # None: the model keeps none (kvcache.py then does nothing)
    written: torch.Tensor  # (B, slots) the position each cache slot was computed at, -1 if none
    # (B,) the row's tokens its recurrent state holds (-1: it holds a token not the row's)
    held: torch.Tensor
    # (B,) what it held after the last round's first position (state-after-zero-draft)
    held_first: torch.Tensor
    behind: int  # the layout's last slots its cache does not hold
    # (B, slots, H) the last hidden state each cache slot's pass computed, kept where a drafter
    # drafts from them (spec/drafters.py: hears)
    hidden: torch.Tensor | None = None

    @classmethod
    def fresh(cls, cache, valid: torch.Tensor, positions: torch.Tensor, behind: int) -> ModelState:
        """The state a laid-out batch's first passes compute, into `cache` (empty until then)."""
        slots = valid.shape[1] - behind
        held = kvcache.held_by(cache, valid.sum(1) - behind)  # (a prefix hit's states, if any)
        return cls(cache, torch.where(valid, positions, -1)[:, :slots], held, held, behind)

    def length(self, width):
        """Its cache's slots on a layout `width` slots wide (an int or a per-row tensor); 0 when it
        keeps none."""
        return width - self.behind if self.cache is not None else 0

    def rearranged(self, rows: torch.Tensor, src: torch.Tensor | None, valid: torch.Tensor,
                   lost: torch.Tensor | None) -> ModelState:
        """This state for the batch laid out again: new row i is old row rows[i], and its new slot j
        old slot src[i, j] (None: every slot stays where it is, and the layout is cut to `valid`'s
        width). `lost`: new slots whose K/V a fault threw away. The cache is rebuilt in place."""
        slots = valid.shape[1] - self.behind
        hidden = self.hidden
        if src is not None:
            kvcache.gather(self.cache, rows, src[:, :slots], valid[:, :slots])
            written = self.written[rows[:, None], src[:, :slots]]
            if hidden is not None:
                hidden = hidden[rows[:, None], src[:, :slots]]
        else:
            if len(rows) < len(self.held):
                kvcache.select_rows(self.cache, rows)
            kvcache.crop(self.cache, slots, valid[:, :slots])
            written = self.written[rows, :slots]
            if hidden is not None:
                hidden = hidden[rows, :slots]
        if lost is not None:
            kvcache.zero_slots(self.cache, lost[:, :slots])
            written = written.masked_fill(lost[:, :slots], -1)
        return ModelState(self.cache, written.masked_fill(~valid[:, :slots], -1), self.held[rows],
                          self.held_first[rows], self.behind, hidden)

    def split(self, spans: list[tuple[int, int]], valid: torch.Tensor) -> list[ModelState]:
        """One single-row state per batch row, row i keeping the layout's slots
        spans[i] = (start, end) (`valid`: the layout's real slots)."""
        slots = [(lo, hi - self.behind) for lo, hi in spans]
        caches = kvcache.split(self.cache, slots, valid)
        return [ModelState(cache, self.written[i: i + 1, lo:hi], self.held[i: i + 1],
                           self.held_first[i: i + 1], self.behind,
                           None if self.hidden is None else self.hidden[i: i + 1, lo:hi])
                for i, (cache, (lo, hi)) in enumerate(zip(caches, slots))]

    def let_go(self) -> None:
        """Its row left: a paged cache gives its blocks back."""
        kvcache.let_go(self.cache)

    @staticmethod
    def merge(states: list[ModelState], valid: torch.Tensor) -> ModelState:
        """Single-row states stacked into one batch laid out as `valid` (left-padded
        to its width)."""
        slots = valid.shape[1] - states[0].behind
        written = torch.where(valid, valid.long().cumsum(1) - 1, -1)[:, :slots]
        hidden = None
        if states[0].hidden is not None:  # left-padded with zeros, as the cache is
            hidden = torch.cat([
                torch.nn.functional.pad(s.hidden, (0, 0, slots - s.hidden.shape[1], 0))
                for s in states])
        return ModelState(kvcache.merge([s.cache for s in states]), written,
                          torch.cat([s.held for s in states]),
                          torch.cat([s.held_first for s in states]), states[0].behind, hidden)
