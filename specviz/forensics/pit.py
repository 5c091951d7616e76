"""Is a sampler drawing from the target's distribution? The randomized probability
integral transform.

For an emitted token x with target probabilities p at its prefix, U = F(x-) + V * p(x), where F(x-)
is the mass of the tokens ranked before x and V an independent uniform draw. Under a correct sampler
the U values are i.i.d. uniform on (0, 1), whatever p is and whatever order ranks the tokens, as
long as p alone fixes it; a wrong sampler shows as a non-uniform split. The order here is most
probable first: a sampler that favours likely tokens (too low a temperature, a draft's own picks)
piles values near 0, one that favours unlikely tokens near 1, where an order by token id would
scatter both over (0, 1). Splits are made by things known before the token is drawn (slot in the
round, row, rounds, pairs of rows), so each one is uniform too under H0.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from specviz.trace.evidence import Distribution, Split

BINS = 20  # equal bins on [0, 1] for the chi-square test and the histograms
# a split with fewer values is not tested: it would add to the Bonferroni count and cannot reject
MIN = 50
CHUNK = 1 << 22  # elements of probs summed at once: 32 MB in float64, whatever the vocabulary


def pit(probs: torch.Tensor, tokens: torch.Tensor,
        draws: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(u, mass) per token: u = F(x-) + draw * p(x), mass = p(x), both float64.

    probs (n, V): the target's probabilities after temperature/top-k/top-p, rows summing to 1 within
    their dtype's rounding; tokens (n,) the emitted ids; draws (n,) uniform on (0, 1), independent
    of everything else. Each row is renormalised in float64, so u stays in [0, 1] where a float32
    row sums to 1 + 1e-7 (an unlikely token drawn near the top of its interval went over 1 so).
    F(x-) is summed a chunk of rows at a time, so no (n, V) float64 temporary exists. A token the
    target gives probability 0 gets u = NaN: it is impossible under the target, and callers count
    it apart.
    """
    n, vocab = probs.shape
    ids = torch.arange(vocab, device=probs.device)
    below, total = (torch.empty(n, dtype=torch.float64, device=probs.device) for _ in range(2))
    step = max(1, CHUNK // vocab)
    for i in range(0, n, step):
        p, x = probs[i:i + step].double(), tokens[i:i + step, None]
        px = p.gather(1, x)
        # more probable, or as probable with a smaller id
        ranked_before = (p > px) | ((p == px) & (ids < x))
        below[i:i + step] = torch.where(ranked_before, p, 0).sum(1)
        total[i:i + step] = p.sum(1)
    mass = probs.gather(1, tokens[:, None])[:, 0].double() / total
    # float64's own last bit aside, u < 1 already
    u = (below / total + draws.to(below) * mass).clamp(max=1.0)
    u[mass == 0] = math.nan
    return u.cpu().numpy(), mass.cpu().numpy()


def bins(n: int) -> int:
    """BINS, or fewer for small n so that each bin expects at least 5 values (the chi-square rule
    of thumb)."""
    return max(2, min(BINS, n // 5))


def uniformity(values: np.ndarray, name: str) -> Split:
    """KS and binned chi-square tests of values against uniform(0, 1).

    KS sees a shifted or tilted distribution; chi-square sees atoms and narrow bumps (a missing
    randomisation, rows that repeat each other). Values must lie in [0, 1]: drop the NaNs of
    impossible tokens first.
    """
    values = np.asarray(values, dtype=np.float64)
    outside = np.count_nonzero(~((values >= 0) & (values <= 1)))
    if outside:
        raise ValueError(f"{name}: {outside} values outside [0, 1] (NaN: an impossible token, "
                         "count it apart; above 1: F(x) in place of F(x-))")
    k = bins(len(values))
    counts = np.bincount(np.minimum((values * k).astype(np.int64), k - 1), minlength=k)
    ks = float(stats.kstest(values, "uniform").pvalue)
    chi2 = float(stats.chisquare(counts).pvalue)
    return Split(name=name, n=len(values), ks=ks, chi2=chi2, p=min(1.0, 2 * min(ks, chi2)),
                 counts=counts.tolist())


def pit_test(samples: dict[str, np.ndarray], impossible: int = 0, alpha: float = 0.001,
             min_count: int = MIN) -> Distribution:
    """Test every split with at least min_count values; Bonferroni across them.

    samples maps split names to values uniform under H0, the pooled split ("all tokens") first. A
    smaller split is listed in skipped, untested; when the pooled one is, nothing is tested ("too
    few tokens"). An impossible token rejects on its own: no sampler from the target can emit it.
    """
    pooled = len(next(iter(samples.values()), []))
    tested = ({name: v for name, v in samples.items() if len(v) >= min_count}
              if pooled >= min_count else {})
    splits = [uniformity(v, name) for name, v in tested.items()]
    skipped = [name for name in samples if name not in tested]
    worst = min(splits, key=lambda s: s.p, default=None)
    p = min(1.0, worst.p * len(splits)) if worst else None
    if impossible:
        verdict, p, failing = "not the target's distribution", 0.0, "impossible tokens"
    elif worst is None:
        verdict, failing = "too few tokens", None
    elif p < alpha:
        verdict, failing = "not the target's distribution", worst.name
    else:
        verdict, failing = "consistent", None
    return Distribution(verdict=verdict, alpha=alpha, p=p, failing=failing, tokens=pooled,
                        impossible=impossible, splits=splits, skipped=skipped)


def pair_differences(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(a - b) mod 1 over the common length: uniform when the two rows' U values are independent.

    Two rows of one batch that share a random stream and a prompt emit the same tokens; with
    independent V draws their difference is (V_a - V_b) * p(x) mod 1, which piles up near 0 (and,
    wrapped, near 1) whenever p(x) < 1. NaNs (impossible tokens) stay NaN.
    """
    m = min(len(a), len(b))
    return np.mod(a[:m] - b[:m], 1.0)


def row_pairs(rows: list[np.ndarray]) -> np.ndarray:
    """The "row pairs" split: pair_differences of rows (0, 1), (2, 3), ... of one batch, each row's
    U values in output order; disjoint pairs keep the differences independent of each other. NaNs
    are dropped."""
    d = np.concatenate([pair_differences(rows[i], rows[i + 1]) for i in range(0, len(rows) - 1, 2)]
                       or [np.empty(0)])
    return d[~np.isnan(d)]
