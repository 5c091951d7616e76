"""The verdict on a sampled run: are its tokens drawn from the target's distribution?

Independent of the engine: each sequence's tokens are teacher-forced through the
target alone (batch size 1, no cache, nothing of the engine's layout), its
distribution at every prefix is rebuilt with the run's temperature, top-k and
top-p, and each token gets its randomized PIT (pit.py). Under a correct sampler
the values are independent and uniform; they are pooled and split by what is
known before a token is drawn (its slot in the round, its batch row, the
rounds, pairs of rows), and every split is tested.

Beside it, the decision audit re-derives every recorded accept/reject decision
from the recorded p, q and draw: a correct engine has no mismatch.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from specviz.decoding.sampling import PIT, sampling_of, uniform
from specviz.forensics import pit
from specviz.forensics.recompute import fresh_logits
from specviz.models.pairs import ModelPair
from specviz.trace import metrics
from specviz.trace.evidence import Decisions
from specviz.trace.findings import Findings
from specviz.trace.schema import Trace

PIT_SEED = 0x5EC7  # the PIT's own draws: never the engine's (those are seeded by the run)
ROUND_SPLITS = 4  # the rounds (or, without rounds, the token indices) cut in this many ranges
MAX_LISTED = 20


def judge(trace: Trace, pair: ModelPair, prompt_ids: list[list[int]], progress=None) -> Findings:
    """Score every sequence under the target: each sequence's `pit`, the run's `distribution` and, for
    speculative runs, its `decisions`."""
    sampling = sampling_of(trace.manifest.spec)
    sampler = sampling.target
    pits: dict[int, list[float | None]] = {}
    for s in trace.sequences:
        pits[s.seq] = []
        if s.output_ids:
            logits = fresh_logits(pair.target, prompt_ids[s.seq] + s.output_ids[:-1], len(s.output_ids),
                                  pair.vocab_size)
            if sampling.penalties:  # each token drawn under the penalty of the prompt and the tokens before it
                logits = sampling.penalties.along(logits, prompt_ids[s.seq], s.output_ids[:-1])
            seqs = torch.tensor([s.seq])
            draws = uniform(PIT_SEED, seqs, torch.arange(len(s.output_ids))[None], PIT)[0]
            u, _ = pit.pit(sampler.probs(logits), torch.tensor(s.output_ids), draws)
            pits[s.seq] = [None if np.isnan(x) else float(x) for x in u]
        if progress:
            progress(len(s.output_ids))
    found = Findings({seq: {"pit": values} for seq, values in pits.items()})
    found.run["distribution"] = pit.judge(samples(trace, pits),
                                          impossible=sum(x is None for values in pits.values() for x in values))
    if trace.rows:
        found.run["decisions"] = decisions(trace)
    return found


def samples(trace: Trace, pits: dict[int, list[float | None]]) -> dict[str, np.ndarray]:
    """The PIT values (`pits`: each sequence's) pooled, then split by slot in the round (speculative runs), batch
    row, round range and row pairs; impossible tokens (None) are counted apart, not tested."""
    where = _token_places(trace)
    k = trace.manifest.spec.k
    last = max((r for places in where.values() for _, _, r in places), default=0)
    part = [r * ROUND_SPLITS // (last + 1) for r in range(last + 1)]  # each round's range
    pooled, by_slot, by_row, by_part = [], defaultdict(list), defaultdict(list), defaultdict(list)
    for s in trace.sequences:
        for u, (slot, row, rnd) in zip(pits[s.seq], where[s.seq]):
            if u is None:
                continue
            pooled.append(u)
            if slot is not None:
                by_slot[slot].append(u)
            if row is not None:
                by_row[row].append(u)
            by_part[part[rnd]].append(u)
    out = {"all tokens": pooled}
    out |= {f"slot {j}" + (" (bonus)" if j == k else ""): by_slot[j] for j in sorted(by_slot)}
    out |= {f"row {r}": by_row[r] for r in sorted(by_row)}
    out |= {f"rounds {part.index(p)}–{last - part[::-1].index(p)}": by_part[p] for p in sorted(by_part)}
    out = {name: np.array(values) for name, values in out.items()}
    out["row pairs"] = pit.row_pairs([np.array([np.nan if u is None else u for u in pits[s.seq]])
                                      for s in trace.sequences])
    return out


def _token_places(trace: Trace) -> dict[int, list[tuple[int | None, int, int]]]:
    """Per sequence, per output token: (slot in its round or None, batch row or None, round or token index).
    Without rounds (the target alone, an engine judged from outside) a token's index stands in for its round,
    and only batched-reference knows its rows."""
    places: dict[int, list] = defaultdict(list)
    if trace.rows:
        for r in trace.rows:
            places[r.seq] += [(j, r.row, r.round) for j in range(len(r.emitted))]
    else:
        spec = trace.manifest.spec
        for s in trace.sequences:
            row = s.seq % spec.batch_size if spec.method == "batched-reference" else None
            places[s.seq] = [(None, row, i) for i in range(len(s.output_ids))]
    return places


def decisions(trace: Trace) -> Decisions:
    """Accepted iff draw < p/q, i.e. draw * q < p (as the engine computes it), for every decided draft: those
    accepted and the first rejected one. The recorded values are the engine's float64 ones, so a correct engine
    re-derives exactly."""
    drawn = [r for r in trace.rows if r.accept_draws is not None]
    checked = sum(min(r.accepted + 1, len(r.draft_tokens)) for r in drawn)
    bad = [[r.round, r.row, j] for r in drawn for j in metrics.mismatched(r)]
    return Decisions(checked=checked, mismatches=len(bad), first=bad[:MAX_LISTED])
