"""Which bug is this? The replays that name the mechanism of another engine's fork, from its tokens.

For a checked row whose fork the black-box judge (forensics/blackbox.py) did not put down to
rounding, each fault of the catalogue (spec/faults.py, the field casebook's among them) that fits
the engine's declared method is planted in specviz's engine (eqspec), which replays the row beside
the prompts the engine ran it with (its batch, or the requests sent beside it; alone where it
declares none). A replay is watched round by round and stopped at its first token that is not the
engine's: up to there the faulted state has been fed the engine's own tokens, so the replay is the
engine's tokens teacher-forced through the faulted state. The correct engine is replayed the same
way. The replays go to the judge as data (forensics/attribution.py), which scores them and names a
mechanism, or says why none is named.
"""
from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from specviz.decoding.decoders import Job, decode_job
from specviz.decoding.result import Progress
from specviz.forensics.attribution import Replay, evidence, judge_replays
from specviz.models.architecture import is_recurrent, sliding_windows
from specviz.models.pairs import ModelPair
from specviz.spec.faults import FAULTS, FAULT_PRESETS
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace.findings import Findings
from specviz.trace.schema import Trace

# single faults that wrote some tokens of unnamed rows, the most often first, paired for those rows
PARTIAL = 3
# engine settings a replay takes as they are
DECLARED = ("k", "drafter", "ngram_min", "ngram_max", "tree_width")


@dataclass(frozen=True)
class Replaying:
    """What a check knows of how the engine ran: the spec it was checked under, its prompts and
    declared settings, and its batch (the prompts it ran beside each other; 1: unknown or one
    at a time)."""

    spec: RunSpec
    pair: ModelPair
    prompt_ids: list[list[int]]
    settings: dict
    batch: int = 1


def forks_to_attribute(trace: Trace, every_fork: bool = False) -> list[int]:
    """The sequences whose fork is attributed: those the black-box judge did not put down to
    rounding (with `every_fork`, rounding's too: how the threshold is measured on correct engines),
    with the engine's own ids and a token of its at the fork (an engine that stopped early wrote
    nothing to attribute)."""
    return [s.seq for s in trace.sequences if s.forensics and s.first_divergence is not None
            and s.engine
            and not s.engine.error and not s.engine.approximate
            and s.first_divergence < len(s.engine.ids)
            and (every_fork or s.forensics.verdict != "numerics")]


def attribute(trace: Trace, replaying: Replaying, seqs: list[int],
              progress: Progress | None = None) -> Findings:
    """The forks of `seqs` (forks_to_attribute) replayed, and each row's `attribution` as the judge
    finds it: the correct engine and every single fault first; then, for the rows none of them
    explains to the end, pairs of the (at most PARTIAL) faults that wrote some of such a row's
    departing tokens (pairs()), as a compound bug would."""
    if not seqs:
        return Findings()
    fits, skipped = candidates(replaying)
    tally = _Tally(trace, replaying, progress)
    for faults in ((), *fits):
        tally.replay(fits.get(faults) or replay_spec(replaying, faults), seqs)
    # An engine's bugs are its rows' too: the faults that wrote departing tokens of some row (more
    # than the correct engine), paired for every row that no single fault explains to its end.
    unfinished = [seq for seq in seqs if max(h.explained for h in tally.found[seq].values())
                  < len(trace.sequences[seq].engine.ids) - trace.sequences[seq].first_divergence]
    partial = Counter(h.faults[0] for seq in unfinished for h in tally.found[seq].values()
                      if tally.beyond(h) > tally.beyond(tally.found[seq][()]) and len(h.faults) == 1
                      and h.faults[0] in FAULTS)
    for two in pairs([f for f, _ in partial.most_common(PARTIAL)],
                     [f[0] for f in fits if f[0] in FAULTS]):
        # two faults the spec refuses together: not a hypothesis
        with contextlib.suppress(SpecError):
            tally.replay(replay_spec(replaying, two), unfinished)
    return judge_replays(trace, tally.replays, skipped, replaying.pair, replaying.prompt_ids)


def pairs(partial: list[str], singles: list[str]) -> list[tuple[str, ...]]:
    """The pairs worth a replay: the fault that wrote part of the most unnamed rows with every other
    single fault (its partner may have written nothing alone, hidden behind it), and the partial
    faults with each other."""
    if not partial:
        return []
    found = {tuple(sorted((partial[0], f))) for f in singles if f != partial[0]}
    return sorted(found | set(itertools.combinations(sorted(partial), 2)))


class _Tally:
    """Every replay of the forked rows, and each row's latest under each hypothesis. A replay in a
    batch follows every forked row of it at once, and stops once each has failed."""

    def __init__(self, trace: Trace, r: Replaying, progress: Progress | None):
        self.trace, self.r, self.progress = trace, r, progress
        self.replays: list[Replay] = []
        self.found: dict[int, dict[tuple[str, ...], Replay]] = defaultdict(dict)

    def replay(self, spec: RunSpec, seqs: list[int]) -> None:
        for batch in layouts(seqs, len(self.r.prompt_ids), self.r.batch):
            forked = {seq: (self.trace.sequences[seq].engine.ids,
                            self.trace.sequences[seq].first_divergence)
                      for seq in batch if seq in seqs}
            for seq, h in replay_batch(self.r, spec, batch, forked).items():
                self.replays.append(h)
                self.found[seq][spec.faults] = h
            if self.progress:
                self.progress(1)

    def beyond(self, h: Replay) -> int:
        """The judge's evidence in replay `h`: the departing tokens it wrote."""
        return evidence(self.trace.sequences[h.seq], h.explained)


def candidates(r: Replaying) -> tuple[dict[tuple[str, ...], RunSpec], dict[str, str]]:
    """Every hypothesis that fits the engine's method, as the spec of its replay, and why each other
    was not tried. Single faults first, then the presets: the paper's re-creations
    of published implementations."""
    fits, skipped = {}, {}
    # what the engine's target and the check settle; the replay's spec validates the rest
    has = {"recurrent": is_recurrent(r.pair.target), "window": bool(sliding_windows(r.pair.target)),
           "penalty": r.spec.repetition_penalty != 1 or r.spec.presence_penalty != 0,
           "grammar": r.spec.json_schema is not None, "reasoning": r.spec.reasoning_end is not None}
    for fault in (*(name for name, f in FAULTS.items() if f.changes_tokens), *FAULT_PRESETS):
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
    """The spec of a replay under `faults`: the check's, run by eqspec with the engine's
    declared settings."""
    declared = {f: r.settings[f] for f in DECLARED if r.settings.get(f) is not None}
    return RunSpec.build(**{**r.spec.model_dump(), **declared, "method": "eqspec", "faults": faults,
                            "batch_size": max(1, r.batch)})


def layouts(seqs: list[int], prompts: int, batch: int) -> list[list[int]]:
    """The batches the forked rows `seqs` are replayed in: where the engine ran prompts beside each
    other, each chunk of `batch` prompts in their order that holds some, as an engine that takes
    them in turn lays them out (a fault that acts on a row alone acts there too); else each
    row alone."""
    if batch <= 1 or prompts == 1:
        return [[seq] for seq in seqs]
    chunks = sorted({seq // batch for seq in seqs})
    return [list(range(c * batch, min((c + 1) * batch, prompts))) for c in chunks]


class _Departed(Exception):
    """A replay wrote a token the engine did not, or every one the engine wrote: it stops there."""


class _Follow:
    """A watch (decoding/round.py hears it each round) on a replay's forked rows, each against the
    engine's tokens: it stops the replay once every one has written a token the engine did not, or
    all the engine's."""

    def __init__(self, rows: dict[int, tuple[list[int], int]]):
        self.rows = rows  # batch row -> (the engine's tokens, its fork)
        self.rounds = 0
        self.ids: dict[int, list[int]] = {row: [] for row in rows}
        # the rows done: their first token not the engine's (None: none)
        self.failed_at: dict[int, int | None] = {}
        # row -> (round, slot) of the replay's token at the fork
        self.acted: dict[int, tuple[int, int]] = {}

    def start(self) -> None:
        pass

    # (slots: the watch protocol's, unused here)
    def end(self, seqs: list[int], gen: dict, slots=None) -> None:
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
            wrong = next((j for j in range(have, len(ids)) if j >= len(engine)
                          or ids[j] != engine[j]), None)
            if wrong is not None or len(ids) == len(engine):
                self.failed_at[row] = wrong
        if len(self.failed_at) == len(self.rows):
            raise _Departed


def replay_batch(r: Replaying, spec: RunSpec, batch: list[int],
                 forks: dict[int, tuple[list[int], int]]) -> dict[int, Replay]:
    """Replay `batch` (sequence numbers) under `spec` and follow each forked row of it (seq -> (the
    engine's tokens, its fork)) on the engine's tokens; each gets its share of the seconds."""
    start = time.perf_counter()
    follow = _Follow({batch.index(seq): engine_fork for seq, engine_fork in forks.items()})
    try:
        out = decode_job(Job(spec, r.pair, [r.prompt_ids[i] for i in batch], record=False,
                             watch=follow)).outputs
    except _Departed:
        out = None
    found = {}
    for seq, (engine, fork) in forks.items():
        row = batch.index(seq)
        ids = follow.ids[row] if out is None else out[row].ids
        failed = (follow.failed_at[row] if row in follow.failed_at
                  else (None if ids == engine else len(ids)))
        end = len(engine) if failed is None else failed
        round_, slot = follow.acted.get(row, (None, None))
        seconds = (time.perf_counter() - start) / len(forks)
        found[seq] = Replay(seq=seq, faults=spec.faults, companions=[i for i in batch if i != seq],
                            explained=max(0, end - fork), failed_at=failed,
                            replay_ids=ids[: end + 1], round=round_, slot=slot, seconds=seconds)
    return found
