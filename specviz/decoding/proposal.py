"""The drafter protocol: what proposes the tokens a round verifies (round.py), and what it hands
the round.

A drafter proposes up to k tokens for every row of a padded batch, with a count per row: 0 is
allowed, and that row then takes one token from the target this round. eqspec and exspec verify
whatever it proposes; a row never accepts more drafts than it was offered. What was accepted reaches
a drafter through the batch it is given next round (the committed tokens and its own state, which
every rearrangement of the batch moves with the target's: modelstate.py), as transformers'
`CandidateGenerator` learns it from `input_ids`; and through `observe`, which hears each verify pass
(with the target's hidden states, where its declaration asks for them). The drafters
themselves: drafters.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specviz.decoding.faults import Policy
from specviz.decoding.modelstate import ModelState
from specviz.decoding.sampling import Sampling, Streams
from specviz.spec.drafters import DrafterKind


@dataclass
class Proposal:
    # (B, n): a row's slots past its count hold filler the target never accepts
    tokens: torch.Tensor
    counts: torch.Tensor  # (B,) drafts each row offers, 0..n
    # (B, n, V) the distribution each draft was drawn from; sampled rounds only
    probs: torch.Tensor | None
    confidence: torch.Tensor  # (B, n) the drafter's probability of each of its drafts (recorded)
    # (B, S+n-1) the position each draft cache slot was computed at afterwards, -1 if none
    fed: torch.Tensor
    # (B, n) a token tree (trees.py): each draft's parent, -1 the row's last committed token; a
    # row's drafts past its count are filler. None: a chain
    parents: torch.Tensor | None = None

    def handed(self, rows: torch.Tensor) -> Proposal:
        """The drafts as the rows receive them: row i gets row `rows[i]`'s (the draft cache stays
        the drafter's)."""
        return Proposal(self.tokens[rows], self.counts[rows],
                        None if self.probs is None else self.probs[rows],
                        self.confidence[rows], self.fed,
                        None if self.parents is None else self.parents[rows])


class Drafter(Protocol):
    """What proposes a round's drafts. Verification never knows which drafter it has (transformers'
    `CandidateGenerator`): it reads a `Proposal`."""

    kind: DrafterKind  # its declaration (spec/drafters.py)
    # the target's hidden states it is fed, as indices into transformers' `hidden_states` (a
    # head's; none for the others)
    heard: tuple[int, ...]

    def new_state(self, valid: torch.Tensor, positions: torch.Tensor, pages) -> ModelState:
        """Its state for a freshly laid-out batch, empty until its first pass (a cache of None: it
        keeps none). `pages(unsettled=0)`: the batch's pages in the drafter's pool, where its cache
        is paged (None: contiguous; `unsettled`: paging.Pages')."""

    def prefill(self, policy: Policy, b) -> None:
        """Fill its state (b.draft) with a laid-out batch's slots, once the target has filled
        its own."""

    def propose(self, policy: Policy, b, k: int, sampling: Sampling, stream: Streams,
                have: torch.Tensor) -> Proposal:
        """Up to k drafts for every row of batch `b`, whose rows already have `have` tokens."""

    def observe(self, b, verified, accepted) -> None:
        """Hear the round's verify pass (stages.Verified, with the target's hidden states where
        `kind.hears` asks for them) and what each row accepted (stages.Accepted), before the batch
        is laid out again."""

    def assisted(self, k: int) -> dict:
        """transformers' `generate` arguments that draft as it does
        (the hf-assisted cross-check)."""
