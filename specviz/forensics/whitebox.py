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
  and its cache entries say which;
- float64 arbitration (recompute.py): the true gap between the reference's
  token and the speculative one at the fork.

Under a repetition or presence penalty every argmax and gap above is taken over the target's logits
penalised by the row's whole history (decoding/penalties.py), as the reference chose.

Verdicts:
  decision-bug:accept an accepted draft is not the argmax of the pass that verified it (the accept
  rule); decision-bug:penalty the state was clean, the penalised float64 logits choose the
  reference's token beyond
                      rounding, and with the penalty on the engine's token lifted they choose the
                      engine's: its penalty history lacked tokens the row holds;
  sync-bug:bonus      a correction or bonus token is not the argmax of the logits that chose it
  (I4); sync-bug:<state>    the row's state was corrupt: positions, mask, kv, a hybrid's recurrent
  state
                      (`recurrent`), or `state` when no single input explains it;
                      also when the engine's own invariant checks failed at or before the fork;
  decision-bug:stop   a sequence ran past its end (an end-of-sequence token, a stop string) or
  stopped short, and no engine
                      check failed before it;
  kernel-bug          every input was right, and the same pass rebuilt from correct inputs still
                      computes logits a fresh batch-size-1 pass does not: the verify computation;
  numerics            the state was clean and the float64 gap at the fork is within what rounding
  flips; unexplained         anything else, with the evidence that is missing.
Every name is declared in spec/verdicts.py.
"""
from __future__ import annotations

import functools

import torch

from specviz.decoding.result import DecodeResult
from specviz.decoding.sampling import sampling_of
from specviz.forensics.recompute import ARBITER_MAX_PARAMS, float64_logits
from specviz.models.pairs import ModelPair
from specviz.trace.evidence import Rounding, RunForensics
from specviz.trace.findings import Findings
from specviz.trace.records import RowRecord, SequenceRecord, first_difference
from specviz.trace.schema import Trace
from specviz.trace.text import span

# The engine's own checks whose failure puts the target's view out of step, by priority when several
# fail in the same round (positions also spoil the cache's provenance).
BREAKING = ("bonus", "positions", "mask", "kv", "recurrent")
EXPLAIN = {
    "bonus": ("a correction/bonus token was not the target's own (the argmax of the pass that "
              "chose it, or its draw when sampling) (I4)"),
    "accept": "the accept rule kept a draft the target did not choose (at temperature 0 a draft is "
              "kept only where it is the verifying pass's argmax)",
    "positions": "the position ids fed to the model did not count the row's real tokens (I2)",
    "mask": "the attention mask did not show exactly the row's real tokens",
    "kv": "the KV cache did not hold each real token's entry, computed at its own position (I3)",
    "recurrent": ("a recurrent layer's state (a hybrid's scan or convolution) did not hold exactly "
                  "the row's committed tokens: a rejected draft stayed in it, or accepted tokens "
                  "never reached it (I5)"),
    "state": "the row's state was corrupt, and no single input (first token, positions, mask, "
             "cache) explains it",
}
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


def failures(rows: list[RowRecord], until_round: int | None) -> dict[str, int]:
    """The engine's own breaking checks that failed up to `until_round` (None: any), each at its
    first round."""
    failed: dict[str, int] = {}
    for r in rows:
        if until_round is not None and r.round > until_round:
            break
        for c in BREAKING:
            if not r.checks.get(c, True):
                failed.setdefault(c, r.round)
    return failed


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
        mine["forensics"] = ev
    return found


def rows_of(trace: Trace) -> dict[int, list[RowRecord]]:
    """Each sequence's (round, row) records, in round order."""
    by_seq: dict[int, list[RowRecord]] = {}
    for r in trace.rows:
        by_seq.setdefault(r.seq, []).append(r)
    return by_seq


def _arbiter(pair: ModelPair, penalties, prompt: list[int],
             before: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The target's float64 logits for the token after `prompt + before`, penalised as the run's
    (its prompt and `before` the history), and as they are: (vocab,) each; None without a float64
    target."""
    z = float64_logits(pair, prompt + before)
    return None if z is None else (penalties.along(z[None], prompt, before)[0], z)


def _penalty_bug(ev: RunForensics, rounding: Rounding | None, arbiter, history: list[int]) -> bool:
    """A clean state whose penalised float64 logits choose the reference's token beyond rounding,
    and the engine's once the penalty on the engine's token is lifted: the engine's penalty missed
    tokens the row holds. Fills `ev` as decision-bug:penalty; False where the evidence does not show
    it."""
    clean = (rounding is not None and ev.state_diff is not None
             and ev.state_diff <= rounding.tolerance
             and not ev.failed_checks)
    if (not clean or ev.output_token is None or ev.reference_token is None
        or (z := arbiter()) is None):
        return False
    penalised, raw = z
    t, ref = ev.output_token, ev.reference_token
    lifted = penalised.clone()
    lifted[t] = raw[t]
    gap = float(penalised[ref] - penalised[t])
    if int(penalised.argmax()) != ref or int(lifted.argmax()) != t or gap <= rounding.tolerance:
        return False
    held_at = [i for i, x in enumerate(history) if x == t]
    places = ", ".join(map(str, held_at[:8])) + ("…" if len(held_at) > 8 else "")
    ev.verdict, ev.margin_float64, ev.penalty_lifted = "decision-bug:penalty", gap, t
    ev.explanation = (f"At {_where(ev)} the row's state was clean (its logits within "
                      f"{ev.state_diff:.3g} of a fresh batch-size-1 recomputation) and every check "
                      "held. The target's float64 logits there, penalised by the row's whole "
                      f"history, choose the reference's token {ref} over the engine's {t} by "
                      f"{gap:.3g}, beyond what rounding in {rounding.dtype} flips "
                      f"({rounding.tolerance:.3g}); with the penalty on token {t} lifted they "
                      f"choose {t}. The history holds token {t} {len(held_at)} time(s), at "
                      f"positions {places} of its prompt and output: the engine penalised "
                      "without tokens the row already holds.")
    return True


def corrupt(ev: RunForensics, rounding: Rounding, invariant: str | None, logits: str) -> None:
    """A state beyond the yardstick, the `logits` of its pass named: `kernel-bug` where every input
    was right and the pass rebuilt from them still departs, else `sync-bug:` the input that was
    wrong."""
    component = _component(ev, rounding)
    beyond = (f"{logits} differ from a fresh batch-size-1 recomputation of the row by "
              f"{ev.state_diff:.3g}, {ev.state_diff / rounding.tolerance:.3g} times what rounding "
              f"in {rounding.dtype} allows ({rounding.tolerance:.3g}; two correct computations "
              f"differ by more with probability {rounding.alpha:.2g})")
    if component == "kernel":
        ev.verdict = "kernel-bug"
        ev.explanation = (f"{beyond}, though its first token, positions and mask were right. "
                          f"{_rebuilt_pass_shows(ev, rounding)}")
    else:
        ev.verdict = f"sync-bug:{invariant if component == 'state' and invariant else component}"
        ev.explanation = f"{beyond}: the row's state was corrupt. {_why(ev, component)}"


def failed_check_sentence(ev: RunForensics, invariant: str | None) -> str:
    """The engine's own failed check, in a sentence: it corroborates the independent evidence."""
    return (f" The engine's own check found, in round {ev.failed_checks[invariant]}, that "
            f"{EXPLAIN[invariant]}."
            if invariant else "")


def first_invariant(ev: RunForensics) -> str | None:
    """The engine's own breaking check that failed first, at or before the fork (None: none
    failed)."""
    if not ev.failed_checks:
        return None
    first = min(ev.failed_checks.values())
    return next(c for c in BREAKING if ev.failed_checks.get(c) == first)


def fill_state(ev: RunForensics, fork) -> None:
    """The watch's inspection of the emitting row (watch.ForkState), as evidence."""
    ev.state_diff, ev.kv_diff, ev.tokens_fed_ok = fork.state_diff, fork.kv_diff, fork.tokens_ok
    ev.recurrent_diff = fork.recurrent_diff
    ev.kernel_diff, ev.kernel_diff_float64 = fork.kernel_diff, fork.kernel_diff_float64
    ev.written_at = fork.written_at
    ev.positions_fed, ev.positions_expected = fork.positions_fed, fork.positions_expected
    ev.visible, ev.visible_expected = fork.visible, fork.visible_expected
    ev.emitting_argmax, ev.margin_batched = fork.emitting_argmax, fork.emitting_margin


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


def _kernel_departs(ev: RunForensics, rounding: Rounding) -> bool:
    """The pass rebuilt from correct inputs departs from a fresh one: in the run's dtype beyond its
    rounding, or in float64 (where rounding is nil) beyond float64's."""
    return (ev.kernel_diff is not None and ev.kernel_diff > rounding.tolerance
            or ev.kernel_diff_float64 is not None
            and rounding.float64_tolerance is not None
            and ev.kernel_diff_float64 > rounding.float64_tolerance)


def _component(ev: RunForensics, rounding: Rounding) -> str:
    """Which input of the emitting pass was wrong, checked against the truth one at a time."""
    if ev.tokens_fed_ok is False:
        return "state"  # it was fed another token than its own last one: rows mixed up
    if ev.positions_fed is not None and ev.positions_fed != ev.positions_expected:
        return "positions"
    if ev.visible is not None and ev.visible != ev.visible_expected:
        return "mask"
    if _kernel_departs(ev, rounding):
        return "kernel"  # right inputs, wrong logits: the computation itself
    if ev.kv_diff is not None and ev.kv_diff > rounding.tolerance:
        # Most ill-fitting entries fit their own token at another position: the positions were wrong
        # when they were computed. Entries of other tokens: the cache itself was laid out wrong.
        at_other_positions = sum(at >= 0 for _, at in ev.written_at)
        return "positions" if at_other_positions > len(ev.written_at) / 2 else "kv"
    if ev.recurrent_diff is not None and ev.recurrent_diff > rounding.tolerance:
        return "recurrent"
    return "state"


def _where(ev: RunForensics) -> str:
    return f"token {ev.fork}" + (f" (round {ev.round}, batch row {ev.row})" if ev.round is not None
                                 else "")


def _sync_bug(ev: RunForensics, rounding: Rounding | None) -> bool:
    """Call the fork a sync bug (or a kernel bug) when the evidence shows one, and say which; False
    otherwise."""
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
    elif rounding is not None and _kernel_departs(ev, rounding):
        ev.verdict = "kernel-bug"
        ev.explanation = (f"At {at} the emitting pass's logits are within rounding of a fresh "
                          f"batch-size-1 recomputation ({ev.state_diff:.3g} against "
                          f"{tolerance:.3g} in {rounding.dtype}), so the fork alone could be "
                          f"rounding. {_rebuilt_pass_shows(ev, rounding)}")
    else:
        return False
    return True


def _rebuilt_pass_shows(ev: RunForensics, rounding: Rounding) -> str:
    """What the pass rebuilt from correct inputs shows: a computation the model itself does not
    make."""
    where = []
    if ev.kernel_diff_float64 is not None and rounding.float64_tolerance is not None \
            and ev.kernel_diff_float64 > rounding.float64_tolerance:
        where.append(f"in float64 by {ev.kernel_diff_float64:.3g}, where rounding explains "
                     f"{rounding.float64_tolerance:.2g}")
    if ev.kernel_diff is not None and ev.kernel_diff > rounding.tolerance:
        where.append(f"in {rounding.dtype} by {ev.kernel_diff:.3g}")
    return ("Rebuilt from correct inputs (each row's cache from a fresh prefill of its real "
            "tokens, true positions, a "
            f"plain mask), the same pass still departs from a fresh one, {' and '.join(where)}: "
            "the batched verify "
            "computes logits the model itself does not. A bug in the kernels of a pass of several "
            "queries over a cache, not in the state.")


def _near_tie(ev: RunForensics, rounding: Rounding | None) -> None:
    """A clean fork: `numerics` when float64 shows a gap that rounding flips, else `unexplained`."""
    at = _where(ev)
    if ev.state_diff is None:
        ev.explanation = (f"The output forked at {at}, but the pass that emitted it could not be "
                          "checked (hf-assisted "
                          "decodes inside transformers' generate, where specviz does not watch "
                          "rounds), so numerics cannot be told from a bug here.")
    elif rounding is None:
        ev.explanation = (f"The output forked at {at}, but {NO_YARDSTICK}: neither the row's state "
                          "nor the fork can "
                          "be judged against it. Run a target small enough to copy to float64 to "
                          "judge this fork.")
    elif rounding.anomaly:
        ev.explanation = (f"The output forked at {at}, but the yardstick itself is suspect: "
                          f"{rounding.anomaly}.")
    elif ev.margin_float64 is None:
        ev.explanation = (f"The row's state was clean at {at}, but the fork could not be "
                          "arbitrated in float64 (the "
                          "target is too large to copy to float64), so a near-tie cannot be "
                          "confirmed.")
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


def _why(ev: RunForensics, state: str) -> str:
    if state == "positions" and ev.positions_fed == ev.positions_expected:
        wrong = [(i, at) for i, at in ev.written_at if at >= 0]
        return ("Its cache held entries computed at the wrong positions in earlier passes: "
                + ", ".join(f"the token at position {i} was computed at {at}" for i, at in wrong)
                + ".")
    if state == "positions":
        return (f"It was fed position ids {span(ev.positions_fed)} where its tokens sit at "
                f"{span(ev.positions_expected)}.")
    if state == "mask":
        return (f"Its mask let its verified slots see {span(ev.visible)} key slots where it has "
                f"{span(ev.visible_expected)} real tokens.")
    if state == "kv":
        return ("Replayed alone over only the cache entries its mask showed, with true positions, "
                f"it still differs by {ev.kv_diff:.3g}: the cache held the wrong entries.")
    if state == "recurrent":
        return ("Replayed over fresh K/V of its tokens with its own recurrent states, it still "
                f"differs by {ev.recurrent_diff:.3g}, where the same replay over its own visible "
                "K/V and fresh states "
                f"{'does not' if ev.kv_diff is None or ev.kv_diff <= ev.tolerance else f'differs by {ev.kv_diff:.3g}'}:"
                f" {EXPLAIN['recurrent']}.")
    if ev.tokens_fed_ok is False:
        return ("The first token it was fed is not the sequence's last token: the row was given "
                "another sequence's state.")
    return ("Its first token, positions, mask and visible cache entries each check out alone: "
            + EXPLAIN["state"] + ".")


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
