"""The Trace: the one contract between the engine and everything after it.

Plain, JSON-serializable, versioned data: a manifest, the prompts with their
ids, one record per (round, row), one per round, one per sequence. Pydantic
defines it, validates uploads and emits the JSON Schema (docs/trace.schema.json).
Building one from a decode is recording.py's; this module needs neither torch
nor the models, so a trace file loads and validates with pydantic and orjson alone.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from .engines.base import EngineInfo, EngineOutput
from .spec import Many, Map, RunSpec, SpecError, Strict, describe_validation_error
from .untrusted import parse_file

SCHEMA_VERSION = 5  # 3: sequences carry whole-character pieces (text.py); 4: sampled runs; 5: yardsticks
MAX_TRACE_BYTES = 64 * 2**20
FINGERPRINT = "[0-9a-f]{16}"  # also a file name (serving.save): nothing else may pass

Source = Literal["draft", "correction", "bonus"]
PickFrom = Literal["target", "residual", "draft"]
CHECKS = ("rectangular", "positions", "mask", "kv", "draft_kv", "bonus")


class RowRecord(Strict):
    """One row of one round: what was drafted, verified, kept, and the state around it."""

    round: int
    batch: int
    row: int
    seq: int
    draft_tokens: Many[int]
    draft_probs: Many[float]  # the draft's probability of each of its tokens
    target_tokens: Many[int]  # the target's argmax at each of the k+1 verified slots
    target_probs: Many[float]
    target_margins: Many[float]  # top-1 minus top-2 target logit at each verified slot
    accepted: int
    emitted: Many[int]
    sources: Many[Source]
    finished: bool
    pad_before: int
    pad_after: int | None  # None: the row finished and left the batch
    content_before: int
    content_after: int | None
    pos_first: int  # position ids fed to the target's verify pass: first and last
    pos_last: int
    mask_sum: int  # slots visible to the first verified token
    target_kv_before: int
    target_kv_after: int | None
    draft_kv_before: int
    draft_kv_after: int | None
    delta: int  # slots this row's KV moved by in the realignment
    checks: Map[str, bool]  # invariant checks at the start of / during this round
    audit: float | None = None  # audited rows: largest |verify logit - fresh batch-size-1 logit|
    audit_draft: float | None = None  # the same for the draft's first pass of the round
    # Sampled runs (speculative sampling): draft_probs holds q of each draft, after the draft's temperature/top-k/top-p.
    target_draft_probs: Many[float] | None = None  # p of each draft, after the target's temperature/top-k/top-p
    accept_draws: Many[float] | None = None  # the uniform draw of each draft's decision: accepted iff draw < p/q
    pick_draw: float | None = None  # the uniform draw the non-draft token was sampled with
    pick_from: PickFrom | None = None  # the distribution the non-draft token was drawn from, as the engine did it


class RoundRecord(Strict):
    round: int
    batch: int
    seqs: Many[int]
    realigned: bool  # caches gathered (some row's offset changed), else only cropped
    timings: Map[str, float]  # seconds: draft, verify, realign, trace, watch (forensic checks outside the engine)
    group: bool | None = None  # exspec: a same-length group, needing no realignment
    waits: Many[int] | None = None  # exspec: rounds each row had been passed over


class PromptRecord(Strict):
    seq: int
    text: str
    ids: Many[int]


class Rounding(Strict):
    """A model's rounding in the run's dtype (yardstick.py): how far a correct computation of its logits sits from
    float64 truth, measured on fresh batch-size-1 passes without a cache, which no bug in the batched, cached
    verify path can reach. The white-box verdicts' yardstick."""

    dtype: str
    method: str  # how it was measured, in words
    positions: int  # distinct positions measured
    sequences: int
    levels: Many[float]  # quantile levels in [0, 1], ascending
    quantiles: Many[float]  # per position, the largest |logit - float64 logit| over the vocabulary, at those levels
    resolution: float  # machine epsilon of the dtype times the largest logit: nothing is measured finer
    slots: int | None = None  # positions one comparison spans (a verify pass: k + 1)
    tolerance: float  # two correct computations of `slots` positions differ by more than this with probability alpha
    float64_tolerance: float | None = None  # the same scaled to float64's unit roundoff: for passes rebuilt in float64
    alpha: float | None = None  # that probability: the stated false-alarm rate of one comparison (None: not stated)
    relative: float | None = None  # largest error / (unit roundoff x the largest logit there)
    expected: float | None = None  # the largest `relative` this dtype is known to show
    anomaly: str | None = None  # set when `relative` is far above `expected`: the yardstick itself is suspect

    def place(self, difference: float) -> float:
        """Where a difference between two computations falls on the yardstick: the share of measured positions
        whose rounding, doubled, lies below it (1.0: beyond every one)."""
        below = [level for level, q in zip(self.levels, self.quantiles) if 2 * q < difference]
        return below[-1] if below else 0.0

    def describe(self) -> str:
        """The yardstick in words, for a verdict or a summary."""
        rate = "no false-alarm rate stated" if self.alpha is None else f"false-alarm rate {self.alpha:.2g}"
        return (f"rounding of the target in {self.dtype}: tolerance {self.tolerance:.3g} logits, {rate}, "
                f"from {self.positions} positions of {self.sequences} sequences measured fresh against float64")


class EngineNoise(Strict):
    """An engine's own rounding, measured on its run without speculation (enginenoise.py), which cannot contain a
    speculation bug: where its tokens depart from the target's float64 argmax, and by how much, against the
    margins it kept. The engine verdicts' yardstick."""

    source: Literal["control", "none"]  # none: no control run was given, only transformers' rounding is known
    truth: str  # "float64", or the target's dtype where no float64 copy could be made
    tokens: int  # control tokens scored
    departures: Many[float]  # float64 gaps of the control's tokens that are not the target's argmax, largest first
    sigma: float | None = None  # the control's noise on a logit difference (Gaussian, fitted to flips and kept margins)
    sigma_upper: float | None = None  # its 95% upper bound
    sigma_logprobs: float | None = None  # the same noise read off the control's log-probabilities, where it gave them
    rounding: float  # transformers' own tolerance in this dtype (Rounding.tolerance): the yardstick without a control
    tolerance: float  # the largest float64 gap this engine's own rounding explains, at false-alarm rate alpha
    alpha: float
    method: str

    def describe(self) -> str:
        """What the yardstick explains, and from what."""
        if self.source == "none":
            return (f"transformers' own rounding in this dtype explains gaps up to {self.rounding:.3g} (no control run "
                    "measured this engine's)")
        seen = "none departing" if not self.departures else \
            f"{len(self.departures)} departing, by up to {self.departures[0]:.3g}"
        lp = "" if self.sigma_logprobs is None else f", {self.sigma_logprobs:.3g} from its log-probabilities"
        return (f"this engine's own rounding explains gaps up to {self.tolerance:.3g} (from its control run: "
                f"{self.tokens} tokens, {seen}; noise sigma at most {self.sigma_upper:.3g}{lp}; false-alarm rate "
                f"{self.alpha:g})")


class Fidelity(Strict):
    """How far one run of an engine departs from the model at all, with or without speculation (descriptive: a run
    never judges itself)."""

    role: Literal["engine", "control"]
    outputs: int
    equal: int  # outputs equal to the reference
    tokens: int
    departures: int  # tokens that are not the target's float64 argmax on their own prefix
    beyond: int  # departures beyond the tolerance
    largest_gap: float  # the largest float64 gap of any of its tokens
    sigma: float | None = None  # its noise on a logit difference, fitted as EngineNoise.sigma is
    logprob_error: float | None = None  # the largest |engine log-probability - float64 log-probability|

    def describe(self) -> str:
        sigma = "" if self.sigma is None else f"; noise sigma {self.sigma:.3g}"
        lp = "" if self.logprob_error is None else f"; log-probabilities within {self.logprob_error:.3g}"
        return (f"{self.role}: {self.equal} of {self.outputs} outputs equal the reference; {self.departures} of "
                f"{self.tokens} tokens are not the target's float64 argmax on their own prefix, {self.beyond} beyond "
                f"the tolerance; largest gap {self.largest_gap:.3g}{sigma}{lp}")


class Yardsticks(Strict):
    """What this run's verdicts were judged against: measured on its pair, dtype and device, never on the run."""

    target: Rounding | None  # None: no float64 copy of the target could be made
    draft: Rounding | None = None  # measured for audits
    engine: EngineNoise | None = None  # engine checks


class Forensics(Strict):
    """Why a sequence departed from the reference, with the evidence (forensics.py)."""

    verdict: str  # sync-bug:<bonus|positions|mask|kv|state>, kernel-bug, numerics, engine-bug or unexplained
    explanation: str
    fork: int  # index of the first differing token
    round: int | None = None  # the round and batch row that emitted it (speculative methods)
    row: int | None = None
    output_token: int | None = None
    reference_token: int | None = None
    failed_checks: Map[str, int] = {}  # the engine's own breaking checks -> first round failed, at or before the fork
    margin_reference: float | None = None  # target top-1 minus top-2 logit at the fork: the reference pass (bs 1)
    margin_batched: float | None = None  # the same in the pass that emitted the fork
    margin_float64: float | None = None  # float64, batch size 1: logit of the reference's token minus the output's
    state_diff: float | None = None  # largest |emitting - fresh batch-size-1 logit| over the row's verified slots
    kernel_diff: float | None = None  # the same pass rebuilt from correct inputs (fresh caches, true positions), vs fresh
    kernel_diff_float64: float | None = None  # the same in float64, against a fresh float64 pass
    kv_diff: float | None = None  # the row's visible cache entries alone, true positions and plain mask, vs fresh
    written_at: Many[Many[int]] = []  # cache entries that fit their token badly: [true position, computed at (-1: none)]
    tokens_fed_ok: bool | None = None  # the emitting pass was fed the sequence's own last token
    positions_fed: Many[int] | None = None  # position ids of the verified slots, as fed
    positions_expected: Many[int] | None = None  # where those tokens sit in the sequence
    visible: Many[int] | None = None  # key slots each verified slot could attend to
    visible_expected: Many[int] | None = None  # real tokens up to and including each verified slot
    emitting_argmax: int | None = None  # the emitting pass's own choice at the fork slot
    batching_noise: bool | None = None  # batched-reference (no speculation) already departs here
    # Engine checks (check.py), judged from outside: the engine's tokens teacher-forced through the reference.
    engine_rank: int | None = None  # rank of the engine's fork token under the reference (1: its own choice)
    engine_logprob: float | None = None  # the engine's own log-probability of its fork token, where it gave one
    tolerance: float | None = None  # largest logit difference rounding explains here (the yardstick's)
    alpha: float | None = None  # the false-alarm rate the verdict was judged at
    yardstick: str | None = None  # which yardstick judged it, in words
    first_bad: int | None = None  # first token, at or after the fork, whose reference gap exceeds the tolerance
    control_fork: int | None = None  # where the same engine without speculation departs (None: it does not)
    repeated: float | None = None  # share of repeated 4-grams in the output after the fork (loops)
    nll: float | None = None  # mean negative log-likelihood, under the reference, of the output after the fork
    reference_nll: float | None = None  # the same for the reference's own continuation


class SequenceRecord(Strict):
    seq: int
    output_ids: Many[int]
    output_pieces: Many[str | None]  # per token: the whole characters it completes; None when it only starts one
    margins: Many[float]
    reference_ids: Many[int] | None = None
    reference_pieces: Many[str | None] | None = None
    reference_margins: Many[float] | None = None
    first_divergence: int | None = None  # first index where output_ids and reference_ids differ
    equivalent: bool | None = None
    completion_seconds: float | None = None  # from the start of decoding to its last token
    audit_round: int | None = None  # audited runs: first round its target state departed from the noise floor
    audit_draft_round: int | None = None  # the same for the draft's state
    engine: EngineOutput | None = None  # engine checks: what the engine returned for this prompt
    control: EngineOutput | None = None  # and the same engine without speculation, when given
    gaps: Many[float] | None = None  # engine checks: per output token, the reference's top logit minus that token's,
    #                                  on the engine's own prefix (0: the target's own greedy choice)
    pit: Many[float | None] | None = None  # sampled runs: each token's randomized PIT under the target, recomputed
    #                                        at batch size 1 (distribution.py); None where the target gives it 0
    forensics: Forensics | None = None


def check_sequence(s: SequenceRecord) -> None:
    """What the views rely on in one sequence beyond types: a piece (and PIT value) per token id, and a
    first_divergence and equivalent that follow from its ids. Raises ValueError."""
    if s.pit is not None and len(s.pit) != len(s.output_ids):
        raise ValueError(f"sequence {s.seq}: one PIT value per token id is needed")
    if len(s.output_pieces) != len(s.output_ids) or (s.reference_pieces is None) != (s.reference_ids is None) \
            or s.reference_ids is not None and len(s.reference_pieces) != len(s.reference_ids):
        raise ValueError(f"sequence {s.seq}: one piece of text per token id is needed")
    fork = None if s.reference_ids is None else first_difference(s.output_ids, s.reference_ids)
    if (s.first_divergence, s.equivalent) != (fork, None if s.reference_ids is None else fork is None):
        raise ValueError(f"sequence {s.seq}: first_divergence and equivalent do not match its ids")


class Split(Strict):
    """One tested split of the PIT values and its uniformity test."""

    name: str  # what the values share: "all tokens", "slot 0", "row 3", "rounds 0-9", "row pairs", ...
    n: int  # values tested
    ks: float  # Kolmogorov-Smirnov p-value against uniform(0, 1)
    chi2: float  # chi-square p-value over the bins of counts
    p: float  # the split's p-value: min(1, 2 * min(ks, chi2)), Bonferroni over its two tests
    counts: Many[int]  # values per equal bin on [0, 1]; len(counts) bins (see pit.bins())


class Distribution(Strict):
    """The verdict on a sampler: do its tokens come from the target's distribution?"""

    verdict: Literal["consistent", "not the target's distribution", "too few tokens"]
    alpha: float  # the family-wise significance level of the verdict
    p: float | None  # smallest split p times the number of splits tested (Bonferroni), at most 1; 0 with an
    # impossible token; None when too few tokens were tested
    failing: str | None  # the split with the smallest p, or "impossible tokens", when rejected
    tokens: int  # PIT values in the pooled split
    impossible: int  # emitted tokens the target gives probability 0; any one of them rejects
    splits: Many[Split]  # the tested splits, the pooled one first, in the caller's order
    skipped: Many[str]  # splits with fewer than min_count values: not tested


class Decisions(Strict):
    """Sampled runs: every recorded accept/reject decision re-derived from its recorded p, q and draw."""

    checked: int
    mismatches: int
    first: Many[Many[int]] = []  # [round, row, slot] of the first mismatches (at most 20)


class Manifest(Strict):
    spec: RunSpec
    pair: Map[str, str | None]
    versions: Map[str, str]
    device: str
    device_name: str
    deterministic: Map[str, bool]
    created: str
    decode_seconds: float = Field(ge=0)  # 0: not known (an engine's outputs file)
    reference_seconds: float | None = None
    yardstick: Yardsticks | None = None  # None: no reference was decoded beside the run (or nothing to measure)
    fidelity: Many[Fidelity] = []  # engine checks: how far the engine, and its control, depart from the model
    engine: EngineInfo | None = None  # engine checks: the engine under test, as it described itself
    control: EngineInfo | None = None  # and its run without speculation, when given
    fingerprint: str = Field(pattern=f"^{FINGERPRINT}$")  # hash of the spec and every decision: equal fingerprints, equal runs


class Trace(Strict):
    schema_version: Literal[5] = SCHEMA_VERSION
    manifest: Manifest
    prompts: Many[PromptRecord]
    rounds: Many[RoundRecord]
    rows: Many[RowRecord]
    sequences: Many[SequenceRecord]
    vocab: Map[int, str] = {}  # each token id's own text, so a trace reads without its tokenizer
    distribution: Distribution | None = None  # sampled runs: are the tokens drawn from the target's distribution?
    decisions: Decisions | None = None  # sampled speculative runs: the decision audit

    @model_validator(mode="after")
    def _consistent(self) -> Trace:
        """What the views rely on beyond types: records numbered in order, rows that match their rounds."""
        n = len(self.sequences)
        if [p.seq for p in self.prompts] != list(range(n)) or [s.seq for s in self.sequences] != list(range(n)):
            raise ValueError("prompts and sequences must be numbered 0, 1, 2, … in order, one of each per prompt")
        for s in self.sequences:
            check_sequence(s)
        if [rd.round for rd in self.rounds] != list(range(len(self.rounds))):
            raise ValueError("rounds must be numbered 0, 1, 2, … in order")
        by_round = defaultdict(list)
        for r in self.rows:
            k = len(r.draft_tokens)
            a = min(max(r.accepted, 0), k)  # the sources it implies, built within bounds even when it is out of them
            sources = (["draft"] * a + ["bonus" if a == k else "correction"])[: len(r.emitted)]
            drawn = (r.target_draft_probs, r.accept_draws)
            if not (len(r.draft_probs) == k and len(r.target_tokens) == len(r.target_probs) == len(r.target_margins)
                    == k + 1 and a == r.accepted and len(r.emitted) == len(r.sources) and r.sources == sources
                    and all(d is None or len(d) == k for d in drawn)):
                raise ValueError(f"round {r.round}, row {r.row}: its lists do not fit its {k} drafts")
            by_round[r.round].append((r.row, r.seq))
        for rd in self.rounds:
            if by_round.pop(rd.round, []) != list(enumerate(rd.seqs)) or not all(0 <= q < n for q in rd.seqs):
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


def _from_version_1(raw: dict) -> dict:
    """Version 1 judged forks by a noise level measured on the run itself (`noise`) and a top-8 logit difference
    (`logit_diff`); version 2 replaced both with independent evidence. Old verdicts are kept as recorded."""
    sequences = raw.get("sequences")
    for s in sequences if isinstance(sequences, list) else []:  # anything else is left for validation to report
        if isinstance(s, dict) and isinstance(s.get("forensics"), dict):
            for old in ("noise", "logit_diff"):
                s["forensics"].pop(old, None)
    return {**raw, "schema_version": 2}


def _from_version_2(raw: dict) -> dict:
    """Version 2 kept no whole-character pieces: each token's own text stands in, as version 2 showed it."""
    vocab = raw["vocab"] if isinstance(raw.get("vocab"), dict) else {}

    def own(ids):
        if isinstance(ids, list) and all(type(i) is int for i in ids):
            return [vocab.get(str(i), f"<{i}>") for i in ids]
        return None

    sequences = raw.get("sequences")
    for s in sequences if isinstance(sequences, list) else []:  # anything else is left for validation to report
        if isinstance(s, dict):
            s.setdefault("output_pieces", own(s.get("output_ids")))
            s.setdefault("reference_pieces", own(s.get("reference_ids")))
    return {**raw, "schema_version": 3}


def _from_version_3(raw: dict) -> dict:
    """Version 4 added sampled runs' fields, all optional: a version-3 trace is a version-4 greedy one."""
    return {**raw, "schema_version": 4}


def _from_version_4(raw: dict) -> dict:
    """Version 4 judged by a noise floor measured through the batched, cached kernel path it judged (so a bug there
    raised it): its floor becomes the yardstick it was, as recorded, with no false-alarm rate stated."""
    manifest = raw.get("manifest")
    floors = manifest.pop("noise_floor", None) if isinstance(manifest, dict) else None
    if isinstance(floors, dict):  # anything else is left for validation to report
        manifest["yardstick"] = {role: _floor_as_rounding(f, floors.get("factor"), manifest)
                                 for role, f in floors.items() if role in ("target", "draft") and isinstance(f, dict)}
    return {**raw, "schema_version": 5}


def _floor_as_rounding(floor: dict, factor: object, manifest: dict) -> dict:
    spec = manifest.get("spec")
    return {"dtype": spec.get("dtype", "?") if isinstance(spec, dict) else "?",
            "method": f"version 4's noise floor: {floor.get('method')}",
            **{k: floor.get(k) for k in ("positions", "sequences", "resolution")}, "slots": floor.get("chunk"),
            "levels": [0.5, 1.0], "quantiles": [floor.get("median"), floor.get("value")],
            "tolerance": factor * floor["value"] if isinstance(factor, (int, float)) and
            isinstance(floor.get("value"), (int, float)) else floor.get("value")}


# version -> a function that lifts a raw trace one version up
MIGRATIONS = {1: _from_version_1, 2: _from_version_2, 3: _from_version_3, 4: _from_version_4}


def shown(value: object) -> str:
    """A stranger's JSON value in a message: short, and never repr'd when nested (1000 levels break repr)."""
    if value is None or isinstance(value, (int, float, str)):
        return repr(value)[:40]
    return f"a JSON {'array' if isinstance(value, list) else 'object'}"


def first_difference(a: list[int], b: list[int]) -> int | None:
    """First index where two id lists differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def schema() -> dict:
    return Trace.model_json_schema()
