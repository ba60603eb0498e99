"""The ``llm`` package's import graph: every module imports, and no two modules import each other
(directly or around a longer loop), counting the imports inside functions too, so a cycle cannot
hide behind a lazy import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import llm

LLM = Path(llm.__file__).resolve().parent
MODULES = sorted(f"llm.{p.stem}" for p in LLM.glob("*.py") if p.stem != "__init__")


def llm_imports(path: Path) -> set[str]:
    """The ``llm`` modules (not the package itself) that the import statements of ``path`` name,
    wherever they stand in the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative: inside the llm package
                mod = "llm" + (f".{mod}" if mod else "")
            names.add(mod)
            names.update(f"{mod}.{alias.name}" for alias in node.names)
    return {n for n in names if n in MODULES}


def import_graph() -> dict[str, set[str]]:
    return {m: llm_imports(LLM / f"{m.split('.', 1)[1]}.py") - {m} for m in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``None`` (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"y2"}, "y2": {"y"}}) == ["y", "y2", "y"]


def test_scan_sees_the_trainer_and_lazy_imports():
    graph = import_graph()
    assert {"llm.training.stage", "llm.training.warmstart", "llm.training.grpo_loop", "llm.rl.updates", "llm.training.policy"} <= set(graph)
    assert {"llm.training.warmstart", "llm.training.grpo_loop"} <= graph["llm.training.stage"]
    # llm.training.policy imports llm.model.hf_io inside load_policy only: the scan sees it
    assert "llm.model.hf_io" in graph["llm.training.policy"]


def test_llm_modules_have_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import cycle among llm modules: {' -> '.join(cycle)}"


def test_every_llm_module_imports_in_a_fresh_interpreter():
    code = (
        "import importlib\n"
        f"for name in {MODULES!r}:\n"
        "    importlib.import_module(name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(LLM.parent))
    assert out.returncode == 0, out.stderr[-3000:]
