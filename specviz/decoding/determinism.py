"""Deterministic GPU kernels, where the operator asks for them
(`--deterministic`, SPECVIZ_DETERMINISTIC).

With them a rerun of the same spec on the same machine repeats every decision
bit for bit, so a divergence seen once can be studied again. They do not make
a batched pass equal a batch-size-1 pass (different GEMM shapes sum in a
different order), and they cost speed. CPU kernels are deterministic already.
Every trace records these flags in its manifest.
"""
from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE = ":4096:8"  # cuBLAS reads it when it starts: before any CUDA work


def enable() -> None:
    """Deterministic algorithms, a fixed cuBLAS workspace, TF32 off, deterministic cuDNN."""
    if (os.environ.get("CUBLAS_WORKSPACE_CONFIG") != CUBLAS_WORKSPACE
            and torch.cuda.is_initialized()):
        raise RuntimeError("deterministic mode must be enabled before any CUDA work (cuBLAS has "
                           "already started)")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def flags() -> dict[str, bool]:
    """The state a trace's manifest records."""
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        in (":4096:8", ":16:8"), "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }
