"""OpenVINO GenAI as an engine: the real pipeline (`make openvino`) on the embedded pair, judged
against our reference; its two bugs measured here (a sequence's score under speculation, seeded
sampling with a draft) and a third (speculative sampling verifies at temperature 1) flagged; its
rounds, seen from its steps, checked against its own generate(); a score judged from a file."""
import json
import subprocess

import pytest
from conftest import ENGINE_THREADS

from specviz.app.runview import render
from specviz.cli.main import main
from specviz.engines import openvino
from specviz.run.openvino_check import from_openvino
from specviz.spec.prompts import builtin_set
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace.schema import Trace

NEW_TOKENS = 24
COPY = "Copy this list: apples, pears, plums, cherries, apples, pears, plums, cherries."
SCORE = "decision-bug:score"


def spec(prompt_set: str = "quick", **over) -> RunSpec:
    fields = dict(method="engine", prompts=builtin_set(prompt_set), max_new_tokens=NEW_TOKENS,
                  device="cpu")
    return RunSpec.build(**{**fields, **over})


def openvino_check(*args, **kwargs) -> Trace:
    """OpenVINO on as many threads as the suite gives an engine (conftest.ENGINE_THREADS): its
    threads spin at barriers, and wait long for a core the other test worker holds."""
    return from_openvino(*args, threads=ENGINE_THREADS, **kwargs)


def verdicts(trace: Trace) -> dict[int, str]:
    return {s.seq: s.forensics.verdict for s in trace.sequences if s.forensics}


@pytest.fixture(scope="module")
def greedy(embedded):
    """The quick set and a copying prompt, in float32: the draft and prompt-lookup modes with
    their control, and the pipeline without speculation."""
    prompts = (*builtin_set("quick"), COPY)
    return {mode: openvino_check(spec(prompts=prompts), embedded, openvino.Setting(mode),
                                control=mode != "none")
            for mode in openvino.MODES}


@pytest.mark.parametrize("mode", ["draft", "ngram"])
def test_float32_speculation_gives_the_reference(greedy, mode):
    trace = greedy[mode]
    assert trace.manifest.engine.name == "openvino-genai"
    properties = trace.manifest.engine.settings["properties"]
    assert properties.items() >= openvino.PRECISIONS["f32"].items()
    for s in trace.sequences:
        assert s.engine.error is None and s.equivalent, (mode, s.seq)
        # its control, the same pipeline without speculation, too
        assert s.control.ids == s.engine.ids
    # the tokens are right; what is wrong is the score it reports (below)
    assert set(verdicts(trace).values()) <= {SCORE}
    # speculation really ran: rounds seen from its steps, drafts accepted
    rounds = [r for s in trace.sequences for r in s.engine.rounds[1:]]
    assert sum(r.accepted for r in rounds) > 0 and not any(r.shown for r in rounds)
    assert Trace.from_json(trace.to_json()).sequences[0].engine == trace.sequences[0].engine


def test_rounds_seen_from_steps_concatenate_to_its_generate(greedy, embedded, tmp_path):
    """OpenVINO's own generate() on the same prompts, written apart from the adapter: its ids are
    the concatenated steps, and the rounds cut them."""
    trace = greedy["draft"]
    setting = trace.manifest.engine.settings
    script = tmp_path / "generate.py"
    script.write_text(f"""
import json, sys
import numpy as np, openvino as ov, openvino_genai as g
job = json.load(sys.stdin)
f32 = {setting["properties"]!r}
s = g.SchedulerConfig(); s.cache_size = 1; s.max_num_seqs = 8
props = dict(f32); props["draft_model"] = g.draft_model(job["draft"], "CPU", **f32)
pipe = g.ContinuousBatchingPipeline(job["target"], s, "CPU", props)
c = g.GenerationConfig(); c.max_new_tokens = {NEW_TOKENS}; c.num_assistant_tokens = 5
c.stop_token_ids = set(job["eos"])
res = pipe.generate([ov.Tensor(np.array([p], dtype=np.int64)) for p in job["prompts"]],
                    [c] * len(job["prompts"]))
json.dump([list(r.m_generation_ids[0]) for r in res], sys.stdout)
""")
    from specviz.models.checkpoints import embedded_draft_dir, embedded_target_dir
    job = {"target": str(openvino.exported(embedded_target_dir())),
           "draft": str(openvino.exported(embedded_draft_dir())),
           "prompts": [p.ids for p in trace.prompts], "eos": list(embedded.eos_ids)}
    done = subprocess.run([str(openvino.openvino_python()), "-I", str(script)],
                          input=json.dumps(job), capture_output=True, text=True, check=True)
    generated = json.loads(done.stdout)
    for s, ids in zip(trace.sequences, generated):
        assert s.engine.ids == ids
        assert sum(r.accepted + 1 for r in s.engine.rounds) == len(ids)


def test_the_score_under_speculation_is_flagged_and_the_plain_run_is_not(greedy):
    """OpenVINO GenAI 2026.4.1: a sequence's score under speculation is not the sum of the
    log-probabilities it reports beside it (the tokens and those log-probabilities are right)."""
    for mode in ("draft", "ngram"):
        trace = greedy[mode]
        flagged = [s for s in trace.sequences if s.forensics]
        assert flagged, mode
        for s in flagged:
            f = s.forensics
            assert abs(f.score - f.score_expected) > f.tolerance
            # at the first token of a round after the first: a round of speculation
            starts = [0]
            for r in s.engine.rounds[:-1]:
                starts.append(starts[-1] + r.accepted + 1)
            assert f.fork in starts[1:], (mode, s.seq, f.fork, starts)
    plain = greedy["none"]
    assert verdicts(plain) == {} and all(s.equivalent for s in plain.sequences)


def test_with_prefix_caching_every_pass_gives_the_reference(embedded):
    """Three passes on one pipeline with its prefix cache on: the later ones find the prompts'
    blocks cached (every chat prompt shares the system prompt, and each its own whole prompt)."""
    trace = openvino_check(spec(prompts=(*builtin_set("quick"), COPY)), embedded,
                          openvino.Setting("draft", prefix_caching=True), control=False,
                          determinism=True)
    assert trace.manifest.engine.settings["prefix_caching"] is True
    assert all(s.equivalent for s in trace.sequences)
    assert trace.manifest.determinism.differing == []


def test_the_cpu_defaults_fork_as_numerics_never_a_bug(embedded):
    """bf16 compute and a u8 KV cache where the CPU has bfloat16: its forks are put down to
    OpenVINO's own rounding, measured by its control at the same precision."""
    # (on its own threads: on one, its CPU plugin dies of SIGFPE with these defaults)
    trace = from_openvino(spec(prompt_set="all"), embedded,
                          openvino.Setting("draft", "cpu-default"), control=True)
    settings = trace.manifest.engine.settings
    forks = {seq: v for seq, v in verdicts(trace).items() if v != SCORE}
    assert set(forks.values()) <= {"numerics"}
    for seq in forks:  # placed in the round its steps show
        f = trace.sequences[seq].forensics
        assert f.fork_round is not None and f"round {f.fork_round} wrote" in f.explanation or (
            f.fork_round == 0 and "prefill wrote" in f.explanation)
    for s in trace.sequences:  # every view of every sequence draws (its rounds, its verdict)
        assert f'data-seq="{s.seq}"' in render(trace, s.seq)["grid"]
    if settings["cpu_defaults"]["INFERENCE_PRECISION_HINT"] == "bf16":
        assert forks, "bf16 forks from the float32 reference somewhere on the whole set"
    else:  # a CPU without bfloat16 computes in float32 by default
        assert all(s.equivalent for s in trace.sequences)


@pytest.mark.parametrize("mode", ["draft", "none"])
def test_seeded_sampling_repeats_only_without_speculation(embedded, mode):
    """The same seeded requests on the same pipeline, again and in reverse order: without
    speculation OpenVINO answers alike; with a draft it does not, and its tokens are not the
    target's distribution (the target verifies at temperature 1: named by the rules judge)."""
    trace = openvino_check(spec(prompt_set="all", temperature=0.9, seed=5), embedded,
                          openvino.Setting(mode), control=False, determinism=True)
    asked = trace.manifest.determinism
    assert asked.prompts == len(trace.sequences)
    distribution = trace.distribution
    if mode == "none":
        assert asked.differing == []
        assert distribution.verdict == "consistent"
    else:
        assert asked.differing, "seeded sampling with a draft repeats"
        assert distribution.verdict == "not the target's distribution"
        likeliest = distribution.attribution.hypotheses[0]
        assert (likeliest.fault, likeliest.named) == ("temperature-draft-only", True)


def test_the_command_line_checks_openvino(tmp_path, capsys):
    out = tmp_path / "check.json"
    main(["check", "--openvino", "ngram", "--control-openvino", "--prompt", COPY,
          "--max-new-tokens", str(NEW_TOKENS), "--no-attribution", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "engine rounds:" in printed and "seen from outside" in printed
    assert json.loads(out.read_text())["engine"]["settings"]["mode"] == "ngram"
    for bad, why in ((["--control-openvino", "--server", "http://127.0.0.1:9"], "--openvino MODE"),
                     (["--openvino", "draft", "--stream"], "--stream reads a server's"),
                     (["--openvino", "draft", "--stop", "."], "stop strings are not sent")):
        assert main(["check", *bad, "--prompt", COPY, "--max-new-tokens", "4"]) == 2
        assert why in capsys.readouterr().err


def test_an_unknown_setting_is_refused():
    with pytest.raises(SpecError, match="choose from none, ngram, draft"):
        openvino.Setting("eagle")
    with pytest.raises(SpecError, match="choose from f32, cpu-default"):
        openvino.Setting("draft", "bf16")
