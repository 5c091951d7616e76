"""EqSpec: static-batch greedy speculative decoding that stays in step.

Each round, for every active row of a left-padded batch:
  draft   the draft proposes k tokens from its own KV cache;
  verify  the target scores the last committed token and the k drafts in one pass;
  accept  the row keeps its drafts up to the first disagreement, plus the
          target's own token there (the correction, or the bonus after a fully
          accepted block): 1..k+1 new tokens;
  realign rows grew by different amounts, so the batch is re-laid out
          ("unpad, append, repad") with one gather per cache layer; rows that
          finished leave the batch.

Layout invariant at the start of a round (S slots, see batch.py): the target
cache holds slots 0..S-2 (every real token but the last, which is fed again),
the draft cache slots 0..S-3 (the draft re-feeds the last two, so that after a
fully accepted block it catches up on the k-th draft it never fed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
import torch

from .. import kvcache
from ..models import ModelPair
from .batch import forward, left_pad, positions
from .result import DecodeResult, Progress, SequenceOutput, chunks, top2_margin


@dataclass
class RoundData:
    """One round as recorded: tensors on the CPU, turned into trace records only when saving."""

    batch: int  # index of the static batch
    seqs: list[int]  # sequence id of each row
    k: int
    ints: dict[str, torch.Tensor]  # per-row integer fields, first dim = rows
    floats: dict[str, torch.Tensor]  # per-row float fields
    checks: dict[str, torch.Tensor]  # per-row invariant checks (bool)
    timings: dict[str, float]  # seconds: draft, verify, realign, trace
    realigned: bool  # whether the caches had to be gathered (else only cropped)


class _Clock:
    """Phase timer; synchronizes CUDA so a phase is charged for its own kernels."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.t = time.perf_counter()

    def lap(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt


def _written(valid: torch.Tensor, slots: int) -> torch.Tensor:
    """Cache provenance for a fresh prefill: the position each slot's K/V was
    computed at, -1 where the slot is not a real token."""
    return torch.where(valid, positions(valid), -1)[:, :slots]


def _kv_in_step(written: torch.Tensor, valid: torch.Tensor, slots: int) -> torch.Tensor:
    """I3 per row: every real token in the first `slots` slots has K/V computed
    at its own position, and the cache holds exactly those slots."""
    want = torch.where(valid, positions(valid), -1)[:, :slots]
    return ((written == want) | ~valid[:, :slots]).all(1) & (written.shape[1] == slots)


@torch.inference_mode()
def eqspec(pair: ModelPair, prompts: list[list[int]], batch_size: int, k: int, max_new_tokens: int,
           record: bool = True, progress: Progress | None = None) -> DecodeResult:
    outputs: list[SequenceOutput | None] = [None] * len(prompts)
    rounds: list[RoundData] = []
    start = time.perf_counter()
    for b, chunk in enumerate(chunks(len(prompts), batch_size)):
        _decode_batch(pair, prompts, list(chunk), b, k, max_new_tokens, record, progress, outputs, rounds)
    return DecodeResult(outputs, time.perf_counter() - start, rounds)


def _decode_batch(pair, prompts, seqs, batch_index, k, max_new_tokens, record, progress, outputs, rounds):
    dev, V = pair.device, pair.vocab_size
    eos = torch.tensor(pair.eos_ids, device=dev)
    gen = {i: SequenceOutput([]) for i in seqs}
    tokens, valid = left_pad([prompts[i] for i in seqs], dev, min_width=2)
    S = tokens.shape[1]

    # Prefill: the target caches slots 0..S-2, the draft slots 0..S-3.
    tcache, dcache = kvcache.new(pair.target), kvcache.new(pair.draft)
    forward(pair.target, tokens[:, : S - 1], valid[:, : S - 1], 0, tcache, V, last_only=True)
    if S > 2:
        forward(pair.draft, tokens[:, : S - 2], valid[:, : S - 2], 0, dcache, V, last_only=True)
    t_written, d_written = _written(valid, S - 1), _written(valid, S - 2)

    idx = torch.arange(k + 1, device=dev)
    while seqs:
        clock = _Clock(dev)
        B, S = tokens.shape
        pad = (valid.long().cumsum(1) == 0).sum(1)
        content = valid.sum(1)
        if record:
            checks = {
                "rectangular": pad + content == S,
                "kv": _kv_in_step(t_written, valid, S - 1) & valid[:, -1],
                "draft_kv": _kv_in_step(d_written, valid, S - 2),
            }

        # -- draft: k greedy proposals, the first step re-feeding the last two slots
        d_tok, d_val = tokens, valid
        drafts, d_probs = [], []
        q_start = S - 2
        for j in range(k):
            logits = forward(pair.draft, d_tok, d_val, q_start, dcache, V, last_only=True)[:, -1]
            nxt = logits.argmax(-1)
            drafts.append(nxt)
            if record:
                d_probs.append(logits.softmax(-1).gather(1, nxt[:, None])[:, 0])
            if j < k - 1:
                q_start = d_tok.shape[1]
                d_tok = torch.cat([d_tok, nxt[:, None]], 1)
                d_val = torch.cat([d_val, torch.ones_like(valid[:, :1])], 1)
        D = torch.stack(drafts, 1)  # (B, k)
        t_draft = clock.lap()

        # -- verify: the last committed token and the k drafts, in one target pass
        ext_tok = torch.cat([tokens, D], 1)
        ext_val = torch.cat([valid, torch.ones_like(D, dtype=torch.bool)], 1)
        ver_pos = positions(ext_val)[:, S - 1:]
        logits = forward(pair.target, ext_tok, ext_val, S - 1, tcache, V, pos=ver_pos)  # (B, k+1, V)
        g = logits.argmax(-1)
        t_verify = clock.lap()

        # -- accept: drafts up to the first disagreement, then the target's token
        a = (D == g[:, :k]).long().cumprod(1).sum(1)
        emitted = torch.cat([D, g[:, k:]], 1).scatter(1, a[:, None], g.gather(1, a[:, None]))
        n = a + 1
        is_eos = torch.isin(emitted, eos) & (idx < n[:, None])
        first_eos = torch.where(is_eos.any(1), is_eos.long().argmax(1), k + 1)
        have = torch.tensor([len(gen[i].ids) for i in seqs], device=dev)
        n_keep = torch.minimum(torch.minimum(n, first_eos + 1), max_new_tokens - have)
        finished = (first_eos < n_keep) | (have + n_keep >= max_new_tokens)
        for i, row, m in zip(seqs, emitted.tolist(), n_keep.tolist()):
            gen[i].ids.extend(row[:m])
        if record:
            margins = top2_margin(logits)
            for i, row, m in zip(seqs, margins.tolist(), n_keep.tolist()):
                gen[i].margins.extend(row[:m])
        if progress:
            progress(int(n_keep.sum()))

        # -- realign: right-align each continuing row's real tokens in S' slots
        keep = (~finished).nonzero().flatten()
        out_val = torch.cat([valid, idx[None] < n_keep[:, None]], 1)
        out_tok = torch.cat([tokens, emitted], 1)
        content_after = out_val.sum(1)
        new_S = int(content_after[keep].max()) if len(keep) else 0
        pad_after = new_S - content_after
        delta = pad_after - pad
        # Valid slots first, in order: row r's j-th real token sits at order[r, j].
        order = torch.argsort((~out_val).to(torch.int8), dim=1, stable=True)[keep]
        jj = torch.arange(new_S, device=dev)[None] - pad_after[keep, None]
        src = order.gather(1, jj.clamp(min=0))
        moved = bool(len(keep)) and bool((delta[keep] != 0).any())
        if len(keep):
            if moved:
                kvcache.gather(tcache, keep, src[:, : new_S - 1])
                kvcache.gather(dcache, keep, src[:, : new_S - 2])
            else:  # every offset is 0: only drop finished rows and rejected slots
                if len(keep) < B:
                    kvcache.select_rows(tcache, keep)
                    kvcache.select_rows(dcache, keep)
                kvcache.crop(tcache, new_S - 1)
                kvcache.crop(dcache, new_S - 2)
        t_written_ext = torch.cat([t_written, ver_pos], 1)
        d_written_ext = torch.cat([d_written, positions(ext_val)[:, S - 2: S + k - 1]], 1)
        t_realign = clock.lap()

        if record:
            tkv_before, dkv_before = t_written.shape[1], d_written.shape[1]
        if len(keep):
            rows = keep[:, None]
            t_written = torch.where(jj[:, : new_S - 1] >= 0, t_written_ext[rows, src[:, : new_S - 1]], -1)
            d_written = torch.where(jj[:, : new_S - 2] >= 0, d_written_ext[rows, src[:, : new_S - 2]], -1)
            tokens = out_tok[rows, src]
            valid = jj >= 0

        if record:
            checks["positions"] = (ver_pos == positions(ext_val)[:, S - 1:]).all(1)
            checks["mask"] = ext_val[:, : S].sum(1) == content
            checks["bonus"] = emitted.gather(1, a[:, None])[:, 0] == g.gather(1, a[:, None])[:, 0]
            left = torch.full((B,), -1, dtype=torch.long, device=dev)
            pad_after_row = torch.where(finished, left, pad_after)
            ints = {
                "draft_tokens": D,
                "target_tokens": g,
                "emitted": emitted,
                "accepted": a,
                "n_emitted": n_keep,
                "finished": finished.long(),
                "pad_before": pad,
                "pad_after": pad_after_row,
                "content_before": content,
                "content_after": torch.where(finished, left, content_after),
                "pos_first": ver_pos[:, 0],
                "pos_last": ver_pos[:, -1],
                "mask_sum": ext_val[:, :S].sum(1),
                "target_kv_before": torch.full((B,), tkv_before, device=dev),
                "target_kv_after": torch.where(finished, left, torch.full((B,), max(new_S - 1, 0), device=dev)),
                "draft_kv_before": torch.full((B,), dkv_before, device=dev),
                "draft_kv_after": torch.where(finished, left, torch.full((B,), max(new_S - 2, 0), device=dev)),
                "delta": torch.where(finished, torch.zeros_like(delta), delta),
            }
            floats = {
                "draft_probs": torch.stack(d_probs, 1),
                "target_probs": logits.softmax(-1).gather(2, g[..., None])[..., 0],
                "target_margins": margins,
            }
            rounds.append(RoundData(
                batch_index, list(seqs), k,
                {n_: t.cpu() for n_, t in ints.items()},
                {n_: t.cpu() for n_, t in floats.items()},
                {n_: t.cpu() for n_, t in checks.items()},
                {"draft": t_draft, "verify": t_verify, "realign": t_realign, "trace": clock.lap()},
                moved,
            ))
        seqs = [seqs[r] for r in keep.tolist()]
    for i, o in gen.items():
        outputs[i] = o
