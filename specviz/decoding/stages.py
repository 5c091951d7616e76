"""What one round reads, and what its stages hand each other (round.py runs them in order).

A decode's settings stay the same over its rounds (`Decoding`). A round starts from a laid-out batch
(`Batch`), and each stage hands the next one a value (a frozen dataclass; the models' caches in it
are written in place, as an engine's are): the drafts (`Drafted`), the target's pass over them
(`Verified`), what each row accepts of them (`Accepted`, always as a chain: a token tree's is its
accepted path, treestep.py), the models' states rolled back (`RolledBack`), and the tokens each row
keeps (`Committed`). The round hands its decoder (eqspec, exspec) a `Step`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from specviz.decoding.faults import Policy
from specviz.decoding.grammar import Matcher
from specviz.decoding.modelstate import ModelState
from specviz.decoding.proposal import Drafter, Proposal
from specviz.decoding.sampling import GREEDY, Sampling, Streams
from specviz.decoding.stops import Stops
from specviz.decoding.trees import Tree
from specviz.models.pairs import ModelPair


@dataclass(frozen=True)
class Decoding:
    """What stays the same over a decode's rounds: the pair, the policy (the correct engine, or its
    faults), the drafter, how it samples, the token budget, whether rounds are recorded, and the
    watch (watch.py) that hears when each round starts and ends; and, per sequence, the draws a
    faulty engine's stream skipped (Policy.skips), and its grammar's state (grammar.py)."""

    pair: ModelPair
    policy: Policy
    drafter: Drafter
    max_new_tokens: int
    sampling: Sampling = GREEDY
    record: bool = True
    watch: object | None = None
    # each sequence's last token of each round (a faulty penalty history keeps only these)
    ends: dict[int, list[int]] = field(default_factory=dict)
    skipped: dict[int, int] = field(default_factory=dict)
    # under a grammar: each sequence's matcher, and the sequences aborted when it failed
    grammars: dict[int, Matcher] = field(default_factory=dict)
    aborted: set[int] = field(default_factory=set)

    @cached_property
    def stops(self) -> Stops:
        return Stops.of(self.pair, self.sampling.stop)

    def matcher(self, seq: int, said: list[int]) -> Matcher:
        """Sequence `seq`'s grammar state, after its output so far (`said`: the first time)."""
        if seq not in self.grammars:
            self.grammars[seq] = self.sampling.grammar.matcher(
                self.pair.tokenizer, self.pair.eos_ids, self.pair.vocab_size)
            self.grammars[seq].advance(said)
        return self.grammars[seq]


@dataclass(frozen=True)
class Batch:
    """A padded batch in flight, as laid out at the start of a round."""

    seqs: list[int]  # sequence id of each row
    tokens: torch.Tensor  # (B, S)
    valid: torch.Tensor  # (B, S) real tokens
    stale: torch.Tensor  # (B, S) slots holding a rejected draft (only a faulty engine keeps them)
    target: ModelState  # its cache holds slots 0..S-2
    draft: ModelState  # the drafter's (a cache of None: it keeps none)


@dataclass(frozen=True)
class Drafted:
    """The drafts, as the rows receive them, and how many of them the verify pass takes."""

    have: torch.Tensor  # (B,) each row's output tokens before the round
    stream: Streams  # the round's random draws
    proposal: Proposal
    width: int  # drafts verified per row: the most any row was offered (a tree: its nodes)
    tree: Tree | None  # the drafts' tree (trees.py); None: a chain
    # a recorded round: the state the verify pass starts from, and its invariants (recording.py)
    before: dict

    @property
    def tokens(self) -> torch.Tensor:
        """(B, width) the drafts the verify pass feeds."""
        return self.proposal.tokens[:, :self.width]

    def room(self, max_new_tokens: int) -> torch.Tensor:
        """(B,) the drafts a row may accept: its budget, and the drafts it was offered."""
        budget = (max_new_tokens - 1 - self.have).clamp(min=0, max=self.width)
        return torch.minimum(budget, self.proposal.counts)


@dataclass(frozen=True)
class Verified:
    """The verify pass: the last committed token and the drafts scored in one target pass."""

    tokens: torch.Tensor  # (B, S+k) the slots it was fed: the batch's, then the drafts
    valid: torch.Tensor
    stale: torch.Tensor
    positions: torch.Tensor  # (B, S+k) the position ids the policy derived
    logits: torch.Tensor  # (B, k+1, V) at the last committed token and each draft
    argmax: torch.Tensor  # (B, k+1)
    # (B, q, H) the target's last hidden states at the slots it fed (the last q of the S+k),
    # where the drafter hears them
    hidden: torch.Tensor | None


@dataclass(frozen=True)
class Accepted:
    """Each row's decision over a chain of drafts (a tree's: its accepted path, and the first child
    the target refused after it): the drafts it kept and the target's token after them."""

    verified: Verified  # the verify pass along the chain
    drafts: Proposal  # the chain's drafts
    room: torch.Tensor  # (B,) the drafts a row may accept (Drafted.room)
    accepted: torch.Tensor  # (B,) drafts kept
    own: torch.Tensor  # (B,) the target's token after them (the correction, or the bonus)
    drawn: dict  # sampled rounds: every draw, for the trace
    # (B, k+1) the verify pass's slot each chain slot was fed at (-1: filler), where a walk laid the
    # chain out of a wider pass; None: the chain is the pass
    along: torch.Tensor | None = None
    # the verify pass's own checks of positions and mask, where its layout is not the chain's
    checks: dict[str, torch.Tensor] = field(default_factory=dict)
    record: dict[str, torch.Tensor] = field(default_factory=dict)  # more per-row tensors to record

    @property
    def k(self) -> int:
        """The chain's width: the round's k from here on."""
        return self.verified.logits.shape[1] - 1


@dataclass(frozen=True)
class RolledBack:
    """Both models' states after the round, recurrent states at the positions the policy picks."""

    target: ModelState  # over the slots verify fed (its provenance), with the hidden states heard
    draft: ModelState  # after drafting


@dataclass(frozen=True)
class Committed:
    """What each row keeps of the round, and the slots after it as the policy lays them out."""

    pick: torch.Tensor  # (B, 1) the token taken after the drafts (a fault may take the draft's)
    emitted: torch.Tensor  # (B, k+1) the drafts kept, then the picked token, then filler
    n_keep: torch.Tensor  # (B,) new tokens, up to the first stop and within the budget
    finished: torch.Tensor  # (B,)
    tokens: torch.Tensor  # (B, S+k+1) old slots and this round's
    valid: torch.Tensor
    stale: torch.Tensor


@dataclass(frozen=True)
class Step:
    """What one round produced, before the batch is laid out again."""

    k: int  # the chain's width: the most drafts any row was offered this round (a tree: its path's)
    n_keep: torch.Tensor  # (B,) new tokens each row kept
    finished: torch.Tensor
    accepted: torch.Tensor
    room: torch.Tensor  # (B,) the drafts each row could accept (Accepted.room)
    out_tok: torch.Tensor  # (B, S+k+1) old slots + this round's slots, as the policy lays them out
    out_val: torch.Tensor
    out_stale: torch.Tensor
    target: ModelState  # after the round, over the out_ slots (provenance: the slots verify fed)
    draft: ModelState  # after drafting
    fields: dict  # recorded per-row tensors and checks (empty when not recording)
    timings: dict
