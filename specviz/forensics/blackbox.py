"""The black-box judge: an engine from outside (run/check.py), by its token ids alone.

A correct greedy engine writes, at every position, the target's own argmax given its own prefix, up
to its rounding. So its whole output is teacher-forced through the target in float64 (one fresh
batch-size-1 pass): a token whose logit sits further below the target's choice than that engine's
rounding reaches is one the target would not have written. The engine's rounding is measured on its
control run (enginenoise.py); without one, or with one whose tokens bound none of it, only
transformers' rounding is known, and a fork beyond it is left unexplained, saying what would
decide it.

Verdicts: `numerics` (of that engine), `engine-bug`, `decision-bug:stop` (an output that runs on
past an end-of-sequence token, from its tokens alone), `unexplained` with the evidence that is
missing (spec/verdicts.py).
"""
from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

from specviz.decoding.result import Progress
from specviz.decoding.stops import Stops
from specviz.forensics import enginenoise
from specviz.trace.evidence import EngineForensics, Fidelity
from specviz.trace.findings import Findings
from specviz.trace.records import SequenceRecord, first_difference
from specviz.trace.schema import Trace
from specviz.trace.yardsticks import EngineNoise, Yardsticks

REPEAT_N = 4  # loops are measured on repeated n-grams of this length


def force_outputs(forcing: enginenoise.TeacherForcing, prompt: list[int],
                  outputs: dict[str, list[int]],
                  progress: Progress | None = None) -> dict[str, enginenoise.Forced]:
    """One prompt's outputs ({role: ids}: the engine's, the control's) teacher-forced; the prompt is
    prefilled once, and an output equal to another's is forced once."""
    done: dict[tuple[int, ...], enginenoise.Forced] = {}
    for ids in outputs.values():
        if tuple(ids) not in done:
            done[tuple(ids)] = enginenoise.force(forcing, prompt, ids)
            if progress:
                progress(len(ids))
    return {role: done[tuple(ids)] for role, ids in outputs.items()}


def judge_engine(trace: Trace, forcing: enginenoise.TeacherForcing, truth: str,
                 scored: dict[tuple[str, int], enginenoise.Forced], stops: Stops) -> Findings:
    """`gaps` for every sequence of an engine check, `forensics` for every divergent one, the
    engine's yardstick and each run's fidelity, from its runs' outputs teacher-forced in `truth`:
    (role, seq) -> Forced (force_outputs). `stops`: where the reference stops (an end-of-sequence
    token, a stop string); an output that goes on past one ran past its stop, whatever the target
    would have written after it."""
    ys = trace.manifest.yardstick or Yardsticks(target=None)
    rounding = ys.target.tolerance if ys.target else 0.0
    ys = ys.model_copy(update={"engine": _engine_noise(trace, scored, truth, rounding)})
    found = Findings(run={"manifest.yardstick": ys})
    for s in trace.sequences:
        if ("engine", s.seq) not in scored:
            continue
        mine = found.of(s.seq)
        # the trace's own: a check's Forced is kept (runner.py)
        mine["gaps"] = list(scored["engine", s.seq].gaps)
        mine["forensics"] = None
        if s.equivalent is False:
            reference = functools.partial(_forced_reference, s, forcing, trace.prompts[s.seq].ids,
                                          scored)
            mine["forensics"] = _judge_sequence(s, scored["engine", s.seq], reference, ys, stops,
                                                trace.manifest.spec.batch_invariant)
    found.run["manifest.fidelity"] = [f for role in ("engine", "control")
                                      if (f := _fidelity(trace, scored, role, ys.engine))]
    return found


def _engine_noise(trace: Trace, scored: dict, truth: str, rounding: float) -> EngineNoise:
    """The engine's rounding from its control run's tokens (its log-probabilities, where it gave
    them, are reported beside: enginenoise.py says why they are not granted)."""
    controls = [(s, scored["control", s.seq]) for s in trace.sequences
                if ("control", s.seq) in scored]
    if not controls:
        return EngineNoise(source="none", truth=truth, tokens=0, departures=[], rounding=rounding,
                           tolerance=rounding, alpha=enginenoise.ALPHA,
                           method="no control run: only transformers' own rounding in this "
                                  "dtype is known, and every engine is granted it")
    apart = enginenoise.outliers([(forced.gaps, forced.margins) for _, forced in controls])
    outliers = [s.seq for i, (s, _) in enumerate(controls) if i in apart]
    controls = [c for i, c in enumerate(controls) if i not in apart]
    gaps = [g for _, forced in controls for g in forced.gaps]
    margins = [m for _, forced in controls for m in forced.margins]
    fit = enginenoise.fit_sigma(gaps, margins)
    squares = [x for s, forced in controls if s.control.logprobs
               for x in enginenoise.sigma_from_logprobs(forced, s.control.logprobs)]
    sigma_lp = enginenoise.robust_sigma(squares)
    departures = sorted((g for g in gaps if g > 0), reverse=True)
    measured = dict(truth=truth, tokens=len(gaps),
                    departures=departures[: enginenoise.MAX_DEPARTURES],
                    sigma=fit and fit[0], sigma_upper=fit and fit[1], sigma_logprobs=sigma_lp,
                    rounding=rounding, alpha=enginenoise.ALPHA, outliers=outliers)
    # granting its fit would let any output pass as rounding
    if why := enginenoise.unbounded(gaps, margins, fit):
        return EngineNoise(source="unbounded", tolerance=rounding, method=why, **measured)
    budget = trace.manifest.spec.max_new_tokens
    return EngineNoise(
        source="control", tolerance=enginenoise.tolerance(fit[1], budget), **measured,
        method=(f"the control's {len(gaps)} tokens teacher-forced through the target in {truth}: "
                f"{len(departures)} depart from its argmax; a Gaussian noise on logit differences "
                "fitted to those gaps and to the margins of the tokens it kept"
                + (f" (its {len(squares)} log-probabilities read it too, and are reported, not "
                   "granted)" if squares else "")
                + f"; tolerance: at the 95% upper bound, the gap all {budget} tokens of a correct "
                  "output stay within with probability 1 - alpha "
                  f"(its 1 - alpha / {budget} quantile)"
                + (f"; {len(outliers)} control outputs set apart, their departures needing far "
                   "more noise than the rest's (a likelihood-ratio test at alpha / outputs each)"
                   if outliers else "")))


def _fidelity(trace: Trace, scored: dict, role: str, noise: EngineNoise) -> Fidelity | None:
    """How far one run (the engine, or its control) departs from the model."""
    runs = [(s, getattr(s, role), scored[role, s.seq]) for s in trace.sequences
            if (role, s.seq) in scored]
    if not runs:
        return None
    gaps = [g for _, _, forced in runs for g in forced.gaps]
    fit = enginenoise.fit_sigma(gaps, [m for _, _, forced in runs for m in forced.margins])
    errors = [abs(lp - truth) for _, out, forced in runs if out.logprobs
              for lp, truth in zip(out.logprobs, forced.logprobs)]
    return Fidelity(role=role, outputs=len(runs),
                    equal=sum(out.ids == s.reference_ids for s, out, _ in runs),
                    tokens=len(gaps), departures=sum(g > 0 for g in gaps),
                    beyond=sum(g > noise.tolerance for g in gaps),
                    largest_gap=max(gaps, default=0.0), sigma=fit and fit[0],
                    logprob_error=max(errors, default=None))


def _repeated(ids: list[int]) -> float | None:
    grams = [tuple(ids[i:i + REPEAT_N]) for i in range(len(ids) - REPEAT_N + 1)]
    return None if not grams else 1 - len(set(grams)) / len(grams)


def _forced_reference(s: SequenceRecord, forcing: enginenoise.TeacherForcing, prompt: list[int],
                      scored: dict[tuple[str, int], enginenoise.Forced]) -> enginenoise.Forced:
    """The reference teacher-forced: the control's, where the control wrote the reference, else
    forced here."""
    if s.control is not None and s.control.ids == s.reference_ids and ("control", s.seq) in scored:
        return scored["control", s.seq]
    return enginenoise.force(forcing, prompt, s.reference_ids)


def _judge_sequence(s: SequenceRecord, forced: enginenoise.Forced,
                    reference: Callable[[], enginenoise.Forced],
                    ys: Yardsticks, stops: Stops, invariant: bool) -> EngineForensics:
    """A divergent sequence's verdict, from its output teacher-forced and its reference's
    (`reference()`, forced only where the reference goes past the fork). Up to the fork the two
    share a prefix, so at the fork both were read off the same logits. `invariant`: the engine
    declared a batch-invariant mode, so speculation may not change its output by a bit."""
    f = s.first_divergence
    out, ref = s.output_ids, s.reference_ids
    noise = ys.engine
    ev = EngineForensics(verdict="unexplained", explanation="", fork=f, tolerance=noise.tolerance,
                         alpha=noise.alpha, yardstick=noise.describe(),
                         output_token=out[f] if f < len(out) else None,
                         reference_token=ref[f] if f < len(ref) else None,
                         margin_reference=(s.reference_margins[f]
                                           if s.reference_margins and f < len(s.reference_margins)
                                           else None))
    if s.control is not None and not s.control.error:
        ev.control_fork = first_difference(s.control.ids, ref)
    if ev.output_token is not None:
        ev.engine_rank = forced.ranks[f]
        if s.engine.logprobs and f < len(s.engine.logprobs):
            ev.engine_logprob = s.engine.logprobs[f]
        ev.nll = -statistics.fmean(forced.logprobs[f:])
        ev.repeated = _repeated(out[f:])
        if len(ref) > f:
            forced_ref = reference()
            ev.reference_nll = -statistics.fmean(forced_ref.logprobs[f:])
            # z[reference token] - z[output token], both as gaps below the top
            if noise.truth == "float64":
                ev.margin_float64 = forced.gaps[f] - forced_ref.gaps[f]
    ev.first_bad = next((i for i in range(f, len(out)) if forced.gaps[i] > noise.tolerance), None)
    end = stops.end(out[:-1])
    stop = None if end is None else end - 1  # the token the output should have ended at
    # agreed up to a stop the output went past
    if stop is not None and stop < f and not s.engine.approximate:
        control = (s.control is not None and not s.control.error
                   and s.control.ids[: stop + 2] == out[: stop + 2])
        ev.verdict = "decision-bug:stop"
        ev.explanation = (f"The output ends at token {stop} with {stops.what(out, end)}, where the "
                          f"reference stops, and goes on for {len(out) - stop - 1} more tokens: "
                          "the engine missed a stop. Never rounding: whatever the target writes "
                          "after a stop, a correct engine writes nothing. "
                          + ("The same engine without speculation runs past it too: its stop "
                             "check, not speculation." if control else
                             "A stop check that looks only at the last token of each accepted "
                             "block does this."))
    elif not (invariant and _breaks_invariance(ev, s)):
        _engine_verdict(ev, s, forced.gaps, noise)
        if invariant:
            ev.explanation += (" The engine declared a batch-invariant mode, and its run without "
                               "speculation writes the same tokens: speculation changed nothing."
                               if s.control is not None and not s.control.error else
                               " The engine declared a batch-invariant mode, but without its run "
                               "without speculation (--control-*) it cannot be judged at zero "
                               "tolerance.")
    _place_in_rounds(ev, s)
    return ev


def _place_in_rounds(ev: EngineForensics, s: SequenceRecord) -> None:
    """Where the engine reported its rounds: which wrote the fork token, and whether as one of its
    accepted drafts (the drafter proposed it too, and the verify pass kept it) or as its own token
    (the verify pass's choice after the drafts it kept), said in the explanation."""
    for n, (r, (start, end)) in enumerate(zip(s.engine.rounds or [], s.engine.spans())):
        if ev.fork < end:
            ev.fork_round = n
            ev.fork_written_as = "accepted draft" if ev.fork - start < r.accepted else "own token"
            how = (f"as accepted draft {ev.fork - start + 1} of {r.accepted}: the drafter "
                   "proposed it and the verify pass kept it" if ev.fork_written_as ==
                   "accepted draft" else
                   f"as its own token after {r.accepted} accepted "
                   f"draft{'' if r.accepted == 1 else 's'}: the verify pass chose it")
            ev.explanation += (" The engine's prefill wrote the fork token, its first." if n == 0
                               else f" The engine's round {n} wrote the fork token {how}.")
            return


def _breaks_invariance(ev: EngineForensics, s: SequenceRecord) -> bool:
    """An engine that declared batch-invariant computation, judged at zero tolerance against its
    own run without speculation: any token apart is an engine bug, whatever the margins. False
    where it has no control run, or writes what its control writes."""
    if s.control is None or s.control.error:
        return False
    apart = first_difference(s.control.ids, s.output_ids)
    if apart is None:
        return False
    mine, theirs = (x[apart] if apart < len(x) else "its end"
                    for x in (s.output_ids, s.control.ids))
    ev.verdict, ev.tolerance, ev.alpha = "engine-bug", 0.0, None
    ev.yardstick = "declared batch-invariant: zero tolerance against its own control run"
    ev.explanation = (f"The engine declared batch-invariant computation, so a request's logits are "
                      "the same bits however it is batched and verified, and speculation cannot "
                      f"change its output at all. At token {apart} it wrote {mine} where its own "
                      f"run without speculation wrote {theirs}: speculation changed the output, "
                      "which no rounding allows in this mode.")
    return True


def _engine_verdict(ev: EngineForensics, s: SequenceRecord, gaps: list[float],
                    noise: EngineNoise) -> None:
    f = ev.fork
    control = s.control is not None and not s.control.error
    control_same = (control and ev.control_fork == f and f < len(s.control.ids)
                    and s.control.ids[f] == ev.output_token)
    # The first token beyond rounding was the control's too, on the same prefix: speculation did not
    # write it.
    own = (control and ev.first_bad is not None
           and s.control.ids[: ev.first_bad + 1] == s.output_ids[: ev.first_bad + 1])
    changed = (" The same engine without speculation follows the reference there"
               + ("" if ev.control_fork is None
                  else f" (it departs only at token {ev.control_fork})")
               + ": speculation changed the output."
               if control and (ev.control_fork is None or ev.control_fork > f) else "")
    if s.engine.approximate:
        ev.explanation = (f"The output departs from the reference at token {f}, but the engine "
                          "gave text only: its ids were re-tokenized by specviz and may not be "
                          "the ones it chose, so no verdict is given. Ask the server for "
                          "token ids.")
    elif ev.output_token is None:
        ev.explanation = (f"The engine stopped after {f} tokens without an end-of-sequence token "
                          f"(finish reason {s.engine.finish_reason!r}) where the reference goes "
                          "on: a server-side limit, or a bug.")
    elif ev.first_bad is None:
        ev.verdict = "numerics"
        here = (f"the engine wrote the target's own choice in {noise.truth}: the batch-size-1 "
                "reference took another there, a near-tie its own rounding tipped"
                if gaps[f] == 0
                else f"the engine's token is {gaps[f]:.3g} logits below the target's own choice "
                     f"in {noise.truth}")
        ev.explanation = (f"At token {f} {here}, and every later token is within "
                          f"{noise.tolerance:.3g} of the target's choice: "
                          f"{noise.describe()}. A near-tie that rounding tipped." + changed
                          + (" The same engine without speculation writes the same token here."
                             if control_same else ""))
    elif own:
        where = "the fork" if ev.first_bad == f else f"token {ev.first_bad}, after the fork,"
        ev.explanation = (f"At {where} the engine's token is {gaps[ev.first_bad]:.3g} logits below "
                          f"the target's choice in {noise.truth}, beyond the tolerance "
                          f"({noise.describe()}), but the same engine without speculation writes "
                          "the same tokens up to there: speculation did not change them. The "
                          "engine departs from the model with or without speculation: compare its "
                          "weights and kernels with the target's.")
    else:
        where = "The fork token" if ev.first_bad == f else f"Token {ev.first_bad}, after the fork,"
        beyond = (f"{where} sits {gaps[ev.first_bad]:.3g} logits below what the target itself "
                  f"would write on that prefix (in {noise.truth}); {noise.describe()}")
        if s.seq in noise.outliers:
            ev.explanation = (f"{beyond}{_symptom(ev)}. The same engine without speculation "
                              "departs from the model on this prompt too, by far more than the "
                              "rounding its other outputs show (its output here was set apart from "
                              "the fit): something besides rounding and speculation is wrong on "
                              "this prompt. Missing evidence: the request the engine received "
                              "(its chat template, a truncation) and its weights, compared with "
                              "the target's.")
        elif noise.source == "control":
            ev.verdict = "engine-bug"
            ev.explanation = (f"{beyond}. The engine wrote text the target would not{_symptom(ev)}."
                              + changed)
        elif noise.source == "unbounded":
            ev.explanation = (f"{beyond}{_symptom(ev)}. Whether this engine's kernels round that "
                              "coarsely is not measured: its control run bounds none of its "
                              "rounding. Missing evidence: a control that does (the same engine "
                              "without speculation on more prompts or more tokens); where every "
                              "control token departs from the model, first compare the engine's "
                              "weights, tokenizer and chat template with the target's.")
        else:
            ev.explanation = (f"{beyond}{_symptom(ev)}. Whether this engine's kernels round that "
                              "coarsely is not measured. Missing evidence: its run without "
                              "speculation (the same server and settings, speculation off: "
                              "--control FILE, --control-server URL or --control-engine), which "
                              "measures its rounding and decides this fork.")


def _symptom(ev: EngineForensics) -> str:
    """The paper's symptoms, measured: loops (repeated 4-grams) and gibberish (high NLL under
    the reference)."""
    parts = []
    if ev.repeated is not None and ev.repeated >= 0.3:
        parts.append(f"{ev.repeated:.0%} of its 4-grams after the fork repeat (a loop)")
    if ev.nll is not None and ev.reference_nll is not None and ev.nll > ev.reference_nll + 2:
        parts.append(f"its text after the fork costs {ev.nll:.2f} nats a token under the target, "
                     f"against {ev.reference_nll:.2f} for the reference's own (gibberish)")
    return "; " + " and ".join(parts) if parts else ""
