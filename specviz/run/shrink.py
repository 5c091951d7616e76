"""A minimal reproducer: the smallest run that still forks where a divergent run forked.

From a run whose sequence `seq` first departs from the reference at token
`fork` with token `t`, search for a smaller run whose copy of that prompt
still departs at token `fork` with `t`:
  1. the smallest token budget, fork + 1 at best (nothing after the fork
     matters, but near its end a round drafts fewer tokens);
  2. fewer rows: the divergent prompt with its static batch only, then
     without each batch mate it does not need (delta debugging, ddmin);
  3. the smallest batch size that still holds them, the smallest k, and
     the budget again.
Each candidate is decoded once, with the method alone: the batch-size-1
reference of every prompt is decoded once and reused.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specviz.decoding.result import chunks
from specviz.models.pairs import ModelPair
from specviz.run.runner import decode, encode, reference_for, run
from specviz.run.settings import Settings
from specviz.spec.run import RunSpec, SpecError
from specviz.trace import share
from specviz.trace.records import first_difference
from specviz.trace.schema import Trace

MAX_TRIALS = 64


@dataclass
class Shrunk:
    trace: Trace  # the smallest run found, decoded and explained
    seq: int  # the divergent prompt's index in it
    trials: int  # candidate runs decoded

    @property
    def fork(self) -> int:
        return self.trace.sequences[self.seq].first_divergence

    def link(self) -> str:
        """The share link's query string: this run, focused on the fork (the round that emitted it)."""
        f = self.trace.sequences[self.seq].forensics
        m = self.trace.manifest
        return share.encode(share.Link(m.spec, self.seq, f.round if f else None, m.fingerprint,
                                       share.environment(m)))


def size(spec: RunSpec) -> str:
    n = len(spec.prompts)
    return f"{n} prompt{'s' * (n != 1)}, batch size {spec.batch_size}, k {spec.k}, {spec.max_new_tokens} new tokens"


class _Search:
    def __init__(self, spec: RunSpec, pair: ModelPair, seq: int, fork: int, token: int | None,
                 progress: Callable[[int], None] | None, limits: Settings | None):
        self.pair, self.fork, self.token, self.progress = pair, fork, token, progress
        self.ids = dict(zip(spec.prompts, encode(spec, pair, limits)))  # prompt text -> its ids
        self.prompt = spec.prompts[seq]
        self.trials = 0

    def forks(self, spec: RunSpec) -> bool:
        """Whether `spec`'s copy of the prompt departs from the reference at the same token, with the same token."""
        if self.trials >= MAX_TRIALS:
            return False
        self.trials += 1
        if self.progress:
            self.progress(self.trials)
        ids = [self.ids[p] for p in spec.prompts]
        refs = [reference_for(self.pair, [x], spec.max_new_tokens).outputs[0] for x in ids]
        out = decode(spec, self.pair, ids, record=False).outputs
        i = spec.prompts.index(self.prompt)
        at = first_difference(out[i].ids, refs[i].ids)
        return at == self.fork and (out[i].ids[at:at + 1] or [None])[0] == self.token

    def budget(self, spec: RunSpec) -> RunSpec:
        """The smallest token budget that still forks (bisected: a smaller budget also drafts less near its end)."""
        lo, hi = self.fork + 1, spec.max_new_tokens
        while lo < hi:
            mid = (lo + hi) // 2
            if self.forks(spec.model_copy(update={"max_new_tokens": mid})):
                hi = mid
            else:
                lo = mid + 1
        return spec.model_copy(update={"max_new_tokens": hi})

    def ddmin(self, spec: RunSpec, others: list[str]) -> list[str]:
        """The fewest of `others` (beside the divergent prompt, kept in their order) the fork still needs."""
        def keep(subset):
            chosen = set(subset)
            return [p for p in spec.prompts if p == self.prompt or p in chosen]

        def test(subset):
            prompts = keep(subset)
            return self.forks(spec.model_copy(update={"prompts": tuple(prompts),
                                                      "batch_size": min(spec.batch_size, len(prompts))}))

        n = 2
        while others:
            parts = [others[i * len(others) // n:(i + 1) * len(others) // n] for i in range(n)]
            smaller = next((p for p in parts if len(p) < len(others) and test(p)), None)
            if smaller is None and n > 2:
                smaller = next((c for c in ([x for x in others if x not in p] for p in parts) if test(c)), None)
            if smaller is not None:
                others, n = smaller, max(n - 1, 2)
            elif n >= len(others):
                break
            else:
                n = min(2 * n, len(others))
        return others


def shrink(spec: RunSpec, seq: int, fork: int, token: int | None, pair: ModelPair,
           progress: Callable[[int], None] | None = None, limits: Settings | None = None) -> Shrunk:
    """The smallest run found that still forks at sequence `seq`'s token `fork` with `token`. `progress(n)`
    hears of every candidate run; `limits`, a served page's settings, bound the prompts' tokens."""
    if spec.method == "reference":
        raise SpecError("the reference cannot diverge from itself: nothing to shrink")
    if len(set(spec.prompts)) < len(spec.prompts):
        raise SpecError("the run has repeated prompts; shrink needs each prompt once")
    search = _Search(spec, pair, seq, fork, token, progress, limits)
    prompt = spec.prompts[seq]

    spec = search.budget(spec)
    if spec.method != "exspec":  # a static batch never sees the others
        batch = next(c for c in chunks(len(spec.prompts), spec.batch_size) if seq in c)
        mates = [spec.prompts[i] for i in batch]
        alone = spec.model_copy(update={"prompts": tuple(mates), "batch_size": len(mates)})
        if len(mates) < len(spec.prompts) and search.forks(alone):
            spec = alone
    others = search.ddmin(spec, [p for p in spec.prompts if p != prompt])
    spec = spec.model_copy(update={"prompts": tuple(p for p in spec.prompts if p == prompt or p in set(others)),
                                   "batch_size": min(spec.batch_size, len(others) + 1)})
    for k in range(1, spec.k):
        smaller = spec.model_copy(update={"k": k})
        if search.forks(smaller):
            spec = smaller
            break
    spec = RunSpec.build(**search.budget(spec).model_dump())  # validated as any run is
    trace = run(spec)
    return Shrunk(trace, spec.prompts.index(prompt), search.trials)
