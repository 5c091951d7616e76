import numpy as np
import pytest
import torch
from scipy import stats

from specviz.app.plots import WARN
from specviz.app.plots import pit_figure as figure
from specviz.forensics import pit as pitmod
from specviz.forensics.pit import BINS, pit_test, pair_differences, pit, row_pairs, uniformity
from specviz.trace.evidence import Distribution

# A tiny vocabulary with the exact zeros top-k/top-p leave, the last token among them.
P = np.array([0.30, 0.20, 0.15, 0.0, 0.12, 0.10, 0.13, 0.0])
# Samples the power test needs (tokens ranked most probable first): a p' at total-variation distance
# 0.02 from P was rejected (p < 0.001) for all 20 seeds tried at 20,000 tokens (mass moved 0->6,
# 0->1, 4->5, or +-0.01 alternating over 6 tokens), not at 10,000 (16 to 20 of 20). 30,000 leaves a
# margin: the largest p over those 80 runs was 1.6e-10.
N = 30_000


def ranked_below(p: np.ndarray, t: int) -> float:
    """F(x-) by hand: the mass of the tokens more probable than t, or as probable
    with a smaller id."""
    ids = np.arange(len(p))
    return p[(p > p[t]) | ((p == p[t]) & (ids < t))].sum()


def sample(q, n, seed):
    """n tokens drawn from q, their PIT against P, and the draws: what a checker does
    for a sampler."""
    rng = np.random.default_rng(seed)
    tokens = rng.choice(len(q), size=n, p=q)
    draws = rng.random(n)
    u, mass = pit(torch.tensor(P).expand(n, len(P)), torch.tensor(tokens), torch.tensor(draws))
    return tokens, draws, u, mass


def test_the_target_sampler_is_consistent_and_one_at_tv_002_is_rejected():
    _, _, u, _ = sample(P, N, seed=1)
    right = pit_test({"all tokens": u})
    assert right.verdict == "consistent" and right.p >= 0.001 and right.tokens == N
    for src, dst in ((0, 6), (4, 5)):
        q = P.copy()
        q[src] -= 0.02
        q[dst] += 0.02
        assert 0.5 * np.abs(q - P).sum() == pytest.approx(0.02)
        _, _, u, _ = sample(q, N, seed=2)
        wrong = pit_test({"all tokens": u})
        assert (wrong.verdict == "not the target's distribution" and wrong.p < 0.001
                and wrong.failing == "all tokens")


def test_a_wrong_pit_rejects_the_right_sampler():
    tokens, draws, u, mass = sample(P, N, seed=3)
    below = np.array([ranked_below(P, t) for t in range(len(P))])[tokens]
    upto = below + P[tokens]
    assert np.allclose(u, below + draws * P[tokens]) and np.array_equal(mass, P[tokens])
    # The randomisation forgotten (the bin's midpoint), or F(x) in place of F(x-) without it (x
    # counted too):
    for broken in (below + 0.5 * P[tokens], upto):
        assert pit_test({"all tokens": broken}).p < 1e-6
    # F(x) in place of F(x-) with it: the last possible token goes past 1, which no PIT can.
    with pytest.raises(ValueError, match="above 1: F"):
        pit_test({"all tokens": upto + draws * P[tokens]})


def test_chunked_pit_equals_a_direct_computation(monkeypatch):
    g = torch.Generator().manual_seed(0)
    probs = torch.distributions.Dirichlet(torch.full((50,), 0.3, dtype=torch.float64)).sample((13,))
    probs[:, 40:] = 0  # top-k: the tail is exactly zero
    probs /= probs.sum(1, keepdim=True)
    tokens = torch.multinomial(probs, 1, generator=g)[:, 0]
    tokens[5] = 45  # impossible under the target
    draws = torch.rand(13, generator=g, dtype=torch.float64)
    monkeypatch.setattr(pitmod, "CHUNK", 50 * 4)  # 4 rows a chunk, the last one short
    u, mass = pit(probs, tokens, draws)
    direct = [ranked_below(probs[i].numpy(), t) + draws[i] * probs[i, t]
              for i, t in enumerate(tokens.tolist())]
    assert np.isnan(u[5]) and mass[5] == 0
    keep = np.arange(13) != 5
    assert np.allclose(u[keep], np.array(direct)[keep], rtol=0, atol=1e-15)
    assert np.allclose(mass, probs[torch.arange(13), tokens].numpy(), rtol=0, atol=1e-15)


def test_a_float32_row_that_sums_over_1_keeps_its_pit_in_the_unit_interval():
    """A float32 softmax sums to 1 within its rounding; the least probable token drawn at the top of
    its interval once gave u = 1 + 1e-7, and the run died in the uniformity test (seen on an AVX2
    CPU, residual-unclamped)."""
    probs = torch.tensor([[0.5, 0.3, 0.2000001]], dtype=torch.float32)
    assert probs.double().sum() > 1
    u, mass = pit(probs, torch.tensor([2]), torch.tensor([1 - 1e-12], dtype=torch.float64))
    assert 0.99 < u[0] <= 1 and mass[0] == pytest.approx(0.2, abs=1e-6)
    # raises on a value above 1
    uniformity(np.concatenate([u, np.linspace(0.01, 0.99, 60)]), "all tokens")


def test_the_verdict_is_not_anticonservative():
    """200 runs of 10 independent, exactly uniform splits: family-wise rejections at 0.01 stay
    within a binomial bound (without Bonferroni about 16 of 200 would be), each split's p is a
    p-value (without the factor 2 over KS and chi-square about 16% would fall under 0.1), and the KS
    p-values are uniform (not stuck, not inverted)."""
    rejected, splits = 0, []
    for seed in range(200):
        rows = np.random.default_rng(seed).random((10, 100))
        d = pit_test({f"row {i}": r for i, r in enumerate(rows)}, alpha=0.01)
        rejected += d.verdict != "consistent"
        splits += d.splits
    assert rejected <= stats.binom.ppf(0.999, 200, 0.01)
    assert sum(s.p < 0.1 for s in splits) <= stats.binom.ppf(0.999, len(splits), 0.1)
    assert stats.kstest([s.ks for s in splits], "uniform").pvalue > 0.001


def test_impossible_tokens_reject_alone():
    u = np.random.default_rng(0).random(1000)
    d = pit_test({"all tokens": u}, impossible=1)
    assert (d.verdict, d.failing, d.p, d.impossible) == ("not the target's distribution",
                                                         "impossible tokens", 0.0, 1)
    with pytest.raises(ValueError, match="1 values outside"):
        uniformity(np.array([0.5, np.nan]), "all tokens")


def test_too_few_tokens_says_so():
    d = pit_test({"all tokens": np.random.default_rng(0).random(10),
                  "row 0": np.random.default_rng(1).random(5)})
    assert ((d.verdict, d.p, d.failing, d.splits, d.skipped)
            == ("too few tokens", None, None, [], ["all tokens", "row 0"]))
    assert "too few tokens" in figure(d).layout.annotations[0].text


def test_the_split_that_fails_alone_is_named():
    rows = np.random.default_rng(4).random((10, 500))
    rows[3] **= 1.5  # one row's sampler leans to small u
    d = pit_test({"all tokens": rows.ravel(), **{f"row {i}": r for i, r in enumerate(rows)},
                  "row 10": rows[0, :20]})
    assert d.splits[0].p > 0.01  # diluted in the pool
    assert (d.verdict == "not the target's distribution" and d.failing == "row 3"
            and d.skipped == ["row 10"])
    assert d.p / min(s.p for s in d.splits) == pytest.approx(11)  # Bonferroni over the 11 tested
    assert Distribution.model_validate_json(d.model_dump_json()) == d


def test_small_splits_get_fewer_bins():
    assert len(uniformity(np.linspace(0.01, 0.99, 60), "x").counts) == 12
    s = uniformity(np.linspace(0, 1, 1000), "x")  # 0 and 1 both land in a bin
    assert len(s.counts) == BINS and sum(s.counts) == 1000 and s.p == 1.0


def test_row_pairs_see_rows_that_share_one_stream():
    rng = np.random.default_rng(5)
    independent = [sample(P, 400, seed)[2] for seed in range(6)]
    assert pit_test({"row pairs": row_pairs(independent)}).verdict == "consistent"
    # Every row draws the same tokens (one stream, one prompt); the checker's draws are
    # still independent.
    tokens = torch.tensor(rng.choice(len(P), size=400, p=P))
    same = [pit(torch.tensor(P).expand(400, len(P)), tokens, torch.tensor(rng.random(400)))[0]
            for _ in range(6)]
    # each row alone looks right
    assert all(pit_test({"row": u}).verdict == "consistent" for u in same)
    d = pit_test({"row pairs": row_pairs(same)})
    assert d.verdict == "not the target's distribution" and d.tokens == 1200
    assert len(pair_differences(np.array([0.1, 0.9, 0.5]), np.array([0.3, 0.2]))) == 2
    assert np.allclose(pair_differences(np.array([0.1, 0.9]), np.array([0.3, 0.2])), [0.8, 0.7])
    assert len(row_pairs([np.array([0.1, np.nan]), np.array([0.2, 0.3]), np.array([0.5])])) == 1


def test_figure_has_a_panel_and_band_per_shown_split():
    rows = np.random.default_rng(6).random((15, 300))
    rows[7] **= 2
    d = pit_test({"all tokens": rows.ravel(), **{f"row {i}": r for i, r in enumerate(rows)}})
    fig = figure(d)
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 12 and len([t for t in fig.data if t.name == "band"]) == 12
    assert bars[0].name == "all tokens" and bars[1].name == "row 7" and bars[1].marker.color == WARN
    assert all(b.marker.color != WARN for b in bars[2:])
    assert fig.layout.annotations[1].text.startswith("row 7 · n=300 · p=")
    assert len(fig.layout.xaxis12.domain) == 2
