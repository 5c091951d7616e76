import dataclasses

import pytest
import torch
from transformers import GenerationConfig

from specviz.decoding import kvcache
from specviz.decoding.assisted import hf_assisted
from specviz.decoding.eqspec import eqspec
from specviz.decoding.reference import batched_reference, prefill_groups, reference
from specviz.models.draft import layer_subset
from specviz.models.pairs import tiny_target

NEW = 12


def plain_argmax(model, ids: list[int], n: int, vocab: int) -> list[int]:
    """A bare argmax loop over the first `vocab` logits, without any cache."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1, :vocab].argmax()))
    return seq[len(ids):]


def test_reference_is_plain_argmax(tiny, mixed_prompts):
    ids = mixed_prompts[0]
    out = reference(tiny, [ids], 8).outputs[0]
    assert out.ids == plain_argmax(tiny.target, ids, 8, tiny.vocab_size)
    assert len(out.margins) == len(out.ids) and all(m >= 0 for m in out.margins)


def test_reference_equals_transformers_generate_for_a_model_without_generation_defaults(
        tiny, mixed_prompts):
    """transformers' own greedy `generate` stays the oracle of the reference loop."""
    prompts = mixed_prompts[:6]
    config = GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=list(tiny.eos_ids),
                              pad_token_id=tiny.eos_ids[0])
    with torch.inference_mode():
        expected = [tiny.target.generate(torch.tensor([ids]),
                                         generation_config=config)[0, len(ids):].tolist()
                    for ids in prompts]
    assert [o.ids for o in reference(tiny, prompts, NEW).outputs] == expected


def test_batched_reference_equals_reference_in_float64(tiny, mixed_prompts):
    prompts = mixed_prompts[:9]
    ref = reference(tiny, prompts, 16)
    for bs in (1, 3, 4, 9):
        got = batched_reference(tiny, prompts, bs, 16)
        assert [o.ids for o in got.outputs] == [o.ids for o in ref.outputs], f"batch size {bs}"


def test_batched_reference_keeps_its_batch_full_as_rows_finish_and_stays_the_reference(
        tiny, mixed_prompts):
    """Rows that end at different tokens (EOS set to tokens the reference writes early) leave the
    batch at once, and the next prompts take their places: every decoding pass runs a full batch
    while prompts wait, and every row is still the batch-size-1 reference, the ~330-token passage
    admitted mid-way included."""
    prompts = mixed_prompts[15:26]
    assert max(map(len, prompts)) > 300
    plain = reference(tiny, prompts, 16).outputs
    pair = dataclasses.replace(tiny, eos_ids=(plain[0].ids[2], plain[3].ids[6], plain[7].ids[10]))
    ref = [o.ids for o in reference(pair, prompts, 16).outputs]
    assert len({len(ids) for ids in ref}) > 2  # rows finish at different steps
    passes = []  # (rows, a prefill: an empty cache)
    hook = pair.target.register_forward_pre_hook(
        lambda _, args, kw: passes.append((len(kw["input_ids"]), kvcache.length(kw["cache"]) == 0)),
        with_kwargs=True)
    try:
        got = batched_reference(pair, prompts, 4, 16)
    finally:
        hook.remove()
    assert [o.ids for o in got.outputs] == ref
    last_prefill = max(i for i, (_, prefill) in enumerate(passes) if prefill)
    assert [rows for rows, prefill in passes[:last_prefill] if not prefill] == [4] * sum(
        not prefill for _, prefill in passes[:last_prefill])  # full while prompts waited
    # a pass per token of each row, no more
    assert sum(rows for rows, _ in passes) == sum(map(len, ref))


def test_prompts_admitted_together_are_prefilled_apart_from_a_much_longer_one():
    prompts = [[7] * n for n in (40, 330, 45, 52, 55, 35)]
    # 227 real tokens in 275 slots
    assert prefill_groups(list(range(6)), prompts) == [[0, 2, 3, 4, 5], [1]]
    assert prefill_groups([1, 4], prompts) == [[4], [1]]
    assert prefill_groups([3, 2, 0], prompts) == [[3, 2, 0]]  # the order admitted, within a group


@pytest.fixture(scope="module")
def prompts(mixed_prompts):
    return mixed_prompts[:5]


def test_a_checkpoints_generation_config_does_not_change_the_reference(tiny, prompts):
    """A Hub model may ship repetition_penalty, no_repeat_ngram_size, suppress_tokens,
    min_new_tokens: the reference stays plain argmax, and so does hf-assisted's target."""
    target = tiny_target(torch.float64)
    plain = [plain_argmax(target, ids, NEW, tiny.vocab_size) for ids in prompts]
    target.generation_config.update(repetition_penalty=1.5, no_repeat_ngram_size=2,
                                    min_new_tokens=NEW,
                                    # tokens argmax picks
                                    suppress_tokens=sorted({ids[0] for ids in plain}))
    with torch.inference_mode():  # the config bites when generate is left to read it
        bent = [target.generate(torch.tensor([ids]), max_new_tokens=NEW)[0, len(ids):].tolist()
                for ids in prompts]
    assert all(b != p for b, p in zip(bent, plain))
    pair = dataclasses.replace(tiny, target=target)
    assert [o.ids for o in reference(pair, prompts, NEW).outputs] == plain
    assert [o.ids for o in hf_assisted(pair, prompts, 3, NEW).outputs] == plain
    # the model's own config is left as it was
    assert target.generation_config.repetition_penalty == 1.5


def test_a_padded_output_head_is_argmaxed_over_the_shared_vocabulary_only(tiny, prompts):
    """Rows of the head past the tokenizer's vocabulary (both models', as in a model family that
    pads its heads alike) never win, in the reference, the engine or hf-assisted."""
    target = tiny_target(torch.float64)
    plain = [plain_argmax(target, ids, NEW, tiny.vocab_size) for ids in prompts]
    picked = sorted({t for out in plain for t in out})
    target.resize_token_embeddings(tiny.vocab_size + len(picked), mean_resizing=False)
    head = target.get_output_embeddings().weight
    with torch.no_grad():
        # each picked token's twin, with twice its (positive) logit
        head[tiny.vocab_size:] = 2 * head[picked]
    with torch.inference_mode():  # over the whole head, argmax would pick a padding row
        assert int(target(torch.tensor([prompts[0]])).logits[0, -1].argmax()) >= tiny.vocab_size
    pair = dataclasses.replace(tiny, target=target, draft=layer_subset(target, [0, 1]))
    assert [o.ids for o in reference(pair, prompts, NEW).outputs] == plain
    assert [o.ids for o in eqspec(pair, prompts, 2, 4, NEW).outputs] == plain
    assert [o.ids for o in hf_assisted(pair, prompts, 3, NEW).outputs] == plain
