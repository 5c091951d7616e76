"""Batch-invariant mode (models/invariant.py, docs/batch_invariant.md): a row's logits are the same
bits in any batch, so a verify pass is bit for bit a fresh batch-size-1 pass, and forks and audits
are judged at zero tolerance.

The audit compares every row's verify pass (and its draft's) with a fresh batch-size-1 pass of its
real tokens, without a cache: in this mode every difference is exactly 0.0, on the embedded and the
tiny pairs, in float32 and bfloat16, chains and trees, a draft model, prompt lookup and a head, and
two hybrid families (Gated DeltaNet and Mamba-2). Every planted kernel mutant, those the rounding
yardstick cannot see included, is named at its first differing bit."""
import json

import pytest
import torch
from hybrids import save_pair
from kernel_bugs import BUGS, SUBTLE, planted

from specviz.cli import main as cli
from specviz.models.pairs import load_pair
from specviz.run import runner
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import (TINY_DRAFT, TINY_HYBRID, TINY_HYBRID_DRAFT, TINY_TARGET, TINY_WINDOW,
                              TINY_WINDOW_DRAFT, RunSpec)
from specviz.spec.strict import SpecError
from specviz.trace.schema import Trace

QUICK = tuple(builtin_set("quick"))
PAIRS = {"embedded": {}, "tiny": dict(target=TINY_TARGET, draft=TINY_DRAFT),
         "tiny-hybrid": dict(target=TINY_HYBRID, draft=TINY_HYBRID_DRAFT)}
MODEL, LOOKUP, HEAD = "model", "lookup", "eagle"
# (pair, dtype, method, drafter, tree width): each drafter, chains and trees in both dtypes, on
# every pair (a hybrid's verify takes chains only); the embedded pair in float32 only (its
# bfloat16 run cost CI 70 s, on the kernels the others run)
CASES = [("embedded", "float32", "exspec", LOOKUP, 2),
         ("tiny", "float32", "eqspec", HEAD, 1), ("tiny", "bfloat16", "exspec", HEAD, 2),
         ("tiny-hybrid", "float32", "eqspec", MODEL, 1),
         ("tiny-hybrid", "bfloat16", "exspec", MODEL, 1),
         ("bamba", "float32", "exspec", MODEL, 1), ("bamba", "bfloat16", "eqspec", LOOKUP, 1)]


@pytest.fixture(scope="module")
def bamba(tmp_path_factory):
    """A Mamba-2 hybrid (tests/hybrids.py), saved as a user's local pair."""
    target, draft = save_pair(tmp_path_factory.mktemp("bamba"), "bamba")
    return dict(target=target, draft=draft)


def _spec(models: dict, dtype: str, **settings) -> RunSpec:
    fields = dict(dtype=dtype, device="cpu", prompts=QUICK, batch_size=4, k=4, max_new_tokens=8,
                  audit=4, batch_invariant=True)
    return RunSpec.build(**models, **{**fields, **settings})


@pytest.mark.parametrize("pair, dtype, method, drafter, width", CASES)
def test_every_verify_pass_is_the_bits_of_a_fresh_batch_size_1_pass(pair, dtype, method, drafter,
                                                                     width, bamba):
    models = bamba if pair == "bamba" else PAIRS[pair]
    trace = run(_spec(models, dtype, method=method, drafter=drafter, tree_width=width))
    target = trace.manifest.yardstick.target
    assert target.batch_invariant and target.tolerance == 0 and target.rounding > 0
    audits = [r.audit for r in trace.rows if r.audit is not None]
    assert len(audits) >= 8 and set(audits) == {0.0}, audits
    if drafter == MODEL:  # the draft's passes too
        drafts = [r.audit_draft for r in trace.rows if r.audit_draft is not None]
        assert drafts and set(drafts) == {0.0}, drafts
    if drafter != LOOKUP:  # every draft is what its model (or head) makes alone, fresh, to the
        # bit: any other token is an exact tie (bfloat16 has them), broken otherwise by a tree
        assert trace.acceptance.compared > 0 and trace.acceptance.beyond == 0
        assert trace.acceptance.differ == 0 or trace.acceptance.tolerance == 0
    assert all(s.equivalent for s in trace.sequences)
    assert all(s.audit_round is None for s in trace.sequences)


def test_the_stock_kernels_are_not_batch_invariant_and_the_page_says_which_ran():
    """The other side: without the mode, the same audit finds differences (rounding), and the pair
    says which computation ran."""
    trace = run(_spec(PAIRS["tiny"], "float32").model_copy(update={"batch_invariant": False}))
    assert max(r.audit for r in trace.rows if r.audit is not None) > 0
    assert "batch_invariant" not in trace.manifest.pair
    invariant = load_pair(**PAIRS["tiny"], dtype="float32", device="cpu", batch_invariant=True)
    assert "tiles of 16 rows" in invariant.info["batch_invariant"]


def test_float64_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="float64 is the truth"):
        RunSpec.build(prompts=QUICK, dtype="float64", batch_invariant=True)


def test_a_model_the_mode_cannot_hold_is_refused_at_load_with_what_departed(monkeypatch):
    """The self-test at load (invariant.departure) runs the model in transformers' own batching:
    a kernel whose bits move with the batch is refused, saying by how much."""
    with planted(monkeypatch, "reordered"), pytest.raises(SpecError) as e:
        load_pair(target=TINY_WINDOW, draft=TINY_WINDOW_DRAFT, dtype="float32", device="cpu",
                  batch_invariant=True)
    assert "cannot hold the target on this build" in str(e.value)
    assert "in a padded batch of five" in str(e.value)


MUTANT_TOKENS = 12  # long enough for bfloat16 to show the subtle mutants in some row


@pytest.fixture(scope="module")
def clean():
    """The correct invariant runs, by dtype, on the tiny pair."""
    return {dtype: run(_spec(PAIRS["tiny"], dtype, max_new_tokens=MUTANT_TOKENS))
            for dtype in ("float32", "bfloat16")}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bug", [*BUGS, *SUBTLE])
def test_every_kernel_mutant_is_named_at_its_first_differing_bit(bug, dtype, clean, monkeypatch):
    """Planted in the verify pass's attention: each sequence is named at the first round whose
    logits differ from a fresh pass by any amount, and every fork is a kernel bug, never numerics.
    In float32 every mutant moves every row's bits in the first round that verifies over a cache;
    bfloat16's coarser rounding absorbs the subtle ones on some rows for a while."""
    monkeypatch.setattr(runner, "_ROUNDING", runner.PerPair(4))
    with planted(monkeypatch, bug):
        trace = run(_spec(PAIRS["tiny"], dtype, max_new_tokens=MUTANT_TOKENS))
    assert trace.manifest.yardstick == clean[dtype].manifest.yardstick
    first = min(r.round for r in trace.rows if r.audit)
    for s in trace.sequences:
        departed = [r.round for r in trace.rows if r.seq == s.seq and r.audit]
        assert s.audit_round == min(departed, default=None)
    assert any(s.audit_round is not None for s in trace.sequences)
    if dtype == "float32" or bug in BUGS:
        assert all(s.audit_round == first for s in trace.sequences)
    for s in trace.sequences:
        if s.forensics:
            assert s.forensics.verdict == "kernel-bug", s.forensics.explanation
            assert "allows no difference at all" in s.forensics.explanation


@pytest.mark.parametrize("bug", SUBTLE)
def test_the_subtle_mutants_hide_under_the_rounding_yardstick(bug, monkeypatch):
    """Why the mode matters: without it, the same mutants stay within rounding in every audit."""
    monkeypatch.setattr(runner, "_ROUNDING", runner.PerPair(4))
    with planted(monkeypatch, bug):
        trace = run(_spec(PAIRS["tiny"], "float32").model_copy(update={"batch_invariant": False}))
    assert all(s.audit_round is None for s in trace.sequences)
    assert max(r.audit for r in trace.rows if r.audit is not None) > 0


def _greedy(model, ids: list[int], new: int) -> tuple[list[int], list[float]]:
    """transformers' own greedy generation (not specviz's engine): the tokens, and each one's
    top-2 margin."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False,
                         output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    margins = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    return out.sequences[0, len(ids):].tolist(), margins


def test_an_engine_declaring_the_mode_is_judged_at_zero_tolerance_against_its_control(tmp_path):
    """Outputs files an engine might write, made with transformers' generate: the control is the
    target's greedy output; the speculative run takes the runner-up at the control's narrowest
    near-tie and goes on greedily. Judged against rounding, that fork is numerics; declared
    batch-invariant, speculation changed a token, and that is an engine bug."""
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype="float32", device="cpu")
    prompt = pair.encode(builtin_set("chat")[:1])[0]
    control, margins = _greedy(pair.target, prompt, 16)
    at = min(range(len(margins)), key=margins.__getitem__)
    with torch.inference_mode():
        logits = pair.target(torch.tensor([prompt + control[:at]])).logits[0, -1]
    flipped = control[:at] + [int(logits.topk(2).indices[1])]
    engine = flipped + _greedy(pair.target, prompt + flipped, 16 - len(flipped))[0]
    files = {}
    for name, output in (("engine", engine), ("control", control)):
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text(json.dumps({"prompt_ids": prompt, "output_ids": output}) + "\n")
    verdicts = {}
    for declared in ((), ("--batch-invariant",)):
        out = tmp_path / "check.json"
        assert cli.main(["check", "--pair", "tiny", "--dtype", "float32", "--device", "cpu",
                         "--outputs", str(files["engine"]), "--control", str(files["control"]),
                         "--trace", str(out), "--no-attribution", *declared]) == 0
        (s,) = Trace.from_json(out.read_text()).sequences
        verdicts[declared] = s.forensics
    assert verdicts[()].verdict == "numerics", verdicts[()].explanation
    declared = verdicts[("--batch-invariant",)]
    assert declared.verdict == "engine-bug" and declared.tolerance == 0
    assert f"At token {at} it wrote {engine[at]}" in declared.explanation
