"""Recording: a decode's results become a Trace (trace/schema.py).

The engine records tensors in bulk; Python objects are built here, once.
"""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import platform
import typing
from importlib.metadata import PackageNotFoundError, version

import torch

from specviz.decoding import determinism
from specviz.decoding.result import DecodeResult
from specviz.decoding.round import RoundData
from specviz.models.pairs import ModelPair
from specviz.spec.run import RunSpec
from specviz.trace import text
from specviz.trace.evidence import Yardsticks
from specviz.trace.records import PickFrom, PromptRecord, RoundRecord, RowRecord, SequenceRecord, TreeRecord, first_difference
from specviz.trace.schema import Manifest, Trace


def _version(dist: str) -> str:
    """A distribution's version; a source checkout on PYTHONPATH, never pip-installed, has none."""
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


@functools.cache  # read /proc/cpuinfo once per process, not once per trace
def _cpu_name() -> str:
    """The CPU's model and the vector kernels torch chose on it: float32 and bfloat16 logits round by both, so two
    CPUs of one architecture can write different tokens (an AVX2 and an AVX-512 machine did)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
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


STATE_FIELDS = ("target_state_before", "target_state_after", "draft_state_before", "draft_state_after")


def _row_records(rounds: list[RoundData], audit: dict) -> tuple[list[RoundRecord], list[RowRecord]]:
    round_recs, row_recs = [], []
    for r, rd in enumerate(rounds):
        round_recs.append(RoundRecord(round=r, batch=rd.batch, seqs=rd.seqs, realigned=rd.realigned,
                                      timings=rd.timings, group=rd.group, waits=rd.waits))
        ints = {n: t.tolist() for n, t in rd.ints.items()}
        floats = {n: t.tolist() for n, t in rd.floats.items()}
        checks = {n: t.tolist() for n, t in rd.checks.items()}
        for row, seq in enumerate(rd.seqs):
            a, m, k = ints["accepted"][row], ints["n_emitted"][row], ints["drafts"][row]  # k: the row's own drafts
            sources = ["draft"] * a + ["bonus" if a == k else "correction"]
            row_recs.append(RowRecord(
                round=r, batch=rd.batch, row=row, seq=seq,
                draft_tokens=ints["draft_tokens"][row][:k], draft_probs=floats["draft_probs"][row][:k],
                target_tokens=ints["target_tokens"][row][:k + 1], target_probs=floats["target_probs"][row][:k + 1],
                target_margins=floats["target_margins"][row][:k + 1],
                accepted=a, emitted=ints["emitted"][row][:m], sources=sources[:m],
                finished=bool(ints["finished"][row]),
                **{f: (None if ints[f][row] < 0 else ints[f][row])
                   for f in ("pad_after", "content_after", "target_kv_after", "draft_kv_after")},
                **{f: ints[f][row] for f in ("pad_before", "content_before", "pos_first", "pos_last",
                                             "mask_sum", "target_kv_before", "draft_kv_before", "delta")},
                **{f: ints[f][row] if f.endswith("before") or ints["content_after"][row] >= 0 else None
                   for f in STATE_FIELDS if f in ints},
                checks={n: bool(v[row]) for n, v in checks.items()},
                **dict(zip(("audit", "audit_draft"), audit.get((r, seq), ()))),
                **_drawn(ints, floats, row, k), **_tree(ints, row, a),
            ))
    return round_recs, row_recs


def _tree(ints: dict, row: int, accepted: int) -> dict:
    """A tree round's tree for one row, and the `accepted` nodes of its path (nothing for a chain's round)."""
    if "tree_tokens" not in ints:
        return {}
    offered = ints["tree_offered"][row]
    return {"tree": TreeRecord(tokens=ints["tree_tokens"][row][:offered], parents=ints["tree_parents"][row][:offered],
                               path=ints["tree_path"][row][:accepted])}


def _drawn(ints: dict, floats: dict, row: int, k: int) -> dict:
    """A sampled round's draws and probabilities for one row and its k drafts (nothing for a greedy round)."""
    if "accept_draws" not in floats:
        return {}
    return {"target_draft_probs": floats["target_draft_probs"][row][:k], "accept_draws": floats["accept_draws"][row][:k],
            "pick_draw": floats["pick_draws"][row][0], "pick_from": typing.get_args(PickFrom)[ints["pick_from"][row]]}


def fingerprint(spec: RunSpec, sequences: list[SequenceRecord], rows: list[RowRecord]) -> str:
    decisions = {
        "spec": spec.canonical_json(),
        "outputs": [s.output_ids for s in sequences],
        "accepted": [r.accepted for r in rows],
    }
    return hashlib.sha256(json.dumps(decisions, separators=(",", ":")).encode()).hexdigest()[:16]


def build_trace(spec: RunSpec, pair: ModelPair, prompt_ids: list[list[int]], result: DecodeResult,
                reference: DecodeResult | None = None, yardsticks: Yardsticks | None = None) -> Trace:
    rounds, rows = _row_records(result.rounds, result.audit)
    sequences = []
    for seq, out in enumerate(result.outputs):
        ref = reference.outputs[seq] if reference else None
        fork = first_difference(out.ids, ref.ids) if ref else None
        before = prompt_ids[seq][-1] if prompt_ids[seq] else None
        sequences.append(SequenceRecord(
            seq=seq, output_ids=out.ids, output_pieces=text.pieces(pair.tokenizer, out.ids, before), margins=out.margins,
            logprobs=out.logprobs if spec.logprobs else None,
            reference_ids=ref.ids if ref else None, reference_margins=ref.margins if ref else None,
            reference_proof=ref.proof if ref else None,
            reference_pieces=text.pieces(pair.tokenizer, ref.ids, before) if ref else None,
            first_divergence=fork, equivalent=None if ref is None else fork is None,
            completion_seconds=out.finished_at,
        ))
    manifest = Manifest(
        spec=spec,
        pair={k: (None if v is None else str(v)) for k, v in pair.info.items()},
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        decode_seconds=result.seconds,
        reference_seconds=reference.seconds if reference else None,
        yardstick=yardsticks,
        fingerprint=fingerprint(spec, sequences, rows),
        **_environment(pair),
    )
    prompts = [PromptRecord(seq=i, text=t, ids=ids) for i, (t, ids) in enumerate(zip(spec.prompts, prompt_ids))]
    return Trace(manifest=manifest, prompts=prompts, rounds=rounds, rows=rows, sequences=sequences,
                 vocab=_vocab(pair, sequences, rows))


def _vocab(pair: ModelPair, sequences: list[SequenceRecord], rows: list[RowRecord]) -> dict[int, str]:
    ids = {i for s in sequences for i in (*s.output_ids, *(s.reference_ids or ()))}
    ids |= {i for r in rows for i in (*r.draft_tokens, *r.target_tokens, *(r.tree.tokens if r.tree else ()))}
    ids = sorted(ids)
    return dict(zip(ids, pair.tokenizer.batch_decode([[i] for i in ids])))
