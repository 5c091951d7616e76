"""vLLM speculating with published heads, judged from outside (`check --engine-drafter eagle3
--head DIR`): an EAGLE-3 head over the embedded target, written in the published layout by
tests/published_heads.py and served to vLLM as it is, and as the field's bugs would feed it (its
aux states one layer early, vLLM PR #43671; the engines' default layers, as if its config named
none, vLLM PR #50170); and an EAGLE-1 head, in vLLM's `eagle` mode. Their outputs are judged
against vLLM's own run without speculation; their acceptance, per draft position from /metrics,
against the head's own proposals replayed by specviz on the engine's committed tokens. Each
server starts once, here."""
import json
import shutil

import pytest
from conftest import ENGINE_THREADS
from published_heads import write_eagle1_head, write_eagle3_head

from specviz.decoding.reference import reference
from specviz.engines.vllm import vllm_server
from specviz.run import check
from specviz.spec.prompts import builtin_set
from specviz.spec.run import ENGINE, RunSpec
from specviz.spec.verdicts import verdict
from specviz.trace import metrics

K, NEW = 3, 32
PROMPTS = tuple(builtin_set("all")[:6])
AUX = [1, 14, 28]  # not the engines' default (2, 15, 27) for 30 layers: a fallback changes them
EARLY = "its aux states one layer early (vLLM PR #43671)"
DEFAULT = ("the engines' default aux layers 2, L/2, L-3, as if its config named none "
           "(vLLM PR #50170)")


def _served_as(head, folder, change) -> str:
    """A copy of the head's folder whose config is changed: the head as a buggy engine reads it."""
    shutil.copytree(head, folder)
    raw = json.loads((folder / "config.json").read_text())
    change(raw)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


@pytest.fixture(scope="module")
def runs(embedded, tmp_path_factory):
    """Each way of serving the head, checked (the control: vLLM without speculation)."""
    root = tmp_path_factory.mktemp("vllm-heads")
    ids = embedded.encode(PROMPTS)
    fit = [p + o.ids for p, o in zip(ids, reference(embedded, ids, NEW).outputs)]
    head = write_eagle3_head(root / "head", embedded.target, fit, AUX)
    served = {
        "eagle1": write_eagle1_head(root / "eagle1", embedded.target, fit),
        "right": head,
        "early": _served_as(head, root / "early", lambda raw: raw.update(
            eagle_aux_hidden_state_layer_ids=[i - 1 for i in AUX])),
        "fallback": _served_as(head, root / "fallback", lambda raw: raw.pop(
            "eagle_aux_hidden_state_layer_ids"))}
    # one server at a time (each holds about 3 GiB): the control's answers first
    plain = RunSpec.build(prompts=PROMPTS, method=ENGINE, max_new_tokens=NEW)
    with vllm_server("none", root / "control.log", eager=True, threads=ENGINE_THREADS) as control:
        traces = {"control": check.from_servers(plain, embedded,
                                                (control.url, control.served_model), None, 8,
                                                300.0)}
    for name, folder in served.items():
        # the EAGLE-1 head is judged by itself; the others by the head as it was written
        drafter, judged = ("eagle1", folder) if name == "eagle1" else ("eagle3", head)
        spec = RunSpec.build(prompts=PROMPTS, method=ENGINE, k=K, max_new_tokens=NEW,
                             drafter=drafter, head=str(judged))
        with vllm_server("eagle" if name == "eagle1" else "eagle3", root / f"{name}.log",
                         k=K, eager=True, threads=ENGINE_THREADS, head=folder) as server:
            traces[name] = check.from_servers(spec, embedded, (server.url, server.served_model),
                                              None, 8, 300.0, drafter=drafter)
        # what was measured, for docs/engines.md (pytest -s)
        print(f"{name}: {traces[name].acceptance.explanation}")
    return traces


def test_vllm_with_a_published_head_is_lossless_against_its_own_control(runs):
    """However it feeds the head: the target verifies every draft. (Its run without speculation
    is asked apart, not as the check's control: two servers at once would not fit beside the
    other worker.)"""
    plain = [s.output_ids for s in runs["control"].sequences]
    for name, trace in runs.items():
        assert [s.output_ids for s in trace.sequences] == plain, name
        assert not any(s.forensics and verdict(s.forensics.verdict).bug
                       for s in trace.sequences), name
    assert metrics.equivalence(runs["right"])["exact"] == 1


@pytest.mark.parametrize("served", ["right", "eagle1"])
def test_vllms_acceptance_per_position_is_the_heads_own_replayed(runs, served):
    """Evidence from a loader not ours: vLLM's reading of the files drafts as specviz's does,
    position by position, on the same committed tokens."""
    a = runs[served].acceptance
    assert a.counters and a.verdict is None, a.explanation
    assert a.accepted > 0.2 * a.compared, a.explanation  # a head worth its name, in sample
    assert len(a.per_position) == K
    for engine, replay in zip(a.per_position, a.per_position_fresh):
        assert abs(engine - replay) <= 0.1, a.explanation


def test_the_check_records_which_layers_the_eagle3_head_heard(runs):
    head = runs["right"].manifest.head
    assert (head.aux_layers, head.fell_back, head.coverage) == (AUX, False, 1.0)


@pytest.mark.parametrize(("served", "named"), [("early", EARLY), ("fallback", DEFAULT)])
def test_a_head_fed_the_wrong_features_is_named_from_the_counters_alone(runs, served, named):
    a = runs[served].acceptance
    assert a.verdict == "draft-bug:acceptance", a.explanation
    assert named in a.matches, a.explanation
    assert "Its counters match the head fed" in a.explanation
