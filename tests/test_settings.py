import re

import pytest

from specviz.run.settings import Settings, SettingsError, is_local_path
from specviz.spec.prompts import builtin_set
from specviz.spec.run import EMBEDDED_DRAFT, EMBEDDED_TARGET, PAIR_PRESETS, RunSpec
from specviz.spec.strict import SpecError


def spec(**fields) -> RunSpec:
    return RunSpec.build(prompts=("Hi",), **fields)


def test_defaults_are_safe_for_a_public_page():
    s = Settings.from_env({})
    assert s == Settings()
    assert s.allowed_models == {m for pair in PAIR_PRESETS.values() for m in pair}
    assert not s.trust_remote_code and not s.deterministic and not s.public
    assert (s.max_batch_size, s.max_k, s.max_new_tokens, s.max_prompts) == (16, 8, 256, 64)
    assert (s.max_run_tokens, s.max_prompt_tokens, s.max_total_prompt_tokens) == (4096, 2048, 16384)
    assert s.max_dtype == "float32" and s.devices == {"auto", "cuda"}
    s.check(spec())  # the page's default run passes
    # the largest built-in set
    s.check(RunSpec.build(prompts=tuple(builtin_set("spec-bench")), max_new_tokens=64))
    s.check_prompt_ids([[1] * 2048] * 8)


def test_environment_overrides_every_limit():
    s = Settings.from_env({
        "SPECVIZ_ALLOWED_MODELS": " org/target , org/draft@v1.0,",
        "SPECVIZ_MAX_BATCH_SIZE": "32", "SPECVIZ_MAX_K": "4", "SPECVIZ_MAX_NEW_TOKENS": "64",
        "SPECVIZ_MAX_PROMPTS": "2", "SPECVIZ_TRUST_REMOTE_CODE": "yes", "SPECVIZ_QUEUE_SIZE": "3",
        "SPECVIZ_DETERMINISTIC": "On", "SPECVIZ_MAX_RUN_TOKENS": "100",
        "SPECVIZ_MAX_PROMPT_TOKENS": "10",
        "SPECVIZ_MAX_TOTAL_PROMPT_TOKENS": "15", "SPECVIZ_MAX_DTYPE": "float64",
        "SPECVIZ_DEVICES": "cpu, auto", "SPECVIZ_PUBLIC": "1",
    })
    assert s == Settings(allowed_models=frozenset({"org/target", "org/draft@v1.0"}),
                         max_batch_size=32, max_k=4, max_new_tokens=64, max_prompts=2,
                         trust_remote_code=True, queue_size=3, deterministic=True,
                         max_run_tokens=100, max_prompt_tokens=10, max_total_prompt_tokens=15,
                         max_dtype="float64", devices=frozenset({"cpu", "auto"}), public=True)
    s.check(spec(target="org/target", draft="org/draft", draft_revision="v1.0", batch_size=32, k=4,
                 max_new_tokens=64, dtype="float64", device="cpu"))
    s.check_prompt_ids([[1] * 10, [1] * 5])
    assert Settings.from_env({"SPECVIZ_ALLOWED_MODELS": "*"}).allowed_models is None
    Settings.from_env({"SPECVIZ_ALLOWED_MODELS": "*"}).check(spec(target="/any/path",
                                                                  draft="/any/path"))


def test_a_disallowed_model_is_refused_by_name():
    with pytest.raises(SpecError,
                       match=r"target model 'evil/model' is not allowed on this server; "
                             r"allowed: .*specviz:smollm2-135m.*\(SPECVIZ_ALLOWED_MODELS\)"):
        Settings().check(spec(target="evil/model", draft="HuggingFaceTB/SmolLM2-135M-Instruct"))
    only = Settings.from_env({"SPECVIZ_ALLOWED_MODELS": "org/big"})
    with pytest.raises(SpecError, match="draft model 'org/small' is not allowed"):
        only.check(spec(target="org/big", draft="org/small"))
    with pytest.raises(SpecError, match=f"target model '{EMBEDDED_TARGET}' is not allowed"):
        only.check(spec(target=EMBEDDED_TARGET, draft=EMBEDDED_DRAFT))


@pytest.mark.parametrize("fields, message", [
    ({"batch_size": 32},
     r"batch size 32 is over this server's limit of 16 \(SPECVIZ_MAX_BATCH_SIZE\)"),
    ({"k": 9}, r"k 9 is over this server's limit of 8 \(SPECVIZ_MAX_K\)"),
    ({"max_new_tokens": 257},
     r"max new tokens 257 is over this server's limit of 256 \(SPECVIZ_MAX_NEW_TOKENS\)"),
    ({"prompts": ("a",) * 65},
     r"the number of prompts 65 is over this server's limit of 64 \(SPECVIZ_MAX_PROMPTS\)"),
])
def test_over_limit_runs_are_refused_with_the_limit_and_its_variable(fields, message):
    Settings().check(spec(batch_size=16, k=8, max_new_tokens=256))  # at the limits: fine
    with pytest.raises(SpecError, match=message):
        Settings().check(RunSpec.build(**{"prompts": ("Hi",), **fields}))


@pytest.mark.parametrize("name, value, message", [
    ("MAX_BATCH_SIZE", "many", r"='many': expected a whole number"),
    ("MAX_K", "0", r"=0: must be between 1 and 16"),
    ("MAX_NEW_TOKENS", "100000", r"=100000: must be between 1 and 1024"),
    ("TRUST_REMOTE_CODE", "sure", r"='sure': expected 1/0, true/false"),
    ("DETERMINISTIC", "2", r"='2'"),
    ("MAX_PROMPT_TOKENS", "200000", r"=200000: must be between 1 and 131072"),
    ("MAX_RUN_TOKENS", "-1", r"=-1: must be between 1 and"),
    ("MAX_DTYPE", "float128", r"='float128': expected one of bfloat16, float16, float32"),
    ("DEVICES", "cpu,tpu", r"='cpu,tpu': expected a comma-separated list of auto, cpu, cuda"),
    ("PUBLIC", "maybe", r"='maybe'"),
    ("ALLOWED_MODELS", "org/model@", r": 'org/model@': expected a model id"),
])
def test_bad_values_fail_at_startup_naming_the_variable(name, value, message):
    with pytest.raises(SettingsError, match=f"SPECVIZ_{name}{message}"):
        Settings.from_env({f"SPECVIZ_{name}": value})


def test_describe_shows_the_limits_in_force():
    text = Settings.from_env({"SPECVIZ_MAX_BATCH_SIZE": "8",
                              "SPECVIZ_ALLOWED_MODELS": "org/a,org/b@v2"}).describe()
    lines = text.splitlines()
    assert all(ln.startswith("- ") for ln in lines)
    assert "`org/a`, `org/b@v2`" in text and "batch size ≤ 8" in text and "k ≤ 8" in text
    assert "new tokens ≤ 256" in text and "prompts ≤ 64" in text and "refused" in text
    assert ("prompts × new tokens ≤ 4096" in text
            and "the longest ≤ 2048, all together ≤ 16384" in text)
    assert "up to float32 for Hub and local models" in text and "devices: auto, cuda" in text
    assert "no local paths" not in text
    assert "no local paths" in Settings.from_env({"SPACE_ID": "org/space"}).describe()
    assert "any model id" in Settings.from_env({"SPECVIZ_ALLOWED_MODELS": "*"}).describe()


def test_a_link_cannot_name_another_revision_of_an_allowed_model():
    with pytest.raises(SpecError,
                       match=r"revision 'refs/pr/1' of target model 'Qwen/Qwen3-8B' is not allowed "
                             r"on this server; allowed: .* \(SPECVIZ_ALLOWED_MODELS\)"):
        Settings().check(spec(target="Qwen/Qwen3-8B", draft="Qwen/Qwen3-0.6B",
                              target_revision="refs/pr/1"))
    pinned = Settings.from_env({"SPECVIZ_ALLOWED_MODELS": "org/big@0123abc,org/small"})
    pinned.check(spec(target="org/big", draft="org/small", target_revision="0123abc"))
    for revision, message in ((None, "revision (the default) of target model 'org/big'"),
                              ("main", "revision 'main' of target model 'org/big'")):
        with pytest.raises(SpecError, match=re.escape(message) + r".*\(SPECVIZ_ALLOWED_MODELS\)"):
            pinned.check(spec(target="org/big", draft="org/small", target_revision=revision))
    with pytest.raises(SpecError,
                       match=r"revision 'dev' of draft model 'org/small' is not allowed"):
        pinned.check(spec(target="org/big", draft="org/small", target_revision="0123abc",
                          draft_revision="dev"))


def test_a_public_server_refuses_local_paths_whatever_the_allowlist(tmp_path, monkeypatch):
    # a Space is public unless the operator says not
    assert Settings.from_env({"SPACE_ID": "org/space"}).public
    assert not Settings.from_env({"SPACE_ID": "org/space", "SPECVIZ_PUBLIC": "0"}).public
    assert Settings.from_env({"SPECVIZ_PUBLIC": "1"}).public
    monkeypatch.chdir(tmp_path)
    # a folder named like a Hub id: transformers would read it
    (tmp_path / "org" / "model").mkdir(parents=True)
    public = Settings.from_env({"SPACE_ID": "org/space",
                                "SPECVIZ_ALLOWED_MODELS": f"*,{tmp_path},org/model"})
    for path in (str(tmp_path), "org/model", "./weights", "~/weights", "../weights", "C:\\weights"):
        assert is_local_path(path)
        with pytest.raises(SpecError,
                           match=re.escape(f"target model {path!r} is a local path; this server is "
                                           "public and loads Hub ids only (SPECVIZ_PUBLIC)")):
            public.check(spec(target=path, draft="org/draft"))
    public.check(spec(target="org/other", draft="org/draft"))  # Hub ids are still welcome
    public.check(spec())  # and so are the built-in pairs
    # not public: allowed
    Settings(allowed_models=None).check(spec(target=str(tmp_path), draft="org/model"))


def test_float64_is_capped_for_hub_models_and_free_for_the_built_in_pairs():
    hub = {"target": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
           "draft": "HuggingFaceTB/SmolLM2-135M-Instruct"}
    with pytest.raises(SpecError,
                       match=r"dtype float64 is wider than this server's limit of float32 for Hub "
                             r"and local models \(SPECVIZ_MAX_DTYPE\)"):
        Settings().check(spec(dtype="float64", **hub))
    Settings().check(spec(dtype="float32", **hub))
    Settings().check(spec(dtype="float64", target="specviz:tiny", draft="specviz:tiny-draft"))
    Settings().check(spec(dtype="float64"))  # the embedded pair
    half = Settings.from_env({"SPECVIZ_MAX_DTYPE": "bfloat16"})
    half.check(spec(dtype="float16", **hub))
    with pytest.raises(SpecError,
                       match=r"dtype float32 is wider .* of bfloat16 .*\(SPECVIZ_MAX_DTYPE\)"):
        half.check(spec(dtype="float32", **hub))


def test_devices_and_work_per_run_are_capped():
    with pytest.raises(SpecError,
                       match=r"device 'cpu' is not allowed on this server; allowed: auto, "
                             r"cuda \(SPECVIZ_DEVICES\)"):
        Settings().check(spec(device="cpu"))
    Settings().check(spec(device="cuda"))
    # 4096 tokens: at the limit
    Settings().check(RunSpec.build(prompts=("a",) * 16, max_new_tokens=256))
    with pytest.raises(SpecError,
                       match=r"prompts × max new tokens 4352 is over this server's limit of 4096 "
                             r"\(SPECVIZ_MAX_RUN_TOKENS\)"):
        Settings().check(RunSpec.build(prompts=("a",) * 17, max_new_tokens=256))


def test_prompt_tokens_are_capped_once_tokenized():
    with pytest.raises(SpecError,
                       match=r"prompt 1 is 2049 tokens long, over this server's limit of 2048 "
                             r"\(SPECVIZ_MAX_PROMPT_TOKENS\)"):
        Settings().check_prompt_ids([[1] * 5, [1] * 2049, [1] * 7])
    with pytest.raises(SpecError,
                       match=r"the prompts total 16385 tokens, over this server's limit of 16384 "
                             r"\(SPECVIZ_MAX_TOTAL_PROMPT_TOKENS\)"):
        Settings().check_prompt_ids([[1] * 2048] * 8 + [[1]])


def test_the_runner_checks_the_tokenized_prompts_before_decoding(tiny):
    from specviz.run.runner import run

    # about 2,100 tokens: far below the 400,000-character bound
    long_prompt = " ".join(["word"] * 2100)
    long = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float64",
                         prompts=(long_prompt,), max_new_tokens=4)
    Settings().check(long)  # nothing in the spec itself is over a limit
    with pytest.raises(SpecError,
                       match=r"prompt 0 is \d+ tokens long, over this server's limit of 2048 "
                             r"\(SPECVIZ_MAX_PROMPT_TOKENS\)"):
        run(long, limits=Settings())
    # the command line is the operator's own: no limit applies
    assert run(long).sequences[0].output_ids


def test_engine_servers_are_refused_unless_listed_and_always_when_public():
    with pytest.raises(SpecError, match=r"allowed: none \(SPECVIZ_ENGINE_SERVERS\)"):
        Settings().check_server("http://localhost:8000")
    listed = Settings.from_env({"SPECVIZ_ENGINE_SERVERS": "http://localhost:8000"})
    listed.check_server("http://localhost:8000/v1")
    for sneaky in ("http://localhost:8000.evil.com", "http://localhost:8001",
                   "https://localhost:8000"):
        with pytest.raises(SpecError, match="SPECVIZ_ENGINE_SERVERS"):
            listed.check_server(sneaky)
    public = Settings.from_env({"SPECVIZ_ENGINE_SERVERS": "http://localhost:8000",
                                "SPACE_ID": "me/specviz"})
    with pytest.raises(SpecError, match=r"public.*\(SPECVIZ_PUBLIC\)"):
        public.check_server("http://localhost:8000")
    assert "engine servers the check may ask: none" in public.describe()
