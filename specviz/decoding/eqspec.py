"""EqSpec: static-batch greedy speculative decoding that stays in step.

Each round, for every active row of a padded batch:
  draft   the draft proposes k tokens from its own KV cache;
  verify  the target scores the last committed token and the k drafts in one pass;
  accept  the row keeps its drafts up to the first disagreement, plus the
          target's own token there (the correction, or the bonus after a fully
          accepted block): 1..k+1 new tokens;
  realign rows grew by different amounts, so the batch is re-laid out
          ("unpad, append, repad") with one gather per cache layer, skipped
          when no row moves; rows that finished leave the batch.

Layout at the start of a round (S slots, see batch.py): the target cache holds
slots 0..S-2 (every token but the last, which is fed again), the draft cache
slots 0..S-3 (the draft re-feeds the last two, so that after a fully accepted
block it catches up on the k-th draft it never fed).

Every decision a published implementation got wrong goes through a `Policy`
(faults.py); the default policy is the correct engine. The engine also keeps
the provenance of every cache slot (the position its K/V was computed at), so
that invariant checks see what the cache really holds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .. import kvcache
from ..models import ModelPair
from .batch import forward, left_pad, positions, right_pad
from .faults import Policy
from .result import DecodeResult, Progress, SequenceOutput, chunks

TOP = 8  # target logits kept per verified slot (for forensics, not saved in the trace)


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


def _kv_in_step(written: torch.Tensor, valid: torch.Tensor, slots: int) -> torch.Tensor:
    """I3 per row: every real token in the first `slots` slots has K/V computed
    at its own position (by the mask), and the cache holds exactly those slots."""
    want = torch.where(valid, positions(valid), -1)[:, :slots]
    return ((written == want) | ~valid[:, :slots]).all(1) & (written.shape[1] == slots)


def _to_host(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One device-to-host copy for a dict of same-dtype per-row tensors."""
    rows = next(iter(tensors.values())).shape[0]
    flat = torch.cat([t.reshape(rows, -1) for t in tensors.values()], 1).cpu()
    out, at = {}, 0
    for name, t in tensors.items():
        width = t[0].numel()
        out[name] = flat[:, at:at + width].reshape(t.shape)
        at += width
    return out


@torch.inference_mode()
def eqspec(pair: ModelPair, prompts: list[list[int]], batch_size: int, k: int, max_new_tokens: int,
           faults: tuple[str, ...] = (), record: bool = True, progress: Progress | None = None) -> DecodeResult:
    policy = Policy(tuple(faults))
    outputs: list[SequenceOutput | None] = [None] * len(prompts)
    rounds: list[RoundData] = []
    start = time.perf_counter()
    for b, chunk in enumerate(chunks(len(prompts), batch_size)):
        seqs = list(chunk)
        gen = _decode_batch(pair, policy, [prompts[i] for i in seqs], seqs, b, k, max_new_tokens, record,
                            progress, rounds)
        for i in seqs:
            outputs[i] = gen[i]
    return DecodeResult(outputs, time.perf_counter() - start, rounds)


def _decode_batch(pair: ModelPair, policy: Policy, prompts, seqs, batch_index, k, max_new_tokens, record,
                  progress, rounds) -> dict[int, SequenceOutput]:
    dev, V = pair.device, pair.vocab_size
    eos = torch.tensor(pair.eos_ids, device=dev)
    gen = {i: SequenceOutput([]) for i in seqs}
    layout = right_pad if policy.has("right-padding") else left_pad
    tokens, valid = layout(prompts, dev, min_width=2)
    stale = torch.zeros_like(valid)  # slots holding a rejected draft (only a faulty engine keeps them)
    S = tokens.shape[1]

    def run(model, tok, val, stl, q_start, cache, **kw):
        pos = policy.positions(val, stl)
        return forward(model, tok, val, q_start, cache, V, pos=pos[:, q_start:], seen=policy.seen(val), **kw), pos

    # Prefill: the target caches slots 0..S-2, the draft slots 0..S-3.
    tcache, dcache = kvcache.new(pair.target), kvcache.new(pair.draft)
    _, pos = run(pair.target, tokens[:, : S - 1], valid[:, : S - 1], stale[:, : S - 1], 0, tcache, last_only=True)
    if S > 2:
        run(pair.draft, tokens[:, : S - 2], valid[:, : S - 2], stale[:, : S - 2], 0, dcache, last_only=True)
    # Provenance: the position each cached slot's K/V was computed at; -1 where no real token is.
    written = torch.where(valid[:, : S - 1], pos, -1)
    t_written, d_written = written, written[:, : S - 2]

    idx = torch.arange(k + 1, device=dev)
    steps = policy.draft_steps(k)
    while seqs:
        clock = _Clock(dev)
        B, S = tokens.shape
        pad = (~valid & ~stale).sum(1)
        content = valid.sum(1)
        if record:  # the state this round starts from
            checks = {
                "rectangular": pad + content == S,  # else stale slots lie in the row
                "kv": _kv_in_step(t_written, valid, S - 1) & valid[:, -1],
                "draft_kv": _kv_in_step(d_written, valid, S - 2),
            }

        # -- draft: greedy proposals, the first step re-feeding the last two slots
        d_tok, d_val, d_stl = tokens, valid, stale
        drafts, d_probs = [], []
        q_start = S - 2
        for j in range(steps):
            logits, d_pos = run(pair.draft, d_tok, d_val, d_stl, q_start, dcache, last_only=True)
            nxt = logits[:, -1].argmax(-1)
            drafts.append(nxt)
            if record:
                d_probs.append(logits[:, -1].softmax(-1).gather(1, nxt[:, None])[:, 0])
            if j < steps - 1:
                q_start = d_tok.shape[1]
                d_tok = torch.cat([d_tok, nxt[:, None]], 1)
                d_val = torch.cat([d_val, torch.ones_like(valid[:, :1])], 1)
                d_stl = torch.cat([d_stl, torch.zeros_like(valid[:, :1])], 1)
        D = torch.stack(drafts, 1)  # (B, steps)
        d_fed = torch.cat([d_written, d_pos[:, S - 2:]], 1)
        t_draft = clock.lap()

        # -- verify: the last committed token and the k drafts, in one target pass
        ext_tok = torch.cat([tokens, D[:, :k]], 1)
        ext_val = torch.cat([valid, torch.ones_like(D[:, :k], dtype=torch.bool)], 1)
        ext_stl = torch.cat([stale, torch.zeros_like(D[:, :k], dtype=torch.bool)], 1)
        logits, ext_pos = run(pair.target, ext_tok, ext_val, ext_stl, S - 1, tcache)  # (B, k+1, V)
        g = logits.argmax(-1)
        t_fed = torch.cat([t_written, ext_pos[:, S - 1:]], 1)
        t_verify = clock.lap()

        # -- accept: drafts up to the first disagreement, then the target's token there
        a = (D[:, :k] == g[:, :k]).long().cumprod(1).sum(1)
        source = D if policy.has("draft-bonus") else g
        pick = source.gather(1, a[:, None])
        emitted = torch.cat([D[:, :k], g[:, k:]], 1).scatter(1, a[:, None], pick)
        n = a + 1
        is_eos = torch.isin(emitted, eos) & (idx < n[:, None])
        first_eos = torch.where(is_eos.any(1), is_eos.long().argmax(1), k + 1)
        have = torch.tensor([len(gen[i].ids) for i in seqs], device=dev)
        n_keep = torch.minimum(torch.minimum(n, first_eos + 1), max_new_tokens - have)
        finished = (first_eos < n_keep) | (have + n_keep >= max_new_tokens)
        for i, row, m in zip(seqs, emitted.tolist(), n_keep.tolist()):
            gen[i].ids.extend(row[:m])
        if record:
            top = logits.topk(TOP, dim=-1)
            margins = top.values[..., 0] - top.values[..., 1]
            for i, row, m in zip(seqs, margins.tolist(), n_keep.tolist()):
                gen[i].margins.extend(row[:m])
        if progress:
            progress(int(n_keep.sum()))

        # -- realign: lay each continuing row's tokens out again, right-aligned
        keep = (~finished).nonzero().flatten()
        if policy.compact:  # the emitted tokens follow the row's real tokens
            out_tok = torch.cat([tokens, emitted], 1)
            out_val = torch.cat([valid, idx[None] < n_keep[:, None]], 1)
            out_stl = torch.zeros_like(out_val)
        else:  # rejected drafts stay in place as stale slots; the last token goes after them
            out_tok = torch.cat([tokens, emitted], 1).scatter(1, torch.full_like(pick, S + k), pick)
            out_val = torch.cat([valid, (idx[None] < a[:, None]) | (idx[None] == k)], 1)
            out_stl = torch.cat([stale, (idx[None] >= a[:, None]) & (idx[None] < k)], 1)
        src, new_valid, new_stale, width = _relayout(out_val[keep], out_stl[keep], policy, S, n_keep[keep])
        moved = False
        if len(keep):
            rows = keep[:, None]
            nothing_moves = bool(((src == torch.arange(width, device=dev)) | ~new_valid).all())
            if policy.move_kv and not nothing_moves:
                kvcache.gather(tcache, keep, src[:, : width - 1])
                kvcache.gather(dcache, keep, src[:, : width - 2])
                t_written, d_written = t_fed[rows, src[:, : width - 1]], d_fed[rows, src[:, : width - 2]]
                moved = True
            else:  # no row moves (or the fault forgets to move them): drop rows and trailing slots
                if len(keep) < B:
                    kvcache.select_rows(tcache, keep)
                    kvcache.select_rows(dcache, keep)
                kvcache.crop(tcache, width - 1)
                kvcache.crop(dcache, width - 2)
                t_written, d_written = t_fed[keep, : width - 1], d_fed[keep, : width - 2]
            if policy.has("min-crop"):
                lost = _min_crop_lost(a, keep, src, S, k, width)
                kvcache.zero_slots(tcache, lost[:, : width - 1])
                kvcache.zero_slots(dcache, lost[:, : width - 2])
                t_written = t_written.masked_fill(lost[:, : width - 1], -1)
                d_written = d_written.masked_fill(lost[:, : width - 2], -1)
            t_written = t_written.masked_fill(~new_valid[:, : width - 1], -1)
            d_written = d_written.masked_fill(~new_valid[:, : width - 2], -1)
            new_tokens = out_tok[rows, src]
        t_realign = clock.lap()

        if record:
            after = torch.full((B,), -1, device=dev)  # -1: the row finished and left
            pad_after, content_after = after.clone(), after.clone()
            if len(keep):
                pad_after[keep] = (~new_valid & ~new_stale).sum(1)
                content_after[keep] = new_valid.sum(1)
            seen = policy.seen(ext_val)
            checks["positions"] = (ext_pos == positions(ext_val))[:, S - 1:].all(1)
            checks["mask"] = (seen == ext_val).all(1)
            checks["bonus"] = pick[:, 0] == g.gather(1, a[:, None])[:, 0]
            ints = {
                "draft_tokens": D[:, :k], "target_tokens": g, "emitted": emitted,
                "accepted": a, "n_emitted": n_keep, "finished": finished.long(),
                "pad_before": pad, "pad_after": pad_after, "content_before": content, "content_after": content_after,
                "pos_first": ext_pos[:, S - 1], "pos_last": ext_pos[:, -1],
                "mask_sum": seen[:, :S].sum(1),
                "target_kv_before": torch.full((B,), S - 1, device=dev),
                "target_kv_after": torch.where(finished, after, torch.full_like(after, max(width - 1, 0))),
                "draft_kv_before": torch.full((B,), S - 2, device=dev),
                "draft_kv_after": torch.where(finished, after, torch.full_like(after, max(width - 2, 0))),
                "delta": torch.where(finished, 0, pad_after - pad),
                "target_top_ids": top.indices,
            }
            floats = {
                "draft_probs": torch.stack(d_probs, 1)[:, :k],
                "target_probs": logits.softmax(-1).gather(2, g[..., None])[..., 0],
                "target_margins": margins,
                "target_top_values": top.values.float(),
            }
            rounds.append(RoundData(
                batch_index, list(seqs), k, _to_host(ints), _to_host(floats),
                _to_host(checks),
                {"draft": t_draft, "verify": t_verify, "realign": t_realign, "trace": clock.lap()},
                moved,
            ))
        if len(keep):
            tokens, valid, stale = new_tokens, new_valid, new_stale
        seqs = [seqs[r] for r in keep.tolist()]
    return gen


def _relayout(out_val: torch.Tensor, out_stale: torch.Tensor, policy: Policy, S: int, n_keep: torch.Tensor):
    """Where each continuing row's slots go: (src, new_valid, new_stale, width).

    New slot j of row r takes old (extended) slot src[r, j]; rows are
    right-aligned to a common width. The correct layout removes every stale
    slot and pads rows to the longest; `keep-rejected-kv` keeps stale slots in
    place; `growing-padding` never lets a row's padding shrink.
    """
    dev = out_val.device
    if not len(out_val):
        empty = torch.zeros(0, 0, dtype=torch.long, device=dev)
        return empty, empty.bool(), empty.bool(), 0
    if policy.compact:
        order = torch.argsort((~out_val).to(torch.int8), dim=1, stable=True)  # real slots first, in order
        length = out_val.sum(1)
    else:
        order = torch.arange(out_val.shape[1], device=dev).expand_as(out_val)
        length = out_val.shape[1] - (out_val.flip(1).long().cumsum(1) == 0).sum(1)  # through the last real slot
    width = int(length.max())
    if policy.has("growing-padding"):
        width = max(width, S + int(n_keep.max()))
    shift = width - length
    jj = torch.arange(width, device=dev)[None] - shift[:, None]
    src = order.gather(1, jj.clamp(min=0))
    placed = jj >= 0
    return src, placed & out_val.gather(1, src), placed & out_stale.gather(1, src), width


def _min_crop_lost(a, keep, src, S, k, width):
    """min-crop: slots (in the new layout) of accepted drafts beyond the batch's
    smallest accepted count, whose K/V the fault threw away."""
    ext = torch.arange(S + k + 1, device=a.device)[None]
    lost_ext = (ext >= S + a.min()) & (ext < S + a[:, None])
    return lost_ext[keep[:, None], src]
