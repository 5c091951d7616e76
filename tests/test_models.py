import json

import pytest
import torch
from transformers import AutoTokenizer

from specviz.decoding.batch import left_pad
from specviz.decoding.reference import batched_reference, reference
from specviz.models.checkpoints import embedded_tokenizer_dir
from specviz.models.pairs import load_pair, pair_for, tiny_target
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError


def test_embedded_pair_loads_offline_and_answers(embedded):
    assert embedded.target.config.num_hidden_layers == 30
    # The draft is the target plus seeded noise: same shapes, different weights, derived the same
    # way every time.
    t_w, d_w = (embedded.target.model.layers[3].mlp.up_proj.weight,
                embedded.draft.model.layers[3].mlp.up_proj.weight)
    assert t_w.shape == d_w.shape and not torch.equal(t_w, d_w)
    from specviz.models.draft import derive_draft

    again, _ = derive_draft(embedded.target)
    assert torch.equal(again.model.layers[3].mlp.up_proj.weight, d_w)
    assert embedded.eos_ids == (embedded.tokenizer.eos_token_id,)
    # The draft shares the target's embedding and head instead of copying them.
    assert embedded.draft.lm_head.weight.data_ptr() == embedded.target.lm_head.weight.data_ptr()
    ids = embedded.encode(["What is the capital of France?"])
    out = reference(embedded, ids, 12).outputs[0].ids
    assert "Paris" in embedded.tokenizer.decode(out)


def test_a_pair_loads_once_per_process():
    first = load_pair("specviz:tiny", "specviz:tiny-draft", dtype="float32", device="cpu")
    assert load_pair("specviz:tiny", "specviz:tiny-draft", dtype="float32", device="cpu") is first
    # However it is asked for: by position, as a spec's pair, or with the device auto picks here.
    assert load_pair("specviz:tiny", "specviz:tiny-draft", None, None, "float32", "cpu") is first
    spec = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float32",
                         device="cpu", prompts=("Hi",))
    assert pair_for(spec) is first
    if not torch.cuda.is_available():
        assert load_pair("specviz:tiny", "specviz:tiny-draft", dtype="float32",
                         device="auto") is first


def _save_local(tmp_path, name, tokenizer):
    model = tiny_target(torch.float32)
    model.save_pretrained(tmp_path / name)
    tokenizer.save_pretrained(tmp_path / name)
    return str(tmp_path / name)


def test_mismatched_tokenizers_are_refused(tmp_path):
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    target = _save_local(tmp_path, "target", tok)
    # A draft whose tokenizer maps two tokens to each other's ids.
    draft = _save_local(tmp_path, "draft", tok)
    spec = json.loads((tmp_path / "draft" / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["hello"], vocab["world"] = vocab["world"], vocab["hello"]
    (tmp_path / "draft" / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(SpecError, match="does not match the target's: 2 vocabulary entries differ"):
        load_pair(target, draft, device="cpu")
    same = load_pair(target, target, device="cpu")  # a local pair with one tokenizer loads
    assert same.vocab_size == len(tok)


def test_unknown_model_id_gets_a_clear_message(tmp_path):
    with pytest.raises(SpecError, match="cannot load model"):
        load_pair(str(tmp_path / "missing"), str(tmp_path / "missing"), device="cpu")


def test_pad_equal_to_eos_never_truncates_or_corrupts_prompts(tiny):
    """SmolLM2 pads with its EOS token. Prompts that contain and end with that
    token must stay whole: padding is tracked by the mask, never by value."""
    eos = tiny.eos_ids[0]
    raw = tiny.encode(["The end.<|im_end|>", "<|im_end|>", "Hello there, how are you doing today?"],
                      chat_template=False)
    assert raw[0][-1] == eos and raw[1] == [eos]
    tokens, valid = left_pad(raw, tiny.device)
    assert valid.sum(1).tolist() == [len(r) for r in raw]
    for row, ids in zip(tokens.tolist(), raw):
        assert row[len(row) - len(ids):] == ids
    ref = reference(tiny, raw, 10)
    batched = batched_reference(tiny, raw, 3, 10)
    assert [o.ids for o in batched.outputs] == [o.ids for o in ref.outputs]
    assert all(len(o.ids) > 0 for o in ref.outputs)


def test_the_embedded_draft_folder_loads_back_as_the_derived_draft(embedded):
    from transformers import AutoModelForCausalLM

    from specviz.models import kernels
    from specviz.models.checkpoints import embedded_draft_dir

    folder = embedded_draft_dir()
    assert embedded_draft_dir() == folder  # written once, then reused
    saved = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    kernels.pack_linears(saved)  # the kernels load_pair gives a float32 pair on CPU
    ids = torch.tensor(embedded.encode(["What is the capital of France?"]))
    with torch.inference_mode():
        assert torch.equal(saved(ids).logits, embedded.draft(ids).logits)
    assert AutoTokenizer.from_pretrained(folder).get_vocab() == embedded.tokenizer.get_vocab()
