import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import specviz
from specviz.cli.main import main
from specviz.forensics import enginenoise
from specviz.run.launch import share
from specviz.trace.schema import Trace

ROOT = Path(specviz.__file__).resolve().parent.parent
VERIFY = ["verify", "--pair", "tiny", "--dtype", "float64", "--device", "cpu", "--prompt-set",
          "lists", "--methods", "reference,batched-reference,eqspec,exspec", "--batch-sizes", "1,3",
          "--k", "3", "--max-new-tokens", "10", "--faults", "bsp-like", "--forensics",
          "--allow-divergence"]


@pytest.mark.parametrize("n", range(12))
def test_shares_are_whole_static_batches_covering_every_prompt_once(n):
    for batch_size in (1, 2, 3, 5):
        for world in (1, 2, 3, 4):
            shares = [share(n, batch_size, rank, world) for rank in range(world)]
            assert [i for s in shares for i in s] == list(range(n))
            assert all(s.start % batch_size == 0 for s in shares if s)
            assert max(map(len, shares)) - min(map(len, shares)) <= batch_size  # a fair split


def _launch(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`accelerate launch` of `specviz argv` on two CPU processes; it must succeed."""
    with socket.socket() as s:  # a free port for the processes to meet on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # tests/: the engines test_check holds
    path = [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1"}
    # On CPUs, --multi_gpu is what makes accelerate start N processes (--cpu starts one
    # without MPI).
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
              "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(port), "-m", "specviz.cli"]
    done = subprocess.run([*launch, *argv], env=env, cwd=cwd, capture_output=True, check=False,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _same(a, b, where="report"):
    """Equal, floats up to rounding; completion times (wall clock) are not compared."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a.keys() - {"completion_seconds"}:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), where
    else:
        assert a == b, where


# Sampled: every sequence draws from its own stream, numbered as in the whole list; every
# row audited.
SAMPLED = ["--temperature", "0.8", "--top-p", "0.9", "--seed", "5", "--audit", "3"]


@pytest.mark.parametrize("sampling", [[], SAMPLED], ids=["greedy", "sampled"])
def test_accelerate_launch_on_two_processes_reports_as_one_process(sampling, tiny, tmp_path,
                                                                   capsys):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    verify = [*VERIFY, *sampling]
    assert main([*verify, "--json", str(one)]) == 0
    single = capsys.readouterr().out

    done = _launch([*verify, "--json", str(two)], tmp_path)

    assert done.stdout.replace(str(two), str(one)) == single  # one table, printed once
    report, sharded = json.loads(one.read_text()), json.loads(two.read_text())
    assert len(report["rows"]) == 7 and len(report["sequences"]) == 7 * 4
    # forensics ran: the faulty rows are explained
    assert any(r["verdicts"] for r in report["rows"])
    # judged by their distribution and audited: bsp-like's corrupt positions named by the audit
    if sampling:
        assert (all(r["distribution"] for r in report["rows"])
                and "sync-bug:positions" in str(report["rows"]))
    _same(report, sharded)


@pytest.mark.parametrize("method", ["reference", "eqspec"])
def test_a_shard_of_a_sampled_run_draws_what_one_process_draws(method, tiny):
    """Each sequence's stream is its number in the whole list: a share decoded alone, told where it
    starts, emits the whole run's tokens for its sequences (told nothing, it would draw
    another sequence's)."""
    from specviz.models.pairs import pair_for
    from specviz.run.runner import decode, encode
    from specviz.spec.prompts import builtin_set
    from specviz.spec.run import RunSpec

    spec = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float32",
                         device="cpu", prompts=tuple(builtin_set("quick")), method=method,
                         batch_size=2, k=3, max_new_tokens=12, temperature=0.9, seed=7)
    pair = pair_for(spec)
    prompt_ids = encode(spec, pair)
    whole = [o.ids for o in decode(spec, pair, prompt_ids, record=False).outputs]
    second = [o.ids for o in decode(spec, pair, prompt_ids[2:], record=False, first_seq=2).outputs]
    assert second == whole[2:]
    assert [o.ids for o in decode(spec, pair, prompt_ids[2:], record=False).outputs] != whole[2:]


CHECK = ["check", "--pair", "tiny", "--dtype", "float32", "--device", "cpu", "--prompt-set", "chat",
         "--max-new-tokens", "24", "--engine", "test_check:dsd_like", "--control-engine",
         "test_check:no_speculation"]


def _judged(trace: Trace) -> list[tuple]:
    return [(s.output_ids, s.reference_ids, s.equivalent, s.first_divergence, s.gaps, s.forensics,
             s.reference_proof)
            for s in trace.sequences]


def test_a_check_launched_on_two_processes_judges_as_one_and_resumes_from_its_parts(tiny, tmp_path,
                                                                                    capsys,
                                                                                    monkeypatch):
    one, two, again, saved = (tmp_path / f
                              for f in ("one.json", "two.json", "again.json", "rows.jsonl"))
    assert main([*CHECK, "--trace", str(one)]) == 0
    single = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  [")]
    whole = Trace.from_json(one.read_text())
    # dsd-like forks: there are verdicts to agree on
    assert any(s.forensics for s in whole.sequences)

    done = _launch([*CHECK, "--trace", str(two), "--checkpoint", str(saved)], tmp_path)
    # printed once, alike
    assert [line for line in done.stdout.splitlines() if line.startswith("  [")] == single
    assert _judged(Trace.from_json(two.read_text())) == _judged(whole)
    parts = sorted(tmp_path.glob("rows.jsonl.part*"))
    seqs = [[json.loads(line)["seq"] for line in p.read_text().splitlines()[1:]] for p in parts]
    assert [p.name for p in parts] == ["rows.jsonl.part0", "rows.jsonl.part1"] and all(seqs)
    # each row judged once
    assert sorted(s for share in seqs for s in share) == list(range(len(whole.sequences)))

    def forced_again(*args):
        raise AssertionError("a row kept in a part file was judged again")

    # resumed in one process: every row read back
    monkeypatch.setattr(enginenoise, "force", forced_again)
    assert main([*CHECK, "--trace", str(again), "--checkpoint", str(saved)]) == 0
    assert _judged(Trace.from_json(again.read_text())) == _judged(whole)
