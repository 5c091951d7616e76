import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from fresh import run_fresh

from specviz.app import views
from specviz.app.panel import forensics_html
from specviz.forensics.sampledrun import with_sampled_verdict
from specviz.run.runner import run
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.spec.verdicts import VERDICTS
from specviz.trace import metrics
from specviz.trace.evidence import EngineForensics, RunForensics
from specviz.trace.frames import rows_frame, tokens_frame
from specviz.trace.migrations import SCHEMA_VERSION
from specviz.trace.schema import Trace, trace_schema

DOCS_SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "trace.schema.json"
ASSETS = Path(__file__).resolve().parents[1] / "assets" / "traces"


@pytest.fixture(scope="module")
def trace(tiny):
    spec = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float64",
                         device="cpu",
                         prompts=("Hi", "Name three rivers.", "Write a long story about a dragon."),
                         batch_size=3, k=4, max_new_tokens=16)
    return run(spec)


def test_a_source_checkout_that_was_never_installed_still_traces(tiny, monkeypatch):
    """On a GPU box one may put the checkout on PYTHONPATH without `pip install`:
    no package metadata."""
    from importlib.metadata import PackageNotFoundError

    import specviz.decoding.recording

    installed = specviz.decoding.recording.version

    def specviz_missing(dist):
        if dist == "specviz":
            raise PackageNotFoundError(dist)
        return installed(dist)

    monkeypatch.setattr(specviz.decoding.recording, "version", specviz_missing)
    spec = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float64",
                         device="cpu", prompts=("Hi",), batch_size=1, k=2, max_new_tokens=4)
    assert run(spec).manifest.versions["specviz"] == "not installed"


def test_save_load_round_trip_is_exact(trace):
    again = Trace.from_json(trace.to_json())
    assert again == trace
    assert again.manifest.fingerprint == trace.manifest.fingerprint


def test_a_trace_file_loads_without_torch(trace, tmp_path):
    """The schema stands alone: a process that never imports torch, transformers, scipy, plotly or
    pandas loads, validates and saves a greedy and a sampled trace (the sampled one carries draws
    and a distribution verdict)."""
    sampled = run(RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float64",
                                device="cpu", prompts=("Hi", "Name three rivers."), batch_size=2,
                                k=3, max_new_tokens=8, temperature=0.8))
    assert sampled.distribution and sampled.rows[0].accept_draws is not None
    assert sampled.sampled_verdict is not None  # judged with the run, kept in its trace
    for name, t in (("greedy", trace), ("sampled", sampled)):
        (tmp_path / f"{name}.json").write_text(t.to_json())
    code = (
        "import pathlib, sys\n"
        "from specviz.trace.schema import Trace\n"
        "for p in pathlib.Path(sys.argv[1]).glob('*.json'):\n"
        "    p.with_suffix('.again').write_text(Trace.from_json(p.read_bytes()).to_json())\n"
        "bad = {'torch', 'transformers', 'scipy', 'plotly', 'pandas'} & set(sys.modules)\n"
        "assert not bad, bad\n"
    )
    done = run_fresh(code, str(tmp_path))
    assert done.returncode == 0, done.stderr
    for name, t in (("greedy", trace), ("sampled", sampled)):
        assert Trace.from_json((tmp_path / f"{name}.again").read_bytes()) == t


def test_trace_holds_what_the_design_asks(trace):
    m = trace.manifest
    assert m.spec.method == "eqspec" and m.versions["torch"] and m.device == "cpu"
    assert [p.ids for p in trace.prompts] and all(p.ids for p in trace.prompts)
    assert all(s.equivalent for s in trace.sequences)
    r = trace.rows[0]
    assert len(r.draft_tokens) == 4 and len(r.target_tokens) == 5 and len(r.target_margins) == 5
    assert r.sources[-1] in ("correction", "bonus") and set(r.sources[:-1]) <= {"draft"}
    assert set(r.checks) == {"rectangular", "positions", "mask", "kv", "draft_kv", "bonus"}
    assert set(trace.rounds[0].timings) == {"draft", "verify", "realign", "trace", "watch"}
    # Emitted tokens, concatenated per sequence, are the sequence's output.
    for s in trace.sequences:
        assert [t for r in trace.rows if r.seq == s.seq for t in r.emitted] == s.output_ids


def test_tidy_frames(trace):
    rows = rows_frame(trace)
    assert len(rows) == len(trace.rows) and "check_kv" in rows and rows["check_kv"].all()
    toks = tokens_frame(trace)
    assert len(toks) == sum(len(s.output_ids) for s in trace.sequences)
    assert set(toks["source"]) <= {"draft", "correction", "bonus"}
    acc = metrics.acceptance_rate(trace)
    assert 0 < acc < 1
    per_position = metrics.per_position_acceptance(trace)
    assert len(per_position) == 4 and all(0 <= p <= 1 for p in per_position)


def test_schema_file_is_current():
    assert json.loads(DOCS_SCHEMA.read_text()) == trace_schema()


@pytest.mark.parametrize("mutate,message", [
    (lambda t: t[: len(t) // 2], "invalid JSON"),
    (lambda t: json.dumps({"schema_version": 99}), "schema version 1"),
    (lambda t: json.dumps([1, 2]), "schema version 1"),
    (lambda t: t.replace('"accepted":', '"accepted":"many","x":', 1), "accepted"),
    (lambda t: json.dumps({**json.loads(t), "prompts": "nope"}), "prompts"),
    (lambda t: " " * (64 * 2**20 + 1), "the limit is 64 MiB"),
])
def test_malformed_traces_are_refused_clearly(trace, mutate, message):
    with pytest.raises(SpecError, match=message):
        Trace.from_json(mutate(trace.to_json()))


def test_a_version_1_trace_still_opens_with_its_verdicts(tiny):
    """Version 1 judged forks by noise measured on the run itself; its files open, verdicts
    as recorded."""
    spec = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float64",
                         device="cpu", prompts=("Hi", "Name three rivers."), batch_size=2, k=3,
                         max_new_tokens=12, faults=("dsd-like",))
    raw = json.loads(run(spec).to_json())
    raw["schema_version"] = 1
    del raw["manifest"]["yardstick"], raw["manifest"]["fidelity"]  # version 5's
    for s in raw["sequences"]:
        del s["output_pieces"], s["reference_pieces"]  # version 3's
        if s["forensics"]:
            s["forensics"] = {k: s["forensics"][k]
                              for k in ("verdict", "explanation", "fork", "round", "row")}
            s["forensics"].update(noise=0.5, logit_diff=3.0)
    old = Trace.from_json(json.dumps(raw))
    assert old.schema_version == SCHEMA_VERSION and old.manifest.yardstick is None
    assert [s.forensics.verdict for s in old.sequences if s.forensics] == \
        [s["forensics"]["verdict"] for s in raw["sequences"] if s["forensics"]]


def test_a_version_4_trace_keeps_its_noise_floor_as_the_yardstick_it_was(tiny):
    """Version 4 judged by a floor measured through the batched, cached path: it opens with that
    floor as its yardstick, its verdicts as recorded, and no false-alarm rate claimed for it."""
    spec = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float64",
                         device="cpu", prompts=("Hi", "Name three rivers."), batch_size=2, k=3,
                         max_new_tokens=12, faults=("dsd-like",))
    raw = json.loads(run(spec).to_json())
    raw["schema_version"] = 4
    del raw["manifest"]["yardstick"], raw["manifest"]["fidelity"]
    raw["manifest"]["noise_floor"] = {"target": {"value": 2e-6, "median": 1e-6, "resolution": 1e-15,
                                                 "positions": 88, "sequences": 2, "chunk": 4,
                                                 "method": "teacher-forced, batched"},
                                      "draft": None, "factor": 4.0}
    for s in raw["sequences"]:
        if s["forensics"]:
            for new in ("kernel_diff", "alpha", "yardstick"):
                del s["forensics"][new]
    old = Trace.from_json(json.dumps(raw))
    r = old.manifest.yardstick.target
    assert ((r.tolerance, r.quantiles, r.positions, r.slots, r.alpha)
            == (8e-6, [1e-6, 2e-6], 88, 4, None))
    assert (r.method.startswith("version 4's noise floor: teacher-forced")
            and old.manifest.yardstick.draft is None)
    assert [s.forensics.verdict for s in old.sequences if s.forensics] == \
        [s["forensics"]["verdict"] for s in raw["sequences"] if s["forensics"]]
    forensics_html(old, views.Focus(seq=0, round=None))  # the page shows it


def test_an_undeclared_verdict_name_fails_where_it_is_written(trace):
    """A record's verdict is a name spec/verdicts.py declares: a judge that sets another fails as it
    sets it, and a file that holds one is refused on load."""
    ok = RunForensics(verdict="numerics", explanation="", fork=0)
    ok.verdict = "sync-bug:kv"  # a declared name is taken
    with pytest.raises(ValidationError, match="not a verdict specviz gives"):
        ok.verdict = "made-up"
    with pytest.raises(ValidationError, match="not a verdict specviz gives"):
        EngineForensics(verdict="sync-bug:made-up", explanation="", fork=0)
    raw = json.loads(trace.to_json())
    for name in ("numerics", "made-up"):
        raw["sequences"][0]["forensics"] = {"verdict": name, "explanation": "", "fork": 0}
        if name in VERDICTS:
            assert Trace.from_json(json.dumps(raw)).sequences[0].forensics.verdict == name
        else:
            with pytest.raises(SpecError, match="'made-up' is not a verdict specviz gives"):
                Trace.from_json(json.dumps(raw))
    raw["sequences"][0]["forensics"] = None
    raw["sampled_verdict"] = {"verdict": "made-up", "explanation": ""}
    with pytest.raises(SpecError, match="sampled_verdict"):
        Trace.from_json(json.dumps(raw))


@pytest.mark.parametrize("path", sorted(ASSETS.glob("*.json")), ids=lambda p: p.stem)
def test_every_bundled_trace_loads_its_verdicts_declared(path):
    """Every name a bundled trace (or an older one, above) holds is a declared verdict: none needs
    migrating. A sampled run's trace written before its verdict was kept is judged when read, from
    the same evidence (forensics/sampledrun.py; the trace layer itself never judges)."""
    old = Trace.from_json(path.read_text(encoding="utf-8"))
    names = [s.forensics.verdict for s in old.sequences if s.forensics]
    assert set(names) <= set(VERDICTS)
    read = with_sampled_verdict(old)  # (as stored, where it was kept)
    assert old.sampled_verdict is None or read is old
    if old.distribution is not None and old.rows:  # a sampled run of ours
        assert read.sampled_verdict is not None
        assert Trace.from_json(read.to_json()).sampled_verdict == read.sampled_verdict
        assert metrics.sampled_verdict(read)[0] in {*VERDICTS, "consistent", "too few tokens"}
    else:
        assert read.sampled_verdict is None
