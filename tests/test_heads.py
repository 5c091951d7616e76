"""An EAGLE-style head drafting from the target's own hidden states (models/heads.py,
decoding/drafters.py): every output is the batch-size-1 reference's, and every round's drafts, and
the head's probability of each, are the ones the head writes when it is fed hidden states recomputed
from scratch for the row alone (fresh target pass, batch size 1, float64, no cache). The
probabilities see what the tokens may not: a head whose state kept a slot computed from its own
guess drafts the same tokens, a little less or more sure."""
import pytest
import torch
from safetensors.torch import save_file

from specviz.app.summary import headline
from specviz.decoding.drafters import EagleDrafter
from specviz.decoding.eqspec import eqspec
from specviz.decoding.exspec import exspec
from specviz.decoding.reference import reference
from specviz.models.heads import EagleHead, Recipe
from specviz.run.head_training import examples, train
from specviz.run.runner import run
from specviz.spec.faults import FAULTS, needing
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_HYBRID, TINY_HYBRID_DRAFT, TINY_TARGET, RunSpec
from specviz.spec.strict import SpecError
from specviz.spec.verdicts import verdict
from specviz.trace import metrics

K, NEW = 4, 24


def _ids(tiny, n: int) -> list[list[int]]:
    return [tiny.tokenizer(p).input_ids for p in builtin_set("all")[:n]]


@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("decoder", [eqspec, exspec])
def test_a_head_drafts_to_the_reference_exactly(tiny, decoder, batch_size):
    prompts = _ids(tiny, 9)
    kw = dict(window=2 * batch_size, max_wait=4) if decoder is exspec else {}
    out = decoder(tiny, prompts, batch_size, K, NEW, drafter=EagleDrafter(tiny, K), **kw)
    assert [o.ids for o in out.outputs] == [o.ids for o in reference(tiny, prompts, NEW).outputs]
    accepted = torch.cat([r.ints["accepted"] for r in out.rounds])
    # rows kept several drafts: the slots the head drafted are fed again
    assert (accepted >= 2).sum() >= 5


def _fresh_drafts(tiny, head: EagleHead, ids: list[int], k: int) -> tuple[list[int], list[float]]:
    """The head's greedy drafts after `ids` and its probability of each, from scratch: the target's
    hidden states from one batch-size-1 pass, then the head over the whole sequence again for each
    draft, fed its own output after the last token."""
    hidden = tiny.target(input_ids=torch.tensor([ids]),
                         output_hidden_states=True).hidden_states[-1][0]
    tokens, fed = list(ids), torch.cat([torch.zeros_like(hidden[:1]), hidden[:-1]])
    drafts, probs = [], []
    for _ in range(k):
        out = head.body(inputs_embeds=head.inputs(torch.tensor([tokens]), fed[None]),
                        use_cache=False,
                        position_ids=torch.arange(len(tokens))[None]).last_hidden_state[0]
        p = head.logits(out[-1])[: tiny.vocab_size].softmax(-1)
        drafts.append(int(p.argmax()))
        probs.append(p.max().item())
        tokens, fed = tokens + drafts[-1:], torch.cat([fed, out[-1:]])
    return drafts, probs


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
def test_every_rounds_drafts_are_the_heads_own_from_fresh_hidden_states(tiny, method):
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT,
                         prompts=tuple(builtin_set("all")[:5]), method=method,
                         drafter="eagle", batch_size=3, k=K, max_new_tokens=NEW, dtype="float64",
                         device="cpu")
    trace = run(spec)
    head = EagleHead.of(tiny.target, TINY_TARGET)
    prompt_ids = tiny.encode(spec.prompts)
    checked = 0
    for seq in trace.sequences:
        rows = sorted((r for r in trace.rows if r.seq == seq.seq), key=lambda r: r.round)
        have = 0
        for r in rows:
            if r.draft_tokens:
                ids = prompt_ids[seq.seq] + seq.output_ids[:have]
                drafts, probs = _fresh_drafts(tiny, head, ids, len(r.draft_tokens))
                assert r.draft_tokens == drafts, (seq.seq, r.round)
                assert r.draft_probs == pytest.approx(probs, rel=1e-9, abs=0), (seq.seq, r.round)
                checked += 1
            have += len(r.emitted)
    assert checked >= 20
    # the engine's own invariants hold every round
    assert all(all(r.checks.values()) for r in trace.rows)
    a = trace.acceptance  # the acceptance judge's own replay (forensics) agrees
    assert a.verdict is None and a.beyond == 0 and a.compared >= checked, a.explanation


@pytest.mark.parametrize("fault", needing("hidden"))
def test_a_heads_lossless_bug_keeps_the_output_and_is_named_by_its_side(tiny, fault):
    """vLLM #14647 (the head's input shifted by one) and #14649 (accepted drafts' slots never re-fed
    from the target's hidden states). Lossless (the target verifies every draft), so only the
    acceptance judge, replaying the head from fresh hidden states, sees them."""
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT,
                         prompts=tuple(builtin_set("all")[:5]),
                         method="eqspec", drafter="eagle", faults=(fault,), batch_size=3, k=K,
                         max_new_tokens=NEW, dtype="float64", device="cpu")
    trace = run(spec)
    assert metrics.equivalence(trace)["exact"] == 1
    a = trace.acceptance
    assert a.verdict == FAULTS[fault].acceptance, a.explanation
    assert a.beyond > 0 and a.first is not None, a.explanation
    with pytest.raises(SpecError, match="hears no hidden state; choose drafter eagle"):
        RunSpec.build(prompts=("Hello",), faults=(fault,))
    assert r"drafts by **an EAGLE\-style head \(no draft model\)**" in headline(trace)


def test_a_head_in_float32_forks_only_where_rounding_explains_it(tiny):
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT,
                         prompts=tuple(builtin_set("all")[:8]), method="eqspec",
                         drafter="eagle", batch_size=4, k=K, max_new_tokens=32, dtype="float32",
                         device="cpu")
    trace = run(spec)
    assert all(s.forensics is None or not verdict(s.forensics.verdict).bug for s in trace.sequences)


def test_a_target_without_a_head_is_refused_with_the_reason(tiny):
    spec = RunSpec.build(target=TINY_HYBRID, draft=TINY_HYBRID_DRAFT, prompts=("Hello",),
                         drafter="eagle", device="cpu")
    with pytest.raises(SpecError, match=f"no EAGLE-style head for {TINY_HYBRID}"):
        run(spec)
    with pytest.raises(SpecError, match="an EAGLE-style head runs none"):
        RunSpec.build(prompts=("Hello",), drafter="eagle", faults=("draft-positions-off-by-one",))


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
def test_a_heads_sampled_drafts_keep_the_targets_distribution(method):
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT,
                         prompts=tuple(builtin_set("all")[:8]), method=method,
                         drafter="eagle", batch_size=4, k=K, max_new_tokens=32, dtype="float64",
                         device="cpu", temperature=0.8)
    trace = run(spec)
    assert trace.distribution.verdict == "consistent"
    assert sum(r.accepted for r in trace.rows) > 0


def test_training_a_head_teaches_it_the_targets_argmax_and_it_still_decodes_exactly(tiny):
    """run/head_training.py on the tiny pair, a short recipe: the loss falls, the head agrees with
    the target's argmax far more often on what it learned from (recomputed from fresh passes), and
    its drafts leave every output the reference's. (Its acceptance is the embedded pair's
    benchmark's to measure: the tiny pair is random.)"""
    recipe = Recipe(steps=30, tokens_per_step=256, learning_rate=3e-3, new_tokens=24, sampled=1)
    data = examples(tiny, builtin_set("spec-bench")[:24], recipe)
    head = EagleHead(tiny.target, 1, 0.01)

    def agreement() -> float:
        hits = slots = 0
        for ids, argmax, hidden in data:
            fed = torch.cat([torch.zeros_like(hidden[:1]), hidden[:-1]])
            hits += int((head.logits(head.fresh(ids, fed))[:, : tiny.vocab_size].argmax(-1)
                         == argmax).sum())
            slots += len(ids)
        return hits / slots
    before = agreement()
    losses = train(head, data, tiny.vocab_size, recipe)
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5])
    assert agreement() > before + 0.2, before  # measured: 0.05 before, 0.37 after
    prompts = _ids(tiny, 9)
    drafter = EagleDrafter(tiny, K)
    drafter.head = head
    out = eqspec(tiny, prompts, 3, K, NEW, drafter=drafter)
    assert [o.ids for o in out.outputs] == [o.ids for o in reference(tiny, prompts, NEW).outputs]


def test_a_trained_head_is_loaded_from_the_cache_or_refused_naming_the_command(tiny, tmp_path):
    trained = EagleHead(tiny.target, 1, 0.01)
    with torch.no_grad():
        trained.fc.weight.mul_(0.5)
    path = tmp_path / "head.safetensors"
    save_file({n: w.contiguous() for n, w in trained.state_dict().items()}, path)
    fresh = EagleHead(tiny.target, 1, 0.01)
    fresh.load_trained(path)
    assert all(torch.equal(a, b)
               for a, b in zip(fresh.state_dict().values(), trained.state_dict().values()))
    with pytest.raises(SpecError, match="run `specviz train-head`"):
        fresh.load_trained(tmp_path / "missing" / "head.safetensors")
