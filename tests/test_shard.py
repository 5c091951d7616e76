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
from specviz.run.shard import share

ROOT = Path(specviz.__file__).resolve().parent.parent
VERIFY = ["verify", "--pair", "tiny", "--dtype", "float64", "--device", "cpu", "--prompt-set", "lists",
          "--methods", "reference,batched-reference,eqspec,exspec", "--batch-sizes", "1,3", "--k", "3",
          "--max-new-tokens", "10", "--faults", "bsp-like", "--forensics", "--allow-divergence"]


@pytest.mark.parametrize("n", range(12))
def test_shares_are_whole_static_batches_covering_every_prompt_once(n):
    for batch_size in (1, 2, 3, 5):
        for world in (1, 2, 3, 4):
            shares = [share(n, batch_size, rank, world) for rank in range(world)]
            assert [i for s in shares for i in s] == list(range(n))
            assert all(s.start % batch_size == 0 for s in shares if s)
            assert max(map(len, shares)) - min(map(len, shares)) <= batch_size  # a fair split


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


def test_accelerate_launch_on_two_processes_reports_as_one_process(tiny, tmp_path, capsys):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert main([*VERIFY, "--json", str(one)]) == 0
    single = capsys.readouterr().out

    with socket.socket() as s:  # a free port for the processes to meet on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    # On CPUs, --multi_gpu is what makes accelerate start N processes (--cpu starts one without MPI).
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(port), "-m", "specviz.cli"]
    done = subprocess.run([*launch, *VERIFY, "--json", str(two)], env=env, cwd=tmp_path, capture_output=True, check=False,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    assert done.stdout.replace(str(two), str(one)) == single  # one table, printed once
    report, sharded = json.loads(one.read_text()), json.loads(two.read_text())
    assert len(report["rows"]) == 7 and len(report["sequences"]) == 7 * 4
    assert any(r["verdicts"] for r in report["rows"])  # forensics ran: the faulty rows are explained
    _same(report, sharded)
