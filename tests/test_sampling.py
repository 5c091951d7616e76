"""Speculative sampling: the sampler's pieces against independent anchors, runs that repeat bit for
bit, the correct samplers judged consistent, and every sampling fault (and bugs planted here) judged
not the target's distribution."""
import numpy as np
import pytest
import torch
from scipy import stats
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from specviz.decoding import faults as faults_module
from specviz.decoding.faults import Policy
from specviz.decoding.sampling import ACCEPT, DRAFT, TARGET, Sampler, inverse_cdf, uniform
from specviz.run.runner import run
from specviz.spec.faults import FAULTS, of_kind
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.trace import metrics, share

PROMPTS = ("Write a short poem about the sea.", "Explain recursion.", "List three fruits.",
           "What is 2+2?")
SAMPLED = {"temperature": 0.8, "top_p": 0.95}


def _tiny(prompts=PROMPTS * 4, dtype="float32", **fields):
    fields = {"method": "eqspec", "batch_size": 4, "k": 4, "max_new_tokens": 48, "seed": 1,
              **SAMPLED, **fields}
    return run(RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype=dtype, device="cpu",
                             prompts=prompts, **fields))


@pytest.mark.parametrize("temperature,top_k,top_p",
                         [(0.7, 0, 1.0), (1.3, 20, 1.0), (0.8, 0, 0.9), (1.0, 50, 0.5)])
def test_the_sampler_is_transformers_warpers_in_their_order(temperature, top_k, top_p):
    logits = torch.randn(6, 300, dtype=torch.float64) * 3
    z = TemperatureLogitsWarper(temperature)(None, logits)
    if top_k:
        z = TopKLogitsWarper(top_k)(None, z)
    if top_p < 1:
        z = TopPLogitsWarper(top_p)(None, z)
    assert torch.allclose(Sampler(temperature, top_k, top_p).probs(logits), z.softmax(-1),
                          atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_nucleus_is_transformers_bit_for_bit_over_a_real_vocabulary_ties_included(dtype):
    """Sampled runs replay bit for bit only if the nucleus never moves: on a 49k vocabulary, and on
    coarse logits whose ties straddle the nucleus' edge (where which tied token stays is the sort's
    choice), the distribution is exactly the one transformers' warper gives."""
    g = torch.Generator().manual_seed(0)
    smooth = torch.randn(8, 49_152, generator=g, dtype=dtype) * 3
    coarse = (torch.randn(64, 40, generator=g, dtype=dtype) * 4).round() / 2
    for logits in (smooth, coarse):
        for top_p in (0.3, 0.9, 0.95):
            assert torch.equal(Sampler(1.0, 0, top_p).probs(logits),
                               TopPLogitsWarper(top_p)(None, logits).softmax(-1))


def test_draws_are_uniform_and_each_stream_is_its_own():
    seqs, index = torch.arange(64), torch.arange(200)[None].expand(64, 200)
    u = uniform(7, seqs, index, DRAFT)
    assert stats.kstest(u.flatten().numpy(), "uniform").pvalue > 1e-3
    assert ((u > 0) & (u < 1)).all()
    # One sequence's draws are the same alone or in any batch, and differ by seed, sequence
    # and purpose.
    assert torch.equal(uniform(7, seqs[5:6], index[:1], DRAFT)[0], u[5])
    for other in (uniform(8, seqs, index, DRAFT), uniform(7, seqs + 1, index, DRAFT),
                  uniform(7, seqs, index, ACCEPT)):
        assert abs(np.corrcoef(u.flatten(), other.flatten())[0, 1]) < 0.02


def test_inverse_cdf_draws_from_the_weights():
    # unnormalised on purpose; a zero weight is never drawn
    weights = torch.tensor([0.5, 0.0, 2.0, 1.5])
    u = uniform(0, torch.zeros(40_000, dtype=torch.long), torch.arange(40_000), TARGET)
    counts = torch.bincount(inverse_cdf(weights.expand(40_000, 4), u), minlength=4).numpy()
    assert counts[1] == 0
    assert stats.chisquare(counts[[0, 2, 3]], 40_000 * np.array([0.125, 0.5, 0.375])).pvalue > 1e-3


def test_a_greedy_spec_keeps_its_key():
    """The sampling fields a greedy run leaves at their defaults stay out of its canonical form:
    links and fingerprints of greedy runs made before sampling existed still match."""
    spec = RunSpec.build(prompts=("Hi",))
    assert not any(f in spec.canonical_json() for f in ("top_k", "top_p", "draft_temperature"))
    assert "top_p" in RunSpec.build(prompts=("Hi",), temperature=0.5, top_p=0.9).canonical_json()


def test_a_sampled_run_repeats_bit_for_bit_and_its_link_replays_it():
    first = _tiny(PROMPTS, max_new_tokens=24)
    link = share.decode_link(share.encode_link(share.Link(first.manifest.spec,
                                                          fingerprint=first.manifest.fingerprint)))
    again = run(link.spec)
    assert again.manifest.fingerprint == first.manifest.fingerprint == link.fingerprint
    assert [s.output_ids for s in again.sequences] == [s.output_ids for s in first.sequences]
    other_seed = _tiny(PROMPTS, max_new_tokens=24, seed=2)
    assert [s.output_ids for s in other_seed.sequences] != [s.output_ids for s in first.sequences]


def test_a_sequence_draws_the_same_tokens_whatever_its_batch():
    """Every draw is keyed by (seed, sequence, token index, purpose): in float64, where batching
    changes no probability that matters, eqspec at batch size 1 and 4 and exspec emit the same
    tokens, and so do the reference and batched-reference."""
    def ids(t):
        return [s.output_ids for s in t.sequences]

    eq1 = _tiny(PROMPTS, dtype="float64", batch_size=1, max_new_tokens=24)
    assert ids(_tiny(PROMPTS, dtype="float64", batch_size=4, max_new_tokens=24)) == ids(eq1)
    assert ids(_tiny(PROMPTS, dtype="float64", method="exspec", batch_size=2,
                     max_new_tokens=24)) == ids(eq1)
    ref = _tiny(PROMPTS, dtype="float64", method="reference", batch_size=1, max_new_tokens=24)
    assert ids(_tiny(PROMPTS, dtype="float64", method="batched-reference",
                     max_new_tokens=24)) == ids(ref)


@pytest.mark.parametrize("method", ["reference", "batched-reference", "eqspec", "exspec"])
def test_the_correct_samplers_are_consistent_on_the_tiny_pair(method):
    trace = _tiny(method=method, batch_size=1 if method == "reference" else 4)
    d = trace.distribution
    assert (d.verdict == "consistent" and d.impossible == 0
            and d.tokens == sum(len(s.output_ids) for s in trace.sequences))
    assert all(s.pit is not None and len(s.pit) == len(s.output_ids) for s in trace.sequences)
    if method in ("eqspec", "exspec"):
        assert trace.decisions.checked > 0 and trace.decisions.mismatches == 0
        assert {r.pick_from for r in trace.rows} <= {"target", "residual"}
        assert any(s.name.startswith("slot") for s in d.splits)


# 20 seeds each: benchmarks/sampled_audit.py
@pytest.mark.parametrize("method,seed", [("eqspec", 0), ("exspec", 1)])
def test_the_correct_samplers_are_consistent_on_the_embedded_pair(embedded, method, seed):
    spec = RunSpec.build(prompts=tuple(builtin_set("quick") * 2), method=method, batch_size=4, k=5,
                         max_new_tokens=32, device="cpu", seed=seed, **SAMPLED)
    trace = run(spec)
    assert trace.distribution.verdict == "consistent", trace.distribution
    assert trace.decisions.mismatches == 0


# Where each fault shows on the tiny pair. Its random weights give flat distributions, so at
# temperature 0.8 and top-p 0.95 the faults that put mass outside the nucleus emit impossible
# tokens; a draft that comes from the draft's q shows when q is flatter than p (the draft at 0.6,
# the target at 0.3). (target-probs-mutated rejects every draft: a round a token, minutes here;
# tests/test_row_sampling.py and tests/test_casebook.py run it small.)
# (A draft drawn from another q than its decision reads biases the output too little for this size:
# the proposal audit names it, tests/test_sampled_audit.py.)
SHOWS = {fault: {} for fault in [*of_kind("sampling"), "draft-bonus"]
         if fault != "target-probs-mutated" and FAULTS[fault].verdict != "sampler-bug:proposal"}
SHOWS["residual-from-draft"] = {"temperature": 0.3, "draft_temperature": 0.6}


def _fault_run(fault, **fields):
    """Shared streams show when rows see the same prompt; every other fault on the usual prompts."""
    prompts = (PROMPTS[0],) * 16 if fault == "shared-stream" else PROMPTS * 4
    return _tiny(prompts, faults=(fault,), **fields)


@pytest.mark.parametrize("fault", SHOWS)
def test_every_sampling_fault_is_rejected(fault):
    trace = _fault_run(fault, **SHOWS[fault])
    d = trace.distribution
    assert d.verdict == "not the target's distribution" and d.p < 1e-3, d
    # Unaudited, only a decision against its own record is named; the rest needs the state audit to
    # be told apart from a corrupt state (tests/test_sampled_audit.py runs it).
    kind = "sampler-bug:decisions" if fault == "accept-q-over-p" else "unexplained"
    assert metrics.sampled_verdict(trace)[0] == kind, metrics.sampled_verdict(trace)


@pytest.mark.parametrize("fault",
                         ["residual-unclamped", "residual-unnormalised", "temperature-draft-only",
                          "shared-stream"])
def test_without_top_p_the_pit_splits_alone_reject(fault):
    """No token is impossible without top-k or top-p: these faults are rejected
    by the uniformity tests."""
    d = _fault_run(fault, temperature=0.3, top_p=1.0).distribution
    assert d.verdict == "not the target's distribution" and d.impossible == 0 and d.p < 1e-3, d


def test_the_decision_audit_re_derives_every_decision():
    """The accept-q-over-p fault decides by q/p: re-derived by p/q, its decisions mismatch; the
    correct engine's never do (test above)."""
    trace = _fault_run("accept-q-over-p")
    assert trace.decisions.mismatches > 0 and trace.decisions.first


def test_a_planted_bug_outside_the_catalogue_is_rejected(monkeypatch):
    """A residual that forgets to subtract q (it draws from p after a rejection): no fault of ours
    does that."""
    monkeypatch.setattr(Policy, "residual",
                        lambda self, sampler, logits, p, q, u: inverse_cdf(p, u))
    trace = _tiny(PROMPTS * 4, temperature=1.0, top_p=1.0, draft_temperature=0.4, audit=4)
    d = trace.distribution
    assert d.verdict == "not the target's distribution" and d.impossible == 0, d
    assert metrics.sampled_verdict(trace)[0] == "sampler-bug:rule"


def test_a_planted_target_temperature_is_rejected(monkeypatch):
    """A target that verifies at 0.6 while the run asks 0.8, with no top-p (so no token is
    impossible): the PIT's own splits reject it."""
    real = faults_module.Policy.target_sampler
    monkeypatch.setattr(Policy, "target_sampler", lambda self, s: Sampler(0.6, s.top_k, s.top_p)
                        if real(self, s) == s else real(self, s))
    d = _tiny(PROMPTS * 4, top_p=1.0).distribution
    assert d.verdict == "not the target's distribution" and d.impossible == 0 and d.p < 1e-3, d
