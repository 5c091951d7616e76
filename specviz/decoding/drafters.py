"""Drafters: what proposes the tokens a round verifies (round.py), behind one protocol.

A drafter proposes up to k tokens for every row of a padded batch, with a count per row: 0 is allowed, and
that row then takes one token from the target this round. eqspec and exspec verify whatever it proposes; a
row never accepts more drafts than it was offered. What was accepted reaches a drafter through the batch it
is given next round (the committed tokens and its own state, which every rearrangement of the batch moves
with the target's: modelstate.py), as transformers' `CandidateGenerator` learns it from `input_ids`; and through
`observe`, which hears each verify pass (with the target's hidden states, where its declaration asks for them).
What each drafter is (its cache, cost, options) is declared in spec/drafters.py; here is how it drafts.

- `ModelDrafter`: a draft model with its own KV cache, laid out like the target's.
- `PromptLookup`: n-gram lookup in each row's own prompt and output; no model, no cache.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specviz.decoding import kvcache
from specviz.decoding.faults import Policy
from specviz.decoding.modelstate import ModelState
from specviz.decoding.passes import run_model
from specviz.decoding.sampling import DRAFT, Sampling, Streams, inverse_cdf
from specviz.models.pairs import ModelPair
from specviz.spec.drafters import DRAFTERS, DrafterKind


@dataclass
class Proposal:
    tokens: torch.Tensor  # (B, n): a row's slots past its count hold filler the target never accepts
    counts: torch.Tensor  # (B,) drafts each row offers, 0..n
    probs: torch.Tensor | None  # (B, n, V) the distribution each draft was drawn from; sampled rounds only
    confidence: torch.Tensor  # (B, n) the drafter's probability of each of its drafts (recorded)
    fed: torch.Tensor  # (B, S+n-1) the position each draft cache slot was computed at afterwards, -1 if none

    def handed(self, rows: torch.Tensor) -> Proposal:
        """The drafts as the rows receive them: row i gets row `rows[i]`'s (the draft cache stays the drafter's)."""
        return Proposal(self.tokens[rows], self.counts[rows], None if self.probs is None else self.probs[rows],
                        self.confidence[rows], self.fed)


class Drafter(Protocol):
    """What proposes a round's drafts. Verification never knows which drafter it has (transformers'
    `CandidateGenerator`): it reads a `Proposal`."""

    kind: DrafterKind  # its declaration (spec/drafters.py)

    def new_state(self, valid: torch.Tensor, positions: torch.Tensor) -> ModelState:
        """Its state for a freshly laid-out batch, empty until its first pass (a cache of None: it keeps none)."""

    def prefill(self, policy: Policy, state: ModelState, tokens: torch.Tensor, valid: torch.Tensor,
                stale: torch.Tensor) -> None:
        """Fill its state with a laid-out batch's slots."""

    def propose(self, policy: Policy, b, k: int, sampling: Sampling, stream: Streams,
                have: torch.Tensor) -> Proposal:
        """Up to k drafts for every row of batch `b`, whose rows already have `have` tokens."""

    def observe(self, b, verified, accepted) -> None:
        """Hear the round's verify pass (round.Verified, with the target's hidden states where `kind.hears` asks
        for them) and what each row accepted (round.Accepted), before the batch is laid out again."""

    def assisted(self, k: int) -> dict:
        """transformers' `generate` arguments that draft as it does (the hf-assisted cross-check)."""


def drafter_for(spec, pair: ModelPair) -> Drafter:
    """The drafter a RunSpec asks for, over `pair`."""
    return BUILT[spec.drafter].of(spec, pair)


class ModelDrafter:
    """A draft model proposing k tokens a row, one pass each. Its cache lags the layout by two slots (holds
    0..S-3 at a round's start): the first pass re-feeds the last two, so that after a fully accepted block it
    catches up on the k-th draft it never fed."""

    kind = DRAFTERS["model"]
    behind = 2

    def __init__(self, pair: ModelPair):
        self.pair = pair

    @classmethod
    def of(cls, spec, pair: ModelPair) -> ModelDrafter:
        return cls(pair)

    def new_state(self, valid: torch.Tensor, positions: torch.Tensor) -> ModelState:
        return ModelState.fresh(kvcache.new(self.pair.draft), valid, positions, self.behind)

    def prefill(self, policy: Policy, state: ModelState, tokens: torch.Tensor, valid: torch.Tensor,
                stale: torch.Tensor) -> None:
        n = tokens.shape[1] - self.behind
        if n > 0:
            run_model(self.pair, policy, "draft prefill", tokens[:, :n], valid[:, :n], stale[:, :n], 0, state.cache,
                      keep=1)

    def observe(self, b, verified, accepted) -> None:
        pass  # what the target accepted reaches it through the next round's tokens

    def assisted(self, k: int) -> dict:
        return {"assistant_model": self.pair.draft}

    def propose(self, policy: Policy, b, k: int, sampling: Sampling, stream: Streams,
                have: torch.Tensor) -> Proposal:
        S, state = b.tokens.shape[1], b.draft
        d_tok, d_val, d_stl = b.tokens, b.valid, b.stale
        drafts, probs = [], []
        q_start, steps = (S - self.behind if kvcache.length(state.cache) else 0), policy.draft_steps(k)
        eos = torch.tensor(self.pair.eos_ids, device=b.tokens.device)
        drafted_eos = torch.zeros(len(b.seqs), dtype=torch.bool, device=b.tokens.device)
        sampler = sampling.drafts(b.seqs)
        for j in range(steps):
            # A recurrent draft state after each token it is fed: the first pass's last two, then each draft.
            with kvcache.keeping(state.cache, self.behind if j == 0 else 1):
                logits, d_pos, _ = run_model(self.pair, policy, "draft", d_tok, d_val, d_stl, q_start, state.cache,
                                             keep=policy.first_draft_slots if j == 0 else 1)
            if j == 0:
                logits = policy.first_draft(logits, have)
            if sampling.greedy:
                probs.append(logits[:, -1].softmax(-1))
                nxt = logits[:, -1].argmax(-1)
            else:
                probs.append(sampler.probs(logits[:, -1]))
                nxt = inverse_cdf(probs[-1], stream.draw(have + j, DRAFT))
            drafts.append(nxt)
            drafted_eos |= torch.isin(nxt, eos)
            if j < steps - 1 and not policy.has("draft-bonus") and bool(drafted_eos.all()):
                break  # every row has drafted an EOS: no later draft could be emitted
            if j < steps - 1:
                q_start = d_tok.shape[1]
                d_tok = torch.cat([d_tok, nxt[:, None]], 1)
                d_val = torch.cat([d_val, torch.ones_like(b.valid[:, :1])], 1)
                d_stl = torch.cat([d_stl, torch.zeros_like(b.valid[:, :1])], 1)
        D, Q = torch.stack(drafts, 1), torch.stack(probs, 1)
        confidence = Q.gather(2, D[..., None])[..., 0]
        counts = torch.full_like(have, D.shape[1])
        return Proposal(D, counts, None if sampling.greedy else Q, confidence,
                        torch.cat([state.written, d_pos[:, S - self.behind:]], 1))


class PromptLookup:
    """Prompt lookup: each row proposes the tokens that followed an earlier occurrence of its own last n tokens,
    in its prompt or its output so far. The longest n in [min_n, max_n] with a match wins, and of its matches
    the earliest, as transformers' `PromptLookupCandidateGenerator` and vLLM's `NgramProposer` choose. A row
    with no match offers nothing; one whose match lies near its end offers the fewer tokens that follow it.
    Every row is searched at once: one window comparison per n over the batch."""

    kind = DRAFTERS["lookup"]

    def __init__(self, pair: ModelPair, min_n: int, max_n: int):
        self.vocab_size = pair.vocab_size
        self.min_n, self.max_n = min_n, max_n

    @classmethod
    def of(cls, spec, pair: ModelPair) -> PromptLookup:
        return cls(pair, spec.ngram_min, spec.ngram_max)

    def new_state(self, valid: torch.Tensor, positions: torch.Tensor) -> ModelState:
        # no cache: the slots it would hold (a draft model's) are recorded empty, and never checked
        return ModelState.fresh(None, valid, positions, ModelDrafter.behind)

    def prefill(self, policy: Policy, state: ModelState, tokens, valid, stale) -> None:
        pass

    def observe(self, b, verified, accepted) -> None:
        pass  # it searches each round's tokens afresh

    def assisted(self, k: int) -> dict:  # transformers' PromptLookupCandidateGenerator, matching down to 1 token
        return {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": self.max_n}

    def propose(self, policy: Policy, b, k: int, sampling: Sampling, stream: Streams,
                have: torch.Tensor) -> Proposal:
        B, S = b.tokens.shape
        n_out = policy.draft_steps(k)  # a draft-bonus engine takes one token more from its drafter
        # Each row's real tokens, right-aligned (pads and stale slots moved first): its history.
        hist = b.tokens.gather(1, torch.argsort(b.valid.to(torch.int8), dim=1, stable=True))
        first_real = S - b.valid.sum(1)
        slot = torch.arange(S, device=hist.device)
        found = torch.zeros(B, dtype=torch.bool, device=hist.device)
        begin = torch.zeros(B, dtype=torch.long, device=hist.device)  # where the proposed tokens start
        for n in range(min(self.max_n, S - 1), self.min_n - 1, -1):
            windows = hist.unfold(1, n, 1)[:, : S - n]  # windows followed by at least one token
            hit = (windows == hist[:, None, S - n:]).all(-1) & (slot[None, : S - n] >= first_real[:, None])
            new = hit.any(1) & ~found
            begin = torch.where(new, hit.long().argmax(1) + n, begin)  # argmax: the first hit
            found |= new
        follow = torch.where(found, S - begin, 0)  # the tokens after the match, to the row's end
        j = torch.arange(n_out, device=hist.device)
        at = (begin[:, None] + j).clamp(max=S - 1)
        tokens = torch.where(j < follow[:, None], hist.gather(1, at), hist[:, -1:])  # filler: the row's last token
        probs = None
        if not sampling.greedy:  # a lookup is certain of its drafts: q is a point mass on each
            probs = torch.nn.functional.one_hot(tokens, self.vocab_size).float()
        return Proposal(tokens, follow.clamp(max=k), probs, torch.ones(tokens.shape, device=hist.device),
                        torch.full((B, S + n_out - 1), -1, device=hist.device))


BUILT = {d.kind.name: d for d in (ModelDrafter, PromptLookup)}  # one for every declared drafter (a test holds it)
