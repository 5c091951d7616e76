"""The house's layers, checked by import-linter (its contracts are in pyproject.toml): each package
imports only those below it, no cycle joins the modules of a package, the spec, the trace and
the views never reach torch, only the page imports gradio, the page reads traces and reaches the
engine through the serving layer only, the judges never import the decoders they judge, and
attribution's replays judge nothing. Each contract is shown failing when a bad import is planted
in a copy of the tree."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import specviz

ROOT = Path(specviz.__file__).resolve().parents[1]
LINT = ("import sys\nfrom importlinter.cli import "
        "lint_imports_command\nsys.exit(lint_imports_command())")


def _lint(where: Path) -> subprocess.CompletedProcess:
    """import-linter on the tree at `where` (its pyproject.toml, its specviz),
    in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(where), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache"], cwd=where, env=env,
                          capture_output=True, text=True, check=False)


def test_the_layers_hold():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout and "7 kept" in done.stdout


@pytest.fixture
def copy_of_the_tree(tmp_path):
    """specviz and its pyproject.toml, copied: a place to plant bad imports."""
    shutil.copytree(ROOT / "specviz", tmp_path / "specviz",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize("module, line, broken", [
    ("specviz/decoding/batch.py", "from specviz.run import runner",
     "Each layer imports only the layers below it"),
    ("specviz/trace/metrics.py", "import torch",
     "The spec, the trace and the views are read without torch"),
    ("specviz/app/tokens.py", "from specviz.forensics import recompute",
     "The spec, the trace and the views are read without torch"),
    ("specviz/run/runner.py", "import gradio", "Only the page imports gradio"),
    ("specviz/app/runview.py", "from specviz.run.runner import run", "through the serving layer"),
    ("specviz/forensics/watch.py", "from specviz.decoding import eqspec", "never imports our"),
    ("specviz/trace/evidence.py", "from specviz.trace import schema",
     "No cycles between the modules of a package"),
    ("specviz/run/attribution.py", "from specviz.spec.verdicts import verdict",
     "Attribution's replays judge"),
])
def test_a_planted_import_breaks_its_contract(copy_of_the_tree, module, line, broken):
    path = copy_of_the_tree / module
    path.write_text(path.read_text() + f"\n{line}  # planted\n")
    done = _lint(copy_of_the_tree)
    assert done.returncode != 0, done.stdout
    summary = done.stdout[done.stdout.index("Contracts"):].replace("\n", " ")
    assert f"{broken}" in summary and "BROKEN" in summary, done.stdout


def test_every_module_imports_in_a_fresh_process():
    names = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                   for p in (ROOT / "specviz").rglob("*.py") if p.name != "__main__.py")
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
