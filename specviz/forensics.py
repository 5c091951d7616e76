"""Divergence forensics: where each sequence left the reference, and why.

Every piece of evidence is recomputed independently of the engine it judges:
- the noise floor (noise.py): how far two correct computations of the same
  logits drift on this pair, dtype and device, measured with no speculation;
- the state check (watch.py): the row that emitted the fork, as the model saw
  it, against a fresh batch-size-1 recomputation of its real tokens; when its
  logits differ by more than FACTOR floors, its state was corrupt, and the
  inputs it was fed (first token, positions, mask, cache entries) say which
  part;
- float64 arbitration (recompute.py): the true gap between the reference's
  token and the speculative one at the fork.

Verdicts:
  sync-bug:bonus      the emitted token is not the argmax of the logits that chose it (I4);
  sync-bug:<state>    the row's state was corrupt: positions, mask, kv, or `state` when no
                      single input explains it (or a sequence ran past its end or stopped short);
                      also when the engine's own invariant checks failed at or before the fork;
  numerics            the state was clean and the float64 gap at the fork is within the floor's scale;
  unexplained         anything else, shown loudly.
"""
from __future__ import annotations

import torch

from .decoding.result import DecodeResult
from .models import ModelPair
from .recompute import float64_logits, fresh_logits
from .trace import Forensics, NoiseFloors, RowRecord, SequenceRecord, Trace, first_difference

# A correct engine's rows stay within 1.7 floors of a fresh recomputation (measured: the tiny and the embedded
# pair, float32 and bfloat16, bs 4, k 5); a corrupt state is FACTOR floors away or more. A flip needs the gap
# between two logits to change sign: twice the per-logit tolerance.
FACTOR = 4.0

# The engine's own checks whose failure puts the target's view out of step, by priority when several fail in
# the same round (positions also spoil the cache's provenance).
BREAKING = ("bonus", "positions", "mask", "kv")
EXPLAIN = {
    "bonus": "a correction/bonus token was not the argmax of the target pass that chose it (I4)",
    "positions": "the position ids fed to the model did not count the row's real tokens (I2)",
    "mask": "the attention mask did not show exactly the row's real tokens",
    "kv": "the KV cache did not hold each real token's entry, computed at its own position (I3)",
    "state": "the row's state was corrupt, and no single input (first token, positions, mask, cache) explains it",
}


def _emitter(rows: list[RowRecord], fork: int) -> RowRecord | None:
    """The record that emitted token `fork`."""
    seen = 0
    for r in rows:
        if fork < seen + len(r.emitted):
            return r
        seen += len(r.emitted)
    return None


def _failures(rows: list[RowRecord], until_round: int | None) -> dict[str, int]:
    failed: dict[str, int] = {}
    for r in rows:
        if until_round is not None and r.round > until_round:
            break
        for c in BREAKING:
            if not r.checks.get(c, True):
                failed.setdefault(c, r.round)
    return failed


def _first_over(rows: list[RowRecord], field: str, tolerance: float | None) -> int | None:
    """The first round whose audited difference (`audit` or `audit_draft`) exceeds `tolerance`."""
    if tolerance is None:
        return None
    return next((r.round for r in rows if getattr(r, field) is not None and getattr(r, field) > tolerance), None)


def analyse(trace: Trace, result: DecodeResult, pair: ModelPair | None) -> None:
    """Fill `forensics` for every divergent sequence of `trace` (in place), from the watch's findings in
    `result` (result.forks), the floor in the manifest and, with `pair`, float64 arbitration."""
    floors = trace.manifest.noise_floor
    rows_of: dict[int, list[RowRecord]] = {}
    for r in trace.rows:
        rows_of.setdefault(r.seq, []).append(r)
    for s in trace.sequences:
        rows = rows_of.get(s.seq, [])
        if floors is not None:
            s.audit_round = _first_over(rows, "audit", FACTOR * floors.target.value)
            s.audit_draft_round = _first_over(rows, "audit_draft", floors.draft and FACTOR * floors.draft.value)
        s.forensics = None
        if s.equivalent is not False:
            continue
        ev = _evidence(s, rows, result.forks.get(s.seq))
        if not _sync_bug(ev, floors):  # only a clean state needs the float64 arbiter
            if pair is not None:
                z = float64_logits(pair, trace.prompts[s.seq].ids + s.output_ids[: ev.fork])
                if z is not None:
                    ev.margin_float64 = float(z[ev.reference_token] - z[ev.output_token])
            _near_tie(ev, floors)
        s.forensics = ev


def _evidence(s: SequenceRecord, rows: list[RowRecord], fork) -> Forensics:
    f = s.first_divergence
    rec = _emitter(rows, f)
    ev = Forensics(
        verdict="unexplained", explanation="", fork=f,
        output_token=s.output_ids[f] if f < len(s.output_ids) else None,
        reference_token=s.reference_ids[f] if f < len(s.reference_ids) else None,
        margin_reference=s.reference_margins[f] if s.reference_margins and f < len(s.reference_margins) else None,
        margin_batched=s.margins[f] if f < len(s.margins) else None,
    )
    if rec is not None:
        ev.round, ev.row = rec.round, rec.row
    ev.failed_checks = _failures(rows, ev.round)
    if fork is not None:
        ev.state_diff, ev.kv_diff, ev.tokens_fed_ok = fork.state_diff, fork.kv_diff, fork.tokens_ok
        ev.written_at = fork.written_at
        ev.positions_fed, ev.positions_expected = fork.positions_fed, fork.positions_expected
        ev.visible, ev.visible_expected = fork.visible, fork.visible_expected
        ev.emitting_argmax, ev.margin_batched = fork.emitting_argmax, fork.emitting_margin
    return ev


def _component(ev: Forensics, tolerance: float) -> str:
    """Which input of the emitting pass was wrong, checked against the truth one at a time."""
    if ev.tokens_fed_ok is False:
        return "state"  # it was fed another token than its own last one: rows mixed up
    if ev.positions_fed is not None and ev.positions_fed != ev.positions_expected:
        return "positions"
    if ev.visible is not None and ev.visible != ev.visible_expected:
        return "mask"
    if ev.kv_diff is not None and ev.kv_diff > tolerance:
        # Most ill-fitting entries fit their own token at another position: the positions were wrong when they
        # were computed. Entries of other tokens: the cache itself was laid out wrong.
        at_other_positions = sum(at >= 0 for _, at in ev.written_at)
        return "positions" if at_other_positions > len(ev.written_at) / 2 else "kv"
    return "state"


def _at(ev: Forensics) -> str:
    return f"token {ev.fork}" + (f" (round {ev.round}, batch row {ev.row})" if ev.round is not None else "")


def _sync_bug(ev: Forensics, floors: NoiseFloors | None) -> bool:
    """Call the fork a sync bug when the evidence shows one (and say which state); False otherwise."""
    at = _at(ev)
    tolerance = FACTOR * floors.target.value if floors else None
    # The engine's own checks (its provenance of every cache slot) corroborate; they name the state only where
    # the independent evidence cannot.
    invariant = None
    if ev.failed_checks:
        first = min(ev.failed_checks.values())
        invariant = next(c for c in BREAKING if ev.failed_checks.get(c) == first)
    recorded = (f" The engine's own check found, in round {ev.failed_checks[invariant]}, that {EXPLAIN[invariant]}."
                if invariant else "")
    if ev.output_token is None or ev.reference_token is None:
        ended = "the reference had already ended" if ev.reference_token is None else "the output had stopped"
        ev.verdict = f"sync-bug:{invariant or 'state'}"
        ev.explanation = (f"At {at} {ended}: the engine {'ran past the end of' if ev.reference_token is None else 'cut short'} "
                          "the sequence (EOS or token budget)." + recorded)
    elif ev.emitting_argmax is not None and ev.emitting_argmax != ev.output_token:
        ev.verdict = "sync-bug:bonus"
        ev.explanation = (f"At {at} the engine emitted a token that is not the argmax of the target pass that chose "
                          f"it (the pass's own logits pick id {ev.emitting_argmax}): {EXPLAIN['bonus']}.")
    elif ev.state_diff is not None and tolerance is not None and ev.state_diff > tolerance:
        state = _component(ev, tolerance)
        ev.verdict = f"sync-bug:{invariant if state == 'state' and invariant else state}"
        ev.explanation = (f"At {at} the emitting pass's logits differ from a fresh batch-size-1 recomputation of the "
                          f"row by {ev.state_diff:.3g}, {ev.state_diff / floors.target.value:.3g} times the noise floor "
                          f"({floors.target.value:.3g}): the row's state was corrupt. {_why(ev, state)}" + recorded)
    elif invariant is not None:
        ev.verdict = f"sync-bug:{invariant}"
        ev.explanation = f"The output forked at {at}." + recorded
    else:
        return False
    return True


def _near_tie(ev: Forensics, floors: NoiseFloors | None) -> None:
    """A clean fork: `numerics` when float64 shows a near-tie at the floor's scale, else `unexplained`."""
    at = _at(ev)
    tolerance = FACTOR * floors.target.value if floors else None
    if ev.state_diff is None or tolerance is None:
        ev.explanation = (f"The output forked at {at}, but the pass that emitted it could not be checked (hf-assisted "
                          "decodes inside transformers' generate, where specviz does not watch rounds), so numerics "
                          "cannot be told from a bug here.")
    elif ev.margin_float64 is None:
        ev.explanation = (f"The row's state was clean at {at}, but the fork could not be arbitrated in float64 (the "
                          "target is too large to copy to float64), so a near-tie cannot be confirmed.")
    elif abs(ev.margin_float64) <= 2 * tolerance:
        ev.verdict = "numerics"
        ev.explanation = (f"At {at} the row's state was clean (within {ev.state_diff / floors.target.value:.2g} noise "
                          f"floors of a fresh batch-size-1 recomputation), and in float64 the reference's token and "
                          f"the speculative one are {abs(ev.margin_float64):.3g} logits apart, within the floor's scale "
                          f"({2 * tolerance:.3g}): a near-tie that floating point tipped.")
    else:
        ev.explanation = (f"At {at} the row's state was clean and every check held, yet in float64 the two tokens are "
                          f"{abs(ev.margin_float64):.3g} logits apart, far beyond the noise floor "
                          f"({floors.target.value:.3g}). This is not a known failure: please report it.")


def _why(ev: Forensics, state: str) -> str:
    if state == "positions" and ev.positions_fed == ev.positions_expected:
        wrong = [(i, at) for i, at in ev.written_at if at >= 0]
        return ("Its cache held entries computed at the wrong positions in earlier passes: "
                + ", ".join(f"the token at position {i} was computed at {at}" for i, at in wrong) + ".")
    if state == "positions":
        return f"It was fed position ids {span(ev.positions_fed)} where its tokens sit at {span(ev.positions_expected)}."
    if state == "mask":
        return (f"Its mask let its verified slots see {span(ev.visible)} key slots where it has "
                f"{span(ev.visible_expected)} real tokens.")
    if state == "kv":
        return (f"Replayed alone over only the cache entries its mask showed, with true positions, it still differs "
                f"by {ev.kv_diff:.3g}: the cache held the wrong entries.")
    if ev.tokens_fed_ok is False:
        return "The first token it was fed is not the sequence's last token: the row was given another sequence's state."
    return "Its first token, positions, mask and visible cache entries each check out alone: " + EXPLAIN["state"] + "."


def span(xs: list[int] | None) -> str:
    return "?" if not xs else str(xs[0]) if len(xs) == 1 else f"{xs[0]}…{xs[-1]}"


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


# ---------------------------------------------------------------- engines judged from outside (check.py)

REPEAT_N = 4  # loops are measured on repeated n-grams of this length


def judge_engine(trace: Trace, pair: ModelPair) -> None:
    """Fill `gaps` for every sequence of an engine check, and `forensics` for every divergent one (in place).

    A correct greedy engine writes, at every position, the target's own argmax given its own prefix, up to
    numerics. So its whole output is teacher-forced through the reference (one fresh batch-size-1 pass): a
    token whose logit sits more than the tolerance below the target's choice is one the target would not
    have written. The tolerance is 2 x FACTOR x the floor: ours, or the engine's own drift from the reference
    where a control run (the engine without speculation) reports log-probabilities.
    """
    floor = trace.manifest.noise_floor.target.value
    drift = _control_drift(trace, pair)
    tolerance = 2 * FACTOR * max(floor, drift or 0.0)
    for s in trace.sequences:
        if s.engine is None or s.engine.error is not None:
            continue
        prompt = trace.prompts[s.seq].ids
        logits = _teacher_forced(pair, prompt, s.output_ids)
        s.gaps = [float(z.max() - z[t]) for z, t in zip(logits, s.output_ids)]
        s.forensics = None
        if s.equivalent is False:
            s.forensics = _judge(s, pair, prompt, logits, tolerance)


def _teacher_forced(pair: ModelPair, prompt: list[int], output: list[int]) -> torch.Tensor:
    """The reference's logits for each token of `output`, on its own prefix: (len(output), vocab) float64."""
    if not output:
        return torch.zeros(0, pair.vocab_size, dtype=torch.float64)
    return fresh_logits(pair.target, prompt + output[:-1], len(output), pair.vocab_size)


def _control_drift(trace: Trace, pair: ModelPair) -> float | None:
    """How far the engine's own log-probabilities, without speculation, sit from the reference's, over the tokens
    where that control run follows the reference: the engine's noise floor (None without such logprobs)."""
    drift = None
    for s in trace.sequences:
        c = s.control
        if c is None or c.error or not c.logprobs:
            continue
        agree = first_difference(c.ids, s.reference_ids)
        n = min(len(c.logprobs), len(c.ids) if agree is None else agree)
        if n == 0:
            continue
        ours = _teacher_forced(pair, trace.prompts[s.seq].ids, c.ids[:n]).log_softmax(-1)
        diffs = [abs(ours[i, t] - lp) for i, (t, lp) in enumerate(zip(c.ids[:n], c.logprobs[:n]))]
        drift = max(drift or 0.0, float(max(diffs)))
    return drift


def _repeated(ids: list[int]) -> float | None:
    grams = [tuple(ids[i:i + REPEAT_N]) for i in range(len(ids) - REPEAT_N + 1)]
    return None if not grams else 1 - len(set(grams)) / len(grams)


def _judge(s: SequenceRecord, pair: ModelPair, prompt: list[int], logits: torch.Tensor, tolerance: float) -> Forensics:
    f = s.first_divergence
    out, ref = s.output_ids, s.reference_ids
    ev = Forensics(verdict="unexplained", explanation="", fork=f, tolerance=tolerance,
                   output_token=out[f] if f < len(out) else None, reference_token=ref[f] if f < len(ref) else None,
                   margin_reference=s.reference_margins[f] if s.reference_margins and f < len(s.reference_margins) else None)
    if s.control is not None and not s.control.error:
        ev.control_fork = first_difference(s.control.ids, ref)
    if ev.output_token is not None:
        z = logits[f]
        ev.engine_rank = 1 + int((z > z[ev.output_token]).sum())
        if s.engine.logprobs and f < len(s.engine.logprobs):
            ev.engine_logprob = s.engine.logprobs[f]
        after = logits[f:].log_softmax(-1)
        ev.nll = float(-after[torch.arange(len(out) - f), torch.tensor(out[f:])].mean())
        ev.repeated = _repeated(out[f:])
        if len(ref) > f:
            reference_after = _teacher_forced(pair, prompt + ref[:f], ref[f:]).log_softmax(-1)
            ev.reference_nll = float(-reference_after[torch.arange(len(ref) - f), torch.tensor(ref[f:])].mean())
        z64 = float64_logits(pair, prompt + out[:f])  # the true gap between the two tokens at the fork
        if z64 is not None and ev.reference_token is not None:
            ev.margin_float64 = float(z64[ev.reference_token] - z64[ev.output_token])
    ev.first_bad = next((i for i in range(f, len(out)) if s.gaps[i] > tolerance), None)
    _engine_verdict(ev, s)
    return ev


def _engine_verdict(ev: Forensics, s: SequenceRecord) -> None:
    f = ev.fork
    control_same = (ev.control_fork == f and f < len(s.control.ids) and s.control.ids[f] == ev.output_token)
    if s.engine.approximate:
        ev.explanation = (f"The output departs from the reference at token {f}, but the engine gave text only: its "
                          "ids were re-tokenized by specviz and may not be the ones it chose, so no verdict is given. "
                          "Ask the server for token ids.")
    elif ev.output_token is None:
        ev.explanation = (f"The engine stopped after {f} tokens without an end-of-sequence token (finish reason "
                          f"{s.engine.finish_reason!r}) where the reference goes on: a server-side limit, or a bug.")
    elif s.control is not None and not s.control.error and (ev.control_fork is None or ev.control_fork > f):
        ev.verdict = "engine-bug"
        ev.explanation = (f"At token {f} speculation changed the output: the same engine without speculation follows "
                          f"the reference there{'' if ev.control_fork is None else f' (it departs only at token {ev.control_fork})'}.")
    elif ev.first_bad is not None and not control_same:
        where = "The fork token" if ev.first_bad == f else f"Token {ev.first_bad}, after the fork,"
        ev.verdict = "engine-bug"
        ev.explanation = (f"{where} sits {s.gaps[ev.first_bad]:.3g} logits below what the target itself would write "
                          f"on that prefix, beyond anything numerics explains here ({ev.tolerance:.3g}): the engine "
                          f"wrote text the target would not{_symptom(ev)}.")
    else:
        near = ev.margin_float64 is not None and abs(ev.margin_float64) <= ev.tolerance
        tail = ("; the same engine without speculation departs here too, with the same token: this engine differs "
                "from transformers anyway, speculation or not" if control_same else "")
        if near and ev.first_bad is None:
            ev.verdict = "numerics"
            ev.explanation = (f"At token {f} the two tokens are {abs(ev.margin_float64):.3g} logits apart in float64, "
                              f"within the floor's scale ({ev.tolerance:.3g}), and every later token is the target's own "
                              f"choice up to numerics: a near-tie that floating point tipped{tail}.")
        else:
            ev.explanation = (f"At token {f} the engine's token is "
                              f"{'not confirmed as a near-tie in float64' if ev.margin_float64 is None else f'{abs(ev.margin_float64):.3g} logits from the reference token in float64'}"
                              f"{tail}. This is not a known pattern: please report it.")


def _symptom(ev: Forensics) -> str:
    """The paper's symptoms, measured: loops (repeated 4-grams) and gibberish (high NLL under the reference)."""
    parts = []
    if ev.repeated is not None and ev.repeated >= 0.3:
        parts.append(f"{ev.repeated:.0%} of its 4-grams after the fork repeat (a loop)")
    if ev.nll is not None and ev.reference_nll is not None and ev.nll > ev.reference_nll + 2:
        parts.append(f"its text after the fork costs {ev.nll:.2f} nats a token under the target, against "
                     f"{ev.reference_nll:.2f} for the reference's own (gibberish)")
    return "; " + " and ".join(parts) if parts else ""
