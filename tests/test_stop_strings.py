"""Stop strings: an output ends at the token whose text completes one, that token
kept (decoding/stops.py).

The rule is checked against transformers' own (`generate` with `stop_strings`); the speculative
engines end where the reference ends, inside an accepted block too; the stop fault, which sees a
stop string only after the whole block is kept, runs past it and is named; and `check` calls an
engine's output that ignored a stop string a stop bug, never rounding. All on the tiny pair: a stop
string is text, and its text is whatever the model writes."""
import json

import pytest
import torch
from transformers import GenerationConfig

from specviz.cli import main as cli
from specviz.decoding.reference import reference
from specviz.decoding.sampling import Sampling
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.trace import metrics
from specviz.trace.schema import Trace

PROMPTS = tuple(builtin_set("all")[:8])
BUDGET = 24


@pytest.fixture(scope="module")
def stops(tiny):
    """Three stop strings, each the text across two tokens in the middle of a prompt's reference
    output (so that it ends the output there, or earlier where the text holds it before)."""
    ids = tiny.encode(list(PROMPTS))
    found = []
    for out in reference(tiny, ids, BUDGET).outputs[:3]:
        before = tiny.tokenizer.decode(out.ids[:6], skip_special_tokens=True)
        found.append(tiny.tokenizer.decode(out.ids[:8],
                                           skip_special_tokens=True)[len(before) - 2:][:6])
    assert all(found) and len(set(found)) == 3, found
    return tuple(found)


def test_the_reference_ends_at_a_stop_string_as_transformers_generate_does(tiny, stops):
    ids = tiny.encode(list(PROMPTS))
    config = GenerationConfig(max_new_tokens=BUDGET, do_sample=False,
                              eos_token_id=list(tiny.eos_ids),
                              pad_token_id=tiny.eos_ids[0], stop_strings=list(stops))
    with torch.inference_mode():
        expected = [tiny.target.generate(torch.tensor([x]), generation_config=config,
                                         tokenizer=tiny.tokenizer)
                    [0, len(x):].tolist() for x in ids]
    ours = [o.ids for o in reference(tiny, ids, BUDGET, sampling=Sampling(stop=stops)).outputs]
    assert ours == expected
    assert sum(len(o) < BUDGET for o in ours) >= 3  # the stop strings ended outputs early


def _spec(stops, **fields) -> RunSpec:
    return RunSpec.build(**{**dict(target=TINY_TARGET, draft=TINY_DRAFT, device="cpu",
                                   prompts=PROMPTS, max_new_tokens=BUDGET, batch_size=4, k=4,
                                   stop=stops), **fields})


@pytest.mark.parametrize("method", ["eqspec", "exspec", "batched-reference"])
def test_a_correct_engine_ends_where_the_reference_ends_inside_an_accepted_block(stops, method):
    trace = run(_spec(stops, method=method))
    assert metrics.equivalence(trace)["exact"] == 1
    ended = [s for s in trace.sequences if len(s.output_ids) < BUDGET]
    assert len(ended) >= 3
    # some stop string was completed inside a block of accepted drafts
    if method != "batched-reference":
        inside = [r for r in trace.rows if 0 < r.accepted and len(r.emitted) < r.accepted + 1]
        assert inside, "no row ended inside an accepted block: the test would not show the rule"


def test_the_stop_fault_runs_past_a_stop_string_and_is_named(stops):
    trace = run(_spec(stops, faults=("stop-at-last-token",)))
    verdicts = [s.forensics.verdict for s in trace.sequences if s.forensics]
    assert verdicts and set(verdicts) == {"decision-bug:stop"}, verdicts


def test_check_names_an_engine_that_ignored_a_stop_string_a_stop_bug(tiny, stops, tmp_path):
    """The engine: transformers' `generate` (not specviz's decoding), with and without
    the stop strings."""
    ids = tiny.encode(list(PROMPTS))
    checked = {}
    for name, strings in (("stops", list(stops)), ("ignores", None)):
        config = GenerationConfig(max_new_tokens=BUDGET, do_sample=False,
                                  eos_token_id=list(tiny.eos_ids),
                                  pad_token_id=tiny.eos_ids[0], stop_strings=strings)
        lines = [{"engine": {"name": f"generate, {name}"}}]
        with torch.inference_mode():
            for x in ids:
                out = tiny.target.generate(torch.tensor([x]), generation_config=config,
                                           tokenizer=tiny.tokenizer)
                lines.append({"prompt_ids": x, "output_ids": out[0, len(x):].tolist()})
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(json.dumps(line) for line in lines))
        out = tmp_path / f"{name}.trace.json"
        args = ["check", "--target", TINY_TARGET, "--draft", TINY_DRAFT, "--dtype", "float64",
                "--device", "cpu", "--max-new-tokens", str(BUDGET), "--outputs", str(path),
                "--trace", str(out)]
        assert cli.main(args + [a for s in stops for a in ("--stop", s)]) == 0
        checked[name] = Trace.from_json(out.read_text())
    assert all(s.equivalent for s in checked["stops"].sequences)
    ran_on = [s for s in checked["ignores"].sequences if not s.equivalent]
    assert len(ran_on) >= 3
    for s in ran_on:
        assert s.output_ids[: len(s.reference_ids)] == s.reference_ids
        assert (s.forensics.verdict == "decision-bug:stop"
                and "the stop string" in s.forensics.explanation), \
            s.forensics.explanation
