"""A local server process, for the engines specviz starts itself (vllm.py, llamacpp.py): a free
localhost port, a process group of its own (stopping it stops every process it started), its output
in a log, and a wait for its health endpoint that names the log's tail when it fails."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from specviz.spec.strict import SpecError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(name: str, command: list[str], env: dict[str, str], log: Path, url: str, health: str,
            startup_timeout: float) -> Iterator[None]:
    """Run `command` (with `env` over this process's environment, output to `log`) until the block
    ends, once `url + health` answers 200; `name` is what errors call it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        # A session of its own: stopping it stops the engine and worker processes it starts.
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **env},
                                start_new_session=True)
    try:
        _wait_healthy(name, proc, url + health, log, startup_timeout)
        yield
    finally:
        _stop(proc)


def _wait_healthy(name: str, proc: subprocess.Popen, health: str, log: Path,
                  timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SpecError(f"{name} exited with code {proc.returncode} before serving "
                            f"{health}.\n{tail(log)}")
        try:
            if httpx.get(health, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SpecError(f"{name} did not answer {health} within {timeout:g} s.\n{tail(log)}")


def tail(log: Path, lines: int = 40) -> str:
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return f"Last {len(text)} lines of {log}:\n" + "\n".join(text)


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM to the server's process group; SIGKILL, after `grace` seconds, to whatever
    of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
