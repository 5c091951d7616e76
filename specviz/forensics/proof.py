"""The greedy reference proved from an output, instead of decoded token by token.

The batch-size-1 reference writes, at each position, the target's argmax on its own prefix, in the
run's dtype. An output teacher-forced through the target in float64 (one fresh batch-size-1 pass;
enginenoise.force) shows, at every position, the float64 argmax and its top-1 minus top-2 margin.
Where the output's token is that argmax by a margin beyond the rounding yardstick's tolerance (the
most two correct passes in the run's dtype differ on a logit difference, at the yardstick's stated
false-alarm rate), the reference, a correct pass in that dtype, writes the same token. So an
output's leading tokens are the reference's, proved, with no decode at all.

The proof ends at the output's first fork (its token is not the float64 argmax), its first near-tie
(a margin within the tolerance: there the reference's own rounding decides), or its end short of the
budget without an end of sequence. From a fork or an end the reference is decoded one token at a
time at batch size 1 on the proved prefix (prefilled in one pass), and kept where that decode's own
margins are clear; from a near-tie, or where they are not, it is decoded from the prompt exactly as
the plain reference is. Each sequence records which way its reference was obtained.
"""
from __future__ import annotations

import math
import time

from specviz.decoding import reference as decoding
from specviz.decoding.result import DecodeResult, Progress, SequenceOutput
from specviz.decoding.sampling import GREEDY, Sampling
from specviz.decoding.stops import Stops
from specviz.forensics.enginenoise import Forced, Memo, computed
from specviz.models.pairs import ModelPair
from specviz.trace.records import ReferenceProof

NEAR_TIE = "a near-tie"


def proved(output: list[int], forced: Forced, tolerance: float, stops: Stops,
           budget: int) -> tuple[int, str | None]:
    """How many leading tokens of `output` are the reference's, and why the proof stops short of the
    whole reference (None: it does not; the output is the reference)."""
    end = stops.end(output[:budget])
    for i in range(min(len(output), budget)):
        if forced.gaps[i] > 0:
            return i, (f"a fork at token {i}: the output's token is {forced.gaps[i]:.3g} logits "
                       "below the target's float64 argmax")
        if forced.margins[i] <= tolerance:
            return i, (f"{NEAR_TIE} at token {i}: the target's float64 top-2 margin, "
                       f"{forced.margins[i]:.3g} logits, is within the tolerance "
                       f"({tolerance:.3g}), so the reference's own rounding decides it")
        if i + 1 == end:
            return end, None
    if len(output) >= budget:
        return budget, None
    return (len(output),
            f"the output ends at token {len(output)}, short of the budget, without a stop")


def proved_reference(pair: ModelPair, prompt_ids: list[list[int]],
                     candidates: list[dict[str, tuple[list[int], Forced]]],
                     budget: int, tolerance: float, progress: Progress | None = None,
                     memo: Memo = computed, greedy: Sampling = GREEDY) -> DecodeResult:
    """The reference of every prompt, proved from the longest-proved of its candidate outputs
    ({role: (ids, forced)}, e.g. an engine's and its control's), and decoded where the proof stops
    (`greedy`: the run's stop strings). `memo(key, compute)`: where each decode's tail is kept, so
    that a prompt decoded on from the same tokens again is decoded once.

    After a fork or an output's end, the rest is decoded on the proved prefix. That decode's cache
    was filled in one pass where the plain reference's grew a token at a time: two correct
    computations, which choose alike wherever the decode's own margin exceeds twice the tolerance
    (each may move a margin by up to the tolerance). A sequence whose decode meets a closer margin,
    or whose proof stopped at a near-tie, is decoded again from its prompt, token by token, exactly
    as the plain reference is."""
    start, refs, stops = time.perf_counter(), [], Stops.of(pair, greedy.stop)
    for outputs in candidates:
        found = {role: proved(ids, forced, tolerance, stops, budget)
                 for role, (ids, forced) in outputs.items()}
        role = max(found, key=lambda r: (found[r][0], found[r][1] is None), default=None)
        n, stop = found[role] if role else (0, "no output to prove it from")
        ids, forced = outputs[role] if role else ([], Forced([], [], [], [], []))
        refs.append(SequenceOutput(ids[:n], forced.margins[:n], proof=ReferenceProof(
            proved=n, decoded=0, source=role or "none", tolerance=tolerance,
            smallest_margin=min(forced.margins[:n], default=None), stop=stop)))
    stopped = [i for i, out in enumerate(refs) if out.proof.stop]
    tails = [i for i in stopped if refs[i].proof.proved
             and not refs[i].proof.stop.startswith(NEAR_TIE)]
    _decode(pair, prompt_ids, tails, refs, budget, progress, memo, greedy)
    again = [i for i in stopped if i not in tails
             or min(refs[i].margins[refs[i].proof.proved:], default=math.inf) <= 2 * tolerance]
    for i in set(again) & set(tails):
        tail = refs[i].margins[refs[i].proof.proved:]
        j = refs[i].proof.proved + next(k for k, m in enumerate(tail) if m <= 2 * tolerance)
        refs[i].proof.stop += (f"; decoded after it, token {j}'s margin ({refs[i].margins[j]:.3g}) "
                               "was within twice the tolerance, so the reference was decoded again "
                               "from its prompt")
    for i in again:
        refs[i] = SequenceOutput(
            [], proof=refs[i].proof.model_copy(update={"proved": 0, "smallest_margin": None}))
    _decode(pair, prompt_ids, again, refs, budget, progress, memo, greedy)
    return DecodeResult(refs, time.perf_counter() - start)


def holds(out: SequenceOutput, tolerance: float) -> bool:
    """Whether a reference obtained here stands under a wider `tolerance`: every proved margin
    beyond it, and every margin decoded after a proved prefix beyond twice it (one decoded from its
    prompt is the plain reference)."""
    p = out.proof
    if p is None or not p.proved:
        return True
    return (p.smallest_margin is None or p.smallest_margin > tolerance) and all(
        m > 2 * tolerance for m in out.margins[p.proved:])


def _decode(pair: ModelPair, prompt_ids: list[list[int]], seqs: list[int],
            refs: list[SequenceOutput], budget: int,
            progress: Progress | None, memo: Memo, greedy: Sampling) -> None:
    """Decode the references of `seqs` on from their tokens so far, in place."""
    for i in seqs:
        out, prompt = refs[i], prompt_ids[i]
        key = ("decoded on", tuple(prompt), tuple(out.ids), budget, *greedy.stop)
        ids, margins = memo(key, lambda: _tail(pair, prompt, out, budget, progress, greedy))
        out.ids.extend(ids)
        out.margins.extend(margins)
        out.proof.decoded = len(out.ids) - out.proof.proved


def _tail(pair: ModelPair, prompt: list[int], out: SequenceOutput, budget: int,
          progress: Progress | None, greedy: Sampling) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The tokens and margins the batch-size-1 reference decodes after `out`'s."""
    given = len(out.ids)
    done = decoding.reference(pair, [prompt], budget, progress, greedy,
                              known=[SequenceOutput(list(out.ids), list(out.margins))])
    return tuple(done.outputs[0].ids[given:]), tuple(done.outputs[0].margins[given:])
