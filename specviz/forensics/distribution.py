"""The verdict on a sampled run: are its tokens drawn from the target's distribution?

Independent of the engine: each sequence's tokens are teacher-forced through the
target alone (batch size 1, no cache, nothing of the engine's layout), its
distribution at every prefix is rebuilt with the run's temperature, top-k and
top-p, and each token gets its randomized PIT (pit.py). Under a correct sampler
the values are independent and uniform; they are pooled and split by what is
known before a token is drawn (its slot in the round, its batch row, the
rounds, pairs of rows), and every split is tested.

Beside it, the decision audit re-derives every recorded accept/reject decision
from the recorded p, q and draw: a correct engine has no mismatch. The draws of
an audited run, or of one with per-request settings (where seeded and unseeded
streams mix), are re-derived too, each from its row's own stream at its token: a
row whose noise was never written, or shared, or shifted by the schedule, fails
there even where its distribution holds. A run with per-request settings has
each sequence's tokens scored under every request's settings: tokens another
request's settings fit far better than the row's own were sampled with them.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch

from specviz.decoding.sampling import ACCEPT, PIT, RESIDUAL, TARGET, Sampler, sampling_of, uniform
from specviz.forensics import pit
from specviz.forensics.recompute import fresh_logits
from specviz.models.pairs import ModelPair
from specviz.trace import metrics
from specviz.trace.evidence import Decisions, OtherSettings
from specviz.trace.findings import Findings
from specviz.trace.schema import Trace

PIT_SEED = 0x5EC7  # the PIT's own draws: never the engine's (those are seeded by the run)
FAMILY_ALPHA = 0.001  # the family-wise significance level of the PIT test and of the settings test
ROUND_SPLITS = 4  # the rounds (or, without rounds, the token indices) cut in this many ranges
MAX_LISTED = 20


def judge_distribution(trace: Trace, pair: ModelPair, prompt_ids: list[list[int]],
                       progress=None) -> Findings:
    """Score every sequence under the target: each sequence's `pit`, the run's `distribution` (with
    the requests' settings that fit a sequence better than its own) and, for speculative runs,
    its `decisions`."""
    spec = trace.manifest.spec
    sampling = sampling_of(spec)
    # Per-request settings: every request's, and greedy (an unset temperature read as greedy), are
    # the others.
    others = (list(dict.fromkeys([*(r.target for r in sampling.rows), Sampler()]))
              if spec.rows else [])
    # Markov: under its own settings, another's likelihood ratio exceeds 1/x with probability at
    # most x.
    threshold = math.log(max(1, len(trace.sequences) * len(others)) / FAMILY_ALPHA)
    fits = []
    pits: dict[int, list[float | None]] = {}
    for s in trace.sequences:
        pits[s.seq] = []
        sampler = sampling.row(s.seq).target
        if s.output_ids:
            logits = fresh_logits(pair.target, prompt_ids[s.seq] + s.output_ids[:-1],
                                  len(s.output_ids), pair.vocab_size)
            # each token drawn under the penalty of the prompt and the tokens before it
            if sampling.penalties:
                logits = sampling.penalties.along(logits, prompt_ids[s.seq], s.output_ids[:-1])
            seqs = torch.tensor([s.seq])
            draws = uniform(PIT_SEED, seqs, torch.arange(len(s.output_ids))[None], PIT)[0]
            tokens = torch.tensor(s.output_ids)
            u, _ = pit.pit(sampler.probs(logits), tokens, draws)
            pits[s.seq] = [None if np.isnan(x) else float(x) for x in u]
            fits += _better_settings(s.seq, logits, tokens, sampler, others, threshold)
        if progress:
            progress(len(s.output_ids))
    found = Findings({seq: {"pit": values} for seq, values in pits.items()})
    found.run["distribution"] = pit.pit_test(
        samples(trace, pits), impossible=sum(x is None for values in pits.values() for x in values),
        alpha=FAMILY_ALPHA)
    found.run["distribution"].settings = fits
    if trace.rows:
        found.run["decisions"] = decisions(trace)
    return found


def _log_likelihood(sampler: Sampler, logits: torch.Tensor, tokens: torch.Tensor) -> float:
    """log P(tokens) under `sampler`'s distributions (-inf where one is impossible)."""
    return float(sampler.probs(logits).double().gather(1, tokens[:, None]).log().sum())


def _better_settings(seq: int, logits: torch.Tensor, tokens: torch.Tensor, own: Sampler,
                     others: list[Sampler], threshold: float) -> list[OtherSettings]:
    """The settings of `others` that fit sequence `seq`'s tokens best, if their likelihood beats its
    `own` settings' by more than e^threshold (nothing else)."""
    mine = _log_likelihood(own, logits, tokens)
    scored = [(_log_likelihood(o, logits, tokens), o) for o in others if o != own]
    best, settings = max(scored, key=lambda x: x[0], default=(-math.inf, None))
    if best == -math.inf or best - mine <= threshold:
        return []
    return [OtherSettings(seq=seq, temperature=settings.temperature, top_k=settings.top_k,
                          top_p=settings.top_p,
                          log_ratio=None if mine == -math.inf else best - mine)]


def samples(trace: Trace, pits: dict[int, list[float | None]]) -> dict[str, np.ndarray]:
    """The PIT values (`pits`: each sequence's) pooled, then split by slot in the round (speculative
    runs), batch row, round range and row pairs; impossible tokens (None) are counted apart,
    not tested."""
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
    out |= {f"rounds {part.index(p)}–{last - part[::-1].index(p)}": by_part[p]
            for p in sorted(by_part)}
    out = {name: np.array(values) for name, values in out.items()}
    out["row pairs"] = pit.row_pairs([np.array([np.nan if u is None else u for u in pits[s.seq]])
                                      for s in trace.sequences])
    return out


def _token_places(trace: Trace) -> dict[int, list[tuple[int | None, int, int]]]:
    """Per sequence, per output token: (slot in its round or None, batch row or None, round or token
    index). Without rounds (the target alone, an engine judged from outside) a token's index stands
    in for its round, and only batched-reference knows its rows."""
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
    """Accepted iff draw < p/q, i.e. draw * q < p (as the engine computes it), for every decided
    draft: those accepted and the first rejected one. The recorded values are the engine's float64
    ones, so a correct engine re-derives exactly."""
    drawn = [r for r in trace.rows if r.accept_draws is not None]
    checked = sum(min(r.accepted + 1, len(r.draft_tokens)) for r in drawn)
    bad = [[r.round, r.row, j] for r in drawn for j in metrics.mismatched(r)]
    audit = Decisions(checked=checked, mismatches=len(bad), first=bad[:MAX_LISTED])
    if trace.manifest.spec.audit or trace.manifest.spec.rows:
        draws, off = streams(trace)
        audit.draws, audit.stream_mismatches, audit.stream_first = draws, len(off), off[:MAX_LISTED]
    return audit


def streams(trace: Trace) -> tuple[int, list[list[int]]]:
    """Every recorded draw against the one its row's own stream gives at its token (a seeded
    request's seed, else the run's seed and the sequence): each decided draft's at the row's token
    index plus its slot, the non-draft token's at the index it lands on, for a bonus (every draft
    accepted) or a residual. Returns the draws checked and [round, seq, token index] of those
    that differ."""
    sampling, have = sampling_of(trace.manifest.spec), defaultdict(int)
    checked, off = 0, []
    for r in sorted((r for r in trace.rows if r.accept_draws is not None), key=lambda r: r.round):
        n, at = len(r.draft_tokens), have[r.seq]
        index = at + torch.tensor([*range(n), r.accepted])
        purpose = torch.tensor([ACCEPT] * n + [TARGET if r.accepted == n else RESIDUAL])
        decided = min(r.accepted + 1, n)  # a draft after the first rejected one decides nothing
        want = sampling.streams([r.seq]).draw(index[None], purpose[None])[0].tolist()
        got = [*r.accept_draws, r.pick_draw]
        slots = [*range(decided), n]
        checked += len(slots)
        off += [[r.round, r.seq, int(index[j])] for j in slots if got[j] != want[j]]
        have[r.seq] += len(r.emitted)
    return checked, off
