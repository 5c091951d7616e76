"""Repetition and presence penalties kept right under speculation, and the log-probabilities of
accepted drafts: the correct engine equals the penalised batch-size-1 reference, transformers' own
repetition penalty is the reference's oracle, and the field's two bugs are planted and named."""
import pytest
import torch
from transformers import GenerationConfig

from specviz.app.panel import forensics_html
from specviz.app.views import Focus
from specviz.decoding.assisted import bare_generation_configs, hf_assisted
from specviz.decoding.drafters import PromptLookup
from specviz.decoding.eqspec import eqspec
from specviz.decoding.exspec import exspec
from specviz.decoding.penalties import Penalties
from specviz.decoding.reference import batched_reference, reference
from specviz.decoding.sampling import Sampler, Sampling
from specviz.forensics.logprobs import _float64_logprobs
from specviz.forensics.recompute import float64_target
from specviz.models.pairs import load_pair
from specviz.run.runner import run
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.spec.strict import SpecError

NEW = 12


def _ids(result):
    return [o.ids for o in result.outputs]


@pytest.mark.parametrize("dtype,penalties", [("float64", Penalties(repetition=1.5)),
                                             ("float32", Penalties(repetition=1.3, presence=1.0))])
def test_speculation_equals_the_penalised_reference(dtype, penalties, mixed_prompts):
    """Every verify slot is penalised by the row's prompt, its output and the drafts before
    that slot."""
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype=dtype, device="cpu")
    prompts, sampling = mixed_prompts[:3], Sampling(penalties=penalties)
    ref = _ids(reference(pair, prompts, NEW, sampling=sampling))
    assert ref != _ids(reference(pair, prompts,
                                 NEW)), "the penalty must change some token to be tested"
    lookup = PromptLookup(pair, 1, 3)
    runs = {"eqspec at batch size 1": eqspec(pair, prompts, 1, 4, NEW, sampling=sampling),
            "eqspec": eqspec(pair, prompts, 3, 4, NEW, sampling=sampling),
            "exspec": exspec(pair, prompts, 3, 4, NEW, window=4, max_wait=2, sampling=sampling),
            "eqspec lookup": eqspec(pair, prompts, 3, 4, NEW, sampling=sampling, drafter=lookup),
            "batched-reference": batched_reference(pair, prompts, 3, NEW, sampling=sampling)}
    for name, got in runs.items():
        assert _ids(got) == ref, name


def test_sampled_penalised_runs_draw_alike_in_any_batch(tiny, mixed_prompts):
    """At temperature > 0 a row's draws do not depend on its batch, under a penalty too: the
    reference equals the batched reference, and speculation at batch size 1 equals it at 3, in
    eqspec and exspec."""
    prompts = mixed_prompts[:3]
    sampling = Sampling(Sampler(0.8), Sampler(0.8), seed=3,
                        penalties=Penalties(repetition=1.3, presence=0.5))
    assert _ids(batched_reference(tiny, prompts, 3, NEW, sampling=sampling)) == _ids(
        reference(tiny, prompts, NEW, sampling=sampling))
    alone = _ids(eqspec(tiny, prompts, 1, 4, NEW, sampling=sampling))
    assert _ids(eqspec(tiny, prompts, 3, 4, NEW, sampling=sampling)) == alone
    assert _ids(exspec(tiny, prompts, 3, 4, NEW, window=4, max_wait=2, sampling=sampling)) == alone


def test_the_reference_penalises_as_transformers_does(mixed_prompts):
    """transformers' `RepetitionPenaltyLogitsProcessor` in `generate`, and in assisted generation,
    is the oracle of the penalised reference (float32: the dtype transformers penalises in)."""
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype="float32", device="cpu")
    prompts = mixed_prompts[:3]
    config = GenerationConfig(max_new_tokens=NEW, do_sample=False, repetition_penalty=1.5,
                              eos_token_id=list(pair.eos_ids), pad_token_id=pair.eos_ids[0])
    with torch.inference_mode(), bare_generation_configs(pair, 4):
        expected = [pair.target.generate(torch.tensor([ids]),
                                         generation_config=config)[0, len(ids):].tolist()
                    for ids in prompts]
    assert _ids(reference(pair, prompts, NEW,
                          sampling=Sampling(penalties=Penalties(repetition=1.5)))) == expected
    assert _ids(hf_assisted(pair, prompts, 4, NEW, repetition_penalty=1.5)) == expected


def _run(**kw):
    return run(RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float64", device="cpu",
                             **{"batch_size": 3, "k": 4, "max_new_tokens": 24, **kw}))


def test_a_history_without_the_accepted_drafts_forks_and_is_named(mixed_prompts, tiny):
    """FB-25 (SGLang PR #33643): the penalty history gains only each round's last token, the drafts
    of a block go uncounted; the fork is the penalty's, never numerics."""
    prompts = tuple(tiny.tokenizer.decode(ids) for ids in mixed_prompts[:6])
    trace = _run(prompts=prompts, chat_template=False, repetition_penalty=2.0,
                 faults=("penalty-history-last-token",))
    forked = [s for s in trace.sequences if not s.equivalent]
    assert forked and all(s.forensics.verdict == "decision-bug:penalty" for s in forked)
    ev = forked[0].forensics
    assert (ev.penalty_lifted == ev.output_token != ev.reference_token
            and ev.margin_float64 > ev.tolerance)
    assert ev.penalty_lifted in trace.prompts[forked[0].seq].ids + forked[0].output_ids[: ev.fork]


def test_logprobs_are_the_targets_and_a_drafts_are_named(mixed_prompts, tiny):
    """A correct run's log-probabilities, accepted drafts' included, are the float64 target's within
    rounding, greedy and sampled, under a penalty; FB-28's (llama.cpp #27972): accepted drafts'
    taken from the drafter."""
    prompts = tuple(tiny.tokenizer.decode(ids) for ids in mixed_prompts[:3])
    truth = float64_target(tiny)
    for kw in ({}, {"temperature": 0.8, "drafter": "lookup"}):
        trace = _run(prompts=prompts, chat_template=False, logprobs=True, repetition_penalty=1.3,
                     max_new_tokens=16, **kw)
        sampling = Sampling(Sampler(kw.get("temperature", 0.0)),
                            penalties=Penalties(repetition=1.3))
        for s in trace.sequences:
            assert s.forensics is None or s.forensics.verdict != "decision-bug:logprobs"
            want = _float64_logprobs(truth, tiny.vocab_size, sampling, trace.prompts[s.seq].ids,
                                     s.output_ids)
            assert torch.allclose(torch.tensor(s.logprobs, dtype=torch.float64), want, atol=1e-9,
                                  rtol=0)
    trace = _run(prompts=prompts, chat_template=False, logprobs=True, max_new_tokens=16,
                 faults=("logprobs-from-draft",))
    assert all(s.equivalent for s in trace.sequences)  # the tokens stay right
    named = [s.forensics for s in trace.sequences if s.forensics]
    assert named and all(f.verdict == "decision-bug:logprobs" for f in named)
    assert (abs(named[0].logprob - named[0].logprob_float64) > named[0].tolerance
            and named[0].round is not None)
    # the page shows it, tokens equal or not
    assert "decision-bug:logprobs" in forensics_html(trace, Focus(seq=trace.sequences.index(
        next(s for s in trace.sequences if s.forensics)), round=None))


@pytest.mark.parametrize("fields,message", [
    ({"repetition_penalty": 0.5}, "greater than or equal to 1"),
    ({"presence_penalty": -1.0}, "greater than or equal to 0"),
    ({"method": "hf-assisted", "batch_size": 1, "presence_penalty": 0.5},
     "hf-assisted takes no presence penalty"),
    ({"method": "engine", "repetition_penalty": 1.2}, "engine check sends no penalties"),
    ({"method": "hf-assisted", "batch_size": 1, "logprobs": True}, "records no log-probabilities"),
    ({"faults": ("penalty-history-last-token",)}, "needs a repetition or presence penalty"),
    ({"faults": ("logprobs-from-draft",)}, "set logprobs"),
])
def test_bad_penalties_are_refused(fields, message):
    with pytest.raises(SpecError, match=message):
        RunSpec.build(prompts=("Hi",), **fields)


def test_penalties_at_their_defaults_keep_the_run_key():
    assert RunSpec.build(prompts=("Hi",)).key() == RunSpec.build(
        prompts=("Hi",), repetition_penalty=1.0, presence_penalty=0.0, logprobs=False).key()
    assert (RunSpec.build(prompts=("Hi",)).key()
            != RunSpec.build(prompts=("Hi",), repetition_penalty=1.1).key())
