"""One round of batch speculation on a padded batch, shared by eqspec and exspec
(they differ only in how a batch is formed and laid out again), in four steps:
draft, verify, accept, lay out; recording what a round did is kept apart.

For every row: the drafter (drafters.py) proposes up to k tokens; the target
scores the last committed token and the drafts in one pass; the row keeps its
drafts up to the first disagreement plus the target's own token there (the
correction, or the bonus after its last draft): 1..k+1 new tokens. A row
offered no drafts takes the target's next token alone.
When sampling, a draft d is accepted with probability min(1, p(d)/q(d)); the
first rejected one is replaced by a draw from max(0, p - q), normalised, and a
fully accepted block gains a bonus drawn from p (speculative sampling).

Layout at the start of a round (S slots, see batch.py): the target cache holds
slots 0..S-2 (every token but the last, which is fed again), a draft model's
cache slots 0..S-3 (the draft re-feeds the last two, so that after a fully
accepted block it catches up on the k-th draft it never fed); modelstate.py
keeps each model's state in step with the layout. A batch fresh from
`lay_out` has empty caches: its first round's draft and verify passes are the
prefill, as in transformers' assisted generation. Every decision a published
implementation got wrong goes through a `Policy` (faults.py). The batch also
carries the provenance of every cache slot (the position its K/V was computed
at), so that invariant checks see what the cache really holds.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from functools import cached_property

import torch

from specviz.decoding import kvcache, trees
from specviz.decoding.batch import positions
from specviz.decoding.drafters import Drafter, Proposal
from specviz.decoding.faults import Policy
from specviz.decoding.modelstate import ModelState
from specviz.decoding.passes import run_model
from specviz.decoding.penalties import history, logprobs
from specviz.decoding.result import SequenceOutput
from specviz.decoding.sampling import ACCEPT, GREEDY, RESIDUAL, TARGET, Samplers, Sampling, Streams, inverse_cdf
from specviz.decoding.stops import Stops
from specviz.decoding.trees import Tree, walk, walk_sampled
from specviz.models.architecture import narrowest_window
from specviz.models.pairs import ModelPair

TOP = 8  # target logits kept per verified slot (for forensics, not saved in the trace)


@dataclass
class Batch:
    """A padded batch in flight."""

    seqs: list[int]  # sequence id of each row
    tokens: torch.Tensor  # (B, S)
    valid: torch.Tensor  # (B, S) real tokens
    stale: torch.Tensor  # (B, S) slots holding a rejected draft (only a faulty engine keeps them)
    target: ModelState  # its cache holds slots 0..S-2
    draft: ModelState  # the drafter's (a cache of None: it keeps none)


@dataclass
class Step:
    """What one round produced, before the batch is laid out again."""

    k: int  # the most drafts any row was offered this round
    n_keep: torch.Tensor  # (B,) new tokens each row kept
    finished: torch.Tensor
    accepted: torch.Tensor
    room: torch.Tensor  # (B,) the drafts each row could accept (Accepted.room)
    out_tok: torch.Tensor  # (B, S+k+1) old slots + this round's slots, as the policy lays them out
    out_val: torch.Tensor
    out_stale: torch.Tensor
    target: ModelState  # after the round, over the out_ slots (its provenance: the slots verify fed)
    draft: ModelState  # after drafting
    fields: dict  # recorded per-row tensors and checks (empty when not recording)
    timings: dict


@dataclass
class RoundData:
    """One round as recorded: tensors on the CPU, turned into trace records only when saving."""

    batch: int  # index of the static batch (eqspec) or -1 (exspec)
    seqs: list[int]
    k: int
    ints: dict[str, torch.Tensor]
    floats: dict[str, torch.Tensor]
    checks: dict[str, torch.Tensor]
    timings: dict[str, float]  # seconds: draft, verify, realign, trace
    realigned: bool  # whether the caches had to be gathered (else only cropped or stacked)
    group: bool | None = None  # exspec: a same-length group (no realignment at all)
    waits: list[int] | None = None  # exspec: rounds each row had been passed over


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


def lay_out(pair: ModelPair, policy: Policy, drafter: Drafter, seqs: list[int], tokens, valid) -> Batch:
    """A freshly laid-out batch with empty caches: the first round's passes fill them."""
    stale = torch.zeros_like(valid)
    pos = policy.positions(valid, stale)
    return Batch(seqs, tokens, valid, stale, ModelState.fresh(kvcache.new(pair.target), valid, pos, 1),
                 drafter.new_state(valid, pos))


def prefill(pair: ModelPair, policy: Policy, drafter: Drafter, seqs: list[int], tokens, valid) -> Batch:
    """A laid-out batch with both caches filled: the target's slots 0..S-2, and the drafter's."""
    b = lay_out(pair, policy, drafter, seqs, tokens, valid)
    n = b.target.length(tokens.shape[1])
    b.target.hidden = run_model(pair, policy, "target", tokens[:, :n], valid[:, :n], b.stale[:, :n], 0, b.target.cache,
                                keep=1, hidden="hidden" in drafter.kind.hears).hidden
    drafter.prefill(policy, b)
    return b


def _kv_in_step(written: torch.Tensor, valid: torch.Tensor, slots: int) -> torch.Tensor:
    """I3 per row: every real token in the first `slots` slots has K/V computed
    at its own position (by the mask), and the cache holds exactly those slots."""
    want = torch.where(valid, positions(valid), -1)[:, :slots]
    return ((written == want) | ~valid[:, :slots]).all(1) & (written.shape[1] == slots)


@dataclass(frozen=True)
class Decoding:
    """What stays the same over a decode's rounds: the pair, the policy (the correct engine, or its faults), the
    drafter, how it samples, the token budget, whether rounds are recorded, and the watch (watch.py) that hears
    when each round starts and ends; and, per sequence, the draws a faulty engine's stream skipped (Policy.skips)."""

    pair: ModelPair
    policy: Policy
    drafter: Drafter
    max_new_tokens: int
    sampling: Sampling = GREEDY
    record: bool = True
    watch: object | None = None
    ends: dict[int, list[int]] = field(default_factory=dict)  # each sequence's last token of each round (a faulty
    #                                                           penalty history keeps only these)
    skipped: dict[int, int] = field(default_factory=dict)

    @cached_property
    def stops(self) -> Stops:
        return Stops.of(self.pair, self.sampling.stop)


@dataclass
class Verified:
    """The verify pass: the last committed token and the drafts scored in one target pass."""

    tokens: torch.Tensor  # (B, S+k) the slots it was fed: the batch's, then the drafts
    valid: torch.Tensor
    stale: torch.Tensor
    positions: torch.Tensor  # (B, S+k) the position ids the policy derived
    logits: torch.Tensor  # (B, k+1, V) at the last committed token and each draft
    argmax: torch.Tensor  # (B, k+1)
    hidden: torch.Tensor | None  # (B, q, H) the target's last hidden states at the slots it fed (the last q of the
    #                              S+k), where the drafter hears them
    # A tree's pass, taken along each row's path (_along_path): which of the pass's logits each slot's are (B, k+1),
    # the tree as proposed and walked (for the record), and its own checks of positions and mask.
    slots: torch.Tensor | None = None
    tree: dict[str, torch.Tensor] | None = None
    tree_checks: dict[str, torch.Tensor] | None = None
    decided: tuple | None = None  # a sampled tree's decisions, made along its walk (accepted, own token, draws)


@dataclass
class Accepted:
    """Each row's decision: the drafts it kept and the token that follows them."""

    room: torch.Tensor  # (B,) the drafts a row may accept: its budget, and the drafts it was offered
    accepted: torch.Tensor  # (B,) drafts kept
    own: torch.Tensor  # (B,) the target's token after them (the correction, or the bonus)
    pick: torch.Tensor  # (B, 1) the token the row takes there (a fault may take the draft's)
    emitted: torch.Tensor  # (B, k+1) the drafts kept, then the picked token, then filler
    n_keep: torch.Tensor  # (B,) new tokens, up to the first stop and within the budget
    finished: torch.Tensor
    drawn: dict  # sampled rounds: every draw, for the trace


def speculate(d: Decoding, b: Batch, k: int, gen: dict[int, SequenceOutput], clock: Clock) -> Step:
    """Draft, verify, accept and lay out every row of `b`; append the new tokens to `gen`.

    Near the token budget the round drafts fewer than k: a row that may emit only r more tokens needs at most
    r-1 drafts (the last is the target's). The verify pass is as wide as the most drafts any row was offered.
    """
    if d.watch:
        d.watch.start()
    have = torch.tensor([len(gen[i].ids) for i in b.seqs], device=d.pair.device)
    k = max(1, min(k, d.max_new_tokens - 1 - int(have.min())))
    stream = d.policy.stream(d.sampling.streams(b.seqs, [d.skipped.get(i, 0) for i in b.seqs], d.pair.device))
    draft_empty = kvcache.length(b.draft.cache) == 0  # before the drafter fills it
    prop = d.drafter.propose(d.policy, b, k, d.sampling, stream, have).handed(
        d.policy.draft_rows(len(b.seqs), have.device))
    k = int(prop.counts.max()) if prop.parents is not None else min(k, int(prop.counts.max()))  # a tree: its nodes
    for i, skips in zip(b.seqs, d.policy.skips(prop.counts, k).tolist()):
        if skips:  # from the next round on
            d.skipped[i] = d.skipped.get(i, 0) + skips
    if d.policy.stale_state_without_drafts:  # a row offered nothing: the decode path's stale state
        zero = prop.counts == 0
        kvcache.read_stale(b.target.cache, zero)
        b.target.held = torch.where(zero, b.target.held_first, b.target.held)
    before = _state_before(b, draft_empty) if d.record else {}
    t_draft = clock.lap()
    tree = None if prop.parents is None or not k else Tree.of(prop.parents[:, :k])
    v = verify(d, b, prop.tokens[:, :k], have, tree)
    if tree is not None:
        v, prop, k = _along_path(d, b, v, prop, tree, have, stream)
    t_verify = clock.lap()
    acc = accept(d, v, prop, have, stream, b.seqs, [gen[i].ids for i in b.seqs])
    d.drafter.observe(b, v, acc)
    lps = d.policy.logprobs(logprobs(v.logits, acc.emitted, d.sampling.target.temperature), prop.confidence[:, :k],
                            acc.accepted)
    heard = v.hidden if v.hidden is None or b.target.hidden is None else torch.cat([b.target.hidden, v.hidden], 1)
    target = _roll_back(d.policy, b.target, torch.cat([b.target.written, v.positions[:, b.tokens.shape[1] - 1:]], 1),
                        acc.accepted, heard)
    draft = _roll_back(d.policy, b.draft, prop.fed, acc.accepted)
    for i, row, lp, m in zip(b.seqs, acc.emitted.tolist(), lps.tolist(), acc.n_keep.tolist()):
        gen[i].ids.extend(row[:m])
        gen[i].logprobs.extend(lp[:m])
        d.ends.setdefault(i, []).append(row[m - 1])
    out_tok, out_val, out_stale = slots_after(d.policy, b, acc, k)
    fields = _recorded(d, b, prop, v, acc, before, gen) if d.record else {}
    timings = {"draft": t_draft, "verify": t_verify}
    if d.watch:
        with clock.pause():
            d.watch.end(b.seqs, gen, v.slots)
        timings["watch"] = clock.paused
    return Step(k, acc.n_keep, acc.finished, acc.accepted, acc.room, out_tok, out_val, out_stale, target, draft,
                fields, timings)


def verify(d: Decoding, b: Batch, drafts: torch.Tensor, have: torch.Tensor, tree: Tree | None = None) -> Verified:
    """The target over the last committed token and the drafts, in one pass (the prefill too, on an empty cache); its
    logits penalised by each row's history, where the run sets a penalty (`have`: each row's output tokens). A
    `tree`'s drafts are its nodes, each at its depth's position, seeing its ancestors only (trees.py)."""
    S, k = b.tokens.shape[1], drafts.shape[1]
    tok = torch.cat([b.tokens, drafts], 1)
    val = torch.cat([b.valid, torch.ones_like(drafts, dtype=torch.bool)], 1)
    stl = torch.cat([b.stale, torch.zeros_like(drafts, dtype=torch.bool)], 1)
    with kvcache.keeping(b.target.cache, k + 1):  # a recurrent state after the last committed token and each draft
        logits, pos, hidden = run_model(d.pair, d.policy, "target", tok, val, stl,
                                        S - 1 if kvcache.length(b.target.cache) else 0, b.target.cache, keep=k + 1,
                                        hidden="hidden" in d.drafter.kind.hears, tree=tree)
    if d.sampling.penalties:
        prompt, output = history(b.tokens, b.valid, have, logits.shape[-1])
        output, drafts = d.policy.penalty_history(output, _ends(d.ends, b.seqs, output), drafts)
        logits = d.sampling.penalties.apply(logits, prompt, output, drafts)
    return Verified(tok, val, stl, pos, logits, logits.argmax(-1), hidden)


def _along_path(d: Decoding, b: Batch, v: Verified, prop, tree: Tree, have: torch.Tensor, stream: Streams):
    """A verified tree as the chain of the path each row accepts (trees.walk, or trees.walk_sampled, which decides
    the row's tokens too), followed by the first child the target refused: the verify pass's slots, logits and
    hidden states taken along it, the target's cache compacted (through the policy) so that its slots hold the
    chain's, and the proposal the chain's drafts. Returns them and the chain's width, the round's k from here on."""
    policy = d.policy
    S, (B, n) = b.tokens.shape[1], prop.tokens[:, :tree.parents.shape[1]].shape
    decided = None
    if d.sampling.greedy:
        path, length, refused = walk(prop.tokens[:, :n], tree, prop.counts, v.argmax)
    else:
        P = policy.verify_samplers([d.sampling.row(i) for i in b.seqs]).probs(v.logits)
        path, length, refused, own, drawn = walk_sampled(
            prop.tokens[:, :n], tree, prop.counts, P, prop.probs[:, :n], (d.max_new_tokens - 1 - have).clamp(min=0),
            stream, have, policy.accept)
        decided = (length, own, drawn)
    along = trees.slots(path, S)
    rows = torch.arange(B, device=path.device)
    kvcache.gather(b.target.cache, rows, trees.slots(policy.compacted(path), S))
    fed_at = torch.cat([torch.zeros_like(path[:, :1]), 1 + path], 1)  # each chain slot's place in the verify pass
    bonus = policy.bonus_node(path, length)  # where the token after the path is chosen
    at = fed_at.scatter(1, length[:, None], torch.where(length > 0, 1 + bonus, 0)[:, None])
    logits = v.logits.gather(1, at[..., None].expand(-1, -1, v.logits.shape[-1]))
    hidden = v.hidden
    if hidden is not None:  # the last q of the S+n slots fed
        skip = S + n - hidden.shape[1]
        hidden = hidden.gather(1, (along[:, skip:] - skip)[..., None].expand(-1, -1, hidden.shape[-1]))
    live = torch.arange(n, device=path.device)[None] < prop.counts[:, None]
    checks = {  # over every node offered, as the padding mask's check is over every slot
        "positions": ((v.positions[:, S:] == trees.positions(positions(v.valid), tree)[:, S:]) | ~live).all(1),
        "mask": ((policy.tree_among(tree) == tree.ancestors) | ~live[:, :, None]).all(2).all(1),
    }
    record = {"tree_tokens": prop.tokens[:, :n], "tree_parents": tree.parents, "tree_path": path,
              "tree_offered": prop.counts}
    past = torch.arange(fed_at.shape[1], device=path.device) > (length + refused)[:, None]  # filler slots
    chain = Verified(v.tokens.gather(1, along), v.valid.gather(1, along), v.stale.gather(1, along),
                     v.positions.gather(1, along), logits, logits.argmax(-1), hidden, fed_at.masked_fill(past, -1),
                     record, checks, decided)
    drafts = prop.tokens.gather(1, path)
    return chain, Proposal(drafts, length + refused, None, prop.confidence.gather(1, path), prop.fed), path.shape[1]


def _ends(ends: dict[int, list[int]], seqs: list[int], like: torch.Tensor) -> torch.Tensor:
    """(B, V) like `like`: the tokens that ended each row's earlier rounds."""
    mask = torch.zeros_like(like)
    for r, i in enumerate(seqs):
        mask[r, ends.get(i, [])] = True
    return mask


def _roll_back(policy: Policy, state: ModelState, fed: torch.Tensor, accepted: torch.Tensor,
               hidden: torch.Tensor | None = None) -> ModelState:
    """The model's state after the round, whose cache slots were computed at positions `fed` (with last hidden
    states `hidden`, where kept): each row's recurrent states continue from the position the policy picks (the
    correct engine: the row's own accepted count), and hold the row's tokens up to it (-1: a token not the row's, a
    rejected draft)."""
    held, kept = state.held, kvcache.kept(state.cache)
    first = held + (held >= 0)  # what they held after the round's first position
    if not kept:  # no recurrent state: a correct engine's count, for the record
        return ModelState(state.cache, fed, torch.where(held >= 0, held + accepted + 1, -1), first, state.behind,
                          hidden)
    index, conv = policy.state_index(accepted, kept)
    kvcache.roll_back(state.cache, index, conv)
    own = (index <= accepted) & ((index if conv is None else conv) <= accepted) & (held >= 0)
    return ModelState(state.cache, fed, torch.where(own, held + index + 1, -1), first, state.behind, hidden)


def accept(d: Decoding, v: Verified, prop, have: torch.Tensor, stream: Streams, seqs: list[int],
           said: list[list[int]]) -> Accepted:
    """Drafts up to the first disagreement (or rejection), then the target's token there, for the rows of
    sequences `seqs` (`said`: each one's output so far). A row never accepts past its own budget or the drafts it
    was offered (its `room`), whatever the batch drafted: its tokens and draws are then the same in any batch."""
    k = v.logits.shape[1] - 1
    D, g = prop.tokens, v.argmax
    room = torch.minimum((d.max_new_tokens - 1 - have).clamp(min=0, max=k), prop.counts)
    drawn = {}
    if v.decided is not None:  # a sampled tree's, decided along its walk
        a, own, drawn = v.decided
    elif d.sampling.greedy:
        def raw() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # only a fault's rule reads them
            return (v.logits[:, :k].softmax(-1).gather(2, D[:, :k, None])[..., 0].double(),
                    prop.confidence[:, :k].double(), stream.draw(have[:, None] + torch.arange(k, device=D.device), ACCEPT))

        passed = d.policy.greedy_accept(D[:, :k], g[:, :k], raw)
        a = torch.minimum(passed.long().cumprod(1).sum(1), room)
        own = g.gather(1, a[:, None])[:, 0]
    else:
        target = d.policy.verify_samplers([d.sampling.row(i) for i in seqs])
        a, own, drawn = _accept_sampled(d.policy, target, v.logits, prop.probs, D, room, stream, have)
    pick = (D.gather(1, a[:, None]) if d.policy.bonus_from_draft
            else own[d.policy.bonus_rows(len(own), own.device), None])
    emitted = torch.cat([D[:, :k], g[:, k:]], 1).scatter(1, a[:, None], pick)
    idx = torch.arange(k + 1, device=D.device)
    is_eos = torch.isin(emitted, torch.tensor(d.pair.eos_ids, device=D.device)) & d.policy.stops(idx, a)
    first_eos = torch.where(is_eos.any(1), is_eos.long().argmax(1), k + 1)
    n_keep = torch.minimum(torch.minimum(a + 1, first_eos + 1), d.max_new_tokens - have)
    finished = (first_eos < n_keep) | (have + n_keep >= d.max_new_tokens)
    if d.stops.strings:
        n_keep, finished = _stop_strings(d, emitted, n_keep, finished, said)
    return Accepted(room, a, own, pick, emitted, n_keep, finished, drawn)


def _stop_strings(d: Decoding, emitted: torch.Tensor, n_keep: torch.Tensor, finished: torch.Tensor,
                  said: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A row whose kept tokens complete a stop string ends, keeping what the policy keeps (Policy.string_stop)."""
    keep, done = n_keep.tolist(), finished.tolist()
    for r, (old, row) in enumerate(zip(said, emitted.tolist())):
        end = d.stops.text_end(old + row[: keep[r]], len(old))
        if end is not None:
            keep[r] = d.policy.string_stop(end - len(old), keep[r])
            done[r] = True
    return torch.tensor(keep, device=n_keep.device), torch.tensor(done, device=finished.device)


def slots_after(policy: Policy, b: Batch, acc: Accepted, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The slots after this round, as the policy lays them out: tokens, real slots and stale slots, (B, S+k+1)."""
    S = b.tokens.shape[1]
    idx = torch.arange(k + 1, device=b.tokens.device)
    if policy.compact:  # the emitted tokens follow the row's real tokens
        return (torch.cat([b.tokens, acc.emitted], 1), torch.cat([b.valid, idx[None] < acc.n_keep[:, None]], 1),
                torch.zeros(b.tokens.shape[0], S + k + 1, dtype=torch.bool, device=b.tokens.device))
    # rejected drafts stay in place as stale slots; the last token goes after them
    a = acc.accepted[:, None]
    return (torch.cat([b.tokens, acc.emitted], 1).scatter(1, torch.full_like(acc.pick, S + k), acc.pick),
            torch.cat([b.valid, (idx[None] < a) | (idx[None] == k)], 1),
            torch.cat([b.stale, (idx[None] >= a) & (idx[None] < k)], 1))


def _state_before(b: Batch, draft_empty: bool) -> dict:
    """What a recorded round keeps of the state it starts from, and the invariants that state holds."""
    S = b.tokens.shape[1]
    pad, content = (~b.valid & ~b.stale).sum(1), b.valid.sum(1)
    checks = {
        "rectangular": pad + content == S,  # else stale slots lie in the row
        "kv": _kv_in_step(b.target.written, b.valid, b.target.length(S)) & b.valid[:, -1],
        # no cache, or an empty one (filled from the start, as a fresh batch's): nothing out of step
        "draft_kv": _kv_in_step(b.draft.written, b.valid, S - b.draft.behind) | draft_empty,
    }
    models = {"target": b.target, "draft": b.draft}
    recurrent = tuple(who for who, m in models.items() if kvcache.recurrent(m.cache))
    if recurrent:  # I5: a recurrent state holds exactly the row's tokens but those its cache lags by
        checks["recurrent"] = torch.stack([models[who].held == content - models[who].behind for who in recurrent]).all(0)
    return {"checks": checks, "pad": pad, "content": content, "recurrent": recurrent,
            "kv": {who: m.length(S) for who, m in models.items()}, "state": {who: m.held for who, m in models.items()}}


def _recorded(d: Decoding, b: Batch, prop, v: Verified, acc: Accepted, before: dict,
              gen: dict[int, SequenceOutput]) -> dict:
    """A recorded round's per-row tensors and checks (still on the device; record_round brings them over)."""
    S, k = b.tokens.shape[1], v.logits.shape[1] - 1
    top = v.logits.topk(TOP, dim=-1)
    margins = top.values[..., 0] - top.values[..., 1]
    for i, row, m in zip(b.seqs, margins.tolist(), acc.n_keep.tolist()):
        gen[i].margins.extend(row[:m])
    seen = d.policy.seen(v.valid, v.stale, narrowest_window(d.pair.target))
    tree = v.tree_checks or {}  # a tree's: over its nodes (its chain's slots past the path are filler)
    fields = {**before, "checks": {**before["checks"],
                                   "positions": tree.get("positions", (v.positions == positions(v.valid))[:, S - 1:].all(1)),
                                   "mask": (seen == v.valid).all(1) & tree.get("mask", True),
                                   "bonus": acc.pick[:, 0] == acc.own}}
    fields["ints"] = {
        "draft_tokens": prop.tokens[:, :k], "target_tokens": v.argmax, "emitted": acc.emitted,
        "accepted": acc.accepted, "n_emitted": acc.n_keep, "finished": acc.finished.long(), "drafts": acc.room,
        "pos_first": v.positions[:, S - 1], "pos_last": v.positions[:, -1], "mask_sum": seen[:, :S].sum(1),
        "target_top_ids": top.indices, **(v.tree or {}),
    }
    fields["floats"] = {
        "draft_probs": prop.confidence[:, :k],
        "target_probs": v.logits.softmax(-1).gather(2, v.argmax[..., None])[..., 0],
        "target_margins": margins, "target_top_values": top.values.float(),
    }
    if not d.sampling.greedy:
        fields["floats"].update(acc.drawn)
        # trace.PickFrom: 0 target (the bonus), 1 residual, 2 draft (a fault takes the draft's own token)
        fields["ints"]["pick_from"] = (torch.full_like(acc.accepted, 2) if d.policy.bonus_from_draft
                                       else (acc.accepted < acc.room).long())
    return fields


def _accept_sampled(policy: Policy, target: Samplers, logits: torch.Tensor, Q: torch.Tensor, D: torch.Tensor,
                    room: torch.Tensor, stream: Streams, have: torch.Tensor):
    """Speculative sampling's decisions for every row, verified with its `target` sampler: the accepted count (at
    most the row's `room`), the target's own token at the first slot not accepted (from the residual, or from p
    after a fully accepted block), and what was drawn."""
    k = logits.shape[1] - 1
    B, idx = D.shape[0], torch.arange(k, device=D.device)
    P = policy.target_probs(target.probs(logits), D[:, :k])  # (B, k+1, V)
    p = P[:, :k].gather(2, D[:, :k, None])[..., 0].double()
    q = Q[:, :k].gather(2, D[:, :k, None])[..., 0].double()
    u = policy.noise(stream, stream.draw(have[:, None] + idx, ACCEPT))
    a = torch.minimum(policy.accept(p, q, u).long().cumprod(1).sum(1), room)
    rows, bonus = torch.arange(B, device=D.device), a == room
    v = policy.noise(stream, stream.draw(have + a, torch.where(bonus, TARGET, RESIDUAL)))
    P_a = P[rows, a]
    Q_a = Q[rows, a.clamp(max=k - 1)] if k else P_a  # with no drafts every row takes its bonus: Q_a is unread
    own = torch.where(bonus, inverse_cdf(P_a, v), policy.residual(target, logits[rows, a], P_a, Q_a, v))
    drawn = {"target_draft_probs": p, "accept_draws": u, "pick_draws": v[:, None]}
    return a, own, drawn


def _to_host(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One device-to-host copy for a dict of same-dtype per-row tensors."""
    rows = next(iter(tensors.values())).shape[0]
    flat = torch.cat([t.reshape(rows, t[0].numel()) for t in tensors.values()], 1).cpu()
    out, at = {}, 0
    for name, t in tensors.items():
        width = t[0].numel()
        out[name] = flat[:, at:at + width].reshape(t.shape)
        at += width
    return out


def record_round(step: Step, seqs: list[int], batch_index: int, after: dict[str, torch.Tensor],
                 timings: dict, realigned: bool, **extra) -> RoundData:
    """Bring one round's tensors to the host. `after` holds each row's pad, content, target_kv and draft_kv after
    the round (-1 for rows that left; a drafter without a cache: 0), and the tokens its recurrent states hold."""
    f = step.fields
    B = len(seqs)
    left = step.finished
    ints = dict(f["ints"])
    for who in f["recurrent"]:
        ints.update({f"{who}_state_before": f["state"][who], f"{who}_state_after": after[f"{who}_state"]})
    ints.update(
        pad_before=f["pad"], content_before=f["content"],
        **{f"{who}_kv_before": torch.full((B,), kv, device=left.device) for who, kv in f["kv"].items()},
        pad_after=after["pad"], content_after=after["content"],
        target_kv_after=after["target_kv"], draft_kv_after=after["draft_kv"],
        delta=torch.where(left, 0, after["pad"] - f["pad"]),
    )
    return RoundData(batch_index, list(seqs), step.k, _to_host(ints), _to_host(f["floats"]), _to_host(f["checks"]),
                     timings, realigned, **extra)
