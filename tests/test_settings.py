import pytest

from specviz.models import PRESETS
from specviz.settings import Settings, SettingsError
from specviz.spec import EMBEDDED_DRAFT, EMBEDDED_TARGET, RunSpec, SpecError


def spec(**fields) -> RunSpec:
    return RunSpec.build(prompts=("Hi",), **fields)


def test_defaults_are_safe_for_a_public_page():
    s = Settings.from_env({})
    assert s == Settings()
    assert s.allowed_models == {m for pair in PRESETS.values() for m in pair}
    assert not s.trust_remote_code and not s.deterministic
    assert (s.max_batch_size, s.max_k, s.max_new_tokens, s.max_prompts) == (16, 8, 256, 64)
    s.check(spec())  # the page's default run passes


def test_environment_overrides_every_limit():
    s = Settings.from_env({
        "SPECVIZ_ALLOWED_MODELS": " org/target , org/draft,",
        "SPECVIZ_MAX_BATCH_SIZE": "32", "SPECVIZ_MAX_K": "4", "SPECVIZ_MAX_NEW_TOKENS": "64",
        "SPECVIZ_MAX_PROMPTS": "2", "SPECVIZ_TRUST_REMOTE_CODE": "yes", "SPECVIZ_QUEUE_SIZE": "3",
        "SPECVIZ_DETERMINISTIC": "On",
    })
    assert s == Settings(frozenset({"org/target", "org/draft"}), 32, 4, 64, 2, True, 3, True)
    s.check(spec(target="org/target", draft="org/draft", batch_size=32, k=4, max_new_tokens=64))
    assert Settings.from_env({"SPECVIZ_ALLOWED_MODELS": "*"}).allowed_models is None
    Settings.from_env({"SPECVIZ_ALLOWED_MODELS": "*"}).check(spec(target="/any/path", draft="/any/path"))


def test_a_disallowed_model_is_refused_by_name():
    with pytest.raises(SpecError, match=r"target model 'evil/model' is not allowed on this server; allowed: .*"
                                        r"specviz:smollm2-135m.*\(SPECVIZ_ALLOWED_MODELS\)"):
        Settings().check(spec(target="evil/model", draft="HuggingFaceTB/SmolLM2-135M-Instruct"))
    only = Settings.from_env({"SPECVIZ_ALLOWED_MODELS": "org/big"})
    with pytest.raises(SpecError, match="draft model 'org/small' is not allowed"):
        only.check(spec(target="org/big", draft="org/small"))
    with pytest.raises(SpecError, match=f"target model '{EMBEDDED_TARGET}' is not allowed"):
        only.check(spec(target=EMBEDDED_TARGET, draft=EMBEDDED_DRAFT))


@pytest.mark.parametrize("fields, message", [
    ({"batch_size": 32}, r"batch size 32 is over this server's limit of 16 \(SPECVIZ_MAX_BATCH_SIZE\)"),
    ({"k": 9}, r"k 9 is over this server's limit of 8 \(SPECVIZ_MAX_K\)"),
    ({"max_new_tokens": 257}, r"max new tokens 257 is over this server's limit of 256 \(SPECVIZ_MAX_NEW_TOKENS\)"),
    ({"prompts": ("a",) * 65}, r"the number of prompts 65 is over this server's limit of 64 \(SPECVIZ_MAX_PROMPTS\)"),
])
def test_over_limit_runs_are_refused_with_the_limit_and_its_variable(fields, message):
    Settings().check(spec(batch_size=16, k=8, max_new_tokens=256))  # at the limits: fine
    with pytest.raises(SpecError, match=message):
        Settings().check(RunSpec.build(**{"prompts": ("Hi",), **fields}))


@pytest.mark.parametrize("env, message", [
    ({"SPECVIZ_MAX_BATCH_SIZE": "many"}, r"SPECVIZ_MAX_BATCH_SIZE='many': expected a whole number"),
    ({"SPECVIZ_MAX_K": "0"}, r"SPECVIZ_MAX_K=0: must be between 1 and 16"),
    ({"SPECVIZ_MAX_NEW_TOKENS": "100000"}, r"SPECVIZ_MAX_NEW_TOKENS=100000: must be between 1 and 1024"),
    ({"SPECVIZ_TRUST_REMOTE_CODE": "sure"}, r"SPECVIZ_TRUST_REMOTE_CODE='sure': expected 1/0, true/false"),
    ({"SPECVIZ_DETERMINISTIC": "2"}, r"SPECVIZ_DETERMINISTIC='2'"),
])
def test_bad_values_fail_at_startup_naming_the_variable(env, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_describe_shows_the_limits_in_force():
    text = Settings.from_env({"SPECVIZ_MAX_BATCH_SIZE": "8", "SPECVIZ_ALLOWED_MODELS": "org/a,org/b"}).describe()
    lines = text.splitlines()
    assert all(ln.startswith("- ") for ln in lines)
    assert "`org/a`, `org/b`" in text and "batch size ≤ 8" in text and "k ≤ 8" in text
    assert "new tokens ≤ 256" in text and "prompts ≤ 64" in text and "refused" in text
    assert "any model id" in Settings.from_env({"SPECVIZ_ALLOWED_MODELS": "*"}).describe()
