"""Every hybrid family transformers 5.24 ships (tests/hybrids.py): decoded as the model alone
decodes it, with the draft model and with prompt lookup, or refused at load with the reason.
docs/models.md's "Architectures" table reports what this file holds."""
import pytest
from hybrids import FAMILIES, REFUSED, save, save_pair
from test_reference import plain_argmax

from specviz.decoding.drafters import PromptLookup
from specviz.decoding.eqspec import eqspec
from specviz.decoding.reference import reference
from specviz.models.pairs import load_pair
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
