"""Drafters: what proposes the tokens a round verifies (round.py), behind one protocol
(proposal.py: what a drafter is asked, and the Proposal it hands the round). What each drafter is
(its cache, cost, options) is declared in spec/drafters.py; here is how it drafts.

- `ModelDrafter`: a draft model with its own KV cache, laid out like the target's.
- `PromptLookup`: n-gram lookup in each row's own prompt and output; no model, no cache.
- `HeadDrafter`: a head over the target's own hidden states (an EAGLE-style head, or the target's
  own MTP layer: `EagleDrafter`, `MtpDrafter`); no draft model.
"""
from __future__ import annotations

import torch

from specviz.decoding import kvcache, trees
from specviz.decoding.faults import Policy
from specviz.decoding.modelstate import ModelState
from specviz.decoding.passes import run_head, run_model
from specviz.decoding.proposal import Drafter, Proposal
from specviz.decoding.sampling import DRAFT, Sampling, Streams, inverse_cdf, sibling
from specviz.models.architecture import is_recurrent
from specviz.models.heads import head_for
from specviz.models.pairs import ModelPair
from specviz.spec.drafters import DRAFTERS, DrafterKind
from specviz.spec.strict import SpecError


def drafter_for(spec, pair: ModelPair) -> Drafter:
    """The drafter a RunSpec asks for, over `pair`."""
    return BUILT[spec.drafter].of(spec, pair)


class ModelDrafter:
    """A draft model proposing k tokens a row, one pass each. Its cache lags the layout by two slots
    (holds 0..S-3 at a round's start): the first pass re-feeds the last two, so that after a fully
    accepted block it catches up on the k-th draft it never fed."""

    kind = DRAFTERS["model"]
    behind = 2
    heard = ()

    def __init__(self, pair: ModelPair, width: int = 1):
        self.pair, self.width = pair, _tree_width(pair, width)

    @classmethod
    def of(cls, spec, pair: ModelPair) -> ModelDrafter:
        return cls(pair, spec.tree_width)

    def new_state(self, valid: torch.Tensor, positions: torch.Tensor, pages) -> ModelState:
        return ModelState.fresh(kvcache.new(self.pair.draft, pages()), valid, positions,
                                self.behind)

    def prefill(self, policy: Policy, b) -> None:
        n = b.tokens.shape[1] - self.behind
        if n > 0:
            run_model(self.pair, policy, "draft prefill", b.tokens[:, :n], b.valid[:, :n],
                      b.stale[:, :n], 0, b.draft.cache, keep=1)

    def observe(self, b, verified, accepted) -> None:
        pass  # what the target accepted reaches it through the next round's tokens

    def assisted(self, k: int) -> dict:
        return {"assistant_model": self.pair.draft}

    def propose(self, policy: Policy, b, k: int, sampling: Sampling, stream: Streams,
                have: torch.Tensor) -> Proposal:
        S, state = b.tokens.shape[1], b.draft

        def drafting_pass(j: int, tok, val, stl, q_start: int):
            # A recurrent draft state after each token it is fed: the first pass's last two, then
            # each draft.
            with kvcache.keeping(state.cache, self.behind if j == 0 else 1):
                logits, pos, _ = run_model(self.pair, policy, "draft", tok, val, stl, q_start,
                                           state.cache,
                                           keep=policy.first_draft_slots if j == 0 else 1)
            return (policy.first_draft(logits, have) if j == 0 else logits)[:, -1], pos

        q_start = S - self.behind if kvcache.length(state.cache) else 0
        drafts, probs, pos = _chain(policy, b, k, sampling, stream, have, self.pair.eos_ids,
                                    drafting_pass, q_start)
        return _proposal(drafts, probs, have, sampling, stream,
                         torch.cat([state.written, pos[:, S - self.behind:]], 1), self.width)


def _chain(policy: Policy, b, k: int, sampling: Sampling, stream: Streams, have: torch.Tensor,
           eos_ids: tuple[int, ...], drafting_pass, start: int):
    """A chain of drafts, one pass each: the first feeds the batch's slots start.., each later one
    the draft before. `drafting_pass(j, tokens, valid, stale, q_start)` gives the logits at its last
    slot and the positions of the layout it saw. Returns the drafts (B, n), the distributions they
    were drawn from (B, n, V) and the last pass's positions."""
    tok, val, stl = b.tokens, b.valid, b.stale
    drafts, probs = [], []
    steps = policy.draft_steps(k)
    eos = torch.tensor(eos_ids, device=tok.device)
    drafted_eos = torch.zeros(len(b.seqs), dtype=torch.bool, device=tok.device)
    sampler, q_start = sampling.drafts(b.seqs), start
    for j in range(steps):
        logits, pos = drafting_pass(j, tok, val, stl, q_start)
        if sampling.greedy:
            probs.append(logits.softmax(-1))
            nxt = logits.argmax(-1)
        else:
            q = sampler.probs(logits)
            nxt = inverse_cdf(policy.draft_drawn_from(sampler, logits, q),
                              stream.draw(have + j, policy.draft_purpose))
            probs.append(policy.draft_probs(sampler, logits, q))
        drafts.append(nxt)
        drafted_eos |= torch.isin(nxt, eos)
        if j < steps - 1 and not policy.bonus_from_draft and bool(drafted_eos.all()):
            break  # every row has drafted an EOS: no later draft could be emitted
        if j < steps - 1:
            q_start = tok.shape[1]
            tok = torch.cat([tok, nxt[:, None]], 1)
            val = torch.cat([val, torch.ones_like(b.valid[:, :1])], 1)
            stl = torch.cat([stl, torch.zeros_like(b.valid[:, :1])], 1)
    return torch.stack(drafts, 1), torch.stack(probs, 1), pos


def _proposal(D: torch.Tensor, Q: torch.Tensor, have: torch.Tensor, sampling: Sampling,
              stream: Streams, fed: torch.Tensor, width: int = 1) -> Proposal:
    """Every row offered all of its drafts `D`, drawn from `Q`. Wider than 1, a tree grown from the
    chain: at each depth, beside the chain's draft, width-1 other candidates from its distribution:
    the likeliest (greedy), or further independent draws (sampled: SpecInfer's acceptance needs each
    drawn from its q)."""
    confidence = Q.gather(2, D[..., None])[..., 0]
    if width == 1:
        return Proposal(D, torch.full_like(have, D.shape[1]), None if sampling.greedy else Q,
                        confidence, fed)
    if sampling.greedy:
        others = Q.scatter(2, D[..., None], -1.0).topk(width - 1, dim=-1).indices
    else:
        at = have[:, None] + torch.arange(D.shape[1], device=D.device)
        others = torch.stack([inverse_cdf(Q, stream.draw(at, sibling(DRAFT, s)))
                              for s in range(1, width)], -1)
    tokens = torch.cat([D, others.flatten(1)], 1)
    return Proposal(tokens, torch.full_like(have, tokens.shape[1]),
                    None if sampling.greedy
                    else torch.cat([Q, Q.repeat_interleave(width - 1, 1)], 1),
                    torch.cat([confidence, Q.gather(2, others).flatten(1)], 1), fed,
                    trees.main_line(D.shape[1], width, D.device).expand(len(D), -1))


def _tree_width(pair: ModelPair, width: int) -> int:
    """`width`, where the pair's target can verify a tree of it."""
    if width > 1 and is_recurrent(pair.target):
        raise SpecError("the target carries a recurrent state (a hybrid model), which cannot hold "
                        "a token tree's branches apart, and one verify pass per branch is not "
                        "built: draft chains (tree width 1) on this pair")
    return width


class HeadDrafter:
    """A draft head (models/heads.py) drafting k tokens a row from the target's own hidden states,
    which the target's state keeps for it. A head slot is fed its token and the target's hidden
    state at the slot before; each draft after the first is fed the head's own output instead. Its
    cache lags the layout by two slots, as a draft model's does, but the slots of accepted drafts
    were computed from the head's guesses: each round it re-feeds the last k+1 slots from the
    target's hidden states (the at most k-1 accepted drafts it holds and the two it does not; a
    fixed count, so that the batch's rows stay in step), then drafts. A fresh batch's first round
    offers nothing: the target has computed no hidden state yet, and its verify pass is the prefill.
    Which head: its `kind`, and for a published one its folder (`source`); fed as `policy` feeds
    it (a head fault feeds it wrongly throughout the run)."""

    kind: DrafterKind
    behind = 2

    def __init__(self, pair: ModelPair, k: int, width: int = 1, source: str | None = None,
                 policy: Policy = Policy()):
        self.pair, self.k = pair, k
        self.head = policy.fed_head(head_for(self.kind.name, pair.target, pair.info["target"],
                                             source))
        self.width, self.heard = _tree_width(pair, width), self.head.heard

    @classmethod
    def of(cls, spec, pair: ModelPair) -> HeadDrafter:
        return cls(pair, spec.k, spec.tree_width, spec.head, Policy(spec.faults))

    def new_state(self, valid: torch.Tensor, positions: torch.Tensor, pages) -> ModelState:
        # the accepted drafts its cache holds, from its own guesses, are computed again next round
        return ModelState.fresh(kvcache.new(self.head.body, pages(unsettled=self.k - 1)), valid,
                                positions, self.behind)

    def prefill(self, policy: Policy, b) -> None:
        n = b.tokens.shape[1] - self.behind
        if n > 0:
            run_head(self.pair, self.head, policy, b.tokens[:, :n], b.valid[:, :n], b.stale[:, :n],
                     self._features(policy, b, slice(0, n)), 0, b.draft.cache, keep=1)

    def propose(self, policy: Policy, b, k: int, sampling: Sampling, stream: Streams,
                have: torch.Tensor) -> Proposal:
        if b.target.hidden is None:
            return _nothing(b, k, sampling, self.pair.vocab_size)
        S, state = b.tokens.shape[1], b.draft
        start = min(max(0, S - policy.head_refeed(self.k, self.behind)),
                    kvcache.length(state.cache))
        kvcache.crop(state.cache, start)
        features = self._features(policy, b, slice(start, None))

        def drafting_pass(j: int, tok, val, stl, q_start: int):
            nonlocal features
            logits, pos, hidden = run_head(self.pair, self.head, policy, tok, val, stl, features,
                                           q_start, state.cache, keep=1)
            features = hidden[:, -1:]  # the head's guess of the target's next hidden state
            return logits[:, -1], pos

        drafts, probs, pos = _chain(policy, b, k, sampling, stream, have, self.pair.eos_ids,
                                    drafting_pass, start)
        return _proposal(drafts, probs, have, sampling, stream,
                         torch.cat([state.written[:, :start], pos[:, start:]], 1), self.width)

    def observe(self, b, verified, accepted) -> None:
        pass  # it reads the hidden states the target's state keeps

    def _features(self, policy: Policy, b, slots: slice) -> torch.Tensor:
        """(B, slots, H) what the head drafts from at those slots of batch `b`, out of the
        target's hidden states (_features): mapped for the head only where it is fed."""
        return self.head.from_target(policy.head_features(_features(b))[:, slots])


class EagleDrafter(HeadDrafter):
    """Drafts with an EAGLE-style head of specviz's (models/heads.py)."""

    kind = DRAFTERS["eagle"]

    def assisted(self, k: int) -> dict:
        raise SpecError("transformers' assisted generation runs no EAGLE-style head of specviz's")


class Eagle1Drafter(HeadDrafter):
    """Drafts with a published EAGLE-1 head (models/eagle1.py), from its folder."""

    kind = DRAFTERS["eagle1"]

    def assisted(self, k: int) -> dict:
        raise SpecError("transformers' assisted generation runs no EAGLE-1 head")


class Eagle3Drafter(HeadDrafter):
    """Drafts with a published EAGLE-3 head (models/eagle3.py), from its folder."""

    kind = DRAFTERS["eagle3"]

    def assisted(self, k: int) -> dict:
        raise SpecError("transformers' assisted generation runs no EAGLE-3 head")


class MtpDrafter(HeadDrafter):
    """Drafts with the target's own MTP layer (models/heads.py)."""

    kind = DRAFTERS["mtp"]

    # transformers' MTPCandidateGenerator: one draft per MTP layer a round
    def assisted(self, k: int) -> dict:
        return {"use_mtp": True}


def _features(b) -> torch.Tensor:
    """(B, S, H) the hidden state each slot of batch `b` is fed: the target's at the slot before
    (zeros at a row's first token, which has none)."""
    hidden = b.target.hidden
    before = torch.cat([torch.zeros_like(b.valid[:, :1]), b.valid[:, :-1]], 1)
    return torch.cat([torch.zeros_like(hidden[:, :1]), hidden], 1).masked_fill(~before[..., None],
                                                                               0)


def _nothing(b, k: int, sampling: Sampling, vocab_size: int) -> Proposal:
    """No drafts for any row: filler (each row's last token) the target never accepts."""
    B, S = b.tokens.shape
    tokens = b.tokens[:, -1:].expand(B, k)
    probs = None if sampling.greedy else torch.nn.functional.one_hot(tokens, vocab_size).float()
    return Proposal(tokens, torch.zeros(B, dtype=torch.long, device=tokens.device), probs,
                    torch.ones(tokens.shape, device=tokens.device),
                    torch.full((B, S + k - 1), -1, device=tokens.device))


class PromptLookup:
    """Prompt lookup: each row proposes the tokens that followed an earlier occurrence of its own
    last n tokens, in its prompt or its output so far. The longest n in [min_n, max_n] with a match
    wins, and of its matches the earliest, as transformers' `PromptLookupCandidateGenerator` and
    vLLM's `NgramProposer` choose. A row with no match offers nothing; one whose match lies near its
    end offers the fewer tokens that follow it. Every row is searched at once: one window comparison
    per n over the batch."""

    kind = DRAFTERS["lookup"]
    heard = ()

    def __init__(self, pair: ModelPair, min_n: int, max_n: int, width: int = 1):
        self.vocab_size = pair.vocab_size
        self.min_n, self.max_n, self.width = min_n, max_n, _tree_width(pair, width)

    @classmethod
    def of(cls, spec, pair: ModelPair) -> PromptLookup:
        return cls(pair, spec.ngram_min, spec.ngram_max, spec.tree_width)

    def new_state(self, valid: torch.Tensor, positions: torch.Tensor, pages) -> ModelState:
        # no cache: the slots it would hold (a draft model's) are recorded empty, and never checked
        return ModelState.fresh(None, valid, positions, ModelDrafter.behind)

    def prefill(self, policy: Policy, b) -> None:
        pass

    def observe(self, b, verified, accepted) -> None:
        pass  # it searches each round's tokens afresh

    # transformers' PromptLookupCandidateGenerator, matching down to 1 token
    def assisted(self, k: int) -> dict:
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
        # where the proposed tokens start
        begin = torch.zeros(B, dtype=torch.long, device=hist.device)
        # where every match's tokens start
        starts = torch.zeros(B, S, dtype=torch.bool, device=hist.device)
        for n in range(min(self.max_n, S - 1), self.min_n - 1, -1):
            windows = hist.unfold(1, n, 1)[:, : S - n]  # windows followed by at least one token
            hit = ((windows == hist[:, None, S - n:]).all(-1)
                   & (slot[None, : S - n] >= first_real[:, None]))
            new = hit.any(1) & ~found
            begin = torch.where(new, hit.long().argmax(1) + n, begin)  # argmax: the first hit
            starts[new, n:] = hit[new]
            found |= new
        if self.width > 1:
            return self._tree(hist, starts, k, sampling)
        follow = torch.where(found, S - begin, 0)  # the tokens after the match, to the row's end
        j = torch.arange(n_out, device=hist.device)
        at = (begin[:, None] + j).clamp(max=S - 1)
        # filler: the row's last token
        tokens = torch.where(j < follow[:, None], hist.gather(1, at), hist[:, -1:])
        probs = None
        if not sampling.greedy:  # a lookup is certain of its drafts: q is a point mass on each
            probs = torch.nn.functional.one_hot(tokens, self.vocab_size).float()
        return Proposal(tokens, follow.clamp(max=k), probs,
                        torch.ones(tokens.shape, device=hist.device),
                        torch.full((B, S + n_out - 1), -1, device=hist.device))


    def _tree(self, hist: torch.Tensor, starts: torch.Tensor, k: int,
              sampling: Sampling) -> Proposal:
        """Each row's first `width` matches' next k tokens as one tree (a trie, as SGLang's n-gram
        drafter keeps): the earliest match's branch first, then each later one's where it parts from
        those before."""
        B, S = hist.shape
        rows = []
        for r in range(B):
            index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
            for start in starts[r].nonzero().flatten().tolist()[: self.width]:
                at = -1
                for token in hist[r, start: start + k].tolist():
                    at = index.setdefault((at, token), len(index))
            rows.append(sorted(index.items(), key=lambda item: item[1]))
        n = max(1, max(len(nodes) for nodes in rows))
        tokens = hist[:, -1:].repeat(1, n)  # filler: the row's last token
        parents = torch.full((B, n), -1, device=hist.device)
        for r, nodes in enumerate(rows):
            if nodes:
                tokens[r, :len(nodes)] = torch.tensor([t for (_, t), _ in nodes])
                parents[r, :len(nodes)] = torch.tensor([p for (p, _), _ in nodes])
        counts = torch.tensor([len(nodes) for nodes in rows], device=hist.device)
        probs = (None if sampling.greedy
                 else torch.nn.functional.one_hot(tokens, self.vocab_size).float())
        return Proposal(tokens, counts, probs, torch.ones(tokens.shape, device=hist.device),
                        torch.full((B, S + n - 1), -1, device=hist.device), parents)


# one for every declared drafter (a test holds it)
BUILT = {d.kind.name: d for d in (ModelDrafter, PromptLookup, EagleDrafter, Eagle1Drafter,
                                  Eagle3Drafter, MtpDrafter)}
