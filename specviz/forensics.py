"""Divergence forensics: where each sequence left the reference, and why.

For every divergent sequence: the first differing token, the round and row
that emitted it, that row's invariant checks up to the fork, the target's
top-1/top-2 margin there at batch size 1 and in the emitting pass, and the
largest logit difference between a fresh batch-size-1 pass and that pass.
Verdicts:
  sync-bug:<state>  a breaking invariant failed at or before the fork;
  numerics          invariants held and the fork was a near-tie: its
                    batch-size-1 margin is within the logit noise measured on
                    this run's agreeing tokens;
  unexplained       neither (shown loudly).
"""
from __future__ import annotations

import torch

from .decoding.result import DecodeResult
from .models import ModelPair
from .trace import Forensics, RowRecord, SequenceRecord, Trace, first_difference

# Checks whose failure puts the target's view out of step, by priority when
# several fail in the same round (positions also spoil the cache's provenance).
BREAKING = ("bonus", "positions", "mask", "kv")
EXPLAIN = {
    "bonus": "a correction/bonus token did not come from the target's argmax (I4)",
    "positions": "position ids fed to the model did not follow the mask (I2)",
    "mask": "the attention mask let pad or stale slots through",
    "kv": "the KV cache did not hold each real token's entry at its own position (I3)",
}
MAX_FRESH_PASSES = 64  # batch-size-1 passes for logit differences, per run


def _emitter(rows: list[RowRecord], fork: int) -> tuple[RowRecord | None, int]:
    """The record that emitted token `fork`, and the slot within its round."""
    seen = 0
    for r in rows:
        if fork < seen + len(r.emitted):
            return r, fork - seen
        seen += len(r.emitted)
    return None, 0


def _failures(rows: list[RowRecord], until_round: int | None) -> dict[str, int]:
    failed: dict[str, int] = {}
    for r in rows:
        if until_round is not None and r.round > until_round:
            break
        for c in BREAKING:
            if not r.checks.get(c, True):
                failed.setdefault(c, r.round)
    return failed


def _clean_prefix(seq: SequenceRecord, rows: list[RowRecord]) -> int:
    """How many leading tokens agree with the reference and came from rounds with every check held."""
    n = len(seq.output_ids) if seq.first_divergence is None else seq.first_divergence
    emitted = 0
    for r in rows:
        if any(not r.checks.get(c, True) for c in BREAKING):
            return min(n, emitted)
        emitted += len(r.emitted)
    return n


def measured_noise(trace: Trace, rows_of: dict[int, list[RowRecord]]) -> float | None:
    """Largest |batched margin - batch-size-1 margin| over agreeing, in-step tokens of the run."""
    diffs = []
    for s in trace.sequences:
        if s.reference_margins is None:
            continue
        n = _clean_prefix(s, rows_of.get(s.seq, []))
        diffs += [abs(a - b) for a, b in zip(s.margins[:n], s.reference_margins[:n])]
    return max(diffs) if diffs else None


@torch.inference_mode()
def _logit_diff(pair: ModelPair, prompt_ids: list[int], prefix: list[int], top_ids, top_values) -> float:
    """Largest |batched - fresh batch-size-1| logit over the batched pass's top tokens at the fork."""
    x = torch.tensor([prompt_ids + prefix], device=pair.device)
    logits = pair.target(input_ids=x, logits_to_keep=1).logits[0, -1, : pair.vocab_size].double().cpu()
    return float((logits[top_ids] - top_values.double()).abs().max())


def analyse(trace: Trace, result: DecodeResult | None = None, pair: ModelPair | None = None) -> None:
    """Fill `forensics` for every divergent sequence of `trace` (in place).

    `result` (the DecodeResult the trace was built from) and `pair` enable the
    fresh batch-size-1 logit comparison.
    """
    rows_of: dict[int, list[RowRecord]] = {}
    for r in trace.rows:
        rows_of.setdefault(r.seq, []).append(r)
    noise = measured_noise(trace, rows_of)
    fresh = 0
    for s in trace.sequences:
        if s.equivalent is not False:
            s.forensics = None
            continue
        f = s.first_divergence
        rows = rows_of.get(s.seq, [])
        rec, slot = _emitter(rows, f)
        ev = Forensics(
            verdict="unexplained", explanation="", fork=f, noise=noise,
            output_token=s.output_ids[f] if f < len(s.output_ids) else None,
            reference_token=s.reference_ids[f] if f < len(s.reference_ids) else None,
            margin_reference=s.reference_margins[f] if s.reference_margins and f < len(s.reference_margins) else None,
            margin_batched=s.margins[f] if f < len(s.margins) else None,
        )
        if rec is not None:
            ev.round, ev.row = rec.round, rec.row
        ev.failed_checks = _failures(rows, ev.round)
        if result is not None and pair is not None and rec is not None and fresh < MAX_FRESH_PASSES:
            rd = result.rounds[rec.round]
            ev.logit_diff = _logit_diff(pair, trace.prompts[s.seq].ids, s.reference_ids[:f],
                                        rd.ints["target_top_ids"][rec.row, slot],
                                        rd.floats["target_top_values"][rec.row, slot])
            fresh += 1
        _verdict(ev)
        s.forensics = ev


def _verdict(ev: Forensics) -> None:
    if ev.failed_checks:
        first = min(ev.failed_checks.values())
        state = next(c for c in BREAKING if ev.failed_checks.get(c) == first)
        ev.verdict = f"sync-bug:{state}"
        ev.explanation = f"In round {first}, {EXPLAIN[state]}; the output forked at token {ev.fork}."
    elif ev.margin_reference is not None and ev.noise is not None and ev.margin_reference <= 2 * ev.noise:
        ev.verdict = "numerics"
        ev.explanation = (f"Every invariant held. At token {ev.fork} the target's top two logits were "
                          f"{ev.margin_reference:.3g} apart at batch size 1, within twice the logit noise "
                          f"measured on this run's agreeing tokens ({ev.noise:.3g}): floating point picked the other.")
    else:
        ev.verdict = "unexplained"
        ev.explanation = ("Every invariant held, yet the fork's margin "
                          f"({ev.margin_reference if ev.margin_reference is None else f'{ev.margin_reference:.3g}'}) "
                          f"is larger than the measured noise ({ev.noise}). This is not a known failure: please report it.")


def flag_batching_noise(trace: Trace, batched: DecodeResult) -> None:
    """Mark divergences that batched-reference (same prompts and batch size, no
    speculation) shows at or before the same token: batching noise."""
    for s in trace.sequences:
        ev = s.forensics
        if ev is None:
            continue
        alt = first_difference(batched.outputs[s.seq].ids, s.reference_ids)
        ev.batching_noise = alt is not None and alt <= ev.fork
        if ev.batching_noise:
            ev.explanation += " Batched greedy decoding without speculation departs here too: batching noise."
