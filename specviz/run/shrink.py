"""A minimal reproducer: the smallest run that still shows what a run showed at one
of its sequences.

What it must still show is a `Mark` at token `fork` of sequence `seq`: greedy, that the sequence
departs from the reference there with token `t`; sampled, that its state is named corrupt (the
audit) from the round that drew that token, or that it draws `t` there though the target gives it
probability 0. Search for a smaller run whose copy of that prompt still shows it:
  1. the smallest token budget, fork + 1 at best (nothing after the fork
     matters, but near its end a round drafts fewer tokens);
  2. fewer rows: the divergent prompt with its static batch only, then
     without each batch mate it does not need (delta debugging, ddmin);
  3. the smallest batch size that still holds them, the smallest k, and
     the budget again.
Each greedy candidate is decoded once, with the method alone: the batch-size-1
reference of every prompt is decoded once and reused. A sampled candidate is a
whole run: audited for a state, its tokens scored for an impossible one.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from specviz.decoding.result import chunks
from specviz.decoding.sampling import greedy_of
from specviz.models.pairs import ModelPair
from specviz.run.runner import decode, encode, reference_for, run
from specviz.run.settings import Settings
from specviz.spec.methods import METHODS
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics, share
from specviz.trace.records import SequenceRecord, first_difference
from specviz.trace.schema import Trace

MAX_TRIALS = 64


@dataclass(frozen=True)
class Mark:
    """What a smaller run must still show at its copy of the prompt: `kind` "fork" (it departs from
    the reference at token `fork`, with `token`), "state" (sampled, audited: its state named
    `verdict` from the round that drew token `fork`) or "impossible" (sampled: it draws `token` at
    `fork`, which the target gives probability 0)."""

    kind: Literal["fork", "state", "impossible"]
    fork: int
    token: int | None
    verdict: str | None = None

    def shown_by(self, s: SequenceRecord) -> bool:
        """Whether sequence `s` of a smaller (sampled) run still shows this."""
        if self.kind == "state":
            return (s.forensics is not None
                    and (s.forensics.verdict, s.forensics.fork) == (self.verdict, self.fork))
        return (self.fork < len(s.pit or ()) and s.pit[self.fork] is None
                and s.output_ids[self.fork] == self.token)

    def describe(self) -> str:
        if self.kind == "fork":
            return f"forks at token {self.fork}"
        if self.kind == "state":
            return f"has its state named {self.verdict} from the round that drew token {self.fork}"
        return f"draws token {self.fork} (id {self.token}), which the target gives probability 0"


def mark_of(trace: Trace, seq: int) -> Mark:
    """What sequence `seq` of `trace` shows that a reproducer should keep, or a SpecError saying it
    shows nothing."""
    if not 0 <= seq < len(trace.sequences):
        raise SpecError(f"there is no sequence {seq}: the run has {len(trace.sequences)}")
    s = trace.sequences[seq]
    if not metrics.sampled(trace):
        if s.equivalent is not False:
            raise SpecError(f"sequence {seq} does not diverge from the reference: nothing to "
                            "shrink")
        fork = s.first_divergence
        return Mark("fork", fork, s.output_ids[fork] if fork < len(s.output_ids) else None)
    if s.forensics is not None:
        return Mark("state", s.forensics.fork, s.forensics.output_token, s.forensics.verdict)
    bad = next((i for i, u in enumerate(s.pit or ()) if u is None), None)
    if bad is not None:
        return Mark("impossible", bad, s.output_ids[bad])
    raise SpecError(f"sequence {seq} of this sampled run shows neither a corrupt state nor a token "
                    "the target could not draw: nothing to shrink"
                    + ("" if trace.manifest.spec.audit
                       else " (run it with --audit to check its states)"))


@dataclass
class Shrunk:
    trace: Trace  # the smallest run found, decoded and explained
    seq: int  # the divergent prompt's index in it
    mark: Mark  # what it still shows there
    trials: int  # candidate runs decoded

    @property
    def fork(self) -> int:
        return self.mark.fork

    def link(self) -> str:
        """The share link's query string: this run, focused on the fork (the round
        that emitted it)."""
        f = self.trace.sequences[self.seq].forensics
        m = self.trace.manifest
        return share.encode_link(share.Link(m.spec, self.seq, f.round if f else None, m.fingerprint,
                                            share.environment(m)))


def size(spec: RunSpec) -> str:
    n = len(spec.prompts)
    return (f"{n} prompt{'s' * (n != 1)}, batch size {spec.batch_size}, k {spec.k}, "
            f"{spec.max_new_tokens} new tokens")


class _Search:
    def __init__(self, spec: RunSpec, pair: ModelPair, seq: int, mark: Mark,
                 progress: Callable[[int], None] | None, limits: Settings | None):
        self.pair, self.mark, self.fork, self.progress, self.limits = (pair, mark, mark.fork,
                                                                       progress, limits)
        self.ids = dict(zip(spec.prompts, encode(spec, pair, limits)))  # prompt text -> its ids
        self.prompt = spec.prompts[seq]
        self.trials = 0

    def forks(self, spec: RunSpec) -> bool:
        """Whether `spec`'s copy of the prompt still shows the mark."""
        if self.trials >= MAX_TRIALS:
            return False
        self.trials += 1
        if self.progress:
            self.progress(self.trials)
        i = spec.prompts.index(self.prompt)
        # a sampled run: no reference; its state audited, or its tokens scored
        if self.mark.kind != "fork":
            trace = run(spec, with_reference=self.mark.kind == "impossible", limits=self.limits)
            return self.mark.shown_by(trace.sequences[i])
        ids = [self.ids[p] for p in spec.prompts]
        refs = [reference_for(self.pair, [x], spec.max_new_tokens,
                              greedy=greedy_of(spec)).outputs[0] for x in ids]
        out = decode(spec, self.pair, ids, record=False).outputs
        at = first_difference(out[i].ids, refs[i].ids)
        return at == self.fork and (out[i].ids[at:at + 1] or [None])[0] == self.mark.token

    def budget(self, spec: RunSpec) -> RunSpec:
        """The smallest token budget that still forks (bisected: a smaller budget also drafts less
        near its end)."""
        lo, hi = self.fork + 1, spec.max_new_tokens
        while lo < hi:
            mid = (lo + hi) // 2
            if self.forks(spec.model_copy(update={"max_new_tokens": mid})):
                hi = mid
            else:
                lo = mid + 1
        return spec.model_copy(update={"max_new_tokens": hi})

    def ddmin(self, spec: RunSpec, others: list[str]) -> list[str]:
        """The fewest of `others` (beside the divergent prompt, kept in their order) the fork
        still needs."""
        def keep(subset):
            chosen = set(subset)
            return [p for p in spec.prompts if p == self.prompt or p in chosen]

        def test(subset):
            prompts = keep(subset)
            return self.forks(spec.on_prompts(prompts,
                                              batch_size=min(spec.batch_size, len(prompts))))

        n = 2
        while others:
            parts = [others[i * len(others) // n:(i + 1) * len(others) // n] for i in range(n)]
            smaller = next((p for p in parts if len(p) < len(others) and test(p)), None)
            if smaller is None and n > 2:
                smaller = next((c for c in ([x for x in others if x not in p] for p in parts)
                                if test(c)), None)
            if smaller is not None:
                others, n = smaller, max(n - 1, 2)
            elif n >= len(others):
                break
            else:
                n = min(2 * n, len(others))
        return others


def shrink(spec: RunSpec, seq: int, mark: Mark, pair: ModelPair,
           progress: Callable[[int], None] | None = None, limits: Settings | None = None) -> Shrunk:
    """The smallest run found whose sequence `seq` still shows `mark` (mark_of). `progress(n)` hears
    of every candidate run; `limits`, a served page's settings, bound the prompts' tokens."""
    if spec.method == "reference" and spec.greedy:
        raise SpecError("the reference cannot diverge from itself: nothing to shrink")
    if len(set(spec.prompts)) < len(spec.prompts):
        raise SpecError("the run has repeated prompts; shrink needs each prompt once")
    search = _Search(spec, pair, seq, mark, progress, limits)
    prompt = spec.prompts[seq]

    spec = search.budget(spec)
    if not METHODS[spec.method].refills:  # a static batch never sees the others
        batch = next(c for c in chunks(len(spec.prompts), spec.batch_size) if seq in c)
        mates = [spec.prompts[i] for i in batch]
        alone = spec.on_prompts(mates, batch_size=len(mates))
        if len(mates) < len(spec.prompts) and search.forks(alone):
            spec = alone
    others = search.ddmin(spec, [p for p in spec.prompts if p != prompt])
    spec = spec.on_prompts([p for p in spec.prompts if p == prompt or p in set(others)],
                           batch_size=min(spec.batch_size, len(others) + 1))
    for k in range(1, spec.k):
        smaller = spec.model_copy(update={"k": k})
        if search.forks(smaller):
            spec = smaller
            break
    spec = RunSpec.build(**search.budget(spec).model_dump())  # validated as any run is
    trace = run(spec, limits=limits)
    return Shrunk(trace, spec.prompts.index(prompt), mark, search.trials)
