"""Sampling: a model's logits turned into the distribution it samples from, and
reproducible draws from it.

A `Sampler` applies temperature, then top-k, then top-p, in the order and with
the boundary conventions of transformers' logits warpers and vLLM's sampler
(a token stays in the nucleus unless the tokens below it already hold 1 - top_p).

Every random number is a counter-based draw: a hash of (seed, sequence,
output index, purpose). A sequence's draws do not depend on which rows it
shares a batch with, how the batch is laid out, or the order rows are served
in, so a run repeats bit for bit and eqspec, exspec and the reference consume
the same numbers at the same token.

A run may give each request its own settings (`Row`: temperature, top-k, top-p,
seed), as a serving engine's batch mixes requests: a seeded request draws from
its own seed's stream whatever its sequence, so two identical seeded requests
emit the same tokens, as vLLM's do. A greedy row's distribution is a point mass
on the argmax, which speculative sampling treats exactly as greedy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specviz.decoding.grammar import Grammar, grammar_of
from specviz.decoding.penalties import Penalties, penalties_of

# What a draw is for: its own stream, so that no two decisions ever share a number.
DRAFT, ACCEPT, RESIDUAL, TARGET, PIT = range(5)
PURPOSES = {DRAFT: "the draft's", ACCEPT: "the acceptance's", RESIDUAL: "the residual's",
            TARGET: "the bonus token's"}  # the draws of a round, in words


def sibling(purpose: int, rank: int) -> int:
    """The purpose of the draws for a token tree's rank-th candidate at a position (0: the chain's
    own draw)."""
    return purpose + 8 * rank


@dataclass(frozen=True)
class Sampler:
    temperature: float = 0.0  # 0: greedy (argmax)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor, truncate: bool = True) -> torch.Tensor:
        """The distribution over the last dim (float32 for float32 logits, float64 for float64).
        `truncate=False`: temperature only, no top-k or top-p (what a sampling fault may use)."""
        # a point mass on the argmax (a greedy draft proposing to a sampling target)
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
        z = logits / self.temperature
        if truncate and self.top_k and self.top_k < z.shape[-1]:
            kth = z.topk(self.top_k, dim=-1).values[..., -1:]
            z = z.masked_fill(z < kth, float("-inf"))
        if truncate and self.top_p < 1.0:
            z = z.masked_fill(_outside_nucleus(z, self.top_p), float("-inf"))
        return z.softmax(-1)


class Samplers:
    """Each batch row's own Sampler, with Sampler's `probs`: the rows that share settings are
    computed together, each group exactly as a batch of its own would be (a row's distribution never
    depends on its batch mates)."""

    def __init__(self, by_row: list[Sampler]):
        self.by_row = by_row

    def probs(self, logits: torch.Tensor, truncate: bool = True) -> torch.Tensor:
        """(B, ..., V): each row's distribution under its own sampler."""
        groups: dict[Sampler, list[int]] = {}
        for row, sampler in enumerate(self.by_row):
            groups.setdefault(sampler, []).append(row)
        if len(groups) == 1:
            return self.by_row[0].probs(logits, truncate)
        out = torch.empty_like(logits)
        for sampler, rows in groups.items():
            at = torch.tensor(rows, device=logits.device)
            out[at] = sampler.probs(logits[at], truncate)
        return out


def _outside_nucleus(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """The tokens whose less likely tokens, themselves included, hold at most 1 - top_p: an
    ascending prefix of the sorted logits (the most likely token always stays). Summed in sorted
    order, as transformers and vLLM do; off the CPU exactly as they do.

    On a CPU the values are sorted by numpy, 15x faster than `torch.sort` over a 49k vocabulary (it
    was two thirds of a small model's sampled decode); the prefix is then every logit below its
    first kept value. Only where that value ties with the last dropped one does the choice depend on
    which of the tied tokens a sort put first, and there torch's order decides, as it always has:
    the mask is bit for bit the same either way."""
    if z.device.type != "cpu" or z.dtype not in (torch.float32, torch.float64):
        srt, order = z.sort(dim=-1)
        drop = _dropped(srt, top_p)
        return drop.scatter(-1, order, drop)
    srt = torch.from_numpy(np.sort(z.detach().numpy(), axis=-1))
    drop = _dropped(srt, top_p)
    dropped = drop.sum(-1, keepdim=True)
    edge = srt.gather(-1, dropped)  # the least likely token kept
    tied = (dropped > 0) & (srt.gather(-1, (dropped - 1).clamp(min=0)) == edge)
    if not tied.any():
        return z < edge
    return drop.scatter(-1, z.sort(dim=-1).indices, drop)


def _dropped(ascending: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which of the sorted logits leave the nucleus (a prefix: on a CPU the cumulative sum
    never decreases)."""
    drop = ascending.softmax(-1).cumsum(-1) <= 1 - top_p
    drop[..., -1] = False
    return drop


SEEDED = -1  # the stream number of a request's own seed: never a sequence's (those count from 0)


@dataclass(frozen=True)
class Row:
    """One request's own settings: the target's sampler, the draft's, its seed (None: the run's
    stream for its sequence), and whether its temperature was left unset (the serving engines'
    default 1.0 stands in)."""

    target: Sampler
    draft: Sampler
    seed: int | None = None
    unset_temperature: bool = False


@dataclass(frozen=True)
class Streams:
    """The random stream each row of a batch draws from: a seed and a stream number (a sequence's,
    or SEEDED), and how many draws the row's generator has skipped (a faulty engine's; 0 in a
    correct one)."""

    seeds: torch.Tensor  # (B,)
    numbers: torch.Tensor  # (B,)
    seeded: torch.Tensor  # (B,) rows with a seed of their own
    skipped: torch.Tensor  # (B,)

    def draw(self, index: torch.Tensor, purpose: int | torch.Tensor) -> torch.Tensor:
        """Each row's draws at token `index` (B,) or (B, n), for `purpose`."""
        return uniform(self.seeds, self.numbers,
                       index + self.skipped.reshape(-1, *([1] * (index.dim() - 1))), purpose)


@dataclass(frozen=True)
class Sampling:
    """How a run samples: the target's settings, the draft's, and the seed of every row's stream; or
    each request's own settings, `rows`, given to the prompt list cyclically (sequence i gets rows[i
    % len(rows)]); and the penalties on the target's logits; and the run's stop
    strings (stops.py); and each request's grammar (grammar.py)."""

    target: Sampler = Sampler()
    draft: Sampler = Sampler()
    seed: int = 0
    # the number of this decode's first sequence: a shard of a prompt list continues its numbering
    first_seq: int = 0
    rows: tuple[Row, ...] = ()
    # on the target's logits, before it chooses (greedy or sampled)
    penalties: Penalties = Penalties()
    stop: tuple[str, ...] = ()
    grammar: Grammar | None = None  # structured output (grammar.py): masks the target's logits

    @property
    def greedy(self) -> bool:
        """Every row takes the argmax: a run is greedy only if each of its requests is."""
        return all(r.target.greedy for r in self.rows) if self.rows else self.target.greedy

    def row(self, seq: int) -> Row:
        """The settings of this decode's sequence `seq`."""
        if not self.rows:
            return Row(self.target, self.draft)
        return self.rows[(seq + self.first_seq) % len(self.rows)]

    def targets(self, seqs: list[int]) -> Samplers:
        return Samplers([self.row(i).target for i in seqs])

    def drafts(self, seqs: list[int]) -> Samplers:
        return Samplers([self.row(i).draft for i in seqs])

    def streams(self, seqs: list[int], skipped: list[int] | None = None, device=None) -> Streams:
        """The streams of this decode's sequences `seqs`: a seeded request's own seed, else the
        run's seed and the sequence's number in the whole prompt list (so a shard draws what one
        process decoding the whole list draws)."""
        seeds = [self.row(i).seed for i in seqs]
        return Streams(torch.tensor([self.seed if s is None else s for s in seeds], device=device),
                       torch.tensor([i + self.first_seq if s is None else SEEDED
                                     for i, s in zip(seqs, seeds)], device=device),
                       torch.tensor([s is not None for s in seeds], device=device),
                       torch.tensor(skipped or [0] * len(seqs), device=device))


GREEDY = Sampling()


def sampling_of(spec, first_seq: int = 0) -> Sampling:
    """How the run `spec` (a RunSpec) samples: the target's settings, the draft's, the seed, and
    each request's own where it gives them; `first_seq`: the number of the decode's first prompt in
    the spec's list."""
    rows = tuple(Row(Sampler(*r.target()), Sampler(*spec.draft_sampling(r)), r.seed,
                     r.temperature is None)
                 for r in spec.rows)
    return Sampling(Sampler(spec.temperature, spec.top_k, spec.top_p),
                    Sampler(*spec.draft_sampling()), spec.seed,
                    first_seq, rows, penalties_of(spec), tuple(spec.stop), grammar_of(spec))


def greedy_of(spec) -> Sampling:
    """The greedy reference's settings for the run `spec`: the argmax, under its penalties and its
    grammar, to its stops."""
    return Sampling(penalties=penalties_of(spec), stop=tuple(spec.stop), grammar=grammar_of(spec))


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


GOLDEN, MUL1, MUL2 = (_signed(c)
                      for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer on int64 tensors: multiplication wraps; `>>` is arithmetic, hence
    the masks."""
    x = x ^ ((x >> 30) & ((1 << 34) - 1))
    x = x * MUL1
    x = x ^ ((x >> 27) & ((1 << 37) - 1))
    x = x * MUL2
    return x ^ ((x >> 31) & ((1 << 33) - 1))


def uniform(seed: int | torch.Tensor, seqs: torch.Tensor, index: torch.Tensor,
            purpose: int | torch.Tensor) -> torch.Tensor:
    """Draws in (0, 1), float64, one per element of `index` (B,) or (B, n); `seqs` (B,) names each
    row's stream, and `seed` its seed: one for all, or (B,) each row's."""
    seqs = seqs.reshape(-1, *([1] * (index.dim() - 1)))
    seeds = (torch.full_like(index, seed) if isinstance(seed, int) else
             seed.reshape(-1, *([1] * (index.dim() - 1))).expand_as(index))
    h = _mix(seeds + GOLDEN)
    for part in (seqs, index, torch.as_tensor(purpose, device=index.device)):
        h = _mix((h ^ part) + GOLDEN)
    return (((h >> 11) & ((1 << 53) - 1)).double() + 0.5) * 2.0 ** -53


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor, normalised: bool = True) -> torch.Tensor:
    """The token whose cumulative weight first exceeds u times the total: one exact draw from the
    normalised `weights` (..., V) per draw u (...). `normalised=False` compares with u alone (a
    fault's sampler)."""
    cdf = weights.double().cumsum(-1)
    idx = (cdf < u[..., None] * (cdf[..., -1:] if normalised else 1.0)).sum(-1)
    return idx.clamp(max=weights.shape[-1] - 1)
