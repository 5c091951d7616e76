"""From a RunSpec to a Trace: load the pair, encode the prompts, decode with
the asked method, decode the batch-size-1 reference beside it, record."""
from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable

from specviz.decoding import decoders
from specviz.decoding.decoders import Job
from specviz.decoding.penalties import penalties_of
from specviz.decoding.recording import build_trace
from specviz.decoding.reference import batched_reference, reference
from specviz.decoding.result import DecodeResult, Progress
from specviz.decoding.sampling import GREEDY, Sampling, greedy_of
from specviz.forensics import distribution, yardstick, yardstick_cache
from specviz.forensics.acceptance import judge_acceptance, judge_head_acceptance
from specviz.forensics.logprobs import judge_logprobs
from specviz.forensics.counters import judge_counters
from specviz.forensics.grammar import judge_grammar
from specviz.forensics.proposals import judge_proposals
from specviz.forensics.rejections import judge_rejections, run_rounds
from specviz.forensics.sampledrun import analyse_sampled, judge_sampled_run
from specviz.forensics.watch import Watch
from specviz.forensics.whitebox import analyse, flag_batching_noise
from specviz.models.heads import head_of
from specviz.models.pairs import ONE_DEVICE, ModelPair, Placement, pair_for
from specviz.run.settings import Settings
from specviz.spec.drafters import DRAFTERS
from specviz.spec.prompts import builtin_set
from specviz.spec.run import ENGINE, MAX_PROMPT_TOKENS, PENALTY_FIELDS, RunSpec
from specviz.spec.strict import SpecError
from specviz.spec.verdicts import state_bug
from specviz.trace.evidence import Acceptance
from specviz.trace.findings import Findings
from specviz.trace.schema import Trace
from specviz.trace.yardsticks import Rounding, Yardsticks


def encode(spec: RunSpec, pair: ModelPair, limits: Settings | None = None) -> list[list[int]]:
    """The prompts' token ids, within specviz's bound and, on a served page,
    the operator's `limits`."""
    ids = pair.encode(spec.prompts, spec.chat_template)
    total = sum(len(x) for x in ids)
    if total > MAX_PROMPT_TOKENS:
        raise SpecError(f"prompts total {total} tokens; the limit is {MAX_PROMPT_TOKENS}")
    if limits:
        limits.check_prompt_ids(ids)
    return ids


def decode(spec: RunSpec, pair: ModelPair, prompt_ids: list[list[int]], record: bool = True,
           progress: Progress | None = None, reference: DecodeResult | None = None,
           yardsticks: Yardsticks | None = None, first_seq: int = 0) -> DecodeResult:
    """Decode with the spec's method (decoding/decoders.py). Given the reference's outputs, the
    decode is watched (watch.py): the result then carries the state of every fork's emitting row,
    and the audit (recorded runs only). With the run's `yardsticks`, the watch spares itself
    narrowing down the inputs of a fork whose state is clean. A recorded, audited run without a
    reference (a sampled one) is watched for its audit: the result carries the state of each
    sequence's first audited row beyond the yardstick instead of its fork's. `first_seq`: the number
    of the first of `prompt_ids` in the spec's list (a shard's share): their draws follow it."""
    audit = min(spec.audit, spec.batch_size) if record else 0
    if reference is None and not audit:
        job = Job(spec, pair, prompt_ids, record, progress, first_seq=first_seq)
        return decoders.decode_job(job)
    watch = Watch(pair, prompt_ids, reference and [o.ids for o in reference.outputs], audit,
                  tolerance=yardsticks.target.tolerance if yardsticks else None,
                  penalties=penalties_of(spec))
    with watch.watching():
        job = Job(spec, pair, prompt_ids, record, progress, watch, first_seq)
        result = decoders.decode_job(job)
    result.forks, result.audit = watch.forks, watch.audit
    return result


class PerPair:
    """Results computed from a pair, at most `size` per pair, held only while the pair lives: keyed
    weakly by the pair, so one evicted from models.load_pair's cache is freed with everything
    computed from it."""

    def __init__(self, size: int):
        self.size = size
        self._by_pair: weakref.WeakKeyDictionary[ModelPair, OrderedDict] = (
            weakref.WeakKeyDictionary())

    def get(self, pair: ModelPair, key: Hashable, compute: Callable[[], object]):
        results = self._by_pair.setdefault(pair, OrderedDict())
        if key not in results:
            if len(results) >= self.size:
                results.popitem(last=False)
            results[key] = compute()
        return results[key]


    def clear(self) -> None:
        self._by_pair.clear()


_REFERENCES = PerPair(64)
_BATCHED = PerPair(16)
_CALIBRATION = PerPair(4)
_ROUNDING = PerPair(64)
# outputs teacher-forced and references decoded on by checks: O(prompt + output)
_CHECKED = PerPair(4096)


def clear_caches(calibration: bool = True) -> None:
    """Forget every reference, batched reference, check's intermediate and yardstick computed so far
    (benchmarks start cold), or all but the yardsticks' calibration on the built-in prompts (as a
    later check in the same process finds it)."""
    for cache in (_REFERENCES, _BATCHED, _ROUNDING, _CHECKED,
                  *((_CALIBRATION,) if calibration else ())):
        cache.clear()


def checked(pair: ModelPair, key: Hashable, compute: Callable[[], object]):
    """What a check computes from an output (teacher-forced) or a prefix (the reference decoded on),
    once per process: checking the same outputs again, or another engine beside the same control,
    does not repeat it."""
    return _CHECKED.get(pair, key, compute)


def reference_for(pair: ModelPair, prompt_ids: list[list[int]], max_new_tokens: int,
                  progress: Progress | None = None, greedy: Sampling = GREEDY) -> DecodeResult:
    """The batch-size-1 greedy reference (under `greedy`'s penalties, to its stops:
    sampling.greedy_of), computed once per process for the same pair and prompts."""
    key = (tuple(tuple(x) for x in prompt_ids), max_new_tokens,
           *((greedy,) if greedy != GREEDY else ()))
    return _REFERENCES.get(pair, key,
                           lambda: reference(pair, prompt_ids, max_new_tokens, progress, greedy))


def _cached_batched(pair: ModelPair, prompt_ids: tuple[tuple[int, ...], ...], batch_size: int,
                    max_new_tokens: int, greedy: Sampling) -> DecodeResult:
    return _BATCHED.get(pair, (prompt_ids, batch_size, max_new_tokens, greedy),
                        lambda: batched_reference(pair, [list(x) for x in prompt_ids], batch_size,
                                                  max_new_tokens, sampling=greedy))


Phases = Callable[[str, int], None]  # progress by phase: (phase, new tokens)


def phase(progress: Phases | None, name: str) -> Progress | None:
    """One phase's progress callback from a by-phase one."""
    return functools.partial(progress, name) if progress else None


def run(spec: RunSpec, record: bool = True, with_reference: bool = True,
        progress: Phases | None = None, trust_remote_code: bool = False,
        placement: Placement = ONE_DEVICE, limits: Settings | None = None) -> Trace:
    """Decode, decode the reference beside it, record, and explain every divergence. A sampled run
    has no token-by-token reference: its tokens are scored under the target
    instead (distribution.py).

    `progress(phase, n)` hears of every n new tokens: phase "reference" (skipped when cached), then
    the method, then, for a sampled run, "distribution" (its tokens scored). `limits`: a served
    page's operator settings, whose token limits only the tokenized prompts can show.
    """
    pair = pair_for(spec, trust_remote_code, placement)
    prompt_ids = encode(spec, pair, limits)
    if not spec.greedy:
        yardsticks = sampled_yardsticks(spec, pair)
        result = decode(spec, pair, prompt_ids, record, phase(progress, spec.method),
                        yardsticks=yardsticks)
        return explain_sampled(spec, pair, prompt_ids, result, yardsticks,
                               phase(progress, "distribution") if with_reference else None,
                               with_reference)
    ref = (reference_for(pair, prompt_ids, spec.max_new_tokens, phase(progress, "reference"),
                         greedy_of(spec))
           if with_reference else None)
    if spec.method == "reference" and ref:
        result = ref
    else:
        yardsticks = yardsticks_for(spec, pair, prompt_ids, ref) if ref else None
        result = decode(spec, pair, prompt_ids, record, phase(progress, spec.method), ref,
                        yardsticks)
    return explain(spec, pair, prompt_ids, result, ref)


def explain_sampled(spec: RunSpec, pair: ModelPair, prompt_ids: list[list[int]],
                    result: DecodeResult, yardsticks: Yardsticks | None,
                    progress: Progress | None = None, judge: bool = True) -> Trace:
    """The trace of a sampled run: its distribution judged (`judge`), and an audited run's corrupt
    states named."""
    trace = build_trace(spec, pair, prompt_ids, result, yardsticks=yardsticks)
    if judge:
        distribution.judge_distribution(trace, pair, prompt_ids, progress).record(trace)
    if yardsticks is not None:
        analyse_sampled(trace, result).record(trace)
        if yardsticks.draft is not None and DRAFTERS[spec.drafter].draft_model:
            Findings(run={"proposals": judge_proposals(trace, pair.draft, pair.vocab_size,
                                                       yardsticks.draft.tolerance)}).record(trace)
    if spec.logprobs and judge:
        yardsticks = yardsticks or calibrated_yardsticks(spec, pair)
        judge_logprobs(trace, pair, yardsticks and yardsticks.target).record(trace)
    return judge_sampled_run(trace).record(trace)  # from what every judge above found


def yardsticks_for(spec: RunSpec, pair: ModelPair, prompt_ids: list[list[int]],
                   ref: DecodeResult) -> Yardsticks | None:
    """The run's yardsticks (yardstick.py): the target's rounding, and the draft's when the run is
    audited; measured on fresh passes over the built-in prompts (once per process and pair) and the
    reference's own continuations (once per prompts and continuations), each kept on disk for later
    processes too (yardstick_cache.py). None without a float64 copy of the target."""
    longest = sorted(range(len(prompt_ids)),
                     key=lambda i: -len(ref.outputs[i].ids))[: yardstick.SEQUENCES]
    sequences = [prompt_ids[i] + ref.outputs[i].ids for i in longest]

    def measured(role: str):
        calibration = _calibration(pair, role)
        if calibration is None:
            return None
        model = pair.target if role == "target" else pair.draft
        samples = _ROUNDING.get(pair, (role, tuple(map(tuple, sequences))), lambda: calibration + (
            yardstick_cache.recall(model, role, "the reference's continuations", sequences,
                                   pair.vocab_size, calibration.seen)))
        return _in_mode(spec, yardstick.rounding(samples, pair.dtype, spec.k + 1))

    target = measured("target")
    if target is None:
        return None
    return Yardsticks(target=target, draft=measured("draft") if spec.audit else None)


def sampled_yardsticks(spec: RunSpec, pair: ModelPair) -> Yardsticks | None:
    """A sampled run's yardsticks: the built-in prompts' when it is audited (it has no reference);
    None unaudited."""
    return calibrated_yardsticks(spec, pair) if spec.audit else None


def calibrated_yardsticks(spec: RunSpec, pair: ModelPair) -> Yardsticks | None:
    """The yardsticks from the built-in prompts alone, for a run with no reference (a sampled one)
    or before its reference is known: the target's, and the draft's when audited (None without a
    float64 copy of the target)."""
    target = _calibrated(spec, pair, "target")
    if target is None:
        return None
    return Yardsticks(target=target, draft=_calibrated(spec, pair, "draft") if spec.audit else None)


def _judge_drafts(trace: Trace, spec: RunSpec, pair: ModelPair) -> Acceptance | None:
    """The acceptance judge for the run's drafter, where it can replay it: a draft model, or a head
    over the target's hidden states (None: prompt lookup, whose drafts are its prompt's
    own tokens)."""
    kind = DRAFTERS[spec.drafter]

    def tolerance() -> float | None:
        return getattr(_calibrated(spec, pair, "draft"), "tolerance", None)
    if kind.draft_model:
        return judge_acceptance(trace, pair.draft, pair.vocab_size, tolerance)
    if "hidden" in kind.hears:
        return judge_head_acceptance(trace, pair.target, head_of(spec, pair), pair.vocab_size,
                                     tolerance)
    return None


def _calibrated(spec: RunSpec, pair: ModelPair, role: str) -> Rounding | None:
    """A model's rounding from the built-in prompts alone (None without a float64 copy)."""
    return _in_mode(spec, yardstick.rounding(_calibration(pair, role), pair.dtype, spec.k + 1))


def _in_mode(spec: RunSpec, rounding: Rounding | None) -> Rounding | None:
    """The yardstick the run's verdicts take: zero tolerance in batch-invariant mode. (An engine
    check's is transformers' rounding still: a declared engine is held to its own control,
    forensics/blackbox.py.)"""
    own = spec.batch_invariant and spec.method != ENGINE
    return yardstick.zero_tolerance(rounding) if own else rounding


def calibrated_tolerance(spec: RunSpec, pair: ModelPair) -> float | None:
    """The target's rounding tolerance from the built-in prompts alone (None without a float64 copy
    of it)."""
    yardsticks = calibrated_yardsticks(spec, pair)
    return yardsticks and yardsticks.target.tolerance


def _calibration(pair: ModelPair, role: str):
    model = pair.target if role == "target" else pair.draft
    prompts = builtin_set("all") + builtin_set("spec-bench")
    return _CALIBRATION.get(pair, role, lambda: yardstick_cache.recall(
        model, role, "the built-in prompts", yardstick.chained(pair.encode(prompts)),
        pair.vocab_size, enough=yardstick.CALIBRATION_POSITIONS))


def explain(spec: RunSpec, pair: ModelPair, prompt_ids: list[list[int]], result: DecodeResult,
            ref: DecodeResult | None) -> Trace:
    """The trace of a decoded run, every divergence from `ref` explained; a sampled run's
    distribution judged."""
    if not spec.greedy:
        return explain_sampled(spec, pair, prompt_ids, result, None)
    yardsticks = (yardsticks_for(spec, pair, prompt_ids, ref)
                  if ref is not None and spec.method != "reference" else None)
    trace = build_trace(spec, pair, prompt_ids, result, ref, yardsticks)
    if ref is not None:
        analyse(trace, result, pair).record(trace)
        if any(s.forensics and not state_bug(s.forensics.verdict) for s in trace.sequences):
            # Would batching alone, without speculation, have forked there too?
            batched = _cached_batched(pair, tuple(tuple(x) for x in prompt_ids), spec.batch_size,
                                      spec.max_new_tokens, greedy_of(spec))
            flag_batching_noise(trace, batched).record(trace)
    if spec.logprobs and ref is not None:
        judge_logprobs(trace, pair, yardsticks and yardsticks.target).record(trace)
    if spec.json_schema is not None:
        judge_grammar(trace, pair.tokenizer, pair.eos_ids).record(trace)
    if trace.rows:  # the drafts, the decisions and the counters: lossless bugs show only there
        judge_counters(trace).record(trace)
        # (a penalised or masked choice is not the fresh pass's argmax: the verify pass's own is
        # asked alone)
        fresh = None if spec.changed(PENALTY_FIELDS) or spec.json_schema else pair.target
        Findings(run={"acceptance": _judge_drafts(trace, spec, pair),
                      "rejections": judge_rejections(trace, run_rounds(trace), fresh,
                                                     pair.vocab_size, "the run's")}).record(trace)
    return trace
