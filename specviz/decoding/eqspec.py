"""EqSpec: static-batch speculative decoding that stays in step.

Consecutive prompts form static batches. Each round (round.py) every row
gains 1..k+1 tokens; then the batch is laid out again ("unpad, append,
repad"): each continuing row's real tokens are right-aligned in the new width
and both caches follow with one gather per layer, skipped when no row moves.
Rows that finished leave the batch at once.
"""
from __future__ import annotations

import time

import torch

from specviz.decoding.batch import left_pad, right_pad
from specviz.decoding.drafters import ModelDrafter
from specviz.decoding.faults import Policy
from specviz.decoding.paging import CONTIGUOUS, KVLayout, Memory, Slips
from specviz.decoding.proposal import Drafter
from specviz.decoding.recording import RoundData, record_round
from specviz.decoding.result import DecodeResult, Progress, SequenceOutput, chunks
from specviz.decoding.round import Clock, lay_out, speculate
from specviz.decoding.sampling import GREEDY, Sampling
from specviz.decoding.stages import Batch, Decoding
from specviz.models.pairs import ModelPair


@torch.inference_mode()
def eqspec(pair: ModelPair, prompts: list[list[int]], batch_size: int, k: int, max_new_tokens: int,
           faults: tuple[str, ...] = (), record: bool = True, progress: Progress | None = None,
           watch=None, sampling: Sampling = GREEDY, drafter: Drafter | None = None,
           kv: KVLayout = CONTIGUOUS) -> DecodeResult:
    """`drafter`: what proposes the drafts (drafters.py); the pair's draft model by default. `kv`:
    how the caches are laid out (paging.py)."""
    policy = Policy(tuple(faults))
    memory = Memory(kv, Slips.of(policy.faults), checked=record)
    drafter = drafter or ModelDrafter(pair)
    d = Decoding(pair, policy, drafter, max_new_tokens, sampling, record, watch)
    layout = right_pad if policy.pads_right else left_pad
    outputs: list[SequenceOutput | None] = [None] * len(prompts)
    rounds: list[RoundData] = []
    start = time.perf_counter()
    for index, chunk in enumerate(chunks(len(prompts), batch_size)):
        seqs = list(chunk)
        gen = {i: SequenceOutput([]) for i in seqs}
        b = lay_out(pair, policy, drafter, memory, seqs,
                    *layout([prompts[i] for i in seqs], pair.device, min_width=2))
        while b is not None:
            clock = Clock(pair.device)
            step = speculate(d, b, k, gen, clock)
            if progress:
                progress(int(step.n_keep.sum()))
            old_seqs = b.seqs
            b, moved, after = _realign(b, step, policy)
            for i in set(old_seqs) - set(b.seqs if b else []):
                gen[i].finished_at = time.perf_counter() - start
            timings = {**step.timings, "realign": clock.lap()}
            if record:
                rd = record_round(step, old_seqs, index, after, timings, moved)
                rd.timings["trace"] = clock.lap()
                rounds.append(rd)
        for i in seqs:
            outputs[i] = gen[i]
    return DecodeResult(outputs, time.perf_counter() - start, rounds, paging=memory.stats())


def _realign(b: Batch, step, policy: Policy) -> tuple[Batch | None, bool, dict]:
    """Lay the continuing rows out again, right-aligned; drop finished rows.

    Returns the new batch (None when every row finished), whether the caches had to be gathered, and
    each old row's pad, content and cache lengths afterwards (-1 for rows that left).
    """
    B, S = b.tokens.shape
    dev = b.tokens.device
    keep = (~step.finished).nonzero().flatten()
    after = {name: torch.full((B,), -1, device=dev)
             for name in ("pad", "content", "target_kv", "draft_kv")}
    after["target_state"], after["draft_state"] = step.target.held, step.draft.held
    if not len(keep):  # the batch is done: a paged cache gives its blocks back
        step.target.let_go()
        step.draft.let_go()
        return None, False, after
    src, valid, stale, width = _relayout(step.out_val[keep], step.out_stale[keep], policy, S,
                                         step.n_keep[keep])
    nothing_moves = bool(((src == torch.arange(width, device=dev)) | ~valid).all())
    moved = policy.move_kv and not nothing_moves
    # no row moves (or the fault forgets to move them): rows and trailing slots are dropped only
    lost = _lost(policy, step, keep, src, S)
    target, draft = (m.rearranged(keep, src if moved else None, valid, lost)
                     for m in (step.target, step.draft))
    after["pad"][keep] = (~valid & ~stale).sum(1)
    after["content"][keep] = valid.sum(1)
    after["target_kv"][keep], after["draft_kv"][keep] = target.length(width), draft.length(width)
    seqs = [b.seqs[r] for r in keep.tolist()]
    return Batch(seqs, step.out_tok[keep[:, None], src], valid, stale, target, draft), moved, after


def _relayout(out_val: torch.Tensor, out_stale: torch.Tensor, policy: Policy, S: int,
              n_keep: torch.Tensor):
    """Where each continuing row's slots go: (src, new_valid, new_stale, width).

    New slot j of row r takes old (extended) slot src[r, j]; rows are
    right-aligned to a common width. The correct layout removes every stale
    slot and pads rows to the longest; `keep-rejected-kv` keeps stale slots in
    place; `growing-padding` never lets a row's padding shrink.
    """
    dev = out_val.device
    if policy.compact:
        # real slots first, in order
        order = torch.argsort((~out_val).to(torch.int8), dim=1, stable=True)
        length = out_val.sum(1)
    else:
        order = torch.arange(out_val.shape[1], device=dev).expand_as(out_val)
        # through the last real slot
        length = out_val.shape[1] - (out_val.flip(1).long().cumsum(1) == 0).sum(1)
    width = int(length.max())
    if policy.pads_only_grow:
        width = max(width, S + int(n_keep.max()))
    jj = torch.arange(width, device=dev)[None] - (width - length)[:, None]
    src = order.gather(1, jj.clamp(min=0))
    placed = jj >= 0
    return src, placed & out_val.gather(1, src), placed & out_stale.gather(1, src), width


def _lost(policy: Policy, step, keep: torch.Tensor, src: torch.Tensor,
          S: int) -> torch.Tensor | None:
    """Slots (in the new layout) of committed tokens whose K/V a fault threw away: the last of
    each row's committed entries that Policy.committed_lost counts (the cache holds slots up to
    S + a - 1); None: the correct engine's."""
    a = step.accepted
    erased = policy.committed_lost(a, step.room, step.k)
    if erased is None:
        return None
    ext = torch.arange(step.out_val.shape[1], device=a.device)[None]
    lost_ext = (ext >= S + a[:, None] - erased[:, None]) & (ext < S + a[:, None])
    return lost_ext[keep[:, None], src]
