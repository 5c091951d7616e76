"""The failure-mode catalogue: each fault does what the paper found, and
forensics names the state it breaks."""
import pytest

from specviz.decoding.eqspec import eqspec
from specviz.run.runner import run
from specviz.spec.faults import FAULTS, FAULT_PRESETS, expand, of_kind
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics

BREAKING = list(of_kind("breaking"))
WASTEFUL = list(of_kind("wasteful"))


def _run(faults, batch_size, prompts, **kw):
    spec = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float64",
                         device="cpu", prompts=tuple(prompts), batch_size=batch_size, k=5,
                         max_new_tokens=24, faults=tuple(faults), **kw)
    return run(spec)


@pytest.fixture(scope="module")
def prompts():
    from specviz.spec.prompts import builtin_set

    return builtin_set("all")[:8]


def _verdicts(trace):
    return [s.forensics.verdict for s in trace.sequences if s.forensics]


@pytest.mark.parametrize("fault", BREAKING)
def test_each_breaking_fault_breaks_equivalence_and_is_named(fault, prompts):
    trace = _run([fault], 4, prompts)
    eq = metrics.equivalence(trace)
    assert eq["exact"] < 1
    verdicts = _verdicts(trace)
    assert verdicts and all(v == FAULTS[fault].verdict for v in verdicts), verdicts


@pytest.mark.parametrize("fault,breaks", [
    ("draft-bonus", True), ("positions-from-slots", False), ("no-kv-shift", False),
    ("min-crop", False), ("bsp-like", True),
])
def test_at_batch_size_1(fault, breaks, prompts):
    trace = _run([fault], 1, prompts)
    assert (metrics.equivalence(trace)["exact"] < 1) == breaks
    assert "unexplained" not in _verdicts(trace)


@pytest.mark.parametrize("fault", WASTEFUL)
def test_wasteful_faults_stay_equivalent_and_show_their_cost(fault, prompts):
    correct = _run([], 4, prompts)
    trace = _run([fault], 4, prompts)
    assert metrics.equivalence(trace)["exact"] == 1
    cost, base = metrics.waste(trace), metrics.waste(correct)
    # harmless alone here: the pad block is reclaimed at the first realignment
    if fault == "right-padding":
        assert cost["peak_target_kv"] == base["peak_target_kv"]
    else:
        assert cost["peak_target_kv"] > base["peak_target_kv"]
        assert cost["overhead_slots_pct"] > base["overhead_slots_pct"]


def test_keep_rejected_kv_is_visible_as_stale_slots(prompts):
    trace = _run(["keep-rejected-kv"], 4, prompts)
    rows = [r for r in trace.rows if r.round > 0]
    assert any(not r.checks["rectangular"] for r in rows)  # stale slots lie inside rows
    assert all(r.checks[c] for r in rows for c in ("positions", "mask", "kv", "bonus"))


def test_signatures_dsd_breaks_at_once_bsp_decays(prompts):
    dsd = metrics.equivalence(_run(["dsd-like"], 4, prompts))
    bsp = metrics.equivalence(_run(["bsp-like"], 4, prompts))
    assert dsd["exact"] == 0 and bsp["exact"] == 0
    assert bsp["prefix"] > dsd["prefix"]


def test_presets_expand_and_unknown_faults_are_refused():
    assert set(expand(["bsp-like"])) == set(FAULT_PRESETS["bsp-like"])
    assert expand(["no-mask", "dsd-like"]) == expand(["dsd-like"])
    with pytest.raises(SpecError, match="unknown fault 'nope'"):
        RunSpec.build(prompts=("x",), faults=("nope",))
    with pytest.raises(SpecError, match="faults apply to eqspec, not reference"):
        RunSpec.build(prompts=("x",), method="reference", faults=("no-mask",))


def test_the_engine_itself_expands_presets_and_refuses_a_fault_it_does_not_know(tiny):
    """Called directly (a benchmark, a user's script), not only through a RunSpec: a preset is its
    faults, and a misspelt fault raises instead of running the correct engine."""
    ids = tiny.encode(["The capital of France is", "def add(a, b):"])
    by_preset, by_faults = (eqspec(tiny, ids, 2, 3, 12, faults=f).outputs
                            for f in (("dsd-like",), FAULT_PRESETS["dsd-like"]))
    assert [o.ids for o in by_preset] == [o.ids for o in by_faults]
    assert [o.ids for o in by_preset] != [o.ids for o in eqspec(tiny, ids, 2, 3, 12).outputs]
    with pytest.raises(ValueError, match="unknown fault 'no-masks'"):
        eqspec(tiny, ids, 2, 3, 12, faults=("no-masks",))


def test_numerics_case_in_bfloat16_is_called_numerics(tiny):
    """A correct engine in bfloat16 departs from the batch-size-1 reference through floating point
    alone; forensics must say numerics (at least 90%), else unexplained, never sync-bug."""
    from specviz.spec.prompts import builtin_set

    spec = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="bfloat16",
                         device="cpu", prompts=tuple(builtin_set("spec-bench")[:24]), batch_size=4,
                         k=5, max_new_tokens=48)
    trace = run(spec)
    verdicts = _verdicts(trace)
    assert verdicts and verdicts.count("numerics") >= 0.9 * len(verdicts), verdicts
    assert set(verdicts) <= {"numerics", "unexplained"}, verdicts
    rounding = trace.manifest.yardstick.target
    # enough positions for the stated rate
    assert rounding.positions >= 1200 and rounding.alpha <= 0.01
    # bfloat16 is well above one ulp
    assert rounding.tolerance > 2 * rounding.resolution and rounding.anomaly is None
    for s in trace.sequences:
        if s.forensics and s.forensics.verdict == "numerics":
            ev = s.forensics
            assert not ev.failed_checks and ev.state_diff <= rounding.tolerance
            assert abs(ev.margin_float64) <= rounding.tolerance and ev.alpha == rounding.alpha
            assert ev.batching_noise is not None  # checked against batched-reference


def test_embedded_pair_in_bfloat16_stays_numerics():
    """Real weights, real near-ties: the correct engine on SmolLM2 in bfloat16 (about
    3 minutes here)."""
    from specviz.spec.prompts import builtin_set

    spec = RunSpec.build(dtype="bfloat16", device="cpu", prompts=tuple(builtin_set("all")[:8]),
                         batch_size=4, k=5, max_new_tokens=32)
    verdicts = _verdicts(run(spec))
    assert verdicts and verdicts.count("numerics") >= 0.9 * len(verdicts), verdicts
    assert set(verdicts) <= {"numerics", "unexplained"}, verdicts
