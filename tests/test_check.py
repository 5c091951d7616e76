"""specviz check: an engine judged from outside, by its ids alone, against
the batch-size-1 reference.

The engines here are our own, wrapped as a researcher's callable that hands over ids only: the
correct engine, and the bsp-like and dsd-like re-creations of published bugs. Black-box verdicts
must agree with what the white-box run of the same engine knows.
"""
import contextlib
import json
import re

import pytest
import torch

from specviz.app.panel import forensics_html
from specviz.app.runview import render
from specviz.cli import main as cli
from specviz.decoding.eqspec import eqspec
from specviz.decoding.reference import batched_reference
from specviz.decoding.sampling import Sampler, Sampling
from specviz.forensics.recompute import float64_target, fresh_logits
from specviz.models.pairs import load_pair
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.trace.schema import Trace

BUDGET = 24


def _pair(settings):
    return load_pair(TINY_TARGET, TINY_DRAFT, dtype=settings["dtype"], device="cpu")


def _eqspec(prompt_ids, settings, faults=()):
    return [o.ids
            for o in eqspec(_pair(settings), prompt_ids, 4, settings["k"],
                            settings["max_new_tokens"], faults=faults).outputs]


# The callables a user would point --engine at (module:function): ids in, ids out.
def correct(prompt_ids, settings):
    return _eqspec(prompt_ids, settings)


def bsp_like(prompt_ids, settings):
    return {"outputs": _eqspec(prompt_ids, settings,
                               ("positions-from-slots", "keep-rejected-kv", "right-padding")),
            "name": "bsp-like", "settings": {"k": settings["k"]}}


def dsd_like(prompt_ids, settings):
    return _eqspec(prompt_ids, settings, ("no-mask", "growing-padding", "draft-bonus"))


def sampled(prompt_ids, settings):
    """A sampling engine: eqspec with the temperature, top-k, top-p and seed the check
    hands over."""
    sampler = Sampler(settings["temperature"], settings["top_k"], settings["top_p"])
    result = eqspec(_pair(settings), prompt_ids, 4, settings["k"], settings["max_new_tokens"],
                    sampling=Sampling(sampler, sampler, settings["seed"]))
    return {"outputs": [o.ids for o in result.outputs], "name": "sampled eqspec",
            "settings": settings}


def no_speculation(prompt_ids, settings):
    return [o.ids
            for o in batched_reference(_pair(settings), prompt_ids, 4,
                                       settings["max_new_tokens"]).outputs]


def _check(tmp_path, *engine_args) -> Trace:
    out = tmp_path / "check.json"
    assert cli.main(["check", "--pair", "tiny", "--dtype", "float32", "--device", "cpu",
                     "--prompt-set", "all", "--max-new-tokens", str(BUDGET), "--trace", str(out),
                     *engine_args]) == 0
    return Trace.from_json(out.read_text())


def _white_box(faults) -> Trace:
    return run(RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float32", device="cpu",
                             prompts=tuple(builtin_set("all")), batch_size=4, k=5,
                             max_new_tokens=BUDGET, faults=faults))


def test_a_correct_engine_equals_the_reference_and_gets_no_verdicts(tmp_path, tiny):
    trace = _check(tmp_path, "--engine", "test_check:correct")
    assert trace.manifest.spec.method == "engine" and trace.manifest.engine.source == "callable"
    assert all(s.equivalent for s in trace.sequences)
    tolerance = trace.manifest.yardstick.target.tolerance
    # every token the target's own choice
    assert max(g for s in trace.sequences for g in s.gaps) <= tolerance


def test_in_bfloat16_a_correct_engine_is_numerics_never_an_engine_bug(tmp_path, tiny):
    """And when its control run (here: itself) departs at the same token, never an engine
    bug either."""
    for control in ((), ("--control-engine", "test_check:correct")):
        trace = _check(tmp_path, "--dtype", "bfloat16", "--prompt-set", "spec-bench",
                       "--max-new-tokens", "48", "--engine", "test_check:correct", *control)
        verdicts = [s.forensics.verdict for s in trace.sequences if s.forensics]
        assert verdicts and "engine-bug" not in verdicts
        assert verdicts.count("numerics") >= 0.9 * len(verdicts), verdicts


@pytest.mark.parametrize("engine, faults",
                         [("bsp_like", ("bsp-like",)), ("dsd_like", ("dsd-like",))])
def test_a_broken_engine_is_an_engine_bug_wherever_the_white_box_sees_a_sync_bug(engine, faults,
                                                                                 tmp_path, tiny):
    white = _white_box(faults)
    black = _check(tmp_path, "--engine", f"test_check:{engine}", "--control-engine",
                   "test_check:no_speculation")
    for w, b in zip(white.sequences, black.sequences):
        assert w.output_ids == b.output_ids  # the same engine, seen from outside
        if w.forensics and w.forensics.verdict.startswith("sync-bug"):
            assert b.forensics.verdict == "engine-bug", (b.seq, b.forensics.explanation)
            assert b.forensics.alpha == 0.01 and "control run" in b.forensics.yardstick


def test_the_fork_evidence_is_what_a_fresh_float64_pass_gives(tmp_path, tiny):
    """The engine's rank at the fork, its float64 margin and both texts' costs after it, read from
    the outputs teacher-forced once, are those of a fresh batch-size-1 float64 pass over each
    whole sequence."""
    trace = _check(tmp_path, "--engine", "test_check:dsd_like", "--control-engine",
                   "test_check:no_speculation")
    pair = _pair({"dtype": "float32"})
    truth = float64_target(pair)
    divergent = [s for s in trace.sequences if s.forensics and s.forensics.output_token is not None]
    assert divergent
    for s in divergent:
        f, prompt, vocab = s.forensics, trace.prompts[s.seq].ids, pair.vocab_size
        out = fresh_logits(truth, prompt + s.output_ids[:-1], len(s.output_ids),
                           vocab).log_softmax(-1)
        ref = fresh_logits(truth, prompt + s.reference_ids[:-1], len(s.reference_ids),
                           vocab).log_softmax(-1)
        z = out[f.fork]
        assert f.engine_rank == 1 + int((z > z[f.output_token]).sum())
        assert f.margin_float64 == pytest.approx(float(z[f.reference_token] - z[f.output_token]),
                                                 abs=1e-9)
        nll = -out[torch.arange(f.fork, len(s.output_ids)),
                   torch.tensor(s.output_ids[f.fork:])].mean()
        reference_nll = -ref[torch.arange(f.fork, len(s.reference_ids)),
                             torch.tensor(s.reference_ids[f.fork:])].mean()
        assert (f.nll, f.reference_nll) == pytest.approx((float(nll), float(reference_nll)),
                                                         abs=1e-9)


def test_without_a_control_run_a_fork_beyond_transformers_rounding_asks_for_one(tmp_path, tiny):
    """A real engine's kernels may round far more coarsely than transformers' (llama.cpp quantizes
    activations): without its control run, a gap beyond our own rounding is no proof of a bug, and
    the verdict says what would decide it."""
    trace = _check(tmp_path, "--engine", "test_check:dsd_like")
    divergent = [s for s in trace.sequences if s.equivalent is False]
    assert divergent and trace.manifest.yardstick.engine.source == "none"
    for s in divergent:
        f = s.forensics
        assert f.verdict in ("unexplained", "numerics"), f.explanation
        if f.verdict == "unexplained":
            assert ("Missing evidence: its run without speculation" in f.explanation
                    and "--control" in f.explanation)
            assert s.gaps[f.first_bad] > trace.manifest.yardstick.target.tolerance


def test_a_control_run_says_speculation_changed_it(tmp_path, tiny, capsys):
    trace = _check(tmp_path, "--engine", "test_check:bsp_like", "--control-engine",
                   "test_check:no_speculation")
    divergent = [s for s in trace.sequences if s.equivalent is False]
    assert divergent and all(s.forensics.verdict == "engine-bug" for s in divergent)
    # Every engine-bug comes with the smallest request that shows it: the prompt's ids, up to the
    # fork token.
    printed = capsys.readouterr().out
    s, f = divergent[0], divergent[0].forensics
    assert (f"reproduce: prompt ids {trace.prompts[s.seq].ids}, greedy, {f.fork + 1} tokens: token "
            f"{f.fork} should be {f.reference_token}, is {f.output_token}") in printed
    assert all("speculation changed the output" in s.forensics.explanation for s in divergent
               if s.forensics.control_fork is None or s.forensics.control_fork > s.forensics.fork)
    assert trace.manifest.control.name == "test_check:no_speculation"


def test_a_file_of_outputs_gives_the_same_report_as_the_live_engine(tmp_path, tiny):
    live = _check(tmp_path, "--engine", "test_check:dsd_like")
    lines = [json.dumps({"engine": {"name": "dsd-like", "settings": {"k": 5}}})]
    lines += [json.dumps({"prompt_ids": p.ids, "output_ids": s.output_ids})
              for p, s in zip(live.prompts, live.sequences)]
    path = tmp_path / "outputs.jsonl"
    path.write_text("\n".join(lines))
    filed = _check(tmp_path, "--outputs", str(path))
    assert filed.manifest.engine.source == "file" and filed.manifest.engine.name == "dsd-like"
    assert [p.ids for p in filed.prompts] == [p.ids for p in live.prompts]
    for a, b in zip(live.sequences, filed.sequences):
        assert (a.first_divergence, a.gaps) == (b.first_divergence, b.gaps)
        assert ((a.forensics and a.forensics.model_dump())
                == (b.forensics and b.forensics.model_dump()))


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "hi"}', "line 1: .*output_ids"),
    ('{"prompt": "hi", "output_ids": [1]}\n{"prompt_ids": [1], "prompt": "x", "output_ids": [2]}',
     "line 2: .*exactly one"),
    ('{"prompt": "hi", "output_ids": "many"}', "line 1: output_ids"),
    ('[{"prompt": "hi", "output_ids": [1]}]',
     "line 1: not a JSON object .*a line is a JSON object, not list"),
    ('{"choices": [{"token_ids": [1]}]}', "line 1: .*names no prompt ids"),
    ('{"request": {"prompt": [1]}, "response": {"content": "x"}}',
     "line 1: .*neither an OpenAI-compatible"),
    ("not json", "line 1: not a JSON object"),
    ("", "no output lines"),
])
def test_a_file_with_the_wrong_schema_gets_a_message_naming_the_line(content, message, tmp_path,
                                                                     capsys, tiny):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert cli.main(["check", "--pair", "tiny", "--device", "cpu", "--outputs", str(path)]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and re.search(message, err), err


def test_an_engine_that_is_not_there_gets_a_message(tmp_path, capsys, tiny):
    assert cli.main(["check", "--pair", "tiny", "--device", "cpu", "--engine",
                     "no_such_module:f"]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err


def test_the_page_shows_an_engine_check(tmp_path, tiny):
    from specviz.app import runview as ui
    from specviz.app import summary, tokens, views

    trace = _check(tmp_path, "--engine", "test_check:bsp_like", "--control-engine",
                   "test_check:no_speculation")
    focus, _ = views.resolve(trace)
    s = trace.sequences[focus.seq]
    chips = tokens.timeline_html(trace, focus)
    assert "this engine reported none" in tokens.grid_html(trace, focus)
    own, surprise = chips.count("sv-own"), chips.count("sv-surprise")
    assert own + surprise == len(s.output_ids)
    # the tokens the target would not write
    assert surprise == sum(g > s.forensics.tolerance for g in s.gaps) > 0
    shown = forensics_html(trace, focus)
    assert ("engine-bug" in shown and "rank of the engine" in shown
            and "without speculation departs at" in shown)
    headline = summary.headline(trace)
    assert "engine check" in headline and r"\(control\, no speculation\)" in headline
    views_out = ui.render(trace)
    link, note = views_out["link_query"], views_out["focus_note"]
    assert link == "" and "share its trace file" in note
    assert Trace.from_json(trace.to_json()) == trace


def test_a_sampled_check_tells_a_callable_its_settings_and_judges_its_ids_by_their_distribution(
        tiny):
    """No reference at temperature > 0: the engine's tokens are scored under the target (the PIT); a
    file of the same ids gets the same values, a file of text is refused."""
    from specviz.run import check
    from specviz.spec.strict import SpecError

    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float32", device="cpu",
                         method="engine", prompts=tuple(builtin_set("quick")),
                         max_new_tokens=BUDGET, temperature=0.8, top_k=50, top_p=0.95, seed=2)
    pair = _pair({"dtype": "float32"})
    live = check.from_callables(spec, pair, "test_check:sampled", None)
    told = live.manifest.engine.settings
    assert (told["temperature"], told["top_k"], told["top_p"], told["seed"]) == (0.8, 50, 0.95, 2)
    d = live.distribution
    assert ((d.verdict, d.impossible) == ("consistent", 0)
            and d.tokens == sum(len(s.output_ids) for s in live.sequences))
    assert all(s.reference_ids is None and s.forensics is None for s in live.sequences)
    assert Trace.from_json(live.to_json()) == live
    lines = [json.dumps({"prompt_ids": p.ids, "output_ids": s.output_ids})
             for p, s in zip(live.prompts, live.sequences)]
    filed = check.from_files(spec, pair, ("\n".join(lines).encode(), "outputs.jsonl"))
    assert [s.pit for s in filed.sequences] == [s.pit for s in live.sequences]
    assert filed.distribution.model_dump() == d.model_dump()
    text = [json.dumps({"prompt_ids": p.ids, "output_text": "Paris."}) for p in live.prompts]
    with pytest.raises(SpecError, match="4 of the engine's 4 answers are text"):
        check.from_files(spec, pair, ("\n".join(text).encode(), "text.jsonl"))


def test_the_outputs_schema_file_is_current():
    from pathlib import Path

    from specviz.engines import jsonl

    published = Path(__file__).resolve().parents[1] / "docs" / "engine-outputs.schema.json"
    assert json.loads(published.read_text()) == jsonl.outputs_schema()


def test_two_engines_compare_token_by_token_where_they_part(tmp_path, tiny):
    from specviz.app import sidebyside, sweeptab

    good = _check(tmp_path, "--engine", "test_check:correct")
    bad = _check(tmp_path, "--engine", "test_check:bsp_like")
    sides, a, b = sweeptab.remember_sides(sweeptab.remember_sides({}, good)[0], bad)
    assert (a["value"], b["value"]) == (sidebyside.side_of_trace(good).label,
                                        sidebyside.side_of_trace(bad).label)
    assert b["value"].startswith("engine bsp-like · ")
    s = next(s for s in bad.sequences if s.equivalent is False)
    summary, aligned, link = sweeptab.compare_runs(sides, a["value"], b["value"], s.seq)
    assert (f"first differ at token {s.first_divergence}:" in summary
            and "equal to the batch-size-1 reference" in summary)
    assert link == ""  # an engine check is made from its files: no link replays it
    assert f'data-first="{s.first_divergence}"' in aligned


# ----------------------------------------------------- an engine whose kernels round by batch shape

SHAPE_NOISE = 0.03  # logits: the simulated engine's rounding, on each logit of each pass


@contextlib.contextmanager
def batch_shape_noise(pair, scale, heavy=False):
    """The pair's target, as an engine whose kernels round by batch shape: each pass's logits move
    by noise of `scale` drawn from the pass's shape and where its rows sit (never from a seed the
    run controls), the same in every pass of that shape, as a kernel's blocking would be. `heavy`:
    tails far heavier than a Gaussian's (a Gaussian cubed), as real rounding's can be."""
    def hook(module, args, kwargs, output):
        ids, cache = kwargs["input_ids"], kwargs.get("cache")
        shape = (*ids.shape, 0 if cache is None else cache.get_seq_length() - ids.shape[1])
        noise = torch.randn(output.logits.shape,
                            generator=torch.Generator().manual_seed(hash(shape) % 2**31))
        if heavy:
            noise = noise ** 3 / 15 ** 0.5  # unit variance
        output.logits = output.logits + scale * noise.to(output.logits.dtype)
        return output

    handle = pair.target.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def noisy(prompt_ids, settings):
    with batch_shape_noise(_pair(settings), SHAPE_NOISE):
        return correct(prompt_ids, settings)


def heavy_noisy(prompt_ids, settings):
    with batch_shape_noise(_pair(settings), SHAPE_NOISE, heavy=True):
        return correct(prompt_ids, settings)


def noisy_bsp_like(prompt_ids, settings):
    with batch_shape_noise(_pair(settings), SHAPE_NOISE):
        return bsp_like(prompt_ids, settings)


def noisy_control(prompt_ids, settings):
    with batch_shape_noise(_pair(settings), SHAPE_NOISE):
        return no_speculation(prompt_ids, settings)


def test_kernels_rounding_by_batch_shape_are_numerics_and_the_same_engine_with_a_bug_an_engine_bug(
        tmp_path, tiny):
    """Its control (the same noisy kernels, no speculation) departs from the model as often as it
    does: every fork of the correct engine is that engine's numerics; bsp-like on the same kernels
    is an engine bug."""
    control = ("--control-engine", "test_check:noisy_control")
    correct_noisy = _check(tmp_path, "--engine", "test_check:noisy", *control)
    noise = correct_noisy.manifest.yardstick.engine
    assert noise.source == "control" and noise.departures and noise.tolerance > 100 * noise.rounding
    # a logit difference's noise: sqrt(2) x each logit's
    assert SHAPE_NOISE < noise.sigma < 3 * SHAPE_NOISE
    forks = [s.forensics for s in correct_noisy.sequences if s.forensics]
    assert len(forks) >= 5 and {f.verdict for f in forks} == {"numerics"}, [f.explanation
                                                                            for f in forks]
    engine, ctrl = correct_noisy.manifest.fidelity
    assert (engine.role, ctrl.role, engine.beyond, ctrl.beyond) == ("engine", "control", 0, 0)
    # both depart from the model, neither beyond its rounding
    assert engine.departures > 0 and ctrl.departures > 0

    broken = _check(tmp_path, "--engine", "test_check:noisy_bsp_like", *control)
    verdicts = [s.forensics.verdict for s in broken.sequences if s.forensics]
    assert (verdicts.count("engine-bug") >= 0.9 * len(verdicts)
            and "numerics" not in verdicts), verdicts
    for s in broken.sequences:
        if s.forensics.verdict == "engine-bug":
            f = s.forensics
            assert (s.gaps[f.first_bad] > f.tolerance == noise.tolerance
                    and f"{f.tolerance:.3g}" in f.explanation)


def test_an_engine_judged_against_itself_as_its_own_control_is_never_an_engine_bug(tmp_path, tiny):
    """Kernels with heavy-tailed rounding: the control writes every token the engine writes, on the
    same prefixes, so whatever their gaps, speculation wrote none of them; the tokens after a fork
    are as much the control's as the fork itself."""
    trace = _check(tmp_path, "--engine", "test_check:heavy_noisy", "--control-engine",
                   "test_check:heavy_noisy", "--max-new-tokens", "48")
    assert all(s.engine.ids == s.control.ids for s in trace.sequences)
    forks = [s.forensics for s in trace.sequences if s.forensics]
    assert forks and "engine-bug" not in {f.verdict for f in forks}, [f.explanation for f in forks]


def _judged(engine: list[list[int]], control: list[list[int]], prompts: list[str],
            control_logprobs: list[list[float]] | None = None) -> Trace:
    """An engine check of `engine`'s outputs against `control`'s on the tiny pair in float32
    (rounding above zero)."""
    from specviz.engines.base import EngineRun
    from specviz.run import check
    from specviz.spec.run import ENGINE
    from specviz.trace.records import EngineOutput

    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype="float32", device="cpu")
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float32", device="cpu",
                         prompts=tuple(prompts), method=ENGINE, max_new_tokens=BUDGET)
    logprobs = {"engine": [None] * len(engine),
                "control": control_logprobs or [None] * len(control)}
    runs = [EngineRun(name=name, source="callable", outputs=[EngineOutput(ids=ids, logprobs=lp)
                                                             for ids, lp in zip(outputs,
                                                                                logprobs[name])])
            for name, outputs in (("engine", engine), ("control", control))]
    return check.check(spec, pair, pair.encode(prompts), *runs)


def _dsd_like_and_control(prompts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """dsd-like eqspec's outputs and batched-reference's (its control) on the tiny pair in float32,
    batch size 4."""
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype="float32", device="cpu")
    ids = pair.encode(prompts)
    engine = eqspec(pair, ids, 4, 4, BUDGET, faults=("no-mask", "growing-padding", "draft-bonus"))
    return ([o.ids for o in engine.outputs],
            [o.ids for o in batched_reference(pair, ids, 4, BUDGET).outputs])


def _junk(prompts: list[str]) -> list[list[int]]:
    """Outputs no model wrote: what a server with the wrong weights, tokenizer or chat template
    would return."""
    return [[(7 * i + 13 * j) % 500 + 20 for j in range(BUDGET)] for i in range(len(prompts))]


def test_a_control_departing_at_every_token_grants_no_rounding_so_that_output_is_never_numerics():
    """A server serving the wrong model, used as its own control: every control token departs from
    the model, so the fit cannot bound the noise (it used to report SIGMA_RANGE's top, a tolerance
    of thousands of logits, and call every row numerics). Only transformers' rounding is granted,
    and the rows are unexplained: the engine departs from the model with or without speculation."""
    prompts = builtin_set("chat")[:3]
    trace = _judged(_junk(prompts), _junk(prompts), prompts)
    noise = trace.manifest.yardstick.engine
    assert noise.source == "unbounded" and noise.tolerance == noise.rounding < 1e-3
    assert "depart from the target's own choice" in noise.describe()
    forks = [s.forensics for s in trace.sequences]
    assert all(f is not None and f.verdict == "unexplained" for f in forks), [f and f.explanation
                                                                              for f in forks]
    assert all("with or without speculation" in f.explanation and "bounds none" in f.yardstick
               for f in forks)
    from specviz.app import plots, views

    focus, _ = views.resolve(trace)
    # the page says what the yardstick was, and why
    assert "bounds none" in forensics_html(trace, focus)
    assert "bound none of it" in plots.yardstick(trace, focus).layout.title.text
    assert Trace.from_json(trace.to_json()) == trace


@pytest.mark.parametrize("control", ["departs everywhere", "two tokens"])
def test_a_control_that_bounds_no_rounding_leaves_a_speculative_fork_unexplained_not_numerics(
        control):
    """dsd-like speculation judged against a control that measures nothing: one that departs at
    every token, or one token an output on two prompts (kept tokens alone bound nothing below
    SIGMA_RANGE's top). Granting either fit called its forks numerics; no control's evidence makes
    them engine bugs either."""
    prompts = builtin_set("code")[:2]
    engine, control = _dsd_like_and_control(prompts)
    short = [ids[:1] for ids in control]
    trace = _judged(engine, _junk(prompts) if control == "departs everywhere" else short, prompts)
    noise = trace.manifest.yardstick.engine
    assert noise.source == "unbounded" and noise.tolerance == noise.rounding, noise
    beyond = [s.forensics for s in trace.sequences if s.forensics
              and s.forensics.first_bad is not None]
    assert beyond, "dsd-like should write tokens beyond transformers' rounding"
    for f in beyond:
        assert (f.verdict == "unexplained"
                and "Missing evidence: a control that does" in f.explanation), f.explanation


def test_a_control_whose_log_probabilities_disagree_with_its_tokens_widens_no_tolerance():
    """A server that returns the processed distribution's log-probabilities (greedy: 0 for every
    chosen token) as its control's: read as noise, they claim a sigma of logits where the control's
    tokens bound it far below. They used to widen the tolerance to match, and dsd-like's engine bugs
    became numerics."""
    prompts = builtin_set("code")[:4]
    engine, control = _dsd_like_and_control(prompts)
    plain = _judged(engine, control, prompts)
    processed = _judged(engine, control, prompts,
                        control_logprobs=[[0.0] * len(c) for c in control])
    noise = processed.manifest.yardstick.engine
    assert noise.source == "control" and noise.sigma_logprobs > 100 * noise.sigma_upper
    assert (noise.tolerance == plain.manifest.yardstick.engine.tolerance
            and "not granted" in noise.describe())
    verdicts = [s.forensics.verdict for s in processed.sequences if s.forensics]
    assert verdicts and set(verdicts) == {"engine-bug"}
    assert verdicts == [s.forensics.verdict for s in plain.sequences if s.forensics]


def test_one_control_output_that_departs_everywhere_is_set_apart_and_the_rest_still_judges():
    """A server that answered one request with junk (a truncated prompt, another model behind a
    router): fitted with the rest, its departures would widen the tolerance for every row (on the
    embedded pair, 36 prompts, one junk control output made 22 of dsd-like's 36 engine bugs
    numerics). Set apart, the rest measures the rounding; the row of the junk prompt is unexplained,
    saying that the engine departs there without speculation too."""
    prompts = builtin_set("code")[:4]
    engine, control = _dsd_like_and_control(prompts)
    clean = _judged(engine, control, prompts)
    trace = _judged(engine, [_junk(prompts)[0], *control[1:]], prompts)
    noise = trace.manifest.yardstick.engine
    assert ((noise.source, noise.outliers, clean.manifest.yardstick.engine.outliers)
            == ("control", [0], []))
    assert noise.tolerance < 1 and "set apart" in noise.describe()
    f = trace.sequences[0].forensics
    assert (f.verdict == "unexplained"
            and "departs from the model on this prompt too" in f.explanation)
    assert ([s.forensics.verdict for s in trace.sequences[1:]]
            == [s.forensics.verdict for s in clean.sequences[1:]])
    assert {s.forensics.verdict for s in trace.sequences[1:]} == {"engine-bug"}


def _simulated_control(outputs: int, tokens: int, sigma: float,
                       seed: int) -> list[tuple[list[float], list[float]]]:
    """Control outputs of one engine whose rounding is Gaussian of scale `sigma`: at each token the
    runner-up sits U(0, 5) below the top; the engine writes it (a departure of that gap) where its
    noise reaches past."""
    g = torch.Generator().manual_seed(seed)
    gap = torch.rand(outputs, tokens, generator=g, dtype=torch.float64) * 5
    flips = torch.randn(outputs, tokens, generator=g, dtype=torch.float64) * sigma > gap
    return [(torch.where(f, gap_row, 0.0).tolist(), torch.where(f, 0.0, gap_row).tolist())
            for f, gap_row in zip(flips, gap)]


def test_outputs_of_one_rounding_are_never_set_apart_and_junk_among_them_always_is():
    from specviz.forensics import enginenoise

    apart = [enginenoise.outliers(_simulated_control(30, 40, 0.5, seed)) for seed in range(20)]
    assert sum(map(len, apart)) <= 1, apart  # alpha 1% a control: 20 controls of 30 outputs
    junk = ([3 + 7 * i / 23 for i in range(24)], [0.0] * 24)
    for seed in range(5):
        assert enginenoise.outliers([*_simulated_control(30, 40, 0.5, seed), junk]) == [30]


@pytest.mark.parametrize("departures,kept,bounded", [
    ([0.1], [5.0], False),  # the fit's upper bound is SIGMA_RANGE's top
    ([0.1], [5.0] * 10, False),  # bounded at 5.4: no kept margin tests noise that large
    ([0.1], [5.0] * 100, True),  # bounded at 2.4
    ([], [5.0] * 3, False),  # bounded at 73
    ([8.45, 3.0, 2.0], [], False),  # every token departs
    ([], [], False),  # nothing scored
])
def test_a_control_bounds_the_noise_only_below_the_largest_margin_it_kept(departures, kept,
                                                                          bounded):
    from specviz.forensics import enginenoise

    gaps, margins = departures + [0.0] * len(kept), [0.0] * len(departures) + kept
    fit = enginenoise.fit_sigma(gaps, margins)
    assert (enginenoise.unbounded(gaps, margins, fit) is None) == bounded
    if bounded:
        assert fit[1] < max(kept)


def test_the_engine_tolerance_holds_its_false_alarm_rate_per_output_not_per_token():
    """Gaussian noise of the fitted scale on every token of 20,000 outputs of 48 tokens: outputs
    with a token beyond the tolerance are at most the stated 1% (to sampling error); a per-token
    99th percentile would flag about a third."""
    from scipy import stats

    from specviz.forensics import enginenoise

    sigma, tokens = 0.05, 48
    tol = enginenoise.tolerance(sigma, tokens)
    noise = torch.randn(20_000, tokens, generator=torch.Generator().manual_seed(0)).double() * sigma
    flagged = float((noise > tol).any(-1).double().mean())
    assert 0.005 < flagged <= (enginenoise.ALPHA
                               + 3 * (enginenoise.ALPHA / len(noise)) ** 0.5), flagged  # 3 sd
    per_token = float((noise > stats.norm.isf(enginenoise.ALPHA) * sigma).any(-1).double().mean())
    assert per_token > 0.3, per_token


def _scored_line(prompt, seq, planted: float) -> dict:
    """An output cut into rounds seen from outside (3 tokens a round after the first), each
    reporting the score after it: the sum of its log-probabilities, plus `planted` from round 2."""
    n = len(seq.output_ids)
    chunks = [1] + [3] * ((n - 1) // 3) + ([(n - 1) % 3] if (n - 1) % 3 else [])
    rounds, end = [], 0
    for i, c in enumerate(chunks):
        end += c
        rounds.append({"drafts": [], "accepted": c - 1 if i else 0, "shown": i == 0,
                       "score": -0.25 * end + (planted if i >= 2 else 0.0)})
    return {"prompt_ids": prompt.ids, "output_ids": seq.output_ids, "logprobs": [-0.25] * n,
            "rounds": rounds, "score": rounds[-1]["score"]}


def test_a_score_is_judged_against_the_log_probabilities_beside_it(tmp_path, tiny):
    live = _check(tmp_path, "--engine", "test_check:correct")
    for planted in (0.0, 0.5):
        path = tmp_path / "scored.jsonl"
        path.write_text("\n".join(json.dumps(_scored_line(p, s, planted))
                                  for p, s in zip(live.prompts, live.sequences)))
        filed = _check(tmp_path, "--outputs", str(path))
        for s in filed.sequences:
            assert s.equivalent
            if planted and len(s.engine.rounds) > 2:  # round 2 starts at token 1 + 3
                assert (s.forensics.verdict, s.forensics.fork) == ("decision-bug:score", 4)
                assert s.forensics.score - s.forensics.score_expected == pytest.approx(planted)
                # the page marks the token it points at, in the round that reported it
                shown = render(filed, s.seq)
                assert "WHERE ITS VERDICT POINTS: decision-bug:score" in shown["timeline"]
                assert "score reported after the round" in shown["forensics"]
            else:
                assert s.forensics is None
