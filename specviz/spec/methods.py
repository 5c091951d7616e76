"""The decoding methods, declared once: what each needs and what it costs
(the drafters: spec/drafters.py).

The spec validates against these declarations, the CLI, the app and the bench list and combine them
from here, and the GPU estimate counts their passes. How each one runs is decoding/decoders.py's.
Declarations are plain data: the spec and the trace schema read them without torch.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specviz.spec.drafters import DEFAULT_DRAFTER, DRAFTERS
from specviz.spec.faults import needing


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    passes: Callable[..., int]  # (spec) -> forward passes a run costs, beside the reference's
    drafters: tuple[str, ...] = ()  # empty: the target alone (k and the drafter do not apply)
    faults: bool = False  # faults (decoding/faults.py) can be injected
    samples: bool = True  # runs sampled (temperature > 0) as well as greedy
    batched: bool = True  # False: one prompt at a time, whatever the batch size
    # a finished row's place goes to the next prompt: a row's batch mates are not a fixed chunk
    refills: bool = False
    max_batch_size: int | None = None
    # the penalties it applies (decoding/penalties.py)
    penalties: tuple[str, ...] = ("repetition", "presence")
    logprobs: bool = True  # records each token's log-probability
    stop_strings: bool = True  # ends an output at a stop string (decoding/stops.py)
    trees: bool = False  # verifies a drafter's token trees (decoding/trees.py), not only chains
    grammar: bool = True  # masks the target's logits with a JSON schema's grammar (grammar.py)
    paged: bool = False  # lays its caches out in blocks when asked (decoding/paging.py)

    @property
    def speculative(self) -> bool:
        return bool(self.drafters)

    def batch_sizes(self, asked: list[int]) -> list[int]:
        """The batch sizes worth running of those `asked` (a sweep runs an unbatched
        method once)."""
        if not self.batched:
            return [1]
        return [bs for bs in asked if self.max_batch_size is None or bs <= self.max_batch_size]


def _rounds(spec, rows_at_once: int) -> int:
    """Speculative rounds, counted at two tokens a round (the low end of what the preset pairs
    accept), each costing a verify pass and the drafter's passes."""
    per_round = 1 + DRAFTERS[spec.drafter].draft_passes(spec.k)
    return (math.ceil(len(spec.prompts) / rows_at_once) * math.ceil(spec.max_new_tokens / 2)
            * per_round)


def _refilled(spec) -> int:
    """A batch kept full: a pass per batch of tokens, and at most one prefill per prompt."""
    return math.ceil(len(spec.prompts) * spec.max_new_tokens / spec.batch_size) + len(spec.prompts)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("reference", "the target alone, one prompt at a time: the ground truth",
           passes=lambda spec: 0, batched=False),  # the reference is the run
    Method("batched-reference",
           "the target alone on the padded batch, kept full as rows finish: batching noise "
           "without speculation", passes=_refilled, refills=True),
    Method("hf-assisted", "transformers' own assisted generation (greedy), an external cross-check",
           passes=lambda spec: _rounds(spec, 1),
           drafters=tuple(n for n, d in DRAFTERS.items() if d.in_transformers),
           samples=False, max_batch_size=1,
           # transformers has no presence penalty, and matches stop strings its own way
           penalties=("repetition",), logprobs=False, stop_strings=False, grammar=False),
    Method("eqspec", "static batches realigned every round (unpad, append, repad)",
           passes=lambda spec: _rounds(spec, spec.batch_size), drafters=tuple(DRAFTERS),
           faults=True, trees=True, paged=True),
    Method("exspec", "a window of sequences, same-length groups batched without realignment",
           passes=lambda spec: _rounds(spec, spec.batch_size), drafters=tuple(DRAFTERS),
           refills=True, trees=True, paged=True),
)}


def grid(methods: list[str], drafters: list[str], batch_sizes: list[int], ks: list[int],
         fault_sets: Sequence[tuple[str, ...]] = ((),),
         temperatures: Sequence[float] = (0.0,)) -> list[dict]:
    """The runs a sweep (verify, bench) makes, as spec fields: every method with each of `drafters`
    it takes and each of `fault_sets` (a method that takes no faults once, with none), at the batch
    sizes it runs at (an unbatched method once), each k for a speculative method, and each of
    `temperatures` it samples at (a method that runs greedy only at 0, a fault set holding a fault
    that needs a sampled run only above 0)."""
    out = []
    for name in methods:
        m = METHODS[name]
        for d in [d for d in drafters if d in m.drafters] if m.speculative else [DEFAULT_DRAFTER]:
            for faults in fault_sets if m.faults else [()]:
                sampling = bool(needing("sampled", faults))
                temps = [t for t in temperatures if (m.samples or t == 0)
                         and (t > 0 or not sampling)]
                out += [{"method": name, "drafter": d, "faults": tuple(faults), "batch_size": bs,
                         "k": k, "temperature": t}
                        for bs in m.batch_sizes(batch_sizes)
                        for k in (ks if m.speculative else ks[:1]) for t in temps]
    return out
