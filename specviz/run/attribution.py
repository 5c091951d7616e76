"""Which bug is this? The mechanism behind another engine's fork, named from its tokens alone.

For a checked row whose fork the black-box judge (forensics/blackbox.py) did not put down to rounding, each
fault of the catalogue (spec/faults.py, the field casebook's among them) that fits the engine's declared method
is planted in specviz's engine (eqspec), which replays the row beside the prompts the engine ran it with (its
batch, or the requests sent beside it; alone where it declares none). A replay is watched round by round and
stopped at its first token that is not the engine's: up to there the faulted state has been fed the engine's own
tokens, so the replay is the engine's tokens teacher-forced through the faulted state. Its score is the engine's
tokens it writes from the fork on. The correct engine is replayed the same way.

Most of what a replay writes after the fork proves nothing: once past the fork token, any replay that computes
about right writes the target's own choices on the engine's prefix, as the engine did. The evidence is in the
engine's tokens that the correct target, teacher-forced on the engine's own prefix, would not write (beyond the
check's tolerance, or past where the reference stopped: departing()). A mechanism is named only when its replay
writes at least EVIDENCE of those more than the correct engine replayed the same way does (all the others where the
engine wrote fewer, never fewer than MIN_EVIDENCE), and no other writes more. docs/engines.md measures the threshold
on vLLM's and llama.cpp's controls. Where none is named, the report says so and gives what fresh float64 passes
at batch size 1 establish about the fork token.
"""
from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from specviz.decoding.decoders import Job, decode
from specviz.decoding.result import Progress
from specviz.forensics.enginenoise import truth_model
from specviz.forensics.recompute import fresh_logits
from specviz.models.architecture import is_recurrent, sliding_windows
from specviz.models.pairs import ModelPair
from specviz.spec.casebook import mechanism
from specviz.spec.faults import FAULTS, PRESETS
from specviz.spec.run import RunSpec, SpecError
from specviz.spec.verdicts import verdict
from specviz.trace.evidence import Attribution, Hypothesis
from specviz.trace.records import SequenceRecord
from specviz.trace.schema import Trace

EVIDENCE = 4  # tokens a named mechanism writes that the correct target, on the engine's prefix, would not
MIN_EVIDENCE = 2  # never fewer (where the engine wrote fewer such tokens, all of them): one may be rounding's
PARTIAL = 3  # single faults that wrote some tokens of unnamed rows, the most often first, paired for those rows
DECLARED = ("k", "drafter", "ngram_min", "ngram_max", "tree_width")  # engine settings a replay takes as they are


@dataclass(frozen=True)
class Replaying:
    """What a check knows of how the engine ran: the spec it was checked under, its prompts and declared
    settings, and its batch (the prompts it ran beside each other; 1: unknown or one at a time)."""

    spec: RunSpec
    pair: ModelPair
    prompt_ids: list[list[int]]
    settings: dict
    batch: int = 1


def forks_to_attribute(trace: Trace, every_fork: bool = False) -> list[int]:
    """The sequences whose fork is attributed: those the black-box judge did not put down to rounding (with
    `every_fork`, rounding's too: how the threshold is measured on correct engines), with the engine's own ids and
    a token of its at the fork (an engine that stopped early wrote nothing to attribute)."""
    return [s.seq for s in trace.sequences if s.forensics and s.first_divergence is not None and s.engine
            and not s.engine.error and not s.engine.approximate and s.first_divergence < len(s.engine.ids)
            and (every_fork or s.forensics.verdict != "numerics")]


def attribute(trace: Trace, replaying: Replaying, seqs: list[int], progress: Progress | None = None) -> None:
    """Attribute the forks of `seqs` (forks_to_attribute) and keep each finding on its sequence: the correct
    engine and every single fault first; then, for the rows none of them explains to the end, pairs of the (at
    most PARTIAL) faults that wrote some of such a row's departing tokens (pairs()), as a compound bug would."""
    if not seqs:
        return
    fits, skipped = candidates(replaying)
    tally = _Tally(trace, replaying, progress)
    for faults in ((), *fits):
        tally.replay(fits.get(faults) or replay_spec(replaying, faults), seqs)
    # An engine's bugs are its rows' too: the faults that wrote departing tokens of some row (more than the correct
    # engine), paired for every row that no single fault explains to its end.
    unfinished = [seq for seq in seqs if max(h.explained for h in tally.found[seq].values())
                  < len(trace.sequences[seq].engine.ids) - trace.sequences[seq].first_divergence]
    partial = Counter(h.faults[0] for seq in unfinished for h in tally.found[seq].values()
                      if h.beyond > tally.found[seq][()].beyond and len(h.faults) == 1 and h.faults[0] in FAULTS)
    for two in pairs([f for f, _ in partial.most_common(PARTIAL)], [f[0] for f in fits if f[0] in FAULTS]):
        with contextlib.suppress(SpecError):  # two faults the spec refuses together: not a hypothesis
            tally.replay(replay_spec(replaying, two), unfinished)
    for seq in seqs:
        trace.sequences[seq].attribution = judge(trace, replaying, seq, tally.found[seq], skipped, tally.replays[seq],
                                                 tally.seconds[seq])


def pairs(partial: list[str], singles: list[str]) -> list[tuple[str, ...]]:
    """The pairs worth a replay: the fault that wrote part of the most unnamed rows with every other single fault
    (its partner may have written nothing alone, hidden behind it), and the partial faults with each other."""
    if not partial:
        return []
    found = {tuple(sorted((partial[0], f))) for f in singles if f != partial[0]}
    return sorted(found | set(itertools.combinations(sorted(partial), 2)))


class _Tally:
    """Each forked row's replay under each hypothesis, and the replays (and seconds) spent on it. A replay in a
    batch follows every forked row of it at once, and stops once each has failed."""

    def __init__(self, trace: Trace, r: Replaying, progress: Progress | None):
        self.trace, self.r, self.progress = trace, r, progress
        self.found: dict[int, dict[tuple[str, ...], Hypothesis]] = defaultdict(dict)
        self.replays: dict[int, int] = defaultdict(int)
        self.seconds: dict[int, float] = defaultdict(float)

    def replay(self, spec: RunSpec, seqs: list[int]) -> None:
        for batch in layouts(seqs, len(self.r.prompt_ids), self.r.batch):
            start = time.perf_counter()
            forked = {seq: (self.trace.sequences[seq].engine.ids, self.trace.sequences[seq].first_divergence)
                      for seq in batch if seq in seqs}
            found = replay(self.r, spec, batch, forked)
            for seq, h in found.items():
                self.replays[seq] += 1
                self.seconds[seq] += (time.perf_counter() - start) / len(found)
                h.beyond = sum(departing(self.trace.sequences[seq])[: h.explained])
                self.found[seq][spec.faults] = h
            if self.progress:
                self.progress(1)


def candidates(r: Replaying) -> tuple[dict[tuple[str, ...], RunSpec], dict[str, str]]:
    """Every hypothesis that fits the engine's method, as the spec of its replay, and why each other was not
    tried. Single faults first, then the presets: the paper's re-creations of published implementations."""
    fits, skipped = {}, {}
    # what the engine's target and the check settle; the replay's spec validates the rest
    has = {"recurrent": is_recurrent(r.pair.target), "window": bool(sliding_windows(r.pair.target)),
           "penalty": r.spec.repetition_penalty != 1 or r.spec.presence_penalty != 0}
    for fault in (*(name for name, f in FAULTS.items() if f.changes_tokens), *PRESETS):
        why = FAULTS[fault].unfit_reason(has) if fault in FAULTS else None  # a preset: spec says
        if why is None:
            try:
                fits[(fault,)] = replay_spec(r, (fault,))
            except SpecError as e:
                why = str(e)
        if why:
            skipped[fault] = why
    return fits, skipped


def replay_spec(r: Replaying, faults: tuple[str, ...]) -> RunSpec:
    """The spec of a replay under `faults`: the check's, run by eqspec with the engine's declared settings."""
    declared = {f: r.settings[f] for f in DECLARED if r.settings.get(f) is not None}
    return RunSpec.build(**{**r.spec.model_dump(), **declared, "method": "eqspec", "faults": faults,
                            "batch_size": max(1, r.batch)})


def layouts(seqs: list[int], prompts: int, batch: int) -> list[list[int]]:
    """The batches the forked rows `seqs` are replayed in: where the engine ran prompts beside each other, each
    chunk of `batch` prompts in their order that holds some, as an engine that takes them in turn lays them out
    (a fault that acts on a row alone acts there too); else each row alone."""
    if batch <= 1 or prompts == 1:
        return [[seq] for seq in seqs]
    chunks = sorted({seq // batch for seq in seqs})
    return [list(range(c * batch, min((c + 1) * batch, prompts))) for c in chunks]


def departing(s: SequenceRecord) -> list[bool]:
    """Per engine token from the fork on: one the correct engine would not write, teacher-forced on the engine's
    own prefix: beyond the tolerance below the target's own choice (the check's gaps, in float64), or, where the
    fork is the reference's stop, every one (a correct engine writes nothing there). The rest, the target's own
    choices, any replay that reached them writes too."""
    tolerance = s.forensics.tolerance or 0.0
    gaps = s.gaps or []
    past_stop = s.first_divergence >= len(s.reference_ids or [])  # the engine went on where the reference stopped
    return [past_stop or (j < len(gaps) and gaps[j] > tolerance) for j in range(s.first_divergence, len(s.engine.ids))]


def threshold_of(s: SequenceRecord, correct: Hypothesis) -> int:
    """The departing tokens (departing()) a mechanism must write beyond those the correct engine's replay writes
    (batch-dependent rounding may tip a near-tie as the engine's did) to be named: EVIDENCE, or all the others
    where the engine wrote fewer, and never fewer than MIN_EVIDENCE."""
    return max(MIN_EVIDENCE, min(EVIDENCE, sum(departing(s)) - correct.beyond))


def judge(trace: Trace, r: Replaying, seq: int, best: dict[tuple[str, ...], Hypothesis], skipped: dict[str, str],
          replays: int, seconds: float) -> Attribution:
    """One forked row's attribution from each hypothesis's best replay: ranked, and named beyond the threshold."""
    s = trace.sequences[seq]
    best = dict(best)
    correct = best.pop(())
    # a pair is a hypothesis only where it writes more than each of its faults alone
    best = {faults: h for faults, h in best.items() if len(faults) < 2 or
            all(h.beyond > best[(f,)].beyond for f in faults if (f,) in best)}
    fork, tokens, threshold = s.first_divergence, len(s.engine.ids) - s.first_divergence, threshold_of(s, correct)
    ranked = sorted(best.values(), key=lambda h: (-h.beyond, -h.explained, len(h.companions), len(h.faults)))
    top = ranked[0].beyond if ranked else 0
    for h in ranked:
        h.named = h.beyond == top and h.beyond - correct.beyond >= threshold
    named = [h for h in ranked if h.named]
    a = Attribution(fork=fork, tokens=tokens, departing=[fork + j for j, d in enumerate(departing(s)) if d],
                    threshold=threshold, correct=correct, hypotheses=ranked, skipped=skipped, replays=replays,
                    seconds=seconds, explanation="", facts=[] if named else facts(trace, r, seq))
    a.explanation = explain(a, named, verdict(s.forensics.verdict).bug)
    return a


class _Departed(Exception):
    """A replay wrote a token the engine did not, or every one the engine wrote: it stops there."""


class _Follow:
    """A watch (decoding/round.py hears it each round) on a replay's forked rows, each against the engine's
    tokens: it stops the replay once every one has written a token the engine did not, or all the engine's."""

    def __init__(self, rows: dict[int, tuple[list[int], int]]):
        self.rows = rows  # batch row -> (the engine's tokens, its fork)
        self.rounds = 0
        self.ids: dict[int, list[int]] = {row: [] for row in rows}
        self.failed_at: dict[int, int | None] = {}  # the rows done: their first token not the engine's (None: none)
        self.acted: dict[int, tuple[int, int]] = {}  # row -> (round, slot) of the replay's token at the fork

    def start(self) -> None:
        pass

    def end(self, seqs: list[int], gen: dict, slots=None) -> None:  # (slots: the watch protocol's, unused here)
        self.rounds += 1
        for row, (engine, fork) in self.rows.items():
            if row in self.failed_at:
                continue
            if row not in seqs:  # it finished where the engine went on
                self.failed_at[row] = len(self.ids[row])
                continue
            ids, have = gen[row].ids, len(self.ids[row])
            self.ids[row] = list(ids)
            if have <= fork < len(ids) and fork < len(engine) and ids[fork] == engine[fork]:
                self.acted[row] = (self.rounds - 1, fork - have)
            wrong = next((j for j in range(have, len(ids)) if j >= len(engine) or ids[j] != engine[j]), None)
            if wrong is not None or len(ids) == len(engine):
                self.failed_at[row] = wrong
        if len(self.failed_at) == len(self.rows):
            raise _Departed


def replay(r: Replaying, spec: RunSpec, batch: list[int], forks: dict[int, tuple[list[int], int]]) -> dict[int, Hypothesis]:
    """Replay `batch` (sequence numbers) under `spec` and score each forked row of it (seq -> (the engine's
    tokens, its fork)) on the engine's tokens."""
    follow = _Follow({batch.index(seq): engine_fork for seq, engine_fork in forks.items()})
    try:
        out = decode(Job(spec, r.pair, [r.prompt_ids[i] for i in batch], record=False, watch=follow)).outputs
    except _Departed:
        out = None
    found = {}
    for seq, (engine, fork) in forks.items():
        row = batch.index(seq)
        ids = follow.ids[row] if out is None else out[row].ids
        failed = follow.failed_at[row] if row in follow.failed_at else (None if ids == engine else len(ids))
        end = len(engine) if failed is None else failed
        round_, slot = follow.acted.get(row, (None, None))
        found[seq] = Hypothesis(faults=spec.faults, companions=[i for i in batch if i != seq],
                                explained=max(0, end - fork), failed_at=failed, replay_ids=ids[: end + 1],
                                round=round_, slot=slot)
    return found


def facts(trace: Trace, r: Replaying, seq: int) -> list[str]:
    """What fresh passes at batch size 1 (the target in float64 where it has a float64 copy, the draft in its own
    dtype) establish about a fork no hypothesis explains: which context, or which model or row, the engine's fork
    token is the choice of."""
    s = trace.sequences[seq]
    prompt, out, f = r.prompt_ids[seq], s.engine.ids, s.first_divergence
    token = out[f]
    model, truth = truth_model(r.pair)
    found = []
    if f > 0 and int(fresh_logits(model, prompt + out[: f - 1], 1, r.pair.vocab_size)[0].argmax()) == token:
        found.append(f"The fork token {token} is the target's choice ({truth}) over a context missing the token "
                     f"before it ({out[f - 1]}): as if the last accepted token had not been fed.")
    if int(fresh_logits(r.pair.draft, prompt + out[:f], 1, r.pair.vocab_size)[0].argmax()) == token:
        found.append(f"The fork token {token} is the draft model's own choice on the same prefix: a draft written "
                     "where the target's token belongs.")
    others = [o.seq for o in trace.sequences if o.seq != seq and o.reference_ids and len(o.reference_ids) > f
              and o.reference_ids[f] == token]
    if others:
        found.append(f"The fork token {token} is the reference's token {f} of prompt{'s' * (len(others) > 1)} "
                     f"{', '.join(map(str, others))}: another row's.")
    return found or [f"The fork token {token} is not the target's choice over the context missing the token before "
                     "it, nor the draft model's, nor another prompt's at the same index."]


def explain(a: Attribution, named: list[Hypothesis], judged_bug: bool) -> str:
    """The finding in words (`judged_bug`: the black-box judge called the fork a bug; else it could not decide)."""
    correct = f"the correct engine, replayed the same way, writes {a.correct.beyond} of them"
    departing = f"the {len(a.departing)} the target itself would not write on the engine's prefix"
    if named:
        h = named[0]
        where = "alone" if not h.companions else f"beside prompts {', '.join(map(str, h.companions))}"
        rest = "all of them" if h.failed_at is None else f"first failing token {h.failed_at}"
        also = f" Indistinguishable by these tokens: {', '.join('+'.join(x.faults) for x in named[1:])}." \
            if len(named) > 1 else ""
        return (f"{mechanism(h.faults)}. Replayed {where}, it writes the engine's tokens {a.fork}-"
                f"{a.fork + h.explained - 1} ({h.explained} of the {a.tokens} after the fork, {rest}), {h.beyond} of "
                f"{departing}; {correct}.{also}")
    tried = f"{len(a.hypotheses)} mechanisms of the catalogue tried in {a.replays} replays"
    best = a.hypotheses[0] if a.hypotheses else None
    if best and best.beyond > a.correct.beyond:
        return (f"Too little evidence to name a mechanism: the closest, {'+'.join(best.faults)}, writes {best.beyond} "
                f"of {departing}, and naming one needs {a.threshold} more than the correct engine's ({tried}; "
                f"{correct}). Missing evidence: more "
                "of the engine's tokens after the fork (a larger token budget), or more prompts that fork.")
    if judged_bug:
        return f"A bug outside the casebook: no mechanism writes the engine's departing tokens ({tried}; {correct})."
    return (f"No mechanism of the catalogue writes the engine's departing tokens ({tried}; {correct}): if this fork "
            "is a bug, it is one outside the casebook; the verdict above says what is missing to decide whether it "
            "is one.")
