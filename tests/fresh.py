"""Code run in a fresh Python process over the checkout under test, not another installed copy: what
a process that imports only part of specviz sees."""
import os
import subprocess
import sys
from pathlib import Path

import specviz

ROOT = Path(specviz.__file__).resolve().parents[1]


def run_fresh(code: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c code args...` from the checkout's root, with the checkout first on its path."""
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
                          check=False)
