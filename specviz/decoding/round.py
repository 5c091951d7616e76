"""One round of batch speculation on a padded batch, shared by eqspec and exspec (they differ only
in how a batch is formed and laid out again), in stages that each hand the next a typed value
(stages.py): lay out, draft, verify, accept, roll back, commit. What a round did is recorded
apart (recording.py).

For every row: the drafter (drafters.py) proposes up to k tokens; the target scores the last
committed token and the drafts in one pass; the row keeps its drafts up to the first disagreement
plus the target's own token there (the correction, or the bonus after its last draft): 1..k+1 new
tokens. A row offered no drafts takes the target's next token alone. When sampling, a draft d is
accepted with probability min(1, p(d)/q(d)); the first rejected one is replaced by a draw from
max(0, p - q), normalised, and a fully accepted block gains a bonus drawn from p (speculative
sampling). A token tree is verified in the same one pass; its walk (treestep.py) stands in for
acceptance, and hands the rest of the round the chain of the path each row accepted.

Layout at the start of a round (S slots, see batch.py): the target cache holds slots 0..S-2 (every
token but the last, which is fed again), a draft model's cache slots 0..S-3 (the draft re-feeds the
last two, so that after a fully accepted block it catches up on the k-th draft it never fed);
modelstate.py keeps each model's state in step with the layout. A batch fresh from `lay_out` has
empty caches: its first round's draft and verify passes are the prefill, as in transformers'
assisted generation. Every decision a published implementation got wrong goes through a `Policy`
(faults.py). The batch also carries the provenance of every cache slot (the position its K/V was
computed at), so that invariant checks see what the cache really holds.
"""
from __future__ import annotations

import contextlib
import time

import torch

from specviz.decoding import kvcache, recording
from specviz.decoding.faults import Policy
from specviz.decoding.grammar import FREE, GrammarFailed, dense, masked
from specviz.decoding.modelstate import ModelState
from specviz.decoding.paging import Memory
from specviz.decoding.passes import run_model
from specviz.decoding.penalties import history, logprobs
from specviz.decoding.proposal import Drafter
from specviz.decoding.result import SequenceOutput
from specviz.decoding.sampling import ACCEPT, RESIDUAL, TARGET, Samplers, Streams, inverse_cdf
from specviz.decoding.stages import (Accepted, Batch, Committed, Decoding, Drafted, RolledBack,
                                     Step, Verified)
from specviz.decoding.trees import Tree
from specviz.decoding.treestep import accept_tree
from specviz.models.pairs import ModelPair


class Clock:
    """Phase timer; synchronizes CUDA so a phase is charged for its own kernels."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.t = time.perf_counter()
        self.paused = 0.0  # seconds spent outside the engine's phases (the watcher's checks)

    def lap(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt

    @contextlib.contextmanager
    def pause(self):
        """Time inside is charged to no phase of the engine, but counted in `paused`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - start
            self.t += dt
            self.paused += dt


def lay_out(pair: ModelPair, policy: Policy, drafter: Drafter, memory: Memory, seqs: list[int],
            tokens, valid) -> Batch:
    """A freshly laid-out batch with empty caches (laid out in `memory`): the first round's passes
    fill them."""
    stale = torch.zeros_like(valid)
    pos = policy.positions(valid, stale)
    target = ModelState.fresh(
        kvcache.new(pair.target, memory.pages(seqs, "target", tokens, valid)), valid, pos, 1)
    return Batch(seqs, tokens, valid, stale, target, drafter.new_state(
        valid, pos, lambda unsettled=0: memory.pages(seqs, "draft", tokens, valid, unsettled)))


def prefill(pair: ModelPair, policy: Policy, drafter: Drafter, memory: Memory, seqs: list[int],
            tokens, valid) -> Batch:
    """A laid-out batch with both caches filled: the target's slots 0..S-2, and the drafter's."""
    b = lay_out(pair, policy, drafter, memory, seqs, tokens, valid)
    n = b.target.length(tokens.shape[1])
    b.target.hidden = run_model(pair, policy, "target", tokens[:, :n], valid[:, :n], b.stale[:, :n],
                                0, b.target.cache, keep=1, hidden=drafter.heard).hidden
    drafter.prefill(policy, b)
    return b


def speculate(d: Decoding, b: Batch, k: int, gen: dict[int, SequenceOutput], clock: Clock) -> Step:
    """One round over every row of `b`, each offered at most k drafts; the new tokens are appended
    to `gen`. A token tree's walk (treestep.py) takes the place of the chain's acceptance."""
    if d.watch:
        d.watch.start()
    if d.sampling.grammar:
        for i in b.seqs:
            d.matcher(i, gen[i].ids)
    drafted = draft(d, b, k, gen)
    t_draft = clock.lap()
    verified = verify(d, b, drafted.tokens, drafted.have, drafted.tree)
    t_verify = clock.lap()  # from acceptance on, the round realigns (eqspec.py times it)
    if drafted.tree is None:
        acc = accept(d, b, drafted, verified)
    else:
        acc = accept_tree(d, b, drafted, verified, accept)
    d.drafter.observe(b, acc.verified, acc)
    states = roll_back_models(d, b, acc)
    kept = commit(d, b, drafted, acc, gen)
    fields = recording.round_fields(d, b, drafted, acc, kept, gen) if d.record else {}
    timings = {"draft": t_draft, "verify": t_verify}
    if d.watch:
        with clock.pause():
            d.watch.end(b.seqs, gen, acc.along)
        timings["watch"] = clock.paused
    return Step(acc.k, kept.n_keep, kept.finished, acc.accepted, acc.room, kept.tokens, kept.valid,
                kept.stale, states.target, states.draft, fields, timings)


def draft(d: Decoding, b: Batch, k: int, gen: dict[int, SequenceOutput]) -> Drafted:
    """Each row's drafts, at most k. Near the token budget the round asks for fewer: a row that may
    emit only r more tokens needs at most r-1 drafts (the last is the target's). The verify pass is
    as wide as the most drafts any row was offered (a tree: its nodes)."""
    have = torch.tensor([len(gen[i].ids) for i in b.seqs], device=d.pair.device)
    asked = max(1, min(k, d.max_new_tokens - 1 - int(have.min())))
    skipped = [d.skipped.get(i, 0) for i in b.seqs]
    stream = d.policy.stream(d.sampling.streams(b.seqs, skipped, d.pair.device))
    draft_empty = kvcache.length(b.draft.cache) == 0  # before the drafter fills it
    prop = d.drafter.propose(d.policy, b, asked, d.sampling, stream, have).handed(
        d.policy.draft_rows(len(b.seqs), have.device))
    most = int(prop.counts.max())
    width = most if prop.parents is not None else min(asked, most)
    for i, skips in zip(b.seqs, d.policy.skips(prop.counts, width).tolist()):
        if skips:  # from the next round on
            d.skipped[i] = d.skipped.get(i, 0) + skips
    # a row offered nothing takes the decode path's stale state
    if d.policy.stale_state_without_drafts:
        zero = prop.counts == 0
        kvcache.read_stale(b.target.cache, zero)
        b.target.held = torch.where(zero, b.target.held_first, b.target.held)
    tree = None if prop.parents is None or not width else Tree.of(prop.parents[:, :width])
    before = recording.state_before(b, draft_empty) if d.record else {}
    return Drafted(have, stream, prop, width, tree, before)


def verify(d: Decoding, b: Batch, drafts: torch.Tensor, have: torch.Tensor,
           tree: Tree | None = None) -> Verified:
    """The target over the last committed token and the drafts, in one pass (the prefill too, on an
    empty cache); its logits penalised by each row's history, where the run sets a penalty (`have`:
    each row's output tokens). A `tree`'s drafts are its nodes, each at its depth's position, seeing
    its ancestors only (trees.py)."""
    S, k = b.tokens.shape[1], drafts.shape[1]
    tok = torch.cat([b.tokens, drafts], 1)
    val = torch.cat([b.valid, torch.ones_like(drafts, dtype=torch.bool)], 1)
    stl = torch.cat([b.stale, torch.zeros_like(drafts, dtype=torch.bool)], 1)
    start = S - 1 if kvcache.length(b.target.cache) else 0
    with kvcache.keeping(b.target.cache, k + 1):  # a recurrent state after the last and each draft
        logits, pos, hidden = run_model(d.pair, d.policy, "target", tok, val, stl, start,
                                        b.target.cache, keep=k + 1, hidden=d.drafter.heard,
                                        tree=tree)
    if d.sampling.penalties:
        prompt, output = history(b.tokens, b.valid, have, logits.shape[-1])
        output, drafts = d.policy.penalty_history(output, _ends(d.ends, b.seqs, output), drafts)
        logits = d.sampling.penalties.apply(logits, prompt, output, drafts)
    if d.sampling.grammar:
        logits = masked(logits, _grammar_masks(d, b.seqs, drafts, tree))
    return Verified(tok, val, stl, pos, logits, logits.argmax(-1), hidden)


def _grammar_masks(d: Decoding, seqs: list[int], drafts: torch.Tensor,
                   tree: Tree | None) -> torch.Tensor:
    """(B, n+1, V) the tokens each row's grammar allows at each verify slot: after the row's kept
    tokens and the drafts before the slot (a tree's node: after its ancestors and itself). A row
    whose grammar fails is aborted, as an engine aborts the request."""
    rows = []
    for r, (i, row) in enumerate(zip(seqs, drafts.tolist())):
        m = d.grammars[i]
        try:
            if tree is None:
                rows.append(d.policy.grammar_masks(m, row))
            else:
                rows.append([m.mask()] + [d.policy.grammar_masks(m, [row[j] for j in path])[-1]
                                          for path in _paths(tree, r)])
        except GrammarFailed:
            d.aborted.add(i)
            rows.append([FREE] * (len(row) + 1))
    return torch.stack([torch.stack([dense(x, d.pair.vocab_size) for x in row]) for row in rows])


def _paths(tree: Tree, r: int) -> list[list[int]]:
    """Each node of row r's tree, as the nodes from the root's child down to it."""
    parents, out = tree.parents[r].tolist(), []
    for node in range(len(parents)):
        path = [node]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        out.append(path)
    return out


def _ends(ends: dict[int, list[int]], seqs: list[int], like: torch.Tensor) -> torch.Tensor:
    """(B, V) like `like`: the tokens that ended each row's earlier rounds."""
    mask = torch.zeros_like(like)
    for r, i in enumerate(seqs):
        mask[r, ends.get(i, [])] = True
    return mask


def accept(d: Decoding, b: Batch, drafted: Drafted, v: Verified) -> Accepted:
    """Drafts up to the first disagreement (or rejection), then the target's token there. A row
    never accepts past its own budget or the drafts it was offered (its room), whatever the batch
    drafted: its tokens and draws are then the same in any batch."""
    k, prop, stream, have = drafted.width, drafted.proposal, drafted.stream, drafted.have
    D, g = prop.tokens, v.argmax
    room = drafted.room(d.max_new_tokens)
    if not d.sampling.greedy:
        target = d.policy.verify_samplers([d.sampling.row(i) for i in b.seqs])
        a, own, drawn = _accept_sampled(d.policy, target, v.logits, prop.probs, D, room, stream,
                                        have)
        return Accepted(v, prop, room, a, own, drawn)

    def raw() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # only a fault's rule reads them
        return (v.logits[:, :k].softmax(-1).gather(2, D[:, :k, None])[..., 0].double(),
                prop.confidence[:, :k].double(),
                stream.draw(have[:, None] + torch.arange(k, device=D.device), ACCEPT))

    passed = d.policy.greedy_accept(D[:, :k], g[:, :k], raw)
    a = d.policy.accepted_count(torch.minimum(passed.long().cumprod(1).sum(1), room))
    return Accepted(v, prop, room, a, g.gather(1, a[:, None])[:, 0], {})


def _accept_sampled(policy: Policy, target: Samplers, logits: torch.Tensor, Q: torch.Tensor,
                    D: torch.Tensor, room: torch.Tensor, stream: Streams, have: torch.Tensor):
    """Speculative sampling's decisions for every row, verified with its `target` sampler: the
    accepted count (at most the row's `room`), the target's own token at the first slot not accepted
    (from the residual, or from p after a fully accepted block), and what was drawn."""
    k = logits.shape[1] - 1
    B, idx = D.shape[0], torch.arange(k, device=D.device)
    P = policy.target_probs(target.probs(logits), D[:, :k])  # (B, k+1, V)
    decided = policy.decided_probs(target, logits, P)
    p = decided[:, :k].gather(2, D[:, :k, None])[..., 0].double()
    q = Q[:, :k].gather(2, D[:, :k, None])[..., 0].double()
    u = policy.noise(stream, stream.draw(have[:, None] + idx, ACCEPT))
    a = torch.minimum(policy.accept(p, q, u).long().cumprod(1).sum(1), room)
    rows, bonus = torch.arange(B, device=D.device), a == room
    v = policy.noise(stream, stream.draw(have + a, torch.where(bonus, TARGET, RESIDUAL)))
    P_a = P[rows, a]
    Q_a = Q[rows, a.clamp(max=k - 1)] if k else P_a  # no drafts: every row takes its bonus
    residual = policy.residual(target, logits[rows, a], decided[rows, a], Q_a, v)
    own = torch.where(bonus, inverse_cdf(P_a, v), residual)
    drawn = {"target_draft_probs": p, "accept_draws": u, "pick_draws": v[:, None]}
    return a, own, drawn


def roll_back_models(d: Decoding, b: Batch, acc: Accepted) -> RolledBack:
    """Both models' states after the round: the target's over the slots verify fed (with the hidden
    states it heard, where kept), the drafter's over the slots it fed."""
    v = acc.verified
    fed = torch.cat([b.target.written, v.positions[:, b.tokens.shape[1] - 1:]], 1)
    heard = v.hidden
    if heard is not None and b.target.hidden is not None:
        heard = torch.cat([b.target.hidden, heard], 1)
    return RolledBack(_roll_back(d.policy, b.target, fed, acc.accepted, heard),
                      _roll_back(d.policy, b.draft, acc.drafts.fed, acc.accepted))


def _roll_back(policy: Policy, state: ModelState, fed: torch.Tensor, accepted: torch.Tensor,
               hidden: torch.Tensor | None = None) -> ModelState:
    """The model's state after the round, whose cache slots were computed at positions `fed` (with
    last hidden states `hidden`, where kept): each row's recurrent states continue from the position
    the policy picks (the correct engine: the row's own accepted count), and hold the row's tokens
    up to it (-1: a token not the row's, a rejected draft)."""
    held, kept = state.held, kvcache.kept(state.cache)
    first = held + (held >= 0)  # what they held after the round's first position
    if not kept:  # no recurrent state: a correct engine's count, for the record
        held_after = torch.where(held >= 0, held + accepted + 1, -1)
        return ModelState(state.cache, fed, held_after, first, state.behind, hidden)
    index, conv = policy.state_index(accepted, kept)
    kvcache.roll_back(state.cache, index, conv)
    own = (index <= accepted) & ((index if conv is None else conv) <= accepted) & (held >= 0)
    held_after = torch.where(own, held + index + 1, -1)
    return ModelState(state.cache, fed, held_after, first, state.behind, hidden)


def commit(d: Decoding, b: Batch, drafted: Drafted, acc: Accepted,
           gen: dict[int, SequenceOutput]) -> Committed:
    """Each row's new tokens: the drafts it accepted, then the token it picks there, up to the first
    stop and within the budget; appended to `gen` with their log-probabilities."""
    k, a, own, have = acc.k, acc.accepted, acc.own, drafted.have
    D, g = acc.drafts.tokens, acc.verified.argmax
    pick = (D.gather(1, a[:, None]) if d.policy.bonus_from_draft
            else own[d.policy.bonus_rows(len(own), own.device), None])
    emitted = torch.cat([D[:, :k], g[:, k:]], 1).scatter(1, a[:, None], pick)
    idx = torch.arange(k + 1, device=D.device)
    eos = torch.tensor(d.pair.eos_ids, device=D.device)
    is_eos = torch.isin(emitted, eos) & d.policy.stops(idx, a)
    first_eos = torch.where(is_eos.any(1), is_eos.long().argmax(1), k + 1)
    n_keep = d.policy.kept(a, first_eos, d.max_new_tokens - have)
    finished = (first_eos < n_keep) | (have + n_keep >= d.max_new_tokens)
    if d.stops.strings:
        said = [gen[i].ids for i in b.seqs]
        n_keep, finished = _stop_strings(d, emitted, n_keep, finished, said)
    if d.aborted:  # the request is dropped with what it had before the round
        gone = torch.tensor([i in d.aborted for i in b.seqs], device=D.device)
        n_keep, finished = n_keep.masked_fill(gone, 0), finished | gone
    target = logprobs(acc.verified.logits, emitted, d.sampling.target.temperature)
    lps = d.policy.logprobs(target, acc.drafts.confidence[:, :k], a)
    for i, row, lp, m in zip(b.seqs, emitted.tolist(), lps.tolist(), n_keep.tolist()):
        gen[i].ids.extend(row[:m])
        gen[i].logprobs.extend(lp[:m])
        if m:
            d.ends.setdefault(i, []).append(row[m - 1])
        if d.sampling.grammar:
            d.grammars[i].advance(d.policy.grammar_advance(d.grammars[i], row[:m]))
    slots = _slots_after(d.policy, b, a, pick, emitted, n_keep)
    return Committed(pick, emitted, n_keep, finished, *slots)


def _stop_strings(d: Decoding, emitted: torch.Tensor, n_keep: torch.Tensor, finished: torch.Tensor,
                  said: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A row whose kept tokens complete a stop string ends, keeping what the policy
    keeps (Policy.string_stop)."""
    keep, done = n_keep.tolist(), finished.tolist()
    for r, (old, row) in enumerate(zip(said, emitted.tolist())):
        end = d.stops.text_end(old + row[: keep[r]], len(old))
        if end is not None:
            keep[r] = d.policy.string_stop(end - len(old), keep[r])
            done[r] = True
    return torch.tensor(keep, device=n_keep.device), torch.tensor(done, device=finished.device)


def _slots_after(policy: Policy, b: Batch, accepted: torch.Tensor, pick: torch.Tensor,
                 emitted: torch.Tensor, n_keep: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The slots after this round, as the policy lays them out: tokens, real slots and stale slots,
    (B, S+k+1)."""
    (B, S), k = b.tokens.shape, emitted.shape[1] - 1
    idx = torch.arange(k + 1, device=b.tokens.device)
    if policy.compact:  # the emitted tokens follow the row's real tokens
        return (torch.cat([b.tokens, emitted], 1),
                torch.cat([b.valid, idx[None] < n_keep[:, None]], 1),
                torch.zeros(B, S + k + 1, dtype=torch.bool, device=b.tokens.device))
    # rejected drafts stay in place as stale slots; the last token goes after them
    a = accepted[:, None]
    return (torch.cat([b.tokens, emitted], 1).scatter(1, torch.full_like(pick, S + k), pick),
            torch.cat([b.valid, (idx[None] < a) | (idx[None] == k)], 1),
            torch.cat([b.stale, (idx[None] >= a) & (idx[None] < k)], 1))
