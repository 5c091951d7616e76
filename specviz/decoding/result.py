"""What every decoder returns, whatever its method."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specviz.trace.records import ReferenceProof

Progress = Callable[[int], None]  # called with the number of new tokens just produced


@dataclass
class SequenceOutput:
    ids: list[int]  # generated ids, through the first EOS, never past it
    # target top-1 minus top-2 logit per generated token
    margins: list[float] = field(default_factory=list)
    # per generated token, under the target (decoding/penalties.py)
    logprobs: list[float] = field(default_factory=list)
    # seconds from the start of decoding to this sequence's last token
    finished_at: float | None = None
    # a reference proved by teacher forcing, not decoded (forensics/proof.py)
    proof: ReferenceProof | None = None


@dataclass
class DecodeResult:
    outputs: list[SequenceOutput]
    seconds: float  # decode wall time, model loading excluded
    rounds: list = field(default_factory=list)  # speculative methods: their per-round trace records
    # What a watch (watch.py) found, when the decode was watched: seq -> ForkState at its first
    # divergence, and (round, seq) -> (target, draft) logit differences of audited rows.
    forks: dict = field(default_factory=dict)
    audit: dict = field(default_factory=dict)
    # a paged layout's pools (paging.Memory.stats): blocks, prefix-cache lookups and hits, copies
    paging: dict | None = None

    @property
    def new_tokens(self) -> int:
        return sum(len(o.ids) for o in self.outputs)


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit along the last dim: how close the argmax was to flipping."""
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def chunks(n: int, size: int) -> list[range]:
    """Static batches: consecutive prompts, `size` at a time."""
    return [range(i, min(i + size, n)) for i in range(0, n, size)]
