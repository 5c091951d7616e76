"""Recording: what each round did, as tensors, and a decode's results as a Trace (trace/schema.py).

A recorded round keeps its per-row tensors and checks on the device (`round_fields`, called once by
the round) and brings them to the host in bulk after the batch is laid out again (`record_round`);
Python objects are built from them once, when the trace is built.
"""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import platform
import typing
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

import torch

from specviz.decoding import determinism, kvcache
from specviz.decoding.batch import positions
from specviz.decoding.result import DecodeResult, SequenceOutput
from specviz.decoding.stages import Accepted, Batch, Committed, Decoding, Drafted, Step
from specviz.models.architecture import narrowest_window
from specviz.models.heads import head_of
from specviz.models.pairs import ModelPair
from specviz.spec.run import RunSpec
from specviz.trace import text
from specviz.trace.records import (BlockFinding, BlockTable, PickFrom, PromptRecord, RoundRecord,
                                   RowRecord, SequenceRecord, TreeRecord, first_difference)
from specviz.trace.schema import HeadFacts, Manifest, Paging, Trace
from specviz.trace.yardsticks import Yardsticks

TOP = 8  # target logits kept per verified slot (for forensics, not saved in the trace)


@dataclass
class RoundData:
    """One round as recorded: tensors on the CPU, turned into trace records only when saving."""

    batch: int  # index of the static batch (eqspec) or -1 (exspec)
    seqs: list[int]
    k: int
    ints: dict[str, torch.Tensor]
    floats: dict[str, torch.Tensor]
    checks: dict[str, torch.Tensor]
    timings: dict[str, float]  # seconds: draft, verify, realign, trace, watch
    realigned: bool  # whether the caches had to be gathered (else only cropped or stacked)
    group: bool | None = None  # exspec: a same-length group (no realignment at all)
    waits: list[int] | None = None  # exspec: rounds each row had been passed over
    blocks: list[dict] = field(default_factory=list)  # a paged run's failed paged checks
    tables: list | None = None  # a paged run: each row's block table in the target's pool


def round_fields(d: Decoding, b: Batch, drafted: Drafted, acc: Accepted, kept: Committed,
                 gen: dict[int, SequenceOutput]) -> dict:
    """A recorded round's per-row tensors and checks, still on the device (record_round brings them
    over); each row's margins are appended to `gen`."""
    before = drafted.before
    S, k, v, prop = b.tokens.shape[1], acc.k, acc.verified, acc.drafts
    top = v.logits.topk(TOP, dim=-1)
    margins = top.values[..., 0] - top.values[..., 1]
    for i, row, m in zip(b.seqs, margins.tolist(), kept.n_keep.tolist()):
        gen[i].margins.extend(row[:m])
    seen = d.policy.seen(v.valid, v.stale, narrowest_window(d.pair.target))
    own = acc.checks  # a tree's: over its nodes (its chain's slots past the path are filler)
    chain_positions = (v.positions == positions(v.valid))[:, S - 1:].all(1)
    fields = {**before, "checks": {**before["checks"],
                                   "positions": own.get("positions", chain_positions),
                                   "mask": (seen == v.valid).all(1) & own.get("mask", True),
                                   "bonus": kept.pick[:, 0] == acc.own}}
    fields["blocks"] = _paged_checks(b, fields["checks"])
    fields["tables"] = kvcache.block_tables(b.target.cache)
    fields["ints"] = {
        "draft_tokens": prop.tokens[:, :k], "target_tokens": v.argmax, "emitted": kept.emitted,
        "accepted": acc.accepted, "n_emitted": kept.n_keep, "finished": kept.finished.long(),
        "counted": d.policy.counted(kept.n_keep, acc.accepted),
        "drafts": acc.room, "pos_first": v.positions[:, S - 1], "pos_last": v.positions[:, -1],
        "mask_sum": seen[:, :S].sum(1), "target_top_ids": top.indices, **acc.record,
    }
    fields["floats"] = {
        "draft_probs": prop.confidence[:, :k],
        "target_probs": v.logits.softmax(-1).gather(2, v.argmax[..., None])[..., 0],
        "target_margins": margins, "target_top_values": top.values.float(),
    }
    if not d.sampling.greedy:
        fields["floats"].update(acc.drawn)
        # trace.PickFrom: 0 target (the bonus), 1 residual, 2 draft (a fault takes the draft's)
        fields["ints"]["pick_from"] = (torch.full_like(acc.accepted, 2)
                                       if d.policy.bonus_from_draft
                                       else (acc.accepted < acc.room).long())
    return fields


def state_before(b: Batch, draft_empty: bool) -> dict:
    """What a recorded round keeps of the state its verify pass starts from, and the invariants it
    holds (`draft_empty`: the drafter's cache was empty before it drafted, a fresh batch's
    first round)."""
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
    # I5: a recurrent state holds exactly the row's tokens but those its cache lags by
    if recurrent:
        held = [models[who].held == content - models[who].behind for who in recurrent]
        checks["recurrent"] = torch.stack(held).all(0)
    return {"checks": checks, "pad": pad, "content": content, "recurrent": recurrent,
            "kv": {who: m.length(S) for who, m in models.items()},
            "state": {who: m.held for who, m in models.items()}}


def _paged_checks(b: Batch, checks: dict[str, torch.Tensor]) -> list[dict]:
    """A paged cache's own checks, once the round's passes have written it (kvcache.audit_pages):
    a row whose table maps a position to a slot holding another token fails I3 (kv, draft_kv);
    every failed check, naming its block."""
    found = []
    for who, check in (("target", "kv"), ("draft", "draft_kv")):
        audit = kvcache.audit_pages(getattr(b, who).cache, b.tokens, b.valid)
        if audit is not None:
            checks[check] = checks[check] & audit[0].to(checks[check].device)
            found += [{**f, "model": who} for f in audit[1]]
    return found


def _kv_in_step(written: torch.Tensor, valid: torch.Tensor, slots: int) -> torch.Tensor:
    """I3 per row: every real token in the first `slots` slots has K/V computed
    at its own position (by the mask), and the cache holds exactly those slots."""
    want = torch.where(valid, positions(valid), -1)[:, :slots]
    return ((written == want) | ~valid[:, :slots]).all(1) & (written.shape[1] == slots)


def record_round(step: Step, seqs: list[int], batch_index: int, after: dict[str, torch.Tensor],
                 timings: dict, realigned: bool, **extra) -> RoundData:
    """Bring one round's tensors to the host. `after` holds each row's pad, content, target_kv and
    draft_kv after the round (-1 for rows that left; a drafter without a cache: 0), and the tokens
    its recurrent states hold."""
    f = step.fields
    B = len(seqs)
    left = step.finished
    ints = dict(f["ints"])
    for who in f["recurrent"]:
        ints[f"{who}_state_before"] = f["state"][who]
        ints[f"{who}_state_after"] = after[f"{who}_state"]
    ints.update(
        pad_before=f["pad"], content_before=f["content"],
        **{f"{who}_kv_before": torch.full((B,), kv, device=left.device)
           for who, kv in f["kv"].items()},
        pad_after=after["pad"], content_after=after["content"],
        target_kv_after=after["target_kv"], draft_kv_after=after["draft_kv"],
        delta=torch.where(left, 0, after["pad"] - f["pad"]),
    )
    return RoundData(batch_index, list(seqs), step.k, _to_host(ints), _to_host(f["floats"]),
                     _to_host(f["checks"]), timings, realigned, blocks=f["blocks"],
                     tables=f["tables"], **extra)


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


def _version(dist: str) -> str:
    """A distribution's version; a source checkout on PYTHONPATH, never pip-installed, has none."""
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


@functools.cache  # read /proc/cpuinfo once per process, not once per trace
def _cpu_name() -> str:
    """The CPU's model and the vector kernels torch chose on it: float32 and bfloat16 logits round
    by both, so two CPUs of one architecture can write different tokens (an AVX2 and an AVX-512
    machine did)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info
                          if line.startswith("model name")), model)
    except OSError:  # not Linux
        pass
    return f"{model[:150]} ({torch.backends.cpu.get_cpu_capability()})"


def _environment(pair: ModelPair) -> dict:
    dev = pair.device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_name()
    return {
        "versions": {
            "specviz": _version("specviz"),
            "torch": torch.__version__,
            "transformers": version("transformers"),
            "python": platform.python_version(),
        },
        "device": str(dev),
        "device_name": name,
        "deterministic": determinism.flags(),
    }


STATE_FIELDS = ("target_state_before", "target_state_after", "draft_state_before",
                "draft_state_after")


def _row_records(rounds: list[RoundData], audit: dict) -> tuple[list[RoundRecord], list[RowRecord]]:
    round_recs, row_recs = [], []
    for r, rd in enumerate(rounds):
        round_recs.append(RoundRecord(round=r, batch=rd.batch, seqs=rd.seqs, realigned=rd.realigned,
                                      timings=rd.timings, group=rd.group, waits=rd.waits,
                                      blocks=[BlockFinding(**f) for f in rd.blocks]))
        ints = {n: t.tolist() for n, t in rd.ints.items()}
        floats = {n: t.tolist() for n, t in rd.floats.items()}
        checks = {n: t.tolist() for n, t in rd.checks.items()}
        for row, seq in enumerate(rd.seqs):
            # k: the row's own drafts
            a, m, k = ints["accepted"][row], ints["n_emitted"][row], ints["drafts"][row]
            sources = ["draft"] * a + ["bonus" if a == k else "correction"]
            row_recs.append(RowRecord(
                round=r, batch=rd.batch, row=row, seq=seq,
                draft_tokens=ints["draft_tokens"][row][:k],
                draft_probs=floats["draft_probs"][row][:k],
                target_tokens=ints["target_tokens"][row][:k + 1],
                target_probs=floats["target_probs"][row][:k + 1],
                target_margins=floats["target_margins"][row][:k + 1],
                accepted=a, emitted=ints["emitted"][row][:m], sources=sources[:m],
                finished=bool(ints["finished"][row]), counted=ints["counted"][row],
                **{f: (None if ints[f][row] < 0 else ints[f][row])
                   for f in ("pad_after", "content_after", "target_kv_after", "draft_kv_after")},
                **{f: ints[f][row]
                   for f in ("pad_before", "content_before", "pos_first", "pos_last",
                             "mask_sum", "target_kv_before", "draft_kv_before", "delta")},
                **{f: ints[f][row] if f.endswith("before") or ints["content_after"][row] >= 0
                   else None
                   for f in STATE_FIELDS if f in ints},
                checks={n: bool(v[row]) for n, v in checks.items()},
                **dict(zip(("audit", "audit_draft"), audit.get((r, seq), ()))),
                **_drawn(ints, floats, row, k), **_tree(ints, row, a),
                block_table=rd.tables and BlockTable(blocks=rd.tables[row][0],
                                                     shared=rd.tables[row][1]),
            ))
    return round_recs, row_recs


def _tree(ints: dict, row: int, accepted: int) -> dict:
    """A tree round's tree for one row, and the `accepted` nodes of its path (nothing
    for a chain's round)."""
    if "tree_tokens" not in ints:
        return {}
    offered = ints["tree_offered"][row]
    return {"tree": TreeRecord(tokens=ints["tree_tokens"][row][:offered],
                               parents=ints["tree_parents"][row][:offered],
                               path=ints["tree_path"][row][:accepted])}


def _drawn(ints: dict, floats: dict, row: int, k: int) -> dict:
    """A sampled round's draws and probabilities for one row and its k drafts (nothing
    for a greedy round)."""
    if "accept_draws" not in floats:
        return {}
    return {"target_draft_probs": floats["target_draft_probs"][row][:k],
            "accept_draws": floats["accept_draws"][row][:k],
            "pick_draw": floats["pick_draws"][row][0],
            "pick_from": typing.get_args(PickFrom)[ints["pick_from"][row]]}


def fingerprint(spec: RunSpec, sequences: list[SequenceRecord], rows: list[RowRecord]) -> str:
    decisions = {
        "spec": spec.canonical_json(),
        "outputs": [s.output_ids for s in sequences],
        "accepted": [r.accepted for r in rows],
    }
    return hashlib.sha256(json.dumps(decisions, separators=(",", ":")).encode()).hexdigest()[:16]


def build_trace(spec: RunSpec, pair: ModelPair, prompt_ids: list[list[int]], result: DecodeResult,
                reference: DecodeResult | None = None,
                yardsticks: Yardsticks | None = None) -> Trace:
    rounds, rows = _row_records(result.rounds, result.audit)
    sequences = []
    for seq, out in enumerate(result.outputs):
        ref = reference.outputs[seq] if reference else None
        fork = first_difference(out.ids, ref.ids) if ref else None
        before = prompt_ids[seq][-1] if prompt_ids[seq] else None
        sequences.append(SequenceRecord(
            seq=seq, output_ids=out.ids, output_pieces=text.pieces(pair.tokenizer, out.ids, before),
            margins=out.margins, logprobs=out.logprobs if spec.logprobs else None,
            reference_ids=ref.ids if ref else None, reference_margins=ref.margins if ref else None,
            reference_proof=ref.proof if ref else None,
            reference_pieces=text.pieces(pair.tokenizer, ref.ids, before) if ref else None,
            first_divergence=fork, equivalent=None if ref is None else fork is None,
            completion_seconds=out.finished_at,
        ))
    head = head_of(spec, pair)
    facts = head.facts([i for s in sequences for i in s.output_ids]) if head else None
    manifest = Manifest(
        spec=spec,
        pair={k: (None if v is None else str(v)) for k, v in pair.info.items()},
        head=facts and HeadFacts(**facts),
        paging=result.paging and Paging(**result.paging),
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        decode_seconds=result.seconds,
        reference_seconds=reference.seconds if reference else None,
        yardstick=yardsticks,
        fingerprint=fingerprint(spec, sequences, rows),
        **_environment(pair),
    )
    prompts = [PromptRecord(seq=i, text=t, ids=ids)
               for i, (t, ids) in enumerate(zip(spec.prompts, prompt_ids))]
    return Trace(manifest=manifest, prompts=prompts, rounds=rounds, rows=rows, sequences=sequences,
                 vocab=_vocab(pair, sequences, rows))


def _vocab(pair: ModelPair, sequences: list[SequenceRecord],
           rows: list[RowRecord]) -> dict[int, str]:
    ids = {i for s in sequences for i in (*s.output_ids, *(s.reference_ids or ()))}
    ids |= {i for r in rows
            for i in (*r.draft_tokens, *r.target_tokens, *(r.tree.tokens if r.tree else ()))}
    ids = sorted(ids)
    return dict(zip(ids, pair.tokenizer.batch_decode([[i] for i in ids])))
