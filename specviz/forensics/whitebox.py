"""The white-box judge: where each sequence of one of our runs left the reference, and why.

Every piece of evidence is recomputed independently of the engine it judges:
- the rounding yardstick (yardstick.py): how far a correct computation of the
  target's logits sits from float64 truth in the run's dtype, measured on
  fresh batch-size-1 passes without a cache, which the verify path's kernels
  never run; its tolerance is what two correct computations can differ by,
  at a stated false-alarm rate;
- the state check (watch.py): the row that emitted the fork, as the model saw
  it, against a fresh batch-size-1 recomputation of its real tokens; beyond
  the tolerance its state or its computation was wrong, and the inputs it was
  fed (first token, positions, mask), the pass rebuilt from correct inputs,
  and its cache entries say which (corruption.py);
- float64 arbitration (recompute.py): the true gap between the reference's
  token and the speculative one at the fork.

Under a repetition or presence penalty every argmax and gap above is taken over the target's logits
penalised by the row's whole history (decoding/penalties.py), as the reference chose.

Verdicts:
  decision-bug:accept an accepted draft is not the argmax of the pass that verified it (the
                      accept rule);
  decision-bug:penalty the state was clean, the penalised float64 logits choose the reference's
                      token beyond rounding, and with the penalty on the engine's token lifted
                      they choose the engine's: its penalty history lacked tokens the row holds;
  sync-bug:bonus      a correction or bonus token is not the argmax of the logits that chose it
                      (I4);
  sync-bug:<state>    the row's state was corrupt: positions, mask, kv, a hybrid's recurrent state
                      (`recurrent`), or `state` when no single input explains it;
                      also when the engine's own invariant checks failed at or before the fork;
  decision-bug:stop   a sequence ran past its end (an end-of-sequence token, a stop string) or
                      stopped short, and no engine check failed before it;
  kernel-bug          every input was right, and the same pass rebuilt from correct inputs still
                      computes logits a fresh batch-size-1 pass does not: the verify computation;
  numerics            the state was clean and the float64 gap at the fork is within what rounding
                      flips;
  unexplained         anything else, with the evidence that is missing.
Every name is declared in spec/verdicts.py.
"""
from __future__ import annotations

import functools

import torch

from specviz.decoding.result import DecodeResult
from specviz.decoding.sampling import sampling_of
from specviz.forensics.corruption import (EXPLAIN, corrupt, failed_check_sentence, failures,
                                          fill_state, first_invariant, kernel_departs,
                                          rebuilt_pass_shows)
from specviz.forensics.recompute import ARBITER_MAX_PARAMS, float64_logits
from specviz.models.pairs import ModelPair
from specviz.trace.evidence import RunForensics
from specviz.trace.findings import Findings
from specviz.trace.records import RowRecord, SequenceRecord, first_difference
from specviz.trace.schema import Trace
from specviz.trace.yardsticks import Rounding

NO_YARDSTICK = ("no float64 copy of the target could be made (it is spread over devices or has "
                f"more than {ARBITER_MAX_PARAMS:,} parameters), so its rounding cannot be measured")


def emitter(rows: list[RowRecord], fork: int) -> tuple[RowRecord | None, int]:
    """The record that emitted token `fork`, and the token's slot in it."""
    seen = 0
    for r in rows:
        if fork < seen + len(r.emitted):
            return r, fork - seen
        seen += len(r.emitted)
    return None, 0


def first_over(rows: list[RowRecord], field: str, tolerance: float | None) -> int | None:
    """The first round whose audited difference (`audit` or `audit_draft`) exceeds `tolerance`."""
    if tolerance is None:
        return None
    return next((r.round for r in rows if getattr(r, field) is not None
                 and getattr(r, field) > tolerance), None)


def analyse(trace: Trace, result: DecodeResult, pair: ModelPair | None) -> Findings:
    """`forensics` for every divergent sequence of `trace` (None for the rest), from the watch's
    findings in `result` (result.forks), the yardstick in the manifest and, with `pair`, float64
    arbitration; each sequence's first audited round beyond the yardstick."""
    ys = trace.manifest.yardstick
    rounding = ys.target if ys else None
    penalties = sampling_of(trace.manifest.spec).penalties
    by_seq = rows_of(trace)
    found = Findings()
    for s in trace.sequences:
        rows, mine = by_seq.get(s.seq, []), found.of(s.seq)
        if rounding is not None:
            mine["audit_round"] = first_over(rows, "audit", rounding.tolerance)
            draft = ys.draft and ys.draft.tolerance
            mine["audit_draft_round"] = first_over(rows, "audit_draft", draft)
        mine["forensics"] = None
        if s.equivalent is not False:
            continue
        ev = _forensics_of(s, rows, result.forks.get(s.seq))
        if rounding is not None:
            ev.tolerance, ev.alpha, ev.yardstick = (rounding.tolerance, rounding.alpha,
                                                    rounding.describe())
        prompt, before = trace.prompts[s.seq].ids, s.output_ids[: ev.fork]
        arbiter = functools.cache(lambda: pair and _arbiter(pair, penalties, prompt, before))
        penalty = penalties and _penalty_bug(ev, rounding, arbiter, prompt + before)
        # only a clean state needs the float64 arbiter
        if not penalty and not _sync_bug(ev, rounding):
            if (z := arbiter()) is not None:
                ev.margin_float64 = float(z[0][ev.reference_token] - z[0][ev.output_token])
            _near_tie(ev, rounding)
        ev.explanation += _paged_check_sentence(trace, s.seq, ev.round)
        mine["forensics"] = ev
    return found


def _paged_check_sentence(trace: Trace, seq: int, until_round: int | None) -> str:
    """The first of the paged cache's own checks that failed for `seq`'s row by `until_round` (None:
    any), in a sentence naming the block: it corroborates, and names what the evidence cannot."""
    found = [(f.model != "target", rd.round, f) for rd in trace.rounds for f in rd.blocks
             if f.seq == seq and (until_round is None or rd.round <= until_round)]
    if not found:
        return ""
    _, at, finding = min(found, key=lambda x: x[:2])
    return (f" The paged cache's own check found, by round {at}, that "
            f"{finding.describe(trace.vocab)}.")


def rows_of(trace: Trace) -> dict[int, list[RowRecord]]:
    """Each sequence's (round, row) records, in round order."""
    by_seq: dict[int, list[RowRecord]] = {}
    for r in trace.rows:
        by_seq.setdefault(r.seq, []).append(r)
    return by_seq


def _arbiter(pair: ModelPair, penalties, prompt: list[int],
             before: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The target's float64 logits for the token after `prompt + before`, penalised as the run's
    (its prompt and `before` the history), and as they are: (vocab,) each; None without
    a float64 target."""
    z = float64_logits(pair, prompt + before)
    return None if z is None else (penalties.along(z[None], prompt, before)[0], z)


def _penalty_bug(ev: RunForensics, rounding: Rounding | None, arbiter, history: list[int]) -> bool:
    """A clean state whose penalised float64 logits choose the reference's token beyond rounding,
    and the engine's once the penalty on the engine's token is lifted: the engine's penalty missed
    tokens the row holds. Fills `ev` as decision-bug:penalty; False where the evidence does
    not show it."""
    clean = (rounding is not None and ev.state_diff is not None
             and ev.state_diff <= rounding.tolerance and not ev.failed_checks)
    if (not clean or ev.output_token is None or ev.reference_token is None
            or (z := arbiter()) is None):
        return False
    penalised, raw = z
    t, ref = ev.output_token, ev.reference_token
    lifted = penalised.clone()
    lifted[t] = raw[t]
    gap = float(penalised[ref] - penalised[t])
    flips = rounding.from_float64()
    if int(penalised.argmax()) != ref or int(lifted.argmax()) != t or gap <= flips:
        return False
    held_at = [i for i, x in enumerate(history) if x == t]
    places = ", ".join(map(str, held_at[:8])) + ("…" if len(held_at) > 8 else "")
    ev.verdict, ev.margin_float64, ev.penalty_lifted = "decision-bug:penalty", gap, t
    ev.explanation = (f"At {_where(ev)} the row's state was clean (its logits within "
                      f"{ev.state_diff:.3g} of a fresh batch-size-1 recomputation) and every check "
                      "held. The target's float64 logits there, penalised by the row's whole "
                      f"history, choose the reference's token {ref} over the engine's {t} by "
                      f"{gap:.3g}, beyond what rounding in {rounding.dtype} flips "
                      f"({flips:.3g}); with the penalty on token {t} lifted they "
                      f"choose {t}. The history holds token {t} {len(held_at)} time(s), at "
                      f"positions {places} of its prompt and output: the engine penalised "
                      "without tokens the row already holds.")
    return True


def _forensics_of(s: SequenceRecord, rows: list[RowRecord], fork) -> RunForensics:
    f = s.first_divergence
    rec, slot = emitter(rows, f)
    ev = RunForensics(
        verdict="unexplained", explanation="", fork=f,
        output_token=s.output_ids[f] if f < len(s.output_ids) else None,
        reference_token=s.reference_ids[f] if f < len(s.reference_ids) else None,
        margin_reference=s.reference_margins[f] if s.reference_margins
        and f < len(s.reference_margins) else None,
        margin_batched=s.margins[f] if f < len(s.margins) else None,
    )
    if rec is not None:
        ev.round, ev.row, ev.fork_source = rec.round, rec.row, rec.sources[slot]
    ev.failed_checks = failures(rows, ev.round)
    if fork is not None:
        fill_state(ev, fork)
    return ev


def _where(ev: RunForensics) -> str:
    return f"token {ev.fork}" + (f" (round {ev.round}, batch row {ev.row})" if ev.round is not None
                                 else "")


def _sync_bug(ev: RunForensics, rounding: Rounding | None) -> bool:
    """Call the fork a sync bug (or a kernel bug) when the evidence shows one, and say which;
    False otherwise."""
    at = _where(ev)
    tolerance = rounding.tolerance if rounding else None
    # The engine's own checks (its provenance of every cache slot) corroborate; they name the state
    # only where the independent evidence cannot.
    invariant = first_invariant(ev)
    recorded = failed_check_sentence(ev, invariant)
    if ev.output_token is None or ev.reference_token is None:
        ended = ("the reference had already ended" if ev.reference_token is None
                 else "the output had stopped")
        # a state out of step comes first
        ev.verdict = f"sync-bug:{invariant}" if invariant else "decision-bug:stop"
        ev.explanation = (f"At {at} {ended}: the engine "
                          f"{'ran past the end of' if ev.reference_token is None else 'cut short'} "
                          "the sequence (EOS, stop string or token budget)." + recorded)
    elif (ev.emitting_argmax is not None and ev.emitting_argmax != ev.output_token
          and ev.fork_source == "draft"):
        ev.verdict = "decision-bug:accept"
        ev.explanation = (f"At {at} the engine accepted a draft that the target pass verifying it "
                          f"rejects (the pass's own logits pick id {ev.emitting_argmax}): "
                          f"{EXPLAIN['accept']}.")
    elif ev.emitting_argmax is not None and ev.emitting_argmax != ev.output_token:
        ev.verdict = "sync-bug:bonus"
        ev.explanation = (f"At {at} the engine emitted a token that is not the argmax of the "
                          "target pass that chose it (the pass's own logits pick id "
                          f"{ev.emitting_argmax}): {EXPLAIN['bonus']}.")
    elif ev.state_diff is not None and tolerance is not None and ev.state_diff > tolerance:
        corrupt(ev, rounding, invariant, f"At {at} the emitting pass's logits")
        ev.explanation += recorded
    elif invariant is not None:
        ev.verdict = f"sync-bug:{invariant}"
        ev.explanation = f"The output forked at {at}." + recorded
    elif rounding is not None and kernel_departs(ev, rounding):
        ev.verdict = "kernel-bug"
        ev.explanation = (f"At {at} the emitting pass's logits are within rounding of a fresh "
                          f"batch-size-1 recomputation ({ev.state_diff:.3g} against "
                          f"{tolerance:.3g} in {rounding.dtype}), so the fork alone could be "
                          f"rounding. {rebuilt_pass_shows(ev, rounding)}")
    else:
        return False
    return True


def _near_tie(ev: RunForensics, rounding: Rounding | None) -> None:
    """A clean fork: `numerics` when float64 shows a gap that rounding flips, else `unexplained`."""
    at = _where(ev)
    if ev.state_diff is None:
        ev.explanation = (f"The output forked at {at}, but the pass that emitted it could not be "
                          "checked (hf-assisted decodes inside transformers' generate, where "
                          "specviz does not watch rounds), so numerics cannot be told from a "
                          "bug here.")
    elif rounding is None:
        ev.explanation = (f"The output forked at {at}, but {NO_YARDSTICK}: neither the row's state "
                          "nor the fork can be judged against it. Run a target small enough to "
                          "copy to float64 to judge this fork.")
    elif rounding.batch_invariant:
        ev.explanation = (f"At {at} the row's logits are the same bits as a fresh batch-size-1 "
                          "recomputation of its tokens (batch-invariant mode), so rounding cannot "
                          "have tipped the fork, and the pass chose the engine's token: the "
                          "reference, which should have computed the same bits, chose otherwise. "
                          "Its own path is the suspect; the missing evidence is a recomputation "
                          "of the reference's pass at this token.")
    elif rounding.anomaly:
        ev.explanation = (f"The output forked at {at}, but the yardstick itself is suspect: "
                          f"{rounding.anomaly}.")
    elif ev.margin_float64 is None:
        ev.explanation = (f"The row's state was clean at {at}, but the fork could not be "
                          "arbitrated in float64 (the target is too large to copy to float64), so "
                          "a near-tie cannot be confirmed.")
    elif abs(ev.margin_float64) <= rounding.tolerance:
        ev.verdict = "numerics"
        ev.explanation = (f"At {at} the row's state was clean (its logits within "
                          f"{ev.state_diff:.3g} of a fresh batch-size-1 recomputation), and in "
                          "float64 the reference's token and the speculative one are "
                          f"{abs(ev.margin_float64):.3g} logits apart, within what rounding in "
                          f"{rounding.dtype} flips ({rounding.tolerance:.3g}; a correct pair of "
                          f"computations differs by more with probability {rounding.alpha:.2g}): "
                          "a near-tie that floating point tipped.")
    elif ev.margin_float64 < 0:
        ev.explanation = (f"At {at} the row's state was clean, and in float64 the speculative "
                          f"token is the better one, by {-ev.margin_float64:.3g} logits, beyond "
                          f"what rounding in {rounding.dtype} flips ({rounding.tolerance:.3g}): "
                          "the batch-size-1 reference took the worse token here. Its own "
                          "path (one query a pass over a cache) is the suspect; recompute it, or "
                          "compare with batched-reference and hf-assisted.")
    else:
        ev.explanation = (f"At {at} the row's state was clean (within {ev.state_diff:.3g} of a "
                          "fresh batch-size-1 recomputation) and every check held, yet in float64 "
                          f"the two tokens are {ev.margin_float64:.3g} logits apart, beyond what "
                          f"rounding in {rounding.dtype} flips ({rounding.tolerance:.3g}). Neither "
                          "a corrupt state nor rounding explains it; the missing "
                          "evidence is a check of every round's state before the fork: run it "
                          "again with --audit.")


def flag_batching_noise(trace: Trace, batched: DecodeResult) -> Findings:
    """Mark divergences that batched-reference (same prompts and batch size, no
    speculation) shows at or before the same token: batching noise."""
    found = Findings()
    for s in trace.sequences:
        ev = s.forensics
        if ev is None:
            continue
        alt = first_difference(batched.outputs[s.seq].ids, s.reference_ids)
        noise = alt is not None and alt <= ev.fork
        said = " Batched greedy decoding without speculation departs here too: batching noise."
        found.of(s.seq)["forensics"] = ev.model_copy(update={
            "batching_noise": noise, "explanation": ev.explanation + said * noise})
    return found
