"""OpenVINO GenAI as an engine: its ContinuousBatchingPipeline on a pair's models, run in its own
Python and judged like any engine.

OpenVINO GenAI lives in its own virtual environment, .venv-openvino (`make openvino`): its exporter
(optimum-intel) pins another transformers than specviz. A model runs there as OpenVINO IR, exported
once per model folder by `optimum-cli export openvino` in float32 weights and cached under
$SPECVIZ_CACHE/openvino (25 s a model here; `python -m specviz.engines.openvino` exports the
embedded pair and prints its two folders). openvino_worker.py runs a batch there: every request
added to one pipeline and stepped to its end, so that each step's tokens are one round of the
request's speculation, seen from outside (the drafts themselves are not shown).

Modes, as in vllm.py and llamacpp.py:

- none:  no speculation (the control);
- ngram: prompt lookup, an n-gram of NGRAM tokens looked up, k tokens drafted;
- draft: draft-model speculation with the pair's draft, k tokens a draft.

Precisions: `f32` runs the target, the draft and the KV cache in float32; `cpu-default` leaves the
CPU plugin's defaults (on CPUs with bfloat16, bf16 compute and a u8 KV cache: OpenVINO's rounding,
which its own control at the same precision measures).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from huggingface_hub import snapshot_download

from specviz.engines.base import EngineRun, round_counters, rounds_seen
from specviz.models.checkpoints import (atomic_save, cache_dir, embedded_draft_dir,
                                        embedded_target_dir)
from specviz.spec.run import EMBEDDED_DRAFT, EMBEDDED_TARGET
from specviz.spec.strict import SpecError
from specviz.trace.records import EngineOutput

MODES = ("none", "ngram", "draft")
PRECISIONS = {"f32": {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"},
              "cpu-default": {}}
NGRAM = 3  # tokens an n-gram matches in prompt lookup
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = ROOT / ".venv-openvino" / "bin" / "python"
WORKER = Path(__file__).with_name("openvino_worker.py")
# the exporter's pins: a change exports every model again
PINS = ROOT / "requirements-openvino.txt"
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass(frozen=True)
class Setting:
    """How OpenVINO runs: the speculation mode, the precision, prefix caching, and the drafts."""

    mode: str = "draft"
    precision: str = "f32"
    prefix_caching: bool = False
    k: int = 5

    def __post_init__(self):
        if self.mode not in MODES:
            raise SpecError(f"unknown OpenVINO mode {self.mode!r}; choose from {', '.join(MODES)}")
        if self.precision not in PRECISIONS:
            raise SpecError(f"unknown OpenVINO precision {self.precision!r}; choose from "
                            f"{', '.join(PRECISIONS)}")

    def control(self) -> Setting:
        """The same pipeline without speculation: it measures OpenVINO's own rounding."""
        return Setting("none", self.precision, self.prefix_caching, self.k)


def openvino_python() -> Path:
    """OpenVINO's Python: $SPECVIZ_OPENVINO_PYTHON, else .venv-openvino beside this checkout."""
    path = Path(os.environ.get("SPECVIZ_OPENVINO_PYTHON", DEFAULT_PYTHON))
    if not path.exists():
        raise SpecError(f"OpenVINO's Python is not at {path}: run `make openvino` to install it "
                        "there, or set SPECVIZ_OPENVINO_PYTHON to another one")
    return path


def model_folder(name: str, revision: str | None = None) -> Path:
    """A model's Hugging Face folder: the embedded pair's cached ones, a local folder, or a Hub
    snapshot (where the Hub is reachable)."""
    if name == EMBEDDED_TARGET:
        return embedded_target_dir()
    if name == EMBEDDED_DRAFT:
        return embedded_draft_dir()
    if Path(name).is_dir():
        return Path(name)
    if name.startswith("specviz:"):
        raise SpecError(f"OpenVINO runs real checkpoints; {name} is built in memory by specviz")
    try:
        return Path(snapshot_download(name, revision=revision))
    except Exception as e:  # offline, unknown id, gated: all say the same to the user
        raise SpecError(f"OpenVINO needs {name}'s files and cannot fetch them: {e}") from None


def exported(folder: Path) -> Path:
    """`folder`'s model as OpenVINO IR (float32 weights), exported once and cached; the key is the
    folder's files (names and sizes) and the exporter's pins."""
    files = sorted((p.name, p.stat().st_size) for p in folder.iterdir() if p.is_file())
    key = hashlib.sha256(json.dumps([str(folder.resolve()), files,
                                     PINS.read_text() if PINS.exists() else ""]).encode())
    dest = cache_dir() / "openvino" / f"{folder.name}-{key.hexdigest()[:12]}"
    if dest.exists():
        return dest

    def export(tmp: Path) -> None:
        cli = openvino_python().parent / "optimum-cli"
        done = subprocess.run(
            [str(cli), "export", "openvino", "--model", str(folder), "--task",
             "text-generation-with-past", "--weight-format", "fp32", str(tmp)],
            capture_output=True, text=True, env={**os.environ, **ENV})
        if done.returncode:
            raise SpecError(f"OpenVINO's exporter could not export {folder}: "
                            f"{done.stderr.strip()[-600:]}")

    atomic_save(dest, export)
    return dest


def run(setting: Setting, target: Path, draft: Path | None, prompts: list[list[int]],
        max_new_tokens: int, eos_ids: list[int], sampling: dict | None = None,
        orders: list[list[int]] | None = None, threads: int | None = None) -> list[EngineRun]:
    """`prompts` answered by one OpenVINO pipeline (the IR folders `target` and, for the draft
    mode, `draft`), once per order of `orders` (default: once, in order), each a batch of every
    prompt. `sampling`: temperature, top_p, top_k and seed (None: greedy). `threads`: the CPU
    threads it computes on, unpinned (None: OpenVINO's own choice, every core, pinned)."""
    if setting.mode == "draft" and draft is None:
        raise SpecError("OpenVINO's draft mode needs a draft model")
    orders = orders or [list(range(len(prompts)))]
    job = {"target": str(target), "draft": str(draft) if draft else None, "mode": setting.mode,
           "properties": {**PRECISIONS[setting.precision],
                          **({"INFERENCE_NUM_THREADS": threads, "ENABLE_CPU_PINNING": False}
                             if threads else {})},
           "prefix_caching": setting.prefix_caching,
           "k": setting.k, "ngram": NGRAM, "max_new_tokens": max_new_tokens,
           "eos_ids": list(eos_ids), "prompts": prompts, "orders": orders,
           # a whole prompt in one step, every request's prefill at once
           "max_num_batched_tokens": max(256, sum(map(len, prompts)) + len(prompts)),
           "sampling": sampling}
    env = {**os.environ, **ENV}
    # -I: isolated, so the worker's own folder (this one, with openvino.py) is not on its path
    done = subprocess.run([str(openvino_python()), "-I", str(WORKER)], input=json.dumps(job),
                          capture_output=True, text=True, env=env)
    if done.returncode < 0:  # (its CPU plugin dies of SIGFPE with its CPU defaults on 1 thread)
        raise SpecError(f"OpenVINO GenAI crashed (signal {-done.returncode}) with the properties "
                        f"{job['properties']}: {done.stderr.strip()[-400:]}")
    if done.returncode:
        raise SpecError(f"OpenVINO GenAI failed: {done.stderr.strip()[-600:]}")
    answer = json.loads(done.stdout)
    settings = {**asdict(setting), "ngram": NGRAM, "properties": job["properties"],
                "cpu_defaults": answer["cpu_defaults"], "openvino": answer["openvino"],
                "batch_size": len(prompts), "load_seconds": answer["load_seconds"],
                **({"drafter": "model"} if setting.mode == "draft" else {}),
                **({"sampling": sampling} if sampling else {})}
    return [EngineRun(name="openvino-genai", version=answer["version"], source="openvino",
                      seconds=r["seconds"], settings=settings,
                      outputs=[_output(o, setting.k) for o in r["outputs"]])
            for r in answer["runs"]]


def _output(answer: dict, k: int) -> EngineOutput:
    """One request's answer, its steps as its rounds."""
    rounds = rounds_seen(answer["chunks"], k, answer["scores"])
    drafts, accepted = round_counters(rounds) if rounds else (None, None)
    return EngineOutput(ids=answer["ids"], logprobs=answer["logprobs"], rounds=rounds,
                        score=answer["score"], drafts=drafts, accepted=accepted)

if __name__ == "__main__":  # the embedded pair exported (once), its two IR folders printed
    print(exported(embedded_target_dir()), exported(embedded_draft_dir()))
