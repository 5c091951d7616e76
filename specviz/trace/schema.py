"""The Trace: the one contract between the engine and everything after it.

A manifest (the run and where it ran), the prompts with their ids, one record per (round, row), one
per round, one per sequence (records.py), and the evidence of their verdicts (evidence.py). Pydantic
defines it, validates uploads and emits the JSON Schema (docs/trace.schema.json); older versions are
lifted on load (migrations.py). Building one from a decode is decoding/recording.py's: this package
needs neither torch nor the models, so a trace file loads and validates with pydantic
and orjson alone.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from specviz.spec.run import RunSpec
from specviz.spec.strict import Many, Map, SpecError, Strict, describe_validation_error
from specviz.spec.untrusted import parse_file, shown
from specviz.trace.evidence import (Acceptance, Decisions, Determinism, Distribution, Fidelity,
                                    Proposals, Rejections, SampledJudgement)
from specviz.trace.migrations import MIGRATIONS, SCHEMA_VERSION
from specviz.trace.records import (EngineInfo, PromptRecord, RoundRecord, RowRecord, SequenceRecord,
                                   check_sequence)
from specviz.trace.yardsticks import Yardsticks

MAX_TRACE_BYTES = 64 * 2**20
FINGERPRINT = "[0-9a-f]{16}"  # also a file name (serving.save): nothing else may pass


class HeadFacts(Strict):
    """What a published head (the eagle3 drafter's) drafted from: the target layers it heard, and
    whether its config named them or the engines' default stood in; its draft vocabulary."""
    aux_layers: Many[int]
    fell_back: bool  # its config names no aux layers: the engines' default (2, L/2, L-3)
    draft_vocab: int = Field(ge=1)
    vocab: int = Field(ge=1)  # the target's
    # the share of the tokens this run wrote that the draft vocabulary holds (None: none written)
    coverage: float | None = Field(None, ge=0, le=1)
    variants: Many[str] = []  # the published variants it turns on (norm_before_fc...)

    def describe(self) -> str:
        layers = ", ".join(map(str, self.aux_layers))
        said = ("the engines' default: its config names none" if self.fell_back
                else "named by its config")
        held = ("" if self.coverage is None
                else f", holding {self.coverage:.1%} of the tokens written")
        return (f"EAGLE-3 head: aux layers {layers} ({said}); draft vocabulary {self.draft_vocab} "
                f"of {self.vocab} ids{held}"
                + (f"; variants {', '.join(self.variants)}" if self.variants else ""))


class PoolRecord(Strict):
    """One model's block pool over a paged run (decoding/paging.py), counted in blocks."""
    model: Literal["target", "draft"]  # the target's, or the drafter's (a draft model or head)
    blocks: int = Field(ge=0)  # handed out at the most
    lookups: int = Field(ge=0)  # fresh rows' full prompt blocks looked up in the prefix cache
    hits: int = Field(ge=0)  # of those, found
    copies: int = Field(ge=0)  # copied before a write (copy-on-write)
    moved: int = Field(ge=0)  # slots a realignment copied into place (a tree's accepted path)
    evicted: int = Field(ge=0)  # registered blocks whose room a miss took
    # a hybrid's: registered blocks given its recurrent states after them, and fresh rows whose
    # states a hit's block gave (decoding/boundarystates.py)
    states_saved: int = Field(default=0, ge=0)
    states_restored: int = Field(default=0, ge=0)

    def describe(self) -> str:
        hits = (f", prefix cache {self.hits} of {self.lookups} blocks hit" if self.lookups
                else "")
        states = (f", recurrent states kept with {self.states_saved} blocks and started from "
                  f"by {self.states_restored} requests" if self.states_saved else "")
        return f"{self.model}: {self.blocks} blocks{hits}{states}, {self.copies} copied on write"


class Paging(Strict):
    """How a paged run laid out its caches, and what its pools did."""
    block_size: int = Field(ge=1)
    prefix_caching: bool
    pools: Many[PoolRecord]

    def describe(self) -> str:
        return (f"paged KV, blocks of {self.block_size} tokens"
                + (" with prefix caching" if self.prefix_caching else "") + ": "
                + "; ".join(p.describe() for p in self.pools))


class Manifest(Strict):
    spec: RunSpec
    pair: Map[str, str | None]
    head: HeadFacts | None = None  # runs drafting with a published head
    paging: Paging | None = None  # runs whose caches were paged
    versions: Map[str, str]
    device: str
    device_name: str
    deterministic: Map[str, bool]
    created: str
    decode_seconds: float = Field(ge=0)  # 0: not known (an engine's outputs file)
    reference_seconds: float | None = None
    # None: no reference was decoded beside the run (or nothing to measure)
    yardstick: Yardsticks | None = None
    # engine checks: how far the engine, and its control, depart from the model
    fidelity: Many[Fidelity] = []
    engine: EngineInfo | None = None  # engine checks: the engine under test, as it described itself
    control: EngineInfo | None = None  # and its run without speculation, when given
    # engine checks asked to: the same prompts asked again, compared
    determinism: Determinism | None = None
    # hash of the spec and every decision: equal fingerprints, equal runs
    fingerprint: str = Field(pattern=f"^{FINGERPRINT}$")


class Trace(Strict):
    schema_version: Literal[10] = SCHEMA_VERSION
    manifest: Manifest
    prompts: Many[PromptRecord]
    rounds: Many[RoundRecord]
    rows: Many[RowRecord]
    sequences: Many[SequenceRecord]
    vocab: Map[int, str] = {}  # each token id's own text, so a trace reads without its tokenizer
    # sampled runs: are the tokens drawn from the target's distribution?
    distribution: Distribution | None = None
    decisions: Decisions | None = None  # sampled speculative runs: the decision audit
    # sampled runs of ours with rounds, judged: the run's verdict (None in older traces: not stored)
    sampled_verdict: SampledJudgement | None = None
    # greedy runs with a draft model: were the drafts the drafter's own?
    acceptance: Acceptance | None = None
    # greedy runs with rounds (ours, or an engine's as it reported them): did a round refuse a
    # draft the target chose?
    rejections: Rejections | None = None
    proposals: Proposals | None = None  # audited sampled runs with a draft model

    @model_validator(mode="after")
    def _consistent(self) -> Trace:
        """What the views rely on beyond types: records numbered in order, rows that match
        their rounds."""
        n = len(self.sequences)
        if ([p.seq for p in self.prompts] != list(range(n))
                or [s.seq for s in self.sequences] != list(range(n))):
            raise ValueError("prompts and sequences must be numbered 0, 1, 2, … in order, one of "
                             "each per prompt")
        for s in self.sequences:
            check_sequence(s)
        if [rd.round for rd in self.rounds] != list(range(len(self.rounds))):
            raise ValueError("rounds must be numbered 0, 1, 2, … in order")
        by_round = defaultdict(list)
        for r in self.rows:
            k = len(r.draft_tokens)
            # the sources it implies, built within bounds even when it is out of them
            a = min(max(r.accepted, 0), k)
            sources = (["draft"] * a + ["bonus" if a == k else "correction"])[: len(r.emitted)]
            drawn = (r.target_draft_probs, r.accept_draws)
            if not (len(r.draft_probs) == k
                    and len(r.target_tokens) == len(r.target_probs) == len(r.target_margins)
                    == k + 1 and a == r.accepted and len(r.emitted) == len(r.sources)
                    and r.sources == sources
                    and all(d is None or len(d) == k for d in drawn)):
                raise ValueError(f"round {r.round}, row {r.row}: its lists do not fit its {k} "
                                 "drafts")
            by_round[r.round].append((r.row, r.seq))
        for rd in self.rounds:
            if (by_round.pop(rd.round, []) != list(enumerate(rd.seqs))
                    or not all(0 <= q < n for q in rd.seqs)):
                raise ValueError(f"round {rd.round}: its rows are not one per sequence it lists")
        if by_round:
            raise ValueError(f"rows of rounds that are not recorded: {sorted(by_round)[:5]}")
        return self

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, data: str | bytes) -> Trace:
        """Parse and validate a trace file; every problem becomes one readable SpecError."""
        raw = parse_file(data, "trace file", MAX_TRACE_BYTES)
        found = raw.get("schema_version") if isinstance(raw, dict) else None
        if type(found) is not int or found not in MIGRATIONS and found != SCHEMA_VERSION:
            known = " or ".join(map(str, [*MIGRATIONS, SCHEMA_VERSION]))
            raise SpecError(f"not a specviz trace of schema version {known} (found {shown(found)})")
        try:
            while raw["schema_version"] != SCHEMA_VERSION:
                raw = MIGRATIONS[raw["schema_version"]](raw)
            return cls.model_validate(raw)
        except ValidationError as e:
            raise SpecError("invalid trace: " + describe_validation_error(e)) from None


def trace_schema() -> dict:
    return Trace.model_json_schema()
