"""The decoding methods and drafters, declared once: what each needs and how it runs.

The spec validates against these declarations, the CLI, the app and the bench list and combine them from
here, the GPU estimate counts their passes, and `runner.decode` calls `Method.decode`: a new method is one
entry in METHODS. Declaring imports nothing heavy (the spec and the trace schema read this module without
torch); a method's decoder is imported when it first runs.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .decoding.catalogue import expand

if TYPE_CHECKING:
    from .decoding.result import DecodeResult
    from .spec import RunSpec

# name -> what proposes the drafts
DRAFTERS = {
    "model": "the draft model, one forward pass per draft",
    "lookup": "prompt lookup: the tokens that followed the last n-gram's earliest earlier occurrence; no model",
}


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    decoder: Callable[..., DecodeResult]  # (spec, pair, prompt_ids, progress, record, watch)
    passes: Callable[[RunSpec], int]  # forward passes a run costs, beside the reference's
    drafters: tuple[str, ...] = ()  # empty: the target alone (k and the drafter do not apply)
    faults: bool = False  # faults (decoding/faults.py) can be injected
    samples: bool = True  # runs sampled (temperature > 0) as well as greedy
    batched: bool = True  # False: one prompt at a time, whatever the batch size
    max_batch_size: int | None = None

    @property
    def speculative(self) -> bool:
        return bool(self.drafters)

    def batch_sizes(self, asked: list[int]) -> list[int]:
        """The batch sizes worth running of those `asked` (a sweep runs an unbatched method once)."""
        if not self.batched:
            return [1]
        return [bs for bs in asked if self.max_batch_size is None or bs <= self.max_batch_size]

    def decode(self, spec: RunSpec, pair, prompt_ids: list[list[int]], progress=None, record: bool = True,
               watch=None) -> DecodeResult:
        return self.decoder(spec, pair, prompt_ids, progress, record, watch)


def _reference(spec, pair, prompt_ids, progress, record, watch):
    from .decoding.reference import reference

    return reference(pair, prompt_ids, spec.max_new_tokens, progress, spec.sampling())


def _batched_reference(spec, pair, prompt_ids, progress, record, watch):
    from .decoding.reference import batched_reference

    return batched_reference(pair, prompt_ids, spec.batch_size, spec.max_new_tokens, progress, watch, spec.sampling())


def _hf_assisted(spec, pair, prompt_ids, progress, record, watch):
    from .decoding.assisted import hf_assisted

    lookup = spec.ngram_max if spec.drafter == "lookup" else None
    return hf_assisted(pair, prompt_ids, spec.k, spec.max_new_tokens, progress, lookup=lookup)


def drafter(spec: RunSpec, pair):
    """The spec's drafter over `pair` (decoding/drafters.py)."""
    from .decoding.drafters import ModelDrafter, PromptLookup

    if spec.drafter == "lookup":
        return PromptLookup(pair, spec.ngram_min, spec.ngram_max)
    return ModelDrafter(pair)


def _eqspec(spec, pair, prompt_ids, progress, record, watch):
    from .decoding.eqspec import eqspec

    return eqspec(pair, prompt_ids, spec.batch_size, spec.k, spec.max_new_tokens, faults=expand(spec.faults),
                  record=record, progress=progress, watch=watch, sampling=spec.sampling(), drafter=drafter(spec, pair))


def _exspec(spec, pair, prompt_ids, progress, record, watch):
    from .decoding.exspec import exspec

    return exspec(pair, prompt_ids, spec.batch_size, spec.k, spec.max_new_tokens,
                  window=spec.window or 2 * spec.batch_size, max_wait=spec.max_wait, record=record,
                  progress=progress, watch=watch, sampling=spec.sampling(), drafter=drafter(spec, pair))


def _rounds(spec: RunSpec, rows_at_once: int) -> int:
    """Speculative rounds, counted at two tokens a round (the low end of what the preset pairs accept), each
    costing a verify pass and, with a draft model, k draft passes."""
    per_round = spec.k + 1 if spec.drafter == "model" else 1
    return math.ceil(len(spec.prompts) / rows_at_once) * math.ceil(spec.max_new_tokens / 2) * per_round


def _batches(spec: RunSpec) -> int:
    return math.ceil(len(spec.prompts) / spec.batch_size)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("reference", "the target alone, one prompt at a time: the ground truth", _reference,
           passes=lambda spec: 0, batched=False),  # the reference is the run
    Method("batched-reference", "the target alone on the padded batch: batching noise without speculation",
           _batched_reference, passes=lambda spec: _batches(spec) * spec.max_new_tokens),
    Method("hf-assisted", "transformers' own assisted generation (greedy), an external cross-check", _hf_assisted,
           passes=lambda spec: _rounds(spec, 1), drafters=("model", "lookup"), samples=False, max_batch_size=1),
    Method("eqspec", "static batches realigned every round (unpad, append, repad)", _eqspec,
           passes=lambda spec: _rounds(spec, spec.batch_size), drafters=("model", "lookup"), faults=True),
    Method("exspec", "a window of sequences, same-length groups batched without realignment", _exspec,
           passes=lambda spec: _rounds(spec, spec.batch_size), drafters=("model", "lookup")),
)}


def grid(methods: list[str], drafters: list[str], batch_sizes: list[int], ks: list[int]) -> list[dict]:
    """The runs a sweep (verify, bench) makes, as spec fields: every method with each of `drafters` it takes, at the batch sizes
    it runs at (an unbatched method once), each k for a speculative method."""
    out = []
    for name in methods:
        m = METHODS[name]
        for d in [d for d in drafters if d in m.drafters] if m.speculative else ["model"]:
            out += [dict(method=name, drafter=d, batch_size=bs, k=k)
                    for bs in m.batch_sizes(batch_sizes) for k in (ks if m.speculative else ks[:1])]
    return out
