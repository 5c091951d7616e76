"""Does an engine answer the same prompt alike every time? The same requests asked again, and in
another order (so each prompt lands in other slots and shares its batches with other prompts).
Kernels that round alike whatever the batch give the same ids each time; where two answers part, the
first token where they do is reported with both tokens. This is evidence about the engine, not a
verdict: the reference judges each answer, this says whether an answer can be reproduced at all."""
from __future__ import annotations

from specviz.trace.evidence import Determinism, Repeat
from specviz.trace.records import EngineOutput, first_difference

REPEATS = {"again": "the same requests, in the same order, with the same concurrency",
           "reordered": "the same requests in reverse order: other slots, other batch company"}


def compare(first: list[EngineOutput], repeats: dict[str, list[EngineOutput]]) -> Determinism:
    """Each prompt's first answer against its answer in every repeat (prompts that failed in any
    are skipped)."""
    differing, compared = [], 0
    for seq, out in enumerate(first):
        again = {name: outs[seq] for name, outs in repeats.items()}
        if out.error or any(a.error for a in again.values()):
            continue
        compared += 1
        for name, other in again.items():
            if (i := first_difference(out.ids, other.ids)) is not None:
                differing.append(Repeat(seq=seq, run=name, index=i, first=_token_at(out.ids, i),
                                        then=_token_at(other.ids, i)))
    return Determinism(runs={name: REPEATS.get(name, name) for name in repeats}, prompts=compared,
                       differing=differing)


def _token_at(ids: list[int], i: int) -> int | None:
    return ids[i] if i < len(ids) else None
