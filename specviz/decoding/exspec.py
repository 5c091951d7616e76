"""ExSpec: cross-batch scheduling over a pool of per-sequence states.

Instead of realigning a ragged batch every round, every sequence keeps its own
tokens and its own single-row target and draft caches. Each round forms a
batch from a sliding window of W active sequences: B sequences of the same
length stack into a batch with no padding and need no realignment at all;
when no such group exists, the round falls back to a padded batch (the
merge pads, the split unpads: a realignment). Sequences that finish leave at
once and the window refills from the pool.

Bounded waiting (the paper's ExSpec lacks it and pays in tail latency): a
sequence passed over `max_wait` rounds in a row is forced into the next batch.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

from specviz.decoding.batch import left_pad
from specviz.decoding.drafters import ModelDrafter
from specviz.decoding.faults import Policy
from specviz.decoding.paging import CONTIGUOUS, KVLayout, Memory
from specviz.decoding.modelstate import ModelState
from specviz.decoding.proposal import Drafter
from specviz.decoding.recording import RoundData, record_round
from specviz.decoding.result import DecodeResult, Progress, SequenceOutput
from specviz.decoding.round import Clock, prefill, speculate
from specviz.decoding.sampling import GREEDY, Sampling
from specviz.decoding.stages import Batch, Decoding
from specviz.models.pairs import ModelPair

CORRECT = Policy(())


@dataclass
class SeqState:
    seq: int
    # (1, S) the sequence's slots: real tokens (a 1-token prompt keeps one pad)
    tokens: torch.Tensor
    valid: torch.Tensor
    target: ModelState  # single-row states: a target cache of S-1 slots, the drafter's
    draft: ModelState
    waited: int = 0  # rounds passed over since it last ran

    @property
    def width(self) -> int:
        return self.tokens.shape[1]


def _admit(pair: ModelPair, drafter: Drafter, memory: Memory, seqs: list[int],
           prompts: list[list[int]]) -> list[SeqState]:
    """Prefill the newly admitted sequences in one batch, then give each its own slots: its real
    tokens, and at least 3 slots in all, so that its draft cache is never empty (pads
    are masked)."""
    b = prefill(pair, CORRECT, drafter, memory, seqs,
                *left_pad([prompts[i] for i in seqs], pair.device, min_width=3))
    S = b.tokens.shape[1]
    starts = [min(S - len(prompts[i]), S - 3) for i in seqs]
    spans = [(lo, S) for lo in starts]
    targets, drafts = b.target.split(spans, b.valid), b.draft.split(spans, b.valid)
    return [SeqState(seq, b.tokens[r: r + 1, lo:], b.valid[r: r + 1, lo:], target, draft)
            for r, (seq, lo, target, draft) in enumerate(zip(seqs, starts, targets, drafts))]


def choose_batch(active: list[SeqState], batch_size: int,
                 max_wait: int) -> tuple[list[SeqState], bool]:
    """The round's rows, and whether they form a same-length group.

    A sequence that has waited `max_wait` rounds goes first; otherwise the
    largest group of equal-length sequences (longest-waiting first); if it is
    smaller than the batch, the nearest lengths fill it (a fallback round).
    """
    if len(active) <= batch_size:
        chosen = list(active)
    else:
        overdue = [s for s in active if s.waited >= max_wait]
        groups: dict[int, list[SeqState]] = {}
        for s in active:
            groups.setdefault(s.width, []).append(s)
        if overdue:
            anchor = max(overdue, key=lambda s: s.waited)
        else:
            best = max(groups.values(), key=lambda g: (len(g), max(s.waited for s in g)))
            anchor = max(best, key=lambda s: s.waited)
        chosen = sorted(active, key=lambda s: (s.waited < max_wait, s.width != anchor.width,
                                               abs(s.width - anchor.width), -s.waited))[:batch_size]
    return chosen, len({s.width for s in chosen}) == 1


def _merged_batch(rows: list[SeqState]) -> Batch:
    """Stack the rows' states into one left-padded batch (no padding for a same-length group)."""
    width = max(s.width for s in rows)
    pad = lambda t, v: torch.nn.functional.pad(t, (width - t.shape[1], 0), value=v)  # noqa: E731
    tokens = torch.cat([pad(s.tokens, 0) for s in rows])
    valid = torch.cat([pad(s.valid, False) for s in rows])
    return Batch([s.seq for s in rows], tokens, valid, torch.zeros_like(valid),
                 ModelState.merge([s.target for s in rows], valid),
                 ModelState.merge([s.draft for s in rows], valid))


@torch.inference_mode()
def exspec(pair: ModelPair, prompts: list[list[int]], batch_size: int, k: int, max_new_tokens: int,
           window: int, max_wait: int, sort_by_length: bool = True, record: bool = True,
           progress: Progress | None = None, watch=None, sampling: Sampling = GREEDY,
           drafter: Drafter | None = None, kv: KVLayout = CONTIGUOUS) -> DecodeResult:
    """`drafter`: what proposes the drafts (drafters.py); the pair's draft model by default. `kv`:
    how the caches are laid out (paging.py)."""
    drafter = drafter or ModelDrafter(pair)
    memory = Memory(kv, checked=record)
    d = Decoding(pair, CORRECT, drafter, max_new_tokens, sampling, record, watch)
    order = sorted(range(len(prompts)),
                   key=lambda i: len(prompts[i])) if sort_by_length else range(len(prompts))
    pool = deque(order)
    gen = {i: SequenceOutput([]) for i in range(len(prompts))}
    active: list[SeqState] = []
    rounds: list[RoundData] = []
    start = time.perf_counter()
    while pool or active:
        admitted = [pool.popleft() for _ in range(min(len(pool), window - len(active)))]
        if admitted:
            active += _admit(pair, drafter, memory, admitted, prompts)
        clock = Clock(pair.device)
        rows, group = choose_batch(active, batch_size, max_wait)
        waits = [s.waited for s in rows]
        b = _merged_batch(rows)
        step = speculate(d, b, k, gen, clock)
        if progress:
            progress(int(step.n_keep.sum()))

        first, spans = _split_back(rows, b, step, active, gen, start)
        chosen = {s.seq for s in rows}
        for s in active:
            if s.seq not in chosen:
                s.waited += 1
        timings = {**step.timings, "realign": clock.lap()}
        if record:
            rd = record_round(step, b.seqs, -1, _after(step, first, spans), timings, not group,
                              group=group, waits=waits)
            rd.timings["trace"] = clock.lap()
            rounds.append(rd)
    return DecodeResult([gen[i] for i in range(len(prompts))], time.perf_counter() - start, rounds,
                        paging=memory.stats())


def _split_back(rows: list[SeqState], b: Batch, step, active: list[SeqState], gen: dict,
                start: float):
    """Each continuing row keeps its real slots of the round's batch (contiguous: the policy is
    correct), and at least 3 slots in all; a finished row leaves the window. Returns each row's
    padding and the slots it kept."""
    S = b.tokens.shape[1]
    first = (~step.out_val).long().cumprod(1).sum(1)  # the row's padding
    spans = [(min(int(first[r]), S + int(step.accepted[r]) - 2), S + int(step.accepted[r]) + 1)
             for r in range(len(rows))]
    done = step.finished.tolist()
    for r, (s, target, draft) in enumerate(zip(rows, step.target.split(spans, step.out_val),
                                               step.draft.split(spans, step.out_val))):
        if done[r]:
            target.let_go()
            draft.let_go()
            active.remove(s)
            gen[s.seq].finished_at = time.perf_counter() - start
            continue
        lo, hi = spans[r]
        s.tokens, s.valid = step.out_tok[r: r + 1, lo:hi], step.out_val[r: r + 1, lo:hi]
        s.target, s.draft, s.waited = target, draft, 0
    return first, spans


def _after(step, first: torch.Tensor, spans: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Each row's pad, content, target and draft KV lengths after the round (-1 for rows
    that left)."""
    gone = step.finished
    width = torch.tensor([hi - lo for lo, hi in spans], device=gone.device)
    pads = first - torch.tensor([lo for lo, _ in spans], device=gone.device)
    return {"pad": torch.where(gone, -1, pads), "content": torch.where(gone, -1, width - pads),
            "target_kv": torch.where(gone, -1, step.target.length(width)),
            "draft_kv": torch.where(gone, -1, step.draft.length(width)),
            "target_state": step.target.held, "draft_state": step.draft.held}
