import json

from specviz.cli.main import main
from specviz.trace.schema import Trace

TINY = ["--pair", "tiny", "--dtype", "float64", "--device", "cpu"]


def test_run_reference_answers_the_france_question(embedded, capsys):
    assert main(["run", "--method", "reference", "--prompt", "What is the capital of France?",
                 "--max-new-tokens", "20", "--device", "cpu"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_run_eqspec_writes_json_and_trace(tiny, tmp_path, capsys):
    out, tr = tmp_path / "out.json", tmp_path / "trace.json"
    assert main(["run", *TINY, "--method", "eqspec", "--prompt-set", "lists", "--batch-size", "3",
                 "--k", "3", "--max-new-tokens", "12", "--json", str(out), "--trace", str(tr)]) == 0
    text = capsys.readouterr().out
    assert "acceptance rate" in text and "tokens per round" in text and "= reference" in text
    data = json.loads(out.read_text())
    assert len(data["sequences"]) == 4 and all(s["output_ids"] for s in data["sequences"])
    trace = Trace.from_json(tr.read_text())
    assert [s.output_ids for s in trace.sequences] == [s["output_ids"] for s in data["sequences"]]


def test_verify_prints_table_one_and_writes_json(tiny, tmp_path, capsys):
    out = tmp_path / "verify.json"
    assert main(["verify", *TINY, "--methods", "reference,batched-reference,eqspec",
                 "--batch-sizes", "1,3", "--k", "2,4", "--prompt-set", "chat", "--max-new-tokens",
                 "10", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "exact %" in text and "prefix %" in text
    rows = json.loads(out.read_text())["rows"]
    assert {(r["method"], r["batch_size"], r["k"]) for r in rows} == {
        ("reference", 1, 2), ("batched-reference", 1, 2), ("batched-reference", 3, 2),
        ("eqspec", 1, 2), ("eqspec", 1, 4), ("eqspec", 3, 2), ("eqspec", 3, 4)}
    assert all(r["exact_pct"] == 100 and r["prefix_pct"] == 100 and r["n"] == 7 for r in rows)


def test_sampled_verify_judges_each_run_by_its_distribution_and_fails_on_a_fault(tiny, tmp_path,
                                                                                 capsys):
    """Sampled runs in `verify`: no exact-match claim, the distribution's verdict instead, and exit
    1 when a sampling fault makes a run not the target's distribution."""
    sampled = [*TINY, "--temperature", "0.8", "--top-p", "0.95", "--prompt-set", "all",
               "--max-new-tokens", "24", "--batch-sizes", "4", "--k", "4"]
    out = tmp_path / "verify.json"
    assert main(["verify", *sampled, "--methods", "batched-reference,eqspec,exspec", "--json",
                 str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["method"], r["distribution"]["verdict"]) for r in rows] == [
        ("batched-reference", "consistent"), ("eqspec", "consistent"), ("exspec", "consistent")]
    assert (rows[1]["decisions"]["mismatches"] == 0
            and capsys.readouterr().out.count("consistent (p = ") == 3)
    assert main(["verify", *sampled, "--methods", "eqspec", "--faults",
                 "temperature-draft-only"]) == 1
    assert "not the target's distribution" in capsys.readouterr().out


def test_bad_input_exits_2_with_a_message(capsys, tmp_path):
    assert main(["run", *TINY, "--k", "40", "--prompt", "x"]) == 2
    assert "k: Input should be less than or equal to 16" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert main(["run", *TINY, "--prompts", str(empty)]) == 2
    assert "no prompts found" in capsys.readouterr().err
