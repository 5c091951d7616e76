"""A sweep: one base run across methods × drafters × fault sets × batch sizes × k × temperatures,
and its report.

The report (`specviz verify --json`, the page's Sweep tab) keeps each run's summary row and every
sequence, not the runs' traces: enough to say where equivalence breaks, how early and how, and to
rerun any one run from its spec. Plain data: it loads and validates without torch.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from specviz.spec.defaults import default_of
from specviz.spec.drafters import DEFAULT_DRAFTER, DRAFTER_OPTIONS, DRAFTERS
from specviz.spec.methods import METHODS, grid
from specviz.spec.run import SAMPLING_FIELDS, RunSpec
from specviz.spec.strict import Many, Map, SpecError, Strict, describe_validation_error
from specviz.spec.untrusted import parse_file, shown
from specviz.trace import metrics
from specviz.trace.evidence import Decisions, Distribution
from specviz.trace.records import SequenceRecord, check_sequence
from specviz.trace.schema import MAX_TRACE_BYTES, Trace

# 2: a temperature axis (a version-1 report ran every run at its base's temperature)
REPORT_VERSION = 2
NO_FAULTS = "none"  # the fault set with no faults, as the CLI and the page name it
MAX_RUNS = 4096
# what each run sets; the base the rest
AXES = ("method", "drafter", "faults", "batch_size", "k", "temperature")
# the Sweep's, in AXES' order
AXIS_FIELDS = ("methods", "drafters", "fault_sets", "batch_sizes", "ks", "temperatures")


def _placed(method: str, drafter: str, faults: tuple[str, ...], batch_size: int, k: int,
            temperature: float) -> dict:
    """A run's place in the sweep as its row and sequences show it: "-" for the drafter of a method
    that drafts nothing, the faults comma-joined ("" for none)."""
    return {"method": method, "drafter": drafter if METHODS[method].speculative else "-",
            "faults": ",".join(faults), "batch_size": batch_size, "k": k,
            "temperature": temperature}


def _label(method: str, drafter: str, faults: str) -> str:
    """A run's row in a sweep (placed): the method, the drafter where it is not the draft model,
    the faults."""
    return " · ".join(x for x in (method, drafter not in (DEFAULT_DRAFTER, "-") and drafter, faults)
                      if x)


def _column(batch_size: int, k: int, temperature: float) -> str:
    """A run's column in a sweep: bs 4 · k 5, and its temperature where it samples (· T 0.8)."""
    return f"bs {batch_size} · k {k}" + (f" · T {temperature:g}" if temperature else "")


def run_name(spec: RunSpec) -> str:
    """A run's name as a sweep's row names it (RunRow.name): eqspec · bsp-like · bs 4 · k 5."""
    place = _placed(**{a: getattr(spec, a) for a in AXES})
    label = _label(place["method"], place["drafter"], place["faults"])
    return f"{label} · {_column(spec.batch_size, spec.k, spec.temperature)}"


class Sweep(Strict):
    """What a sweep is: one base spec and its axes. The base's own method, drafter, faults, batch
    size, k and temperature are placeholders; each run sets them (spec_of, specs). The base samples
    at the highest temperature swept, so that its sampling settings (top-p, ...) validate; the
    greedy runs leave them out.

    Or a listed sweep (`listed`): its runs, each the base with some fields set, in place of the
    axes' grid, and its axes the values they take. The field casebook is one: its cases differ in
    pair and drafter, which no axis sweeps, and every combination of its faults and settings would
    be runs of no case."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base: RunSpec
    methods: tuple[Literal[tuple(METHODS)], ...] = Field(min_length=1)
    drafters: tuple[Literal[tuple(DRAFTERS)], ...] = Field((DEFAULT_DRAFTER,), min_length=1)
    fault_sets: tuple[tuple[str, ...], ...] = Field(((),), min_length=1)  # (): no faults
    batch_sizes: tuple[int, ...] = Field(min_length=1)
    ks: tuple[int, ...] = Field(min_length=1)
    temperatures: tuple[float, ...] = Field((0.0,), min_length=1)
    # a listed sweep's runs: spec fields over the base's; (): the axes' grid
    runs: tuple[Map[str, Any], ...] = ()
    _specs: list[RunSpec] = PrivateAttr()

    @classmethod
    def listed(cls, base: RunSpec, runs: Iterable[dict]) -> Sweep:
        """The sweep of these runs, each `base` with its fields set, in this order (the fields kept
        as JSON has them, as a link brings them back)."""
        specs = [(RunSpec.build(**{**base.model_dump(), **fields}), fields) for fields in runs]
        axes = {name: tuple(dict.fromkeys(getattr(s, a) for s, _ in specs))
                for name, a in zip(AXIS_FIELDS, AXES)}
        return cls.build(base=base,
                         runs=tuple({f: s.model_dump(mode="json", include={f})[f] for f in fields}
                                    for s, fields in specs),
                         **axes)

    @model_validator(mode="after")
    def _runs(self) -> Sweep:
        """Every run validates as a spec; the specs are kept, as every view of the report asks
        for them."""
        axes = {name: getattr(self, name) for name in AXIS_FIELDS}
        for name, values in axes.items():
            twice = next((v for v, n in Counter(values).items() if n > 1), None)
            if twice is not None:
                raise ValueError(f"{name} lists "
                                 f"{shown(list(twice) if name == 'fault_sets' else twice)} twice")
        # before any spec is built: a stranger's axes may be long
        bound = len(self.runs) if self.runs else math.prod(map(len, axes.values()))
        if bound > MAX_RUNS:
            raise ValueError(f"up to {bound} runs; a sweep makes {MAX_RUNS} at most")
        if self.runs:
            self._specs = [self._listed(i, fields, axes) for i, fields in enumerate(self.runs)]
            places = Counter(tuple(_placed(**c).values()) for c in self.configs())
            twice = next((place for place, n in places.items() if n > 1), None)
            if twice is not None:  # each run has a cell of its own in the heatmap
                raise ValueError("two runs at "
                                 f"{', '.join(f'{a} {v!r}' for a, v in zip(AXES, twice))}")
            return self
        self._specs = [self._spec(i, c) for i, c in enumerate(self.configs())]
        if not self._specs:
            raise ValueError("no runs: none of these methods runs at these batch sizes and "
                             "temperatures")
        return self

    def _spec(self, run: int, config: dict) -> RunSpec:
        fields = {**self.base.model_dump(), **config}
        # a drafter's options (the lookup's n-gram sizes) are its own: other drafters' runs leave
        # them out
        fields.update({f: default_of(f) for f in DRAFTER_OPTIONS
                       if f not in DRAFTERS[config["drafter"]].options})
        # and sampling settings the sampled runs': the greedy ones leave them out
        if not config["temperature"]:
            fields.update({f: default_of(f) for f in SAMPLING_FIELDS})
        try:
            return RunSpec.build(**fields)
        except SpecError as e:
            raise ValueError(f"run {run} "
                             f"({', '.join(f'{a} {config[a]}' for a in AXES)}): {e}") from None

    def _listed(self, run: int, fields: dict, axes: dict) -> RunSpec:
        """A listed run: the base with `fields` set; as many prompts as the base (a report's
        sequences are counted by them), and its place on the axes."""
        try:
            spec = RunSpec.build(**{**self.base.model_dump(), **fields})
        except SpecError as e:
            raise ValueError(f"run {run}: {e}") from None
        if len(spec.prompts) != len(self.base.prompts):
            raise ValueError(f"run {run} asks {len(spec.prompts)} prompts and its base "
                             f"{len(self.base.prompts)}: a sweep's runs ask as many each")
        for name, a in zip(AXIS_FIELDS, AXES):
            if getattr(spec, a) not in axes[name]:
                raise ValueError(f"run {run}'s {a} {getattr(spec, a)!r} is not on the sweep's "
                                 f"{name}")
        return spec

    def configs(self) -> list[dict]:
        """Each run's own spec fields (AXES): a listed sweep's in its order, the grid's in
        methods.grid order."""
        if self.runs:
            return [{a: getattr(s, a) for a in AXES} for s in self._specs]
        return grid(list(self.methods), list(self.drafters), list(self.batch_sizes), list(self.ks),
                    self.fault_sets, self.temperatures)

    def specs(self) -> list[RunSpec]:
        return list(self._specs)

    def size(self) -> int:
        return len(self._specs)


class RunRow(Strict):
    """One run's summary: where it sits in the sweep, how it compares with the reference, and how
    its drafts fared."""

    method: str
    drafter: str  # "-": a method that drafts nothing
    faults: str  # comma-joined; "" for none
    batch_size: int
    k: int
    temperature: float
    n: int = Field(ge=0)  # sequences compared
    # None: no token reference (a sampled run: see distribution)
    exact_pct: float | None = Field(ge=0, le=100)
    prefix_pct: float | None = Field(ge=0, le=100)
    verdicts: Map[str, int]  # forensic verdict -> divergent sequences
    overhead_slots_pct: float | None = None  # metrics.waste; None: no rounds recorded
    peak_target_kv: int | None = None
    # sampled runs: the verdict on the distribution (its splits left out)
    distribution: Distribution | None = None
    decisions: Decisions | None = None  # sampled speculative runs: the decision audit
    # audited runs: sequences whose target (draft) state left rounding
    audit: Map[str, int] | None = None
    sampled_verdict: str | None = None  # sampled speculative runs: metrics.sampled_verdict's kind
    # Greedy runs with a draft model: the acceptance judge's verdict on the drafts (None: the
    # drafter's own), and [drafts the run accepted, drafts the drafter's own proposals would have
    # had accepted]. A lossless bug's output equals the reference: only these show it.
    drafts_verdict: str | None = None
    drafts_accepted: Many[int] | None = None
    # Greedy runs with rounds: the rejections judge's verdict on the decisions (None: each refused
    # draft was the target's refusal), and [drafts the run accepted, drafts the target's own
    # choices keep], over the rounds it judged.
    rejections_verdict: str | None = None
    rejections_kept: Many[int] | None = None
    # Counted over (round, row) records; [] where no rounds were recorded.
    # [j]: records that accepted exactly j drafts
    accept_lengths: Many[int] = Field(default_factory=list)
    offered: Many[int] = Field(default_factory=list)  # [j]: records offered a draft at position j
    # [j]: records that accepted the draft at position j
    accepted: Many[int] = Field(default_factory=list)

    def label(self) -> str:
        """The heatmap's row."""
        return _label(self.method, self.drafter, self.faults)

    def column(self) -> str:
        return _column(self.batch_size, self.k, self.temperature)

    def name(self) -> str:
        """The run's own name, its row and its column: eqspec · bsp-like · bs 4 · k 5."""
        return f"{self.label()} · {self.column()}"


class SweepSequence(SequenceRecord):
    """One sequence of one run: its run (index into the report's rows) and that run's place, and the
    tokens it received in each of its rounds ([]: not recorded). Its margins stay
    in the run's trace."""

    run: int = Field(ge=0)
    method: str
    drafter: str
    faults: str
    batch_size: int
    k: int
    temperature: float
    rounds: Many[int] = Field(default_factory=list)
    margins: Many[float] = Field(default_factory=list, exclude=True)
    reference_margins: Many[float] | None = Field(None, exclude=True)


class SweepReport(Strict):
    version: Literal[REPORT_VERSION] = REPORT_VERSION
    sweep: Sweep
    rows: Many[RunRow]  # one per run, in the sweep's order
    sequences: Many[SweepSequence]  # every run's sequences, run by run, each run's in prompt order

    @model_validator(mode="after")
    def _consistent(self) -> SweepReport:
        """What the views rely on: a row per run in order, and each run's sequences in order, as the
        run's row says."""
        configs = self.sweep.configs()
        if len(self.rows) != len(configs):
            raise ValueError(f"{len(self.rows)} rows for the sweep's {len(configs)} runs: one row "
                             "per run is needed")
        places = [_placed(**c) for c in configs]
        for i, (row, place) in enumerate(zip(self.rows, places)):
            if row.model_dump(include=set(AXES)) != place:
                raise ValueError(f"row {i} is not run {i} of the sweep "
                                 f"({', '.join(f'{a} {place[a]!r}' for a in AXES)})")
        prompts = len(self.sweep.base.prompts)
        if len(self.sequences) != prompts * len(configs):
            raise ValueError(f"{len(self.sequences)} sequences for {len(configs)} runs of "
                             f"{prompts} prompts")
        for i, s in enumerate(self.sequences):
            run, seq = divmod(i, prompts)
            if (s.run, s.seq) != (run, seq) or s.model_dump(include=set(AXES)) != places[run]:
                raise ValueError(f"sequence {i} should be sequence {seq} of run {run}, and say "
                                 "that run's place")
            check_sequence(s)
            if s.rounds and sum(s.rounds) != len(s.output_ids):
                raise ValueError(f"sequence {seq} of run {run}: its rounds do not add up to its "
                                 "tokens")
        return self

    def spec_of(self, run: int) -> RunSpec:
        return self.sweep.specs()[run]

    def sequences_of(self, run: int) -> list[SweepSequence]:
        """Run `run`'s sequences in prompt order (the report keeps them run by run: _consistent
        checks it)."""
        n = len(self.sweep.base.prompts)
        return self.sequences[run * n:(run + 1) * n]

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, data: str | bytes) -> SweepReport:
        """Parse and validate a stranger's report file; every problem becomes one
        readable SpecError."""
        raw = parse_file(data, "sweep report", MAX_TRACE_BYTES)
        if not isinstance(raw, dict):
            raise SpecError(f"not a sweep report: {shown(raw)} where an object was expected")
        if "schema_version" in raw:
            raise SpecError("this is a run's trace, not a sweep report: open it as a trace")
        if "version" not in raw and "rows" in raw:
            raise SpecError("this report was written by an older specviz, before reports carried "
                            "their sweep: re-run specviz verify --json to load it here")
        found = raw.get("version")
        if found == 1:
            _lift_v1(raw)
            found = raw["version"]
        if type(found) is not int or found != REPORT_VERSION:
            raise SpecError(f"not a specviz sweep report of version {REPORT_VERSION} (found "
                            f"{shown(found)}); write one with specviz verify --json")
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            raise SpecError("invalid sweep report: " + describe_validation_error(e)) from None


def _lift_v1(raw: dict) -> None:
    """A version-1 report (a stranger's: checked only after) to version 2: every run sampled at its
    base's temperature, the one value of the sweep's temperature axis."""
    sweep = raw.get("sweep")
    base = sweep.get("base") if isinstance(sweep, dict) else None
    t = base.get("temperature", 0.0) if isinstance(base, dict) else 0.0
    if isinstance(sweep, dict):
        sweep.setdefault("temperatures", [t])
    for part in ("rows", "sequences"):
        for item in raw.get(part) if isinstance(raw.get(part), list) else []:
            if isinstance(item, dict):
                item.setdefault("temperature", t)
    raw["version"] = 2


def acceptance(trace: Trace, k: int) -> dict[str, list[int]]:
    """How a run's drafts fared, counted over its (round, row) records; nothing where no rounds
    were recorded."""
    if not trace.rows:
        return {}
    lengths, offered, accepted = [0] * (k + 1), [0] * k, [0] * k
    for r in trace.rows:
        lengths[r.accepted] += 1
        for j in range(len(r.draft_tokens)):
            offered[j] += 1
        for j in range(r.accepted):
            accepted[j] += 1
    return {"accept_lengths": lengths, "offered": offered, "accepted": accepted}


def row_of(spec: RunSpec, trace: Trace) -> RunRow:
    eq = metrics.equivalence(trace)
    d = trace.distribution
    sampled = metrics.sampled_verdict(trace)
    a, rejected = trace.acceptance, trace.rejections
    return RunRow(
        **_placed(**{a: getattr(spec, a) for a in AXES}), n=eq.get("n", len(trace.sequences)),
        exact_pct=100 * eq["exact"] if eq else None, prefix_pct=100 * eq["prefix"] if eq else None,
        verdicts=metrics.verdict_counts(trace), **metrics.waste(trace),
        distribution=None if d is None else d.model_copy(update={"splits": []}),
        decisions=trace.decisions if d else None,
        audit=metrics.audit_counts(trace) if spec.audit else None,
        sampled_verdict=sampled and sampled[0],
        drafts_verdict=a and a.verdict, drafts_accepted=a and [a.accepted, a.accepted_fresh],
        rejections_verdict=rejected and rejected.verdict,
        rejections_kept=rejected and [rejected.accepted, rejected.kept],
        **acceptance(trace, spec.k))


def _sequences(run: int, row: RunRow, trace: Trace) -> list[SweepSequence]:
    received = defaultdict(list)
    for r in trace.rows:
        received[r.seq].append(len(r.emitted))
    place = row.model_dump(include=set(AXES))
    return [SweepSequence(**s.model_dump(exclude={"margins", "reference_margins"}), run=run,
                          rounds=received[s.seq], **place) for s in trace.sequences]


def report(sweep: Sweep, traces: Iterable[Trace]) -> SweepReport:
    """The report of `sweep` from its runs' traces, in sweep.specs() order; `traces` may be a
    generator, each trace is let go once summarised."""
    rows, sequences = [], []
    for run, (spec, trace) in enumerate(zip(sweep.specs(), traces)):
        rows.append(row_of(spec, trace))
        sequences += _sequences(run, rows[-1], trace)
    return SweepReport(sweep=sweep, rows=rows, sequences=sequences)
