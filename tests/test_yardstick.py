"""The rounding yardstick: measured on fresh batch-size-1 passes with no cache (a path the verify
kernels never run), as a distribution with a stated false-alarm rate; reported, never silently used,
when it is itself far above its dtype's rounding; and no false alarm on correct runs over the
float32 and bfloat16 grids."""
import math

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface

from specviz.app import plots, serving, views
from specviz.app.panel import forensics_html
from specviz.cli import main as cli
from specviz.forensics import yardstick
from specviz.models.pairs import load_pair
from specviz.run import runner
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.trace.schema import Trace

TINY = dict(target=TINY_TARGET, draft=TINY_DRAFT)


def test_the_order_statistic_and_its_stated_rate():
    errors = torch.arange(1, 2400, dtype=torch.float64)  # n = 2399
    q, rate = yardstick.threshold(errors, slots=6, alpha=0.01)
    # two samples may lie above q: 2 x 6 slots x 2 / (n + 1)
    assert (q, rate) == (2398.0, 2 * 6 * 2 / 2400)
    q, rate = yardstick.threshold(errors[:100], slots=6, alpha=0.01)
    # too few samples for 1%: the largest, at the rate it gives
    assert (q, rate) == (100.0, 12 / 101)


def test_the_yardstick_runs_only_fresh_batch_size_1_passes_without_a_cache():
    pair = load_pair(**TINY, dtype="float32", device="cpu")
    seen = []
    handle = pair.target.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append((kwargs["input_ids"].shape[0], kwargs.get("cache"))),
        with_kwargs=True)
    try:
        samples = yardstick.sample(pair.target, pair.encode(builtin_set("all")), pair.vocab_size)
    finally:
        handle.remove()
    assert seen and all(rows == 1 and cache is None for rows, cache in seen)
    r = yardstick.rounding(samples, pair.dtype, slots=6)
    # the chat template's shared prefix counted once
    assert r.positions >= 1000 and r.sequences == 27
    assert r.quantiles == sorted(r.quantiles) and r.levels[0] == 0 and r.levels[-1] == 1
    assert r.tolerance == 2 * r.quantiles[-1] and r.alpha == pytest.approx(12 / (r.positions + 1))
    assert r.anomaly is None and r.relative < r.expected


def test_the_calibration_chains_the_built_in_prompts_so_each_template_prefix_is_computed_once():
    pair = load_pair(**TINY, dtype="float32", device="cpu")
    prompts = pair.encode(builtin_set("all") + builtin_set("spec-bench"))
    passes = yardstick.chained(prompts)
    assert sum(passes, []) == sum(prompts, [])  # every prompt whole, in order
    assert (all(len(p) <= yardstick.CHAIN or p in prompts for p in passes)
            and len(passes) < len(prompts) / 2)
    fed = []
    handle = pair.target.register_forward_pre_hook(
        lambda m, args, kwargs: fed.append(kwargs["input_ids"].shape), with_kwargs=True)
    try:
        samples = yardstick.sample(pair.target, passes, pair.vocab_size,
                                   enough=yardstick.CALIBRATION_POSITIONS)
    finally:
        handle.remove()
    computed = sum(shape[1] for shape in fed)
    assert (all(shape[0] == 1 for shape in fed)
            and len(samples.errors) >= yardstick.CALIBRATION_POSITIONS)
    # one pass per prompt computed 2,150 positions for 1,330 samples
    assert computed < 1.15 * len(samples.errors)


def test_a_run_states_its_yardstick_and_a_float64_run_scales_float32_rounding():
    runs = {d: run(RunSpec.build(**TINY, dtype=d, device="cpu", prompts=tuple(builtin_set("quick")),
                                 batch_size=2, k=5, max_new_tokens=16))
            for d in ("float32", "float64")}
    r32, r64 = (runs[d].manifest.yardstick.target for d in ("float32", "float64"))
    # calibration and continuations
    assert r32.positions >= 1200 and r32.alpha <= 0.01 and r32.slots == 6
    ratio = torch.finfo(torch.float64).eps / torch.finfo(torch.float32).eps
    assert (r64.tolerance == pytest.approx(r32.tolerance * ratio, rel=0.05)
            and "float32 copy" in r64.method)
    # A rebuilt float64 pass is granted at least the units float32 is known to round by, in
    # float64's unit.
    known = yardstick.KNOWN_RELATIVE["float32"]
    assert r64.float64_tolerance == pytest.approx(max(r64.tolerance, known * r64.resolution))
    assert r32.float64_tolerance == pytest.approx(max(r32.tolerance, known * r32.resolution)
                                                  * ratio)


@pytest.fixture
def lossy_float32_attention(monkeypatch):
    """A precision bug in float32 attention of several queries, fresh passes too: it computes in
    bfloat16 (a one-query decode, the reference's, stays right)."""
    def attention(module, query, key, value, attention_mask, **kwargs):
        if query.dtype != torch.float32 or query.shape[2] == 1:
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        out, weights = sdpa_attention_forward(
            module, query.bfloat16(), key.bfloat16(), value.bfloat16(),
            None if attention_mask is None else attention_mask.bfloat16(), **kwargs)
        return out.float(), weights

    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", attention)
    # measured from the start with the bug, as a user would
    for cache in ("_REFERENCES", "_CALIBRATION", "_ROUNDING"):
        monkeypatch.setattr(runner, cache, runner.PerPair(4))


def test_a_yardstick_far_above_its_dtype_is_reported_and_no_fork_is_put_down_to_it(
        lossy_float32_attention, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert cli.main(["run", "--pair", "tiny", "--dtype", "float32", "--device", "cpu",
                     "--prompt-set", "all", "--batch-size", "4", "--max-new-tokens", "24",
                     "--trace", str(out)]) == 0
    trace = Trace.from_json(out.read_text())
    r = trace.manifest.yardstick.target
    assert r.relative > yardstick.ANOMALY * r.expected and "suspect" in r.anomaly
    assert "WARNING: the yardstick itself is suspect" in capsys.readouterr().out
    forks = [s.forensics for s in trace.sequences if s.forensics]
    assert forks and all(f.verdict != "numerics" for f in forks)
    assert all("the yardstick itself is suspect" in f.explanation for f in forks
               if f.verdict == "unexplained")


GRID = [(method, dtype, bs, k) for method in ("eqspec", "exspec")
        for dtype in ("float32", "bfloat16")
        for bs in (1, 4, 8) for k in (1, 5)]


@pytest.mark.parametrize("method, dtype, bs, k", GRID)
def test_a_correct_run_gets_no_false_alarm(method, dtype, bs, k):
    """Every fork of a correct engine is numerics, and no audited row leaves rounding,
    in either dtype."""
    trace = run(RunSpec.build(**TINY, method=method, dtype=dtype, device="cpu",
                              prompts=tuple(builtin_set("all")[:16]),
                              batch_size=bs, k=k, max_new_tokens=24, audit=min(bs, 2)))
    verdicts = [s.forensics.verdict for s in trace.sequences if s.forensics]
    assert set(verdicts) <= {"numerics"}, [s.forensics.explanation for s in trace.sequences
                                           if s.forensics]
    assert all(s.audit_round is None and s.audit_draft_round is None for s in trace.sequences)


def test_the_page_shows_where_the_fork_falls_on_its_yardstick():
    """On the bundled bfloat16 near-tie (tiny pair, tests/test_bundled.py keeps it current): whether
    a bfloat16 run forks at all depends on the CPU's kernels, and this is about the page."""
    trace = serving.bundled()["numerics near-tie"]
    seq = next(s.seq for s in trace.sequences if s.forensics)
    f, r = trace.sequences[seq].forensics, trace.manifest.yardstick.target
    fig = plots.yardstick(trace, views.Focus(seq=seq, round=f.round))
    names = [t.name for t in fig.data]
    assert (names[0] == "rounding per position"
            and list(fig.data[0].x) == [max(q, 1e-300) for q in r.quantiles])
    assert any(n.startswith(f"tolerance (α {r.alpha:.2g}): {r.tolerance:.3g}") for n in names)
    assert (any(n.startswith("state check:") for n in names)
            and any(n.startswith("|float64 gap|") for n in names))
    panel = forensics_html(trace, views.Focus(seq=seq, round=f.round))
    assert "judged against" in panel and f"{r.tolerance:.3g} logits in bfloat16" in panel
    assert math.isclose(f.tolerance, r.tolerance) and f.alpha == r.alpha
