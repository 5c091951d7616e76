"""Hybrid models: layers that attend beside layers that carry a recurrent state (Gated DeltaNet in
Qwen 3.5 and Qwen3-Next, Mamba-2 in Nemotron-H, short convolutions in LFM2), saved as a user's local
checkpoint is.

A recurrent state cannot be cropped back after rejected drafts: the engine keeps it at every drafted
position and each row continues from the one at its own accepted count (decoding/kvcache.py). Every
method writes what the model alone writes, in float64 and float32; each planted state fault, and a
bug planted here outside the catalogue, is named `sync-bug:recurrent`, never numerics; the float64
truth is float64 throughout."""
import re

import pytest
import torch
from hybrids import save_pair
from test_reference import plain_argmax
from transformers import AutoModelForCausalLM, DynamicCache

from specviz.app import glossary, plots, serving, views
from specviz.app.panel import forensics_html
from specviz.decoding import kvcache
from specviz.decoding.drafters import PromptLookup
from specviz.decoding.eqspec import eqspec
from specviz.decoding.exspec import exspec
from specviz.decoding.reference import batched_reference, reference
from specviz.forensics import enginenoise
from specviz.forensics.recompute import decoded_logits, float64_target, fresh_logits
from specviz.models.architecture import Float64Throughout
from specviz.models.pairs import load_pair
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics
from specviz.trace.schema import Trace

# Gated DeltaNet, Mamba-2, short convolutions, with experts
FOUR = ("qwen3.5", "nemotron-h", "lfm2", "qwen3-next")
NEW = 10


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, tuple[str, str]]:
    pairs = {f: save_pair(tmp_path_factory.mktemp(f), f) for f in FOUR}
    # A target that loops as small models do: prompt lookup drafts in its loops, and offers nothing
    # where one breaks.
    pairs["looping"] = save_pair(tmp_path_factory.mktemp("looping"), "qwen3-next", loops=True)
    return pairs


def _prompts() -> list[str]:
    """Mixed lengths: a one-token prompt beside chats and a ~330-token passage."""
    return ["Hi", *builtin_set("chat")[:3], builtin_set("summarize")[0]]


def _ids(pair) -> list[list[int]]:
    ids = pair.encode(_prompts())
    ids[0] = pair.encode(["Hi"], chat_template=False)[0]
    assert len(ids[0]) == 1 and max(map(len, ids)) > 300
    return ids


@pytest.fixture(scope="module")
def references(saved) -> dict:
    """(pair, prompt ids, the batch-size-1 reference's ids) per family and dtype."""
    out = {}
    for family, (target, draft) in saved.items():
        for dtype in ("float64", "float32"):
            pair = load_pair(target, draft, dtype=dtype, device="cpu")
            ids = _ids(pair)
            out[family, dtype] = pair, ids, [o.ids for o in reference(pair, ids, NEW).outputs]
    return out


@pytest.mark.parametrize("family", FOUR)
def test_the_reference_is_the_models_own_cache_free_greedy_decoding(references, family):
    pair, ids, ref = references[family, "float64"]
    for i in (0, 1, -1):  # one token, a chat, the long passage
        assert ref[i] == plain_argmax(pair.target, ids[i], NEW, pair.vocab_size)


def _lookup(pair):
    return PromptLookup(pair, 1, 3)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("family", FOUR)
def test_every_method_writes_the_batch_size_1_reference(references, family, dtype):
    """batched-reference, then eqspec and exspec with the draft model and with prompt lookup, at
    batch sizes 1, 3 and 8 and k 1 and 5: token for token the reference's."""
    pair, ids, ref = references[family, dtype]
    ran = {}
    for bs in (1, 3, 8):
        ran["batched-reference", bs] = batched_reference(pair, ids, bs, NEW)
        for k in (1, 5):
            for name, drafter in (("model", None), ("lookup", _lookup(pair))):
                ran["eqspec", name, bs, k] = eqspec(pair, ids, bs, k, NEW, drafter=drafter)
                ran["exspec", name, bs, k] = exspec(pair, ids, bs, k, NEW, window=2 * bs,
                                                    max_wait=4, drafter=drafter)
    wrong = {key: [i for i, (o, r) in enumerate(zip(res.outputs, ref)) if o.ids != r]
             for key, res in ran.items()}
    assert not any(wrong.values()), {key: rows for key, rows in wrong.items() if rows}
    accepted = [int(r.ints["accepted"][i]) for r in ran["eqspec", "model", 8, 5].rounds
                for i in range(len(r.seqs))]
    # ragged acceptance: rows roll their states back to different counts
    assert 0 < sum(accepted) < 5 * len(accepted)


def _run(saved, family: str, **kw):
    target, draft = saved[family]
    return run(RunSpec.build(**{**dict(target=target, draft=draft, dtype="float64", device="cpu",
                                       prompts=tuple(_prompts()), batch_size=4, k=4,
                                       max_new_tokens=NEW), **kw}))


@pytest.mark.parametrize("family,fault,drafter", [
    ("qwen3.5", "state-not-rolled-back", "model"), ("nemotron-h", "state-not-rolled-back", "model"),
    ("lfm2", "conv-state-off-by-one", "model"), ("qwen3.5", "conv-state-off-by-one", "model"),
    ("looping", "state-after-zero-draft", "lookup")])
def test_a_planted_state_fault_is_named_by_its_state(saved, family, fault, drafter):
    trace = _run(saved, family, faults=(fault,), drafter=drafter, ngram_min=1)
    verdicts = [s.forensics.verdict for s in trace.sequences if s.forensics]
    assert verdicts and set(verdicts) == {"sync-bug:recurrent"}, verdicts
    # the engine's own I5 check saw it too
    assert any(not r.checks["recurrent"] for r in trace.rows)


@pytest.fixture(scope="module")
def correct(saved) -> Trace:
    return _run(saved, "qwen3.5")


def test_a_correct_run_records_each_rows_state_and_every_state_check_holds(correct):
    trace = correct
    assert metrics.equivalence(trace)["exact"] == 1
    for r in trace.rows:
        assert r.checks["recurrent"] and r.target_state_before == r.content_before - 1
        assert r.draft_state_before == r.content_before - 2
        if r.content_after is not None:
            assert ((r.target_state_after, r.draft_state_after)
                    == (r.content_after - 1, r.content_after - 2))
    assert Trace.from_json(trace.to_json()) == trace


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_roll_back_bug_planted_here_is_named_by_the_states_own_evidence(saved, monkeypatch,
                                                                          dtype):
    """Each row continues from the state one position past its accepted count, and the engine's
    bookkeeping never hears of it: its own checks hold, and the watch's replay of the row's
    recurrent states over fresh K/V names the state."""
    roll_back = kvcache.roll_back

    def one_late(cache, index, conv_index=None):
        roll_back(cache, (index + 1).clamp(max=kvcache.kept(cache) - 1), conv_index)
    monkeypatch.setattr(kvcache, "roll_back", one_late)
    trace = _run(saved, "qwen3.5", dtype=dtype)
    forked = [s.forensics for s in trace.sequences if s.forensics]
    assert forked and all(f.verdict == "sync-bug:recurrent" and not f.failed_checks for f in forked)
    assert all(f.recurrent_diff > f.tolerance >= f.kv_diff for f in forked)


def test_in_bfloat16_a_hybrids_forks_are_numerics_only_where_the_yardstick_says(saved):
    """bfloat16's near-ties are rare here (every row's recurrent layers decode alike): the built-in
    prompts, bs 8."""
    trace = _run(saved, "lfm2", dtype="bfloat16", prompts=tuple(builtin_set("all")), batch_size=8,
                 max_new_tokens=32)
    verdicts = [s.forensics for s in trace.sequences if s.forensics]
    assert verdicts, "no fork in bfloat16: the test needs near-ties"
    for f in verdicts:
        assert f.verdict in ("numerics", "unexplained"), f.explanation
        if f.verdict == "numerics":
            assert abs(f.margin_float64) <= f.tolerance and f.state_diff <= f.tolerance


def test_the_float64_truth_is_float64_throughout(saved, references):
    """A fresh pass runs a recurrent layer's chunked algorithm; a decode its recurrent one.
    transformers computes both partly in float32 even in a float64 model (here 6e-5 apart); the
    truth specviz judges with does not (1e-13)."""
    pair, ids, _ = references["qwen3.5", "float32"]
    long = ids[-1][:64]
    truth = float64_target(pair)
    assert float((fresh_logits(truth, long, 32, pair.vocab_size)
                  - decoded_logits(truth, long, 32, pair.vocab_size)).abs().max()) < 1e-12
    # as transformers computes
    own = AutoModelForCausalLM.from_pretrained(saved["qwen3.5"][0], dtype=torch.float64)
    assert float((fresh_logits(own, long, 32, pair.vocab_size)
                  - decoded_logits(own, long, 32, pair.vocab_size)).abs().max()) > 1e-10
    with Float64Throughout():
        assert (torch.ones(2).float().dtype == torch.float64
                and torch.zeros(2).dtype == torch.float64)
    assert torch.ones(2).float().dtype == torch.float32


def test_the_yardstick_measures_both_algorithms_of_a_hybrid(saved):
    trace = _run(saved, "lfm2", dtype="float32")
    assert "decoded a token a pass" in trace.manifest.yardstick.target.method


def test_teacher_forcing_a_hybrid_reads_what_a_fresh_pass_reads(references):
    """The judge of other engines crops its cache back to each prompt between outputs: a recurrent
    state cannot be cropped, so a hybrid's outputs are forced fresh."""
    pair, ids, ref = references["nemotron-h", "float64"]
    forcing = enginenoise.TeacherForcing(pair.target, pair.vocab_size)
    for prompt, output in zip(ids[1:4], ref[1:4]):
        fresh = fresh_logits(pair.target, prompt + output[:-1], len(output), pair.vocab_size)
        assert torch.equal(forcing(prompt, output), fresh)


def test_transformers_assisted_generation_is_refused_on_a_hybrid(saved):
    with pytest.raises(SpecError, match="cannot crop back"):
        _run(saved, "lfm2", method="hf-assisted", batch_size=1)


def test_the_cache_moves_recurrent_states_with_their_rows(references):
    """Split into rows and merged back (exspec), rows selected and gathered (eqspec's realignment):
    each row's states travel with it."""
    pair, ids, _ = references["qwen3-next", "float64"]
    cache = kvcache.new(pair.target)
    with torch.inference_mode():
        pair.target(input_ids=torch.tensor([ids[1][:5], ids[2][:5], ids[3][:5]]), cache=cache)
    before = [s[("recurrent", 0)] for s in kvcache.layers_states(cache)]
    merged = kvcache.merge(kvcache.split(cache, [(0, 5)] * 3)[::-1])
    assert all(torch.equal(m[("recurrent", 0)], b.flip(0))
               for m, b in zip(kvcache.layers_states(merged), before))
    kvcache.gather(cache, torch.tensor([2, 0]), torch.arange(5).expand(2, 5))
    assert all(torch.equal(s[("recurrent", 0)], b[[2, 0]])
               for s, b in zip(kvcache.layers_states(cache), before))
    assert isinstance(cache, DynamicCache) and kvcache.length(cache) == 5


def test_the_page_shows_each_rows_recurrent_state(saved, correct):
    """A state lane beside the KV lanes, each row's states in the focused round's table, I5 in the
    glossary; and a fault's row shows the state that holds a rejected draft."""
    focus, _ = views.resolve(correct)
    titles = [a.text for a in plots.kv_lanes(correct, focus).layout.annotations]
    assert (any(t.startswith("target recurrent state") for t in titles)
            and any(t.startswith("draft recurrent") for t in titles))
    assert "target recurrent state before → after" in forensics_html(correct, focus)
    assert "I5" in glossary.glossary(correct) and "held I5" in glossary.glossary(correct)
    broken = _run(saved, "qwen3.5", faults=("state-not-rolled-back",))
    focus, _ = views.resolve(broken)
    shown = forensics_html(broken, focus)
    # at the fork the row's state holds a rejected draft: not the row's tokens
    assert "sync-bug:recurrent" in shown
    assert re.search(r"target recurrent state before → after[^<]*</td><td>-1 →", shown)
    attention_only = serving.bundled()["bsp-like decay"]
    assert not {"target_state", "draft_state"} & {field for field, _ in plots.lanes(attention_only)}
