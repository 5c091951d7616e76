"""Every hybrid family transformers 5.24 ships (tests/hybrids.py): decoded as the model alone
decodes it, with the draft model and with prompt lookup, or refused at load with the reason.
docs/models.md's "Architectures" table reports what this file holds. Each family's multi-token
path over a cache is its single steps' (the load-time self-test), and a planted single-token path
is refused at load."""
import functools
import inspect

import pytest
import torch
from hybrids import FAMILIES, REFUSED, save, save_pair
from transformers import AutoModelForCausalLM
from test_reference import plain_argmax

from specviz.decoding.drafters import PromptLookup
from specviz.decoding.eqspec import eqspec
from specviz.decoding.reference import reference
from specviz.models.architecture import in_float64, recurrent_mixers
from specviz.models.pairs import load_pair
from specviz.models.selftest import SHARE, check_verify_path, verify_path_gap
from specviz.spec.prompts import builtin_set
from specviz.spec.strict import SpecError

NEW = 6
WHY = {  # what each refusal says
    "minimax": "outside transformers' cache layers",
    "recurrent-gemma": "outside transformers' cache layers",
    "mamba2": "no attention layer",
    "qwen4-exp": "indexed_attention",
}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_hybrid_family_decodes_as_the_model_alone(family, tmp_path):
    pair = load_pair(*save_pair(tmp_path, family), dtype="float64", device="cpu")
    ids = pair.encode(builtin_set("chat")[:2])
    ref = [o.ids for o in reference(pair, ids, NEW).outputs]
    assert ref[0] == plain_argmax(pair.target, ids[0], NEW, pair.vocab_size)
    for drafter in (None, PromptLookup(pair, 1, 3)):
        assert [o.ids for o in eqspec(pair, ids, 2, 3, NEW, drafter=drafter).outputs] == ref


def test_every_refusal_says_why():
    assert set(WHY) == set(REFUSED)


@pytest.mark.parametrize("family", REFUSED)
def test_a_hybrid_specviz_cannot_lay_out_is_refused_at_load_with_the_reason(family, tmp_path):
    path = save(tmp_path, family)
    with pytest.raises(SpecError, match=WHY[family]):
        load_pair(path, path, dtype="float64", device="cpu")


# Families whose multi-token path over a cache transformers 5.24 breaks (the load-time self-test
# finds it): Jamba's Mamba mixer, on a call of several tokens, runs its full-sequence scan from a
# zero state, ignoring the cached one. specviz steps recurrent layers itself: its runs stand.
BROKEN_PATH = ("jamba",)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_hybrid_familys_verify_over_a_cache_is_its_single_steps(family, tmp_path):
    """The load-time self-test (models/selftest.py) in float32 and float64: one pass over a few
    tokens with a cached prefix computes what as many single steps do, or the finding says what
    departs."""
    path = save(tmp_path, family)
    for dtype in (torch.float32, torch.float64):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                     experts_implementation="eager")
        model = in_float64(model) if dtype == torch.float64 else model
        vocab = model.config.get_text_config().vocab_size
        gap, spread = verify_path_gap(model, vocab)
        assert (gap <= SHARE[dtype] * spread) == (family not in BROKEN_PATH), (dtype, gap, spread)
        assert (check_verify_path(model, vocab, "target") is None) == (family not in BROKEN_PATH)


def _holds_prefix(module, given: dict) -> bool:
    """Whether the cache a call was given held a prefix before it: the module's own layer's
    recurrent state (a mixer), else its K/V (a model)."""
    cache = given.get("cache")
    if cache is None:
        return False
    if hasattr(module, "layer_idx"):
        return any(cache.layers[module.layer_idx].has_previous_state.values())
    return cache.get_seq_length() > 0


def _single_token_path(cls, monkeypatch, holds_prefix) -> None:
    """N-03 (transformers PR #46741), planted on `cls`, a module whose forward takes hidden states
    (or ids) first: once a cache holds a prefix, a call over several tokens computes only its first
    and repeats it. `holds_prefix(module, arguments)`: whether its cache held a prefix."""
    real = cls.forward
    first = list(inspect.signature(real).parameters)[1]  # hidden_states, or input_ids

    @functools.wraps(real)  # its signature, which the load checks
    def forward(self, *args, **kwargs):
        given = inspect.signature(real).bind(self, *args, **kwargs).arguments
        x = given[first]
        if x.shape[1] == 1 or not holds_prefix(self, given):
            return real(self, *args, **kwargs)
        given.pop("self")
        given[first] = x[:, :1]
        for name in ("attention_mask", "position_ids"):
            if given.get(name) is not None:
                given[name] = given[name][:, :1]
        out = real(self, **given)
        if hasattr(out, "logits"):
            out.logits = out.logits.expand(-1, x.shape[1], -1)
            return out
        return out.expand(-1, x.shape[1], -1)

    monkeypatch.setattr(cls, "forward", forward)


@pytest.mark.parametrize("family", ["qwen3.5", "bamba"])
def test_a_hybrids_single_token_path_is_found_at_load_and_recorded(family, tmp_path,
                                                                  monkeypatch):
    """Planted in each recurrent mixer: the self-test finds it at load and the pair records it for
    the manifest (specviz steps the recurrent layers itself, so its own runs stand)."""
    path = save(tmp_path, family)
    probe = AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager")
    (cls,) = {type(m) for m in recurrent_mixers(probe)}
    _single_token_path(cls, monkeypatch, _holds_prefix)
    pair = load_pair(path, path, dtype="float32", device="cpu")
    assert "multi-token path over a cache is broken" in pair.info["target_verify_path"]


def test_an_attention_models_single_token_path_is_refused_at_load(tmp_path, monkeypatch):
    """Planted on a model whose layers all attend (its verify in specviz's engine takes that
    path): refused at load, naming the path."""
    from transformers import LlamaForCausalLM

    tiny = load_pair("specviz:tiny", "specviz:tiny-draft", dtype="float32", device="cpu")
    tiny.target.save_pretrained(tmp_path / "llama")
    tiny.tokenizer.save_pretrained(tmp_path / "llama")
    _single_token_path(LlamaForCausalLM, monkeypatch, _holds_prefix)
    with pytest.raises(SpecError, match="multi-token path over a cache is broken"):
        load_pair(str(tmp_path / "llama"), str(tmp_path / "llama"), dtype="float32",
                  device="cpu")
