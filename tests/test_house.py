"""The house's own rules, checked on the tree: every line fits in 100 characters and ruff's
pycodestyle and pyflakes rules pass (ruff's settings are in pyproject.toml), and no module of the
package is over 400 lines. Each check is shown failing on a planted file."""
import subprocess
import sys
from pathlib import Path

import specviz

ROOT = Path(specviz.__file__).resolve().parents[1]
CHECKED = ["specviz", "tests", "benchmarks", "app.py"]
MAX_MODULE_LINES = 400


def _ruff(*paths: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """ruff check on `paths`, from the venv that runs the tests, with the repository's settings."""
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *paths], cwd=cwd,
                          capture_output=True, text=True, check=False)


def test_ruff_passes_at_line_length_100():
    done = _ruff(*CHECKED)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_fails_a_long_line_and_an_unused_import(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "long.py").write_text(f"X = {'1 + ' * 40}1\n")
    (tmp_path / "unused.py").write_text("import os\n")
    out = _ruff("long.py", "unused.py", cwd=tmp_path).stdout
    assert "E501" in out and "F401" in out


def _long_modules(root: Path) -> dict[str, int]:
    lengths = {str(p.relative_to(root)): len(p.read_text().splitlines())
               for p in (root / "specviz").rglob("*.py")}
    return {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES}


def test_no_module_is_over_400_lines():
    assert _long_modules(ROOT) == {}


def test_a_long_module_is_found(tmp_path):
    (tmp_path / "specviz").mkdir()
    (tmp_path / "specviz" / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert _long_modules(tmp_path) == {"specviz/big.py": MAX_MODULE_LINES + 1}
