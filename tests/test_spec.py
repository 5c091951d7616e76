import pytest

from specviz.spec.run import MAX_PROMPT_CHARS, RunSpec
from specviz.spec.strict import SpecError

GOOD = dict(prompts=("Hello",))


@pytest.mark.parametrize("field,value,message", [
    ("batch_size", 0, "batch_size: Input should be greater than or equal to 1"),
    ("batch_size", 65, "batch_size: Input should be less than or equal to 64"),
    ("k", 0, "k: Input should be greater than or equal to 1"),
    ("k", 17, "k: Input should be less than or equal to 16"),
    ("max_new_tokens", 0, "max_new_tokens: Input should be greater than or equal to 1"),
    ("max_new_tokens", 1025, "max_new_tokens: Input should be less than or equal to 1024"),
    ("prompts", (), "prompts: Tuple should have at least 1 item"),
    ("prompts", ("ok", "  "), "prompts: prompt 1 is empty"),
    ("prompts", ("x" * (MAX_PROMPT_CHARS + 1),), f"the limit is {MAX_PROMPT_CHARS}"),
    ("temperature", -0.5, "temperature: Input should be greater than or equal to 0"),
    ("top_p", 0.9, "top-k, top-p and the draft's sampling settings need a temperature above 0"),
    ("method", "magic", "method: Input should be"),
    ("dtype", "int8", "dtype: Input should be"),
    ("device", "tpu", "device: Input should be"),
    ("target", " ", "target: model id must not be empty"),
    ("draft", "Qwen/Qwen3-0.6B", "the built-in drafts only pair with their own targets"),
    ("colour", "red", "colour: Extra inputs are not permitted"),
])
def test_each_bad_input_has_its_own_message(field, value, message):
    with pytest.raises(SpecError) as err:
        RunSpec.build(**{**GOOD, field: value})
    assert message in str(err.value)


def test_canonical_form_is_stable_and_hashable():
    a = RunSpec.build(prompts=("a", "b"), k=3, batch_size=2)
    b = RunSpec.build(batch_size=2, k=3, prompts=["a", "b"])
    assert a == b and hash(a) == hash(b)
    assert a.canonical_json() == b.canonical_json()
    assert a.key() == b.key() and len(a.key()) == 16
    assert RunSpec.model_validate_json(a.canonical_json()) == a
    assert a.key() != RunSpec.build(prompts=("a", "b"), k=4, batch_size=2).key()
