import torch

from specviz.decoding.reference import batched_reference, reference


def test_reference_is_plain_argmax(tiny, mixed_prompts):
    """The oracle (transformers' generate) equals a bare argmax loop without any cache."""
    ids = mixed_prompts[0]
    out = reference(tiny, [ids], 8).outputs[0]
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(8):
            logits = tiny.target(torch.tensor([seq])).logits[0, -1]
            seq.append(int(logits.argmax()))
    assert out.ids == seq[len(ids):]
    assert len(out.margins) == len(out.ids) and all(m >= 0 for m in out.margins)


def test_batched_reference_equals_reference_in_float64(tiny, mixed_prompts):
    prompts = mixed_prompts[:9]
    ref = reference(tiny, prompts, 16)
    for bs in (1, 3, 4, 9):
        got = batched_reference(tiny, prompts, bs, 16)
        assert [o.ids for o in got.outputs] == [o.ids for o in ref.outputs], f"batch size {bs}"
