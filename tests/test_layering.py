"""The layering README's Layout section states, checked against the code.

* The simulator (every module of ``jaxlake/`` except the orchestration modules) imports nothing
  from ``llm`` nor the language-model stack (transformers, torch, tokenizers, optax, orbax,
  flax's ``nnx`` / ``linen``): checked statically on every import statement, including the
  ones inside functions, and at run time in a fresh interpreter.
* The orchestration modules are exactly the ones README names: the modules of ``jaxlake/``
  that reach ``llm`` through their imports are ``pipeline``, ``run`` and ``study``, no more
  (a new one must be named in README) and no fewer (a stale name must leave it).
* README's Layout block lists every module of both packages and every config group.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import jaxlake
import llm
from jaxlake.conf import CONF_DIR

JAXLAKE = Path(jaxlake.__file__).resolve().parent
LLM = Path(llm.__file__).resolve().parent
README = Path(__file__).resolve().parents[1] / "README.md"

#: jaxlake modules that wire the policy (llm/) to the simulator; README names these.
ORCHESTRATION = {"jaxlake.pipeline.stages", "jaxlake.run", "jaxlake.pipeline.study"}
#: Top-level packages the simulator never imports.
FORBIDDEN = {"llm", "transformers", "torch", "tokenizers", "optax", "orbax"}
#: flax is used for ``flax.struct`` pytree dataclasses only (and its version string).
FORBIDDEN_FLAX = {"flax.nnx", "flax.linen"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(JAXLAKE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(JAXLAKE.rglob("*.py")) if "__pycache__" not in p.parts}


def _imports(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names (``from a import b`` gives a and a.b)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{alias.name}" for alias in node.names)
    return names


def _forbidden(name: str) -> bool:
    return name.split(".")[0] in FORBIDDEN or any(name == f or name.startswith(f + ".") for f in FORBIDDEN_FLAX)


def test_module_scan_sees_the_package():
    assert {"jaxlake", "jaxlake.env", "jaxlake.generator", "jaxlake.conf", "jaxlake.peers.runner"} <= set(MODULES)
    assert ORCHESTRATION <= set(MODULES)
    # the scanner does see lazy imports inside functions
    assert "llm.training.stage" in _imports(MODULES["jaxlake.pipeline.stages"])


def test_simulator_modules_import_no_language_model_code():
    bad = {}
    for name, path in MODULES.items():
        if name in ORCHESTRATION:
            continue
        found = sorted(n for n in _imports(path) if _forbidden(n))
        if found:
            bad[name] = found
    assert not bad, f"simulator modules importing the LLM stack (README's Layout says they do not): {bad}"


def test_orchestration_modules_are_the_ones_that_reach_llm():
    edges = {}
    for name, path in MODULES.items():
        edges[name] = {n for n in _imports(path) if n in MODULES or n.split(".")[0] == "llm"}
        # importing jaxlake.x runs jaxlake/__init__.py first
        edges[name] |= {"jaxlake"} if name != "jaxlake" else set()
    reaches: dict[str, bool] = {}

    def reach(name: str, seen: frozenset = frozenset()) -> bool:
        if name.split(".")[0] == "llm":
            return True
        if name in reaches:
            return reaches[name]
        if name in seen or name not in edges:
            return False
        out = any(reach(n, seen | {name}) for n in edges[name])
        if not seen:
            reaches[name] = out
        return out

    wired = {name for name in MODULES if reach(name)}
    assert wired == ORCHESTRATION, (
        f"modules of jaxlake/ that import llm (directly or through other modules): {sorted(wired)}; "
        f"README's Layout names {sorted(ORCHESTRATION)} as the only ones")


def test_importing_the_simulator_loads_no_language_model_code():
    simulator = sorted(n for n in MODULES if n not in ORCHESTRATION)
    code = (
        "import importlib, sys\n"
        f"for name in {simulator!r}:\n"
        "    importlib.import_module(name)\n"
        f"forbidden = {sorted(FORBIDDEN)!r}\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in forbidden or m.startswith('flax.nnx'))\n"
        "print(len(sys.modules), loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"importing the simulator loaded {out.stdout.strip()}\n{out.stderr[-3000:]}"


def _layout_block() -> str:
    text = README.read_text()
    section = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    return section


def test_readme_layout_lists_the_tree():
    section = _layout_block()
    block = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", block))
    missing = []
    for pkg in (JAXLAKE, LLM):
        for p in sorted(pkg.glob("*.py")):
            if p.stem != "__init__" and p.stem not in words:
                missing.append(f"{pkg.name}/{p.name}")
        for d in sorted(q for q in pkg.iterdir() if (q / "__init__.py").is_file()):
            if f"{d.name}/" not in block:
                missing.append(f"{pkg.name}/{d.name}/")
    assert "conf/" in block
    for group in sorted(q for q in CONF_DIR.iterdir() if q.is_dir() and q.name != "__pycache__"):
        if f"{group.name}/" not in block:
            missing.append(f"conf/{group.name}/")
    assert not missing, f"README's Layout block does not list {missing}"
    # the layering paragraph names the orchestration modules this test enforces
    for name in sorted(ORCHESTRATION):
        assert f"`{name.split('.')[-1]}`" in section or f"`{name}`" in section, name
    assert "test_layering.py" in section
