import dataclasses

import pytest

from specviz.decoding.exspec import SeqState, choose_batch, exspec
from specviz.decoding.reference import reference
from specviz.models.draft import layer_subset
from specviz.run.runner import run
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics


@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("batch_size", [2, 4, 8])
def test_exspec_equals_reference_in_float64(tiny, mixed_prompts, batch_size, k):
    prompts = mixed_prompts[:12]
    ref = reference(tiny, prompts, 20)
    got = exspec(tiny, prompts, batch_size, k, 20, window=batch_size + 3, max_wait=3)
    assert [o.ids for o in got.outputs] == [o.ids for o in ref.outputs]
    assert all(o.finished_at is not None for o in got.outputs)
    for rd in got.rounds:
        assert all(ok.all() for ok in rd.checks.values())


def test_equal_growth_runs_entirely_in_same_length_groups(tiny, mixed_prompts):
    """draft = target and equal prompt lengths: every round is a same-length group,
    none realigns."""
    same = dataclasses.replace(tiny, draft=layer_subset(tiny.target, [0, 1, 2]))
    prompts = [p[:10] for p in mixed_prompts if len(p) >= 10][:8]
    got = exspec(same, prompts, 4, 3, 16, window=8, max_wait=100)
    assert got.rounds and all(rd.group and not rd.realigned for rd in got.rounds)
    assert all((rd.ints["pad_before"] == 0).all() for rd in got.rounds)
    assert [o.ids for o in got.outputs] == [o.ids for o in reference(tiny, prompts, 16).outputs]


def _state(seq, width, waited):
    import torch

    return SeqState(seq, torch.zeros(1, width, dtype=torch.long),
                    torch.ones(1, width, dtype=torch.bool), None, None, waited)


def test_choose_prefers_groups_and_bounds_waiting():
    active = [_state(0, 10, 0), _state(1, 12, 0), _state(2, 12, 0), _state(3, 9, 0),
              _state(4, 12, 1)]
    rows, group = choose_batch(active, 3, max_wait=5)
    assert group and {s.seq for s in rows} == {1, 2, 4}
    active[3].waited = 5  # overdue: forced in, the batch falls back to padding
    rows, group = choose_batch(active, 3, max_wait=5)
    assert 3 in {s.seq for s in rows} and not group


def test_trace_records_groups_waits_and_latency(tiny):
    spec = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float64",
                         device="cpu", method="exspec",
                         prompts=("Hi", "Name three rivers.", "Tell me a joke.", "Count to five.",
                                  "What is 2+2?"),
                         batch_size=2, k=3, max_new_tokens=12, window=4)
    trace = run(spec)
    assert metrics.equivalence(trace)["exact"] == 1
    assert all(r.waits is not None and len(r.waits) == len(r.seqs) for r in trace.rounds)
    assert 0 <= metrics.group_rate(trace) <= 1
    pct = metrics.completion_percentiles(trace)
    assert 0 < pct["p50"] <= pct["p90"] <= pct["p99"]


def test_window_must_exceed_the_batch():
    with pytest.raises(SpecError, match="window .* must be larger than the batch size"):
        RunSpec.build(prompts=("x",), method="exspec", batch_size=4, window=4)
