import os

import pytest
import torch

from specviz.cli.main import main
from specviz.decoding import determinism
from specviz.trace.schema import Trace

TINY = ["--pair", "tiny", "--dtype", "float64", "--device", "cpu"]


@pytest.fixture
def restore_flags():
    """Deterministic mode is process-wide: put everything back for the other tests."""
    workspace = os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark)
    yield
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    if workspace is not None:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace
    torch.use_deterministic_algorithms(saved[0])
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
     torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = saved[1:]


def test_enable_sets_every_flag(restore_flags):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    assert not determinism.flags()["deterministic_algorithms"]
    determinism.enable()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert determinism.flags() == {"deterministic_algorithms": True,
                                   "cublas_workspace_config": True,
                                   "cudnn_deterministic": True, "tf32_matmul": False,
                                   "tf32_cudnn": False}


def test_the_cli_flag_is_recorded_in_the_trace_manifest(tiny, tmp_path, restore_flags):
    plain, det = tmp_path / "plain.json", tmp_path / "det.json"
    args = ["run", *TINY, "--prompt", "Hello there", "--max-new-tokens", "6", "--k", "3"]
    assert main([*args, "--trace", str(plain)]) == 0
    assert main([*args, "--deterministic", "--trace", str(det)]) == 0
    before, after = (Trace.from_json(p.read_text()).manifest for p in (plain, det))
    assert (not before.deterministic["deterministic_algorithms"]
            and not before.deterministic["cublas_workspace_config"])
    assert after.deterministic == determinism.flags()
    assert (after.deterministic["deterministic_algorithms"]
            and after.deterministic["cublas_workspace_config"])
    assert not after.deterministic["tf32_matmul"] and after.deterministic["cudnn_deterministic"]
    assert after.fingerprint == before.fingerprint  # on the CPU the same decisions, flags or not
