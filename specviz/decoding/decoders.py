"""Every method of spec/methods.py as our engine runs it: one function a method, one signature.

The declarations (what a method needs and costs) are plain data in spec/methods.py, read by the
spec, the CLI, the page and the bench without torch; here each is bound to the engine that runs it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specviz.decoding.assisted import hf_assisted
from specviz.decoding.drafters import drafter_for
from specviz.decoding.eqspec import eqspec
from specviz.decoding.exspec import exspec
from specviz.decoding.paging import KVLayout
from specviz.decoding.reference import batched_reference, reference
from specviz.decoding.result import DecodeResult, Progress
from specviz.decoding.sampling import sampling_of
from specviz.models.architecture import is_recurrent
from specviz.models.pairs import ModelPair
from specviz.spec.faults import expand
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError


@dataclass(frozen=True)
class Job:
    """One decode: a spec's method on a pair and its prompts' ids, recorded or not, heard by
    `progress` (every n new tokens) and watched by `watch` (forensics/watch.py), where given.
    `first_seq`: the number of the first of these prompts in the spec's list (a shard's share),
    which their random streams continue."""

    spec: RunSpec
    pair: ModelPair
    prompt_ids: list[list[int]]
    record: bool = True
    progress: Progress | None = None
    watch: object | None = None
    first_seq: int = 0


def kv_layout(s: RunSpec) -> KVLayout:
    return KVLayout(s.kv_block_size, s.prefix_caching, s.kv_blocks or None)


def _decode_reference(job: Job) -> DecodeResult:
    s = job.spec
    return reference(job.pair, job.prompt_ids, s.max_new_tokens, job.progress,
                     sampling_of(s, job.first_seq))


def _batched_reference(job: Job) -> DecodeResult:
    s = job.spec
    return batched_reference(job.pair, job.prompt_ids, s.batch_size, s.max_new_tokens, job.progress,
                             job.watch, sampling_of(s, job.first_seq))


def _hf_assisted(job: Job) -> DecodeResult:
    s = job.spec
    if is_recurrent(job.pair.target) or is_recurrent(job.pair.draft):
        raise SpecError("hf-assisted cannot run on a hybrid model: transformers' assisted "
                        "generation refuses a cache whose recurrent state it cannot crop back; "
                        "eqspec and exspec roll it back per row")
    return hf_assisted(job.pair, job.prompt_ids, s.k, s.max_new_tokens, job.progress,
                       s.repetition_penalty, drafter_for(s, job.pair).assisted(s.k))


def _eqspec(job: Job) -> DecodeResult:
    s = job.spec
    return eqspec(job.pair, job.prompt_ids, s.batch_size, s.k, s.max_new_tokens,
                  faults=expand(s.faults), record=job.record, progress=job.progress,
                  watch=job.watch, sampling=sampling_of(s, job.first_seq),
                  drafter=drafter_for(s, job.pair), kv=kv_layout(s))


def _exspec(job: Job) -> DecodeResult:
    s = job.spec
    return exspec(job.pair, job.prompt_ids, s.batch_size, s.k, s.max_new_tokens,
                  window=s.window or 2 * s.batch_size,
                  max_wait=s.max_wait, record=job.record, progress=job.progress, watch=job.watch,
                  sampling=sampling_of(s, job.first_seq), drafter=drafter_for(s, job.pair),
                  kv=kv_layout(s))


DECODERS: dict[str, Callable[[Job], DecodeResult]] = {
    "reference": _decode_reference, "batched-reference": _batched_reference,
    "hf-assisted": _hf_assisted,
    "eqspec": _eqspec, "exspec": _exspec,
}


def decode_job(job: Job) -> DecodeResult:
    """Run the job's method."""
    if job.spec.method not in DECODERS:
        raise SpecError(f"{job.spec.method!r} is not a decoding method; choose from "
                        f"{', '.join(DECODERS)}")
    return DECODERS[job.spec.method](job)
