"""A bug inside the batched verify kernel must not hide as numerics.

Each bug (tests/kernel_bugs.py) is planted in the target's attention, only where a pass has several
queries over a non-empty cache: ids, positions, masks and caches stay right. The rounding yardstick
is measured on fresh passes without a cache, which never run it, so it cannot move; every fork it
causes is a kernel bug (or a sync bug, or unexplained), never numerics: on the tiny pair in float32
and bfloat16, on the embedded pair in bfloat16.
"""
import pytest
from kernel_bugs import BUGS, planted

from specviz.run import runner
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec

PAIRS = {"tiny": (dict(target=TINY_TARGET, draft=TINY_DRAFT), builtin_set("all")[:12], 32),
         "embedded": ({}, builtin_set("quick"), 16)}


def _spec(pair: str, dtype: str) -> RunSpec:
    models, prompts, budget = PAIRS[pair]
    return RunSpec.build(**models, dtype=dtype, device="cpu", prompts=tuple(prompts), batch_size=4,
                         k=5, max_new_tokens=budget)


# The embedded pair in bfloat16 only: its float32 forks are the tiny pair's mechanism at ten times
# the cost.
CASES = [("tiny", "float32"), ("tiny", "bfloat16"), ("embedded", "bfloat16")]


@pytest.fixture(scope="module")
def clean():
    """The correct runs, by (pair, dtype), made when first asked for (two pairs stay loaded at a
    time, so the tests run pair by pair)."""
    runs = {}

    def correct(pair: str, dtype: str):
        if (pair, dtype) not in runs:
            runs[pair, dtype] = run(_spec(pair, dtype))
        return runs[pair, dtype]
    return correct


@pytest.mark.parametrize("pair, dtype, bug", [(*case, bug) for case in CASES for bug in BUGS])
def test_a_kernel_bug_in_the_verify_pass_is_never_numerics(pair, dtype, bug, clean, monkeypatch):
    correct = clean(pair, dtype)
    # the run's own continuations measured anew, bug in
    monkeypatch.setattr(runner, "_ROUNDING", runner.PerPair(4))
    with planted(monkeypatch, bug):
        trace = run(_spec(pair, dtype))
    # fresh passes only: the bug cannot move it
    assert trace.manifest.yardstick == correct.manifest.yardstick
    forks = [s.forensics for s in trace.sequences if s.forensics]
    assert forks, "the planted bug must change some output"
    for f in forks:
        assert f.verdict != "numerics", f.explanation
        # every input right, the computation wrong: named
        assert f.verdict == "kernel-bug", f.explanation
        r = trace.manifest.yardstick.target
        # rebuilt in float64, it is no rounding at all
        assert f.kernel_diff_float64 > 1e6 * r.float64_tolerance
        assert f"{f.kernel_diff_float64:.3g}" in f.explanation and f.alpha == r.alpha


def test_correct_runs_rebuild_within_float64_rounding(clean):
    """The other side: a correct verify kernel, rebuilt in float64, stays within float64's own
    rounding at every fork, so the check never accuses it (bfloat16's forks are numerics)."""
    traces = {case: clean(*case) for case in CASES}
    for (pair, dtype), trace in traces.items():
        r = trace.manifest.yardstick.target
        for s in trace.sequences:
            if s.forensics:
                assert s.forensics.verdict == "numerics", (pair, dtype, s.forensics.explanation)
                assert s.forensics.kernel_diff_float64 <= r.float64_tolerance
    assert any(s.forensics for (_, dtype), t in traces.items() if dtype == "bfloat16"
               for s in t.sequences)
