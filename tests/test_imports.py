"""specviz's modules import each other without cycles, and every one of them imports."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import specviz

PACKAGE = Path(specviz.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module and package of specviz."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The specviz modules `name` imports anywhere in its file: at module level, in functions (a lazy import
    does not make a cycle go away, it only moves where it breaks) and under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            # `from .engines import jsonl` imports the submodule engines.jsonl; `from .spec import RunSpec`, spec.
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return found & set(modules) - {name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None."""
    state, stack = {}, []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_finds_the_imports_and_their_cycles():
    modules = _modules()
    assert {"specviz.trace", "specviz.decoding.round", "specviz.engines"} <= set(modules)
    assert {"specviz.spec", "specviz.engines.base"} <= _imports("specviz.trace", modules["specviz.trace"], modules)
    assert "specviz.engines.jsonl" in _imports("specviz.check", modules["specviz.check"], modules)
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_specviz_modules_import_each_other_without_cycles():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_imports_in_a_fresh_process():
    names = sorted(_modules())
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(PACKAGE.parent), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-c", code, *names], cwd=PACKAGE.parent, env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
