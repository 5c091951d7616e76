"""A sampled run of ours, judged: each sequence's corrupt state where the run was audited, and the
run's verdict, from three independent pieces of evidence judged before it (the state audit, the
decision audit and the distribution test). The verdict is judged once, with the run, and kept in its
trace (`sampled_verdict`): the views and the sweep only read it."""
from __future__ import annotations

from specviz.decoding.result import DecodeResult
from specviz.forensics.corruption import (EXPLAIN, corrupt, failed_check_sentence, failures,
                                          fill_state, first_invariant)
from specviz.forensics.whitebox import first_over, rows_of
from specviz.trace.evidence import RunForensics, SampledJudgement
from specviz.trace.findings import Findings
from specviz.trace.records import RowRecord, SequenceRecord
from specviz.trace.schema import Trace
from specviz.trace.yardsticks import Rounding

# Audited rounds beyond the yardstick that name a sampled run's state corrupt. Every audited row is
# a comparison at the yardstick's false-alarm rate (about 1 in 500 rows of the embedded pair went
# past it once, in 20 seeds of a correct sampler); a corrupt cache, position or mask stays corrupt,
# so a second round beyond it decides.
PERSISTS = 2


def analyse_sampled(trace: Trace, result: DecodeResult) -> Findings:
    """An audited sampled run: each sequence's first audited round beyond the yardstick and, where
    its target state departed, and stayed out in a later audited round, `forensics` naming what was
    wrong with it, from the watch's inspection of that row (result.forks); where the state held but
    the engine's own checks failed, the check that failed first. A sampled run has no reference to
    fork from: the fork is the first token that round emitted."""
    ys = trace.manifest.yardstick
    by_seq = rows_of(trace)
    found = Findings()
    for s in trace.sequences:
        rows, mine = by_seq.get(s.seq, []), found.of(s.seq)
        mine["audit_round"] = first_over(rows, "audit", ys.target.tolerance)
        draft = ys.draft and ys.draft.tolerance
        mine["audit_draft_round"] = first_over(rows, "audit_draft", draft)
        state, failed = result.forks.get(s.seq), failures(rows, None)
        if sum(r.audit is not None and r.audit > ys.target.tolerance for r in rows) < PERSISTS:
            state = None  # rounding: a correct row leaves it once in a few hundred rounds
        named = state is not None or failed
        mine["forensics"] = _state_verdict(s, rows, state, failed, ys.target) if named else None
    return found


def _state_verdict(s: SequenceRecord, rows: list[RowRecord], state, failed: dict[str, int],
                   rounding: Rounding) -> RunForensics:
    """The earliest evidence names it: the watched state's departure, or the engine's own check
    where that failed in an earlier round (a bonus token drawn from the draft leaves
    the state clean)."""
    checked = min(failed.values(), default=None)
    by_check = state is None or (checked is not None and checked < state.round)
    first_round = checked if by_check else state.round
    fork = sum(len(r.emitted) for r in rows if r.round < first_round)
    ev = RunForensics(verdict="unexplained", explanation="", fork=fork,
                      output_token=s.output_ids[fork] if fork < len(s.output_ids) else None,
                      failed_checks=failures(rows, first_round), tolerance=rounding.tolerance,
                      alpha=rounding.alpha, yardstick=rounding.describe())
    rec = next((r for r in rows if r.round == first_round), None)
    if rec is not None:
        ev.round, ev.row = rec.round, rec.row
    invariant = first_invariant(ev)
    first = (f" The first token drawn from that round is token {fork}; every later draw of this "
             "row rests on it.")
    if by_check:
        ev.verdict = f"sync-bug:{invariant}"
        later = ("every audited round of this sequence kept its target state within rounding of "
                 "a fresh batch-size-1 recomputation" if state is None else
                 f"its target state left rounding later, in round {state.round} (by "
                 f"{state.state_diff:.3g})")
        ev.explanation = (f"The engine's own check failed in round {first_round}: "
                          f"{EXPLAIN[invariant]}; {later}." + first)
        return ev
    fill_state(ev, state)
    ev.emitting_argmax = ev.margin_batched = None  # a sampled token is a draw, not an argmax
    logits = (f"In round {state.round} (batch row {state.row}) the target's verify logits for this "
              "sequence")
    corrupt(ev, rounding, invariant, logits)
    ev.explanation += failed_check_sentence(ev, invariant) + first
    return ev


def judge_sampled_run(trace: Trace) -> Findings:
    """The run's verdict (`sampled_verdict`), judged after every other judge of the run: None where
    there is no sampled run of ours to judge (greedy, not judged, or without rounds: reference
    decoders, engines seen from outside)."""
    found = _run_verdict(trace)
    verdict = found and SampledJudgement(verdict=found[0], explanation=found[1])
    return Findings(run={"sampled_verdict": verdict})


def with_sampled_verdict(trace: Trace) -> Trace:
    """A trace read from a file, its sampled run's verdict as stored; in one written before the
    verdict was stored (the trace layer cannot judge it on load), judged now from the same evidence
    it was judged from."""
    if trace.sampled_verdict is not None:
        return trace
    return judge_sampled_run(trace).record(trace)


def _run_verdict(trace: Trace) -> tuple[str, str] | None:
    """Which kind of fault the run shows, and why, from the state audit (each row's verify logits
    against a fresh batch-size-1 pass), the decision audit (each decision re-derived from its
    recorded p, q and draw) and the distribution test (PIT); the earliest corrupt state first."""
    d, audit = trace.distribution, trace.decisions
    if d is None or not trace.rows:
        return None
    corrupt_rows = sorted((s for s in trace.sequences if s.forensics),
                          key=lambda s: (s.forensics.round or 0, s.seq))
    mismatches = audit.mismatches if audit else 0
    audited = sum(r.audit is not None for r in trace.rows)
    rejected = d.verdict == "not the target's distribution"
    tokens = (f"the tokens are not the target's distribution (failing: {d.failing}, p = {d.p:.2g})"
              if rejected else f"the distribution test says {d.verdict}")
    decided = (f"{mismatches} of {audit.checked} accept/reject decisions do not follow the "
               "engine's own recorded p, q and draw u (accepted iff u < p/q)" if mismatches else
               "every accept/reject decision follows its recorded p, q and draw")
    n = len(trace.sequences)
    if corrupt_rows:
        f, s = corrupt_rows[0].forensics, corrupt_rows[0]
        return f.verdict, (
            f"The target state of {len(corrupt_rows)} of {n} sequences went wrong; the first, "
            f"sequence {s.seq}, in round {f.round} (batch row {f.row}): {f.verdict}. Every p the "
            f"sampler used after that rests on a corrupt state. Besides, {tokens}; {decided}.")
    if mismatches:
        states = (f"Every audited row's state held, and {tokens}." if audited else
                  f"The rows' states were not audited; {tokens}.")
        return "sampler-bug:decisions", (
            f"The sampler does not follow its own record: {decided}; the first at (round, row, "
            f"slot) {audit.first[0]}. " + states)
    if d.settings:
        f = d.settings[0]
        fit = "greedy decoding" if f.temperature == 0 else (
            f"temperature {f.temperature:g}, top-k {f.top_k}, top-p {f.top_p:g}")
        ratio = ("its own settings make one of its tokens impossible" if f.log_ratio is None else
                 f"e^{f.log_ratio:.0f} times likelier than under its own")
        return "decision-bug:settings", (
            f"{len(d.settings)} of {n} sequences were sampled with another request's settings: the "
            f"first, sequence {f.seq}, fits {fit} ({ratio}, beyond what chance gives any of the "
            f"settings). Besides, {tokens}; {decided}.")
    if audit and audit.stream_mismatches:
        return "decision-bug:stream", (
            f"{audit.stream_mismatches} of {audit.draws} recorded draws are not their row's own "
            "stream's (its request's seed, or the run's seed and its sequence, at its token); the "
            f"first at (round, seq, token) {audit.stream_first[0]}. Such a row's tokens depend on "
            f"its batch and schedule, whatever its distribution. Besides, {tokens}; {decided}.")
    drafts = trace.proposals
    if drafts and drafts.drawn_with:
        return "decision-bug:stream", (
            f"{drafts.draw_off} of {drafts.checked} decided drafts are not the draw their q gives "
            f"at their row's own draft draw, and every one is {drafts.drawn_with} draw at the "
            "same token (a fresh batch-size-1 pass of the draft model, beyond its "
            f"rounding); the first at (round, seq, slot) {drafts.first[0]}. One random number "
            "decided two things, which couples the draft with its own acceptance and biases the "
            f"output, though the decisions follow their record ({decided}). Besides, {tokens}.")
    if drafts and (drafts.q_off or drafts.draw_off):
        return "sampler-bug:proposal", (
            f"Of {drafts.checked} decided drafts, {drafts.q_off} carry a recorded q that is not "
            f"the draft model's own under the run's draft settings, and {drafts.draw_off} are not "
            "the draw that q gives at their row's own draft draw (a fresh batch-size-1 pass of "
            "the draft model, beyond its rounding); the first at (round, seq, slot) "
            f"{drafts.first[0]}. A draft decided by another q than the one it was drawn from "
            f"biases the output, though the decisions follow their record ({decided}). Besides, "
            f"{tokens}.")
    if not rejected:
        return d.verdict, (f"No fault found: {tokens}; {decided}" + (
            f"; all {audited} audited row states held." if audited else
            "; the rows' states were not audited."))
    if audited < len(trace.rows):
        which = (f"only {audited} of {len(trace.rows)} (round, row) states were" if audited else
                 "the rows' states were not")
        return "unexplained", (
            f"{tokens[0].upper()}{tokens[1:]} and {decided}, but {which} audited against a fresh "
            "batch-size-1 pass, so a corrupt state cannot be told from a wrong sampling rule. The "
            "missing evidence: run it again auditing every row (--audit with the batch size, or "
            "the page's audit box).")
    return "sampler-bug:rule", (
        "Every row's target state held within rounding of a fresh batch-size-1 recomputation, in "
        f"all {audited} (round, row) states, and {decided}, yet {tokens}: the sampler's rule is "
        "wrong, in what it computes from p and q (the acceptance ratio, the residual, the warping) "
        "or in its random streams.")
