"""Sweeps: `verify --fault-sets ... --json` writes a SweepReport that loads, matches its runs and
reruns; a stranger's report is refused with a message, or shown escaped."""
import json
import re
from pathlib import Path

import pytest

from fresh import run_fresh

from specviz.app import sweepviews
from specviz.cli.main import main
from specviz.run.runner import run
from specviz.spec.methods import grid
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace.evidence import Distribution
from specviz.trace.schema import MAX_TRACE_BYTES
from specviz.trace.sweep import SweepReport

PAYLOAD = "<img src=x onerror=alert(1)>"
VERIFY = ["verify", "--pair", "tiny", "--dtype", "float64", "--device", "cpu", "--prompt-set",
          "lists", "--max-new-tokens", "12", "--k", "5"]
SWEEP = [*VERIFY, "--methods", "batched-reference,eqspec", "--fault-sets", "none", "bsp-like",
         "--batch-sizes", "1,4"]
# The runs, in methods.grid order: a method without faults (batched-reference) runs once per
# batch size.
RUNS = [("batched-reference", "", 1), ("batched-reference", "", 4), ("eqspec", "", 1),
        ("eqspec", "", 4), ("eqspec", "bsp-like", 1), ("eqspec", "bsp-like", 4)]


@pytest.fixture(scope="module")
def written(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "sweep.json"
    assert main([*SWEEP, "--json", str(path), "--allow-divergence"]) == 0
    return path


@pytest.fixture(scope="module")
def report(written):
    return SweepReport.from_json(written.read_bytes())


def test_the_report_holds_one_row_per_run_in_the_sweeps_order(report):
    assert [(r.method, r.faults, r.batch_size) for r in report.rows] == RUNS
    assert [(s.method, s.faults, s.batch_size) for s in report.sweep.specs()] == [
        (m, (f,) if f else (), bs) for m, f, bs in RUNS]
    # the reference's equals, faults or none
    assert all(r.exact_pct == 100 for r in report.rows[:4])
    # bsp-like at batch size 4, explained
    assert report.rows[5].exact_pct < 100 and report.rows[5].verdicts
    assert [r.label() for r in report.rows] == (["batched-reference"] * 2 + ["eqspec"] * 2
                                                + ["eqspec · bsp-like"] * 2)
    assert report.rows[3].column() == "bs 4 · k 5" and report.rows[0].drafter == "-"
    assert [(s.run, s.seq) for s in report.sequences] == [(r, q) for r in range(6)
                                                          for q in range(4)]


def test_a_divergent_sweep_fails_verify_without_allow_divergence(tiny):
    assert main([*VERIFY, "--methods", "eqspec", "--fault-sets", "bsp-like", "--batch-sizes",
                 "4"]) == 1


def test_spec_of_reruns_the_run_its_row_and_sequences_describe(report):
    spec = report.spec_of(5)
    assert spec == RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT,
                                 prompts=tuple(builtin_set("lists")),
                                 max_new_tokens=12, dtype="float64", device="cpu", method="eqspec",
                                 faults=("bsp-like",), batch_size=4, k=5)
    trace = run(spec)
    row, sequences = report.rows[5], report.sequences[20:]
    assert [s.output_ids for s in sequences] == [s.output_ids for s in trace.sequences]
    assert [s.forensics.verdict for s in sequences if s.forensics] == [
        s.forensics.verdict for s in trace.sequences if s.forensics]
    # Accept lengths, offered and accepted drafts count the (round, row) records; rounds, each
    # sequence's tokens.
    assert sum(row.accept_lengths) == len(trace.rows)
    assert row.accept_lengths == [sum(r.accepted == j for r in trace.rows) for j in range(6)]
    assert row.offered == [sum(len(r.draft_tokens) > j for r in trace.rows) for j in range(5)]
    assert row.accepted == [sum(r.accepted > j for r in trace.rows) for j in range(5)]
    for s in sequences:
        assert s.rounds == [len(r.emitted) for r in trace.rows if r.seq == s.seq]
        assert sum(s.rounds) == len(s.output_ids)


def test_non_speculative_runs_have_no_rounds(report):
    assert report.rows[0].accept_lengths == [] and all(s.rounds == [] for s in report.sequences[:4])


def test_the_report_loads_without_torch_plotly_or_pandas(written):
    code = ("import sys\nfrom specviz.trace.sweep import SweepReport\n"
            "r = SweepReport.from_json(open(sys.argv[1], 'rb').read())\nassert r.spec_of(5).faults "
            "== ('bsp-like',)\n"
            "bad = {'torch', 'transformers', 'plotly', 'pandas'} & set(sys.modules)\nassert not "
            "bad, bad\n")
    done = run_fresh(code, str(written))
    assert done.returncode == 0, done.stderr


def test_a_version_1_report_opens_with_its_bases_temperature_as_its_one_temperature(written,
                                                                                    report):
    def version_1(raw):  # as specviz wrote it before the temperature axis
        raw["version"] = 1
        del raw["sweep"]["temperatures"]
        for item in (*raw["rows"], *raw["sequences"]):
            del item["temperature"]
        for row in raw["rows"]:
            del row["sampled_verdict"]
    assert SweepReport.from_json(_edited(written, version_1)) == report


def test_each_temperature_runs_in_the_methods_that_sample_and_sampling_faults_above_0_only():
    runs = grid(["reference", "hf-assisted", "eqspec"], ["model"], [1], [5],
                [(), ("accept-q-over-p",)], [0.0, 0.8])
    assert [(c["method"], c["faults"], c["temperature"]) for c in runs] == [
        ("reference", (), 0.0), ("reference", (), 0.8), ("hf-assisted", (), 0.0),
        ("eqspec", (), 0.0), ("eqspec", (), 0.8), ("eqspec", ("accept-q-over-p",), 0.8)]


def test_verify_sweeps_temperatures_judging_greedy_runs_by_tokens_and_sampled_ones_by_their_verdict(
        tiny, tmp_path):
    path = tmp_path / "sampled.json"
    args = [*VERIFY, "--methods", "eqspec", "--batch-sizes", "4", "--temperatures", "0,0.8",
            "--top-p", "0.5", "--fault-sets", "none", "accept-q-over-p", "--json", str(path)]
    assert main(args) == 1  # accept-q-over-p's distribution is not the target's
    found = SweepReport.from_json(path.read_bytes())
    assert [(r.faults, r.temperature, r.column()) for r in found.rows] == [
        ("", 0.0, "bs 4 · k 5"), ("", 0.8, "bs 4 · k 5 · T 0.8"),
        ("accept-q-over-p", 0.8, "bs 4 · k 5 · T 0.8")]
    greedy, sampled, faulty = found.rows
    assert (greedy.exact_pct == 100 and greedy.distribution is None
            and greedy.sampled_verdict is None)
    # the greedy run leaves top-p out
    assert found.spec_of(0).top_p == 1 and found.spec_of(1).top_p == 0.5
    assert sampled.exact_pct is None
    assert (sampled.sampled_verdict == sampled.distribution.verdict
            != "not the target's distribution")
    assert faulty.sampled_verdict == "sampler-bug:decisions" and faulty.decisions.mismatches > 0
    assert [s.temperature for s in found.sequences] == [0.0] * 4 + [0.8] * 8
    html = sweepviews.heatmap_html(found)
    assert re.findall(r"<th>(bs[^<]*)</th>", html) == ["bs 4 · k 5", "bs 4 · k 5 · T 0.8"]
    assert re.search(r'data-run="2"[^>]*title="[^"]*sampler-bug:decisions[^"]*">✗</td>', html)
    assert html.count("<td></td>") == 1  # accept-q-over-p does not run greedy
    assert "temperatures 0, 0.8" in sweepviews.sweep_summary_md(found)


def test_fault_sets_run_in_the_methods_that_take_faults_only():
    runs = grid(["reference", "eqspec", "exspec"], ["model"], [1, 4], [5],
                [(), ("bsp-like",), ("no-mask",)])
    assert [(c["method"], c["faults"], c["batch_size"]) for c in runs] == [
        ("reference", (), 1),
        *(("eqspec", f, bs) for f in [(), ("bsp-like",), ("no-mask",)] for bs in (1, 4)),
        ("exspec", (), 1), ("exspec", (), 4)]
    # no fault sets: none
    assert all(c["faults"] == () for c in grid(["eqspec"], ["model"], [1], [5]))


@pytest.mark.parametrize("args,says", [
    (["--fault-sets", "none,bsp-like"], "give it alone"),
    (["--fault-sets", "none", PAYLOAD], "unknown fault"),
    (["--faults", "no-mask", "--fault-sets", "none"], "not both"),
])
def test_bad_fault_sets_are_refused_with_a_message(args, says, capsys):
    try:
        code = main(["verify", "--pair", "tiny", "--device", "cpu", *args])
    except SystemExit as e:  # argparse refuses a bad value itself
        code = e.code
    assert code == 2 and says in capsys.readouterr().err


# ---------------------------------------------------------------- a stranger's file


def _edited(written, edit) -> bytes:
    raw = json.loads(written.read_text())
    edit(raw)
    return json.dumps(raw).encode()


@pytest.mark.parametrize("edit,says", [
    (lambda raw: raw.pop("version") and raw.pop("sweep"), "re-run specviz verify --json"),
    (lambda raw: raw.update(version=3), "version 2"),
    (lambda raw: raw["rows"].pop(), "5 rows for the sweep's 6 runs"),
    (lambda raw: raw["rows"].reverse(), "row 0 is not run 0"),
    (lambda raw: raw["sequences"][3].update(run=99), "sequence 3 should be sequence 3 of run 0"),
    (lambda raw: raw["sequences"].pop(), "23 sequences for 6 runs of 4 prompts"),
    (lambda raw: raw["sequences"][21].update(rounds=[1]), "rounds do not add up"),
    (lambda raw: raw["sequences"][21].update(first_divergence=10**6), "do not match its ids"),
    (lambda raw: raw["sweep"]["fault_sets"].append([PAYLOAD]), "unknown fault"),
    (lambda raw: raw["sweep"].update(drafters=["model", "lookup"], batch_sizes=list(range(1, 65)),
                                     ks=list(range(1, 17))),
     "up to 8192 runs; a sweep makes 4096 at most"),
    (lambda raw: raw["rows"][0].update(exact_pct=1e9), "less than or equal to 100"),
])
def test_a_bad_report_is_refused_with_a_message(written, edit, says):
    with pytest.raises(SpecError, match=re.escape(says)):
        SweepReport.from_json(_edited(written, edit))


@pytest.mark.parametrize("data,says", [
    (b"{not json", "not a sweep report: invalid JSON"),
    (b"[1, 2]", "not a sweep report: a JSON array"),
    (b'{"schema_version": 4}', "a run's trace, not a sweep report"),
    (b" " * (MAX_TRACE_BYTES + 1), "the limit is 64 MiB"),
])
def test_what_is_no_report_is_refused_with_a_message(data, says):
    with pytest.raises(SpecError, match=re.escape(says)):
        SweepReport.from_json(data)


def test_stranger_text_is_escaped_in_every_view(written):
    """A row's verdict counts load (their names are free text); a fault name cannot, nor a
    sequence's verdict (a declared name), so those are planted after loading."""
    def plant(raw):
        raw["rows"][5]["verdicts"] = {PAYLOAD: 4}

    def plant_verdicts(raw):
        for s in raw["sequences"][20:]:
            if s["forensics"]:
                s["forensics"]["verdict"] = PAYLOAD
    with pytest.raises(SpecError, match="not a verdict specviz gives"):
        SweepReport.from_json(_edited(written, plant_verdicts))
    report = SweepReport.from_json(_edited(written, plant))
    rows = [*report.rows[:4], *(r.model_copy(update={"faults": PAYLOAD}) for r in report.rows[4:])]
    def planted(s):  # model_copy does not validate: the views escape whatever reaches them
        verdict = s.forensics.model_copy(update={"verdict": PAYLOAD})
        return s.model_copy(update={"forensics": verdict})
    sequences = [*report.sequences[:20],
                 *(planted(s) if s.forensics else s for s in report.sequences[20:])]
    assert any(s.forensics and s.forensics.verdict == PAYLOAD for s in sequences)
    report = report.model_copy(update={"rows": rows, "sequences": sequences})
    shown = [sweepviews.heatmap_html(report),
             sweepviews.heatmap_html(report, "prefix_pct", selected=5)]
    figures = (sweepviews.verdict_bars, sweepviews.divergence_histogram,
               sweepviews.accept_length_histogram, sweepviews.acceptance_curves)
    # not to_json: it writes < as \u003c anyway
    shown += [str(figure(report).to_dict()) for figure in figures]
    assert all(PAYLOAD not in text and "<img" not in text for text in shown)
    assert "&lt;img src=x onerror=alert(1)&gt;" in shown[0]


# ---------------------------------------------------------------- views


def test_heatmap_cells_hold_their_runs_values(report):
    html = sweepviews.heatmap_html(report, selected=5)
    # above the table's scrolling box
    assert html.startswith('<p class="sv-heat-caption">exact match:')
    assert '<div class="sv-heat-wrap"><table class="sv-heat" data-metric="exact_pct">' in html
    cells = re.findall(r'<td class="(sv-hcell[^"]*)" data-run="(\d+)"[^>]*>([^<]*)</td>', html)
    assert sorted(int(i) for _, i, _ in cells) == list(range(6))
    for cls, i, text in cells:
        row = report.rows[int(i)]
        assert text == f"{row.exact_pct:.0f}"  # 4 sequences: a multiple of 25
        assert ("sv-sel" in cls) == (i == "5")
    labels = re.findall(r'<th class="sv-hlabel">([^<]*)</th>', html)
    assert labels == ["batched-reference", "eqspec", "eqspec · bsp-like"]
    assert re.findall(r"<th>(bs[^<]*)</th>", html) == ["bs 1 · k 5", "bs 4 · k 5"]
    assert "prefix match" in sweepviews.heatmap_html(report, "prefix_pct")


def test_a_cell_says_100_and_0_only_when_exactly_so():
    assert ([sweepviews._percent(v) for v in (0, 0.4, 50.5, 99.6, 100)]
            == ["0", "1", "50", "99", "100"])


def test_a_missing_combination_is_an_empty_cell_and_a_sampled_run_its_verdicts_mark(report):
    judged = Distribution(verdict="not the target's distribution", alpha=0.01, p=0.0,
                          failing="slot 0", tokens=48, impossible=0, splits=[], skipped=[])
    rows = [*report.rows[:5],
            report.rows[5].model_copy(update={"exact_pct": None, "distribution": judged})]
    # batched-reference at bs 1 gone
    html = sweepviews.heatmap_html(report.model_copy(update={"rows": rows[1:]}))
    assert html.count("<td></td>") == 1
    assert re.search(r'data-run="4"[^>]*title="[^"]*not the target&#x27;s '
                     r'distribution[^"]*">✗</td>', html)


def test_figures_count_every_sequence(report):
    bars = sweepviews.verdict_bars(report)
    assert bars.data[0].name == "equivalent"
    assert {t.name
            for t in bars.data[1:]} == set(report.rows[4].verdicts) | set(report.rows[5].verdicts)
    # one bar a run, laid sideways: run names read across
    assert all(t.orientation == "h" for t in bars.data)
    assert [sum(t.x[i] for t in bars.data) for i in range(6)] == [r.n for r in report.rows]
    forks = sweepviews.divergence_histogram(report)
    divergent = [s for s in report.sequences if s.equivalent is False]
    assert ([t.name for t in forks.data] == ["eqspec · bsp-like"]
            and sum(forks.data[0].y) == len(divergent))
    assert forks.layout.xaxis.title.text == "first divergent token index"
    lengths = sweepviews.accept_length_histogram(report)
    assert [t.name for t in lengths.data] == ["eqspec", "eqspec · bsp-like"]
    assert all(abs(sum(t.y) - 1) < 1e-12 for t in lengths.data)
    curves = sweepviews.acceptance_curves(report)
    assert len(curves.data) == 4 and all(list(t.x) == [1, 2, 3, 4, 5] for t in curves.data)
    assert all(y is None or 0 <= y <= 1 for t in curves.data for y in t.y)
    summary = sweepviews.sweep_summary_md(report)
    assert "**6 runs**" in summary and "4 of 6 greedy runs equal the reference" in summary


def test_the_published_report_schema_is_the_codes(capsys):
    assert main(["schema", "--report"]) == 0
    published = Path(__file__).resolve().parents[1] / "docs" / "sweep-report.schema.json"
    assert (json.loads(published.read_text()) == json.loads(capsys.readouterr().out)
            == SweepReport.model_json_schema())
