"""The house's import rules (docs/development.md, "Layout" and "Import rules"), checked on every import statement of both packages,
including the ones inside functions, so no rule can hide behind a lazy import.

``jaxlake``
  * the simulator (every module outside the orchestration room ``jaxlake/pipeline/`` and its
    four command-line names ``run``, ``study``, ``report``, ``pretrain``) imports nothing from ``llm`` nor
    the language-model stack (transformers, torch, tokenizers, optax, orbax, flax's ``nnx`` /
    ``linen``), statically and at run time in a fresh interpreter;
  * only the room's modules import ``llm``; the command-line names reach it through the room.

``jaxlake.adapters``, the room of the standard interfaces (the ``ecosystem`` extra)
  * its modules are thin adapters to JaxMARL, Jumanji and JaxUED (:data:`CLIENTS`): only they
    import a client when they are imported; any other module that uses one imports it inside a
    function (the peers and the student benchmark measure a client, in its own run), so that
    ``import jaxlake`` and every other simulator module load no client (checked at run time in a
    fresh interpreter), and the core works without the extra. The clients themselves load
    ``flax.linen`` (they are built on it): the LM rule above is about what our modules name and
    about ``flax.nnx``, so the adapters stay under it unchanged.

``jaxlake.bench``, the simulator's benchmark (``python -m jaxlake.bench``, :data:`BENCH`)
  * a leaf of the simulator: it imports the simulator (and is part of it for the rules above:
    no ``llm``, no orchestration room, no students, no client at import time), and no other
    module of either package imports it, so the simulator, the rooms and ``llm`` load without it.

``jaxlake.students``, the room of the neural students (IPPO, :data:`STUDENTS`)
  * a learner needs an optimiser and a network library, so this room, unlike the simulator, may
    import ``optax`` and ``flax.linen`` / ``flax.nnx``; it is still not the policy stack: it
    imports nothing of ``llm``, of the orchestration room or of its commands, nor
    ``transformers``, ``torch`` or ``tokenizers`` (a student trains without the LLM stack);
  * its command-line name ``jaxlake.ippo`` (:data:`STUDENT_COMMANDS`) reaches it inside a
    function, and no simulator module imports it, so the simulator's rules above hold for
    every other module unchanged.

``llm``, a stack of layers, lowest first (:data:`LLM_LAYERS`)
  * a module imports ``llm`` modules of its own layer or of lower layers only;
  * ``model``, ``generation`` and ``rl`` import nothing of ``jaxlake`` (they are language-model
    machinery, not the game);
  * the top level holds only the public face (``__init__``) and the command-line names
    ``memory`` and ``evaluate``.

Both packages
  * no import cycle among all their modules (:func:`import_graph`: a module's edges are the
    project modules its import statements name, those inside functions included, so a cycle
    cannot hide behind a lazy import; a ``jaxlake`` -> ``llm`` -> ``jaxlake`` loop counts too).

docs/development.md's Layout block lists every module, subpackage and config group.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jaxlake
import llm
from jaxlake.conf import CONF_DIR

JAXLAKE = Path(jaxlake.__file__).resolve().parent
LLM = Path(llm.__file__).resolve().parent
DEVELOPMENT = Path(__file__).resolve().parents[1] / "docs" / "development.md"

#: jaxlake's orchestration room, the one place that imports llm.
ROOM = "jaxlake.pipeline"
#: ``python -m`` names of the room's commands; they import the room, nothing else of llm.
COMMANDS = {"jaxlake.run", "jaxlake.study", "jaxlake.report", "jaxlake.pretrain"}
#: llm's subpackages, lowest layer first: each may import its own and the ones before it.
LLM_LAYERS = ("model", "generation", "rl", "game", "training", "engineer", "benchmark")
#: layers that know nothing of the game (import no jaxlake).
GAME_FREE = {"model", "generation", "rl"}
#: llm's top-level modules: the public face and two command-line names.
LLM_TOP = {"llm", "llm.memory", "llm.evaluate"}
#: Top-level packages the simulator never imports.
FORBIDDEN = {"llm", "transformers", "torch", "tokenizers", "optax", "orbax"}
#: flax is used for ``flax.struct`` pytree dataclasses only (and its version string).
FORBIDDEN_FLAX = {"flax.nnx", "flax.linen"}
#: The simulator's benchmark: a leaf that imports the simulator; nothing outside it imports it.
BENCH = "jaxlake.bench"
#: The room of the neural students: may import optax and flax linen/nnx, never llm (docstring).
STUDENTS = "jaxlake.students"
#: Its command-line name (``python -m jaxlake.ippo``), which imports the room inside a function.
STUDENT_COMMANDS = {"jaxlake.ippo"}
#: What the student room never imports: the policy stack (the room may use optax and flax).
STUDENT_FORBIDDEN = {"llm", "transformers", "torch", "tokenizers"}
#: The room of the standard interfaces, the only place that imports a client at import time.
ADAPTERS = "jaxlake.adapters"
#: The clients of :data:`ADAPTERS` (the ``ecosystem`` extra; JaxUED brings gymnax).
CLIENTS = {"jaxmarl", "jumanji", "jaxued", "gymnax"}


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules(root: Path) -> dict[str, Path]:
    found = {_module_name(p, root): p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}
    if root == JAXLAKE:  # the configs install as jaxlake.conf (pyproject's package-dir)
        found["jaxlake.conf"] = CONF_DIR / "__init__.py"
    return found


JAXLAKE_MODULES = _modules(JAXLAKE)
LLM_MODULES = _modules(LLM)
ALL = {**JAXLAKE_MODULES, **LLM_MODULES}


def imports(path: Path, name: str) -> set[str]:
    """Every module an import statement of ``path`` (module ``name``) names: ``from a import b``
    gives ``a`` and ``a.b``; relative imports are resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{alias.name}" for alias in node.names)
    return names


def own_imports(name: str) -> set[str]:
    """The project modules ``name`` imports: those its import statements name (a package named
    in one, as ``from jaxlake.pipeline import cluster`` names ``jaxlake.pipeline``, is an edge
    to its ``__init__``; the parent packages Python runs first are not counted, or every
    package would be a cycle with its own modules)."""
    found = {n for n in imports(ALL[name], name) if n in ALL}
    return found - {name}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``{module: the modules of `modules` it imports}``, the edges of :func:`own_imports` (every
    import statement, at the top or inside a function) kept within ``modules``."""
    return {name: {n for n in imports(path, name) if n in modules} - {name} for name, path in modules.items()}


def import_time_roots(path: Path) -> set[str]:
    """The top-level packages named by the absolute imports of ``path`` that run when it is
    imported: those outside function bodies (top level, ``if`` / ``try`` blocks, class bodies)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name.split(".")[0] for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
                found.add(child.module.split(".")[0])
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


def in_adapters(name: str) -> bool:
    return name == ADAPTERS or name.startswith(ADAPTERS + ".")


def _forbidden(name: str) -> bool:
    return name.split(".")[0] in FORBIDDEN or any(name == f or name.startswith(f + ".") for f in FORBIDDEN_FLAX)


def in_room(name: str) -> bool:
    return name == ROOM or name.startswith(ROOM + ".")


def in_bench(name: str) -> bool:
    return name == BENCH or name.startswith(BENCH + ".")


def in_students(name: str) -> bool:
    return name == STUDENTS or name.startswith(STUDENTS + ".")


def layer_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LLM_LAYERS else None


def layer_violations(name: str, path: Path) -> list[str]:
    """The imports of module ``name`` (file ``path``, in an llm layer) that break the layer rule:
    ``llm`` modules of a higher layer, the public face ``llm`` itself (importing it runs
    ``llm/__init__``), and, for the game-free layers, anything of ``jaxlake``."""
    rank = LLM_LAYERS.index(layer_of(name))
    names = imports(path, name)
    ours = {n for n in names if n in LLM_MODULES} - {name}
    up = sorted(n for n in ours if n != "llm" and (layer_of(n) is None or LLM_LAYERS.index(layer_of(n)) > rank))
    if "llm" in ours:
        up.append("llm")
    if layer_of(name) in GAME_FREE:
        up += sorted(n for n in names if n.split(".")[0] == "jaxlake")
    return up


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


# ------------------------------------------------------------------------------- the scanner
def test_scan_sees_both_packages_and_lazy_imports():
    assert {"jaxlake", "jaxlake.env", "jaxlake.conf", "jaxlake.peers.runner", "jaxlake.pipeline.stages",
            "jaxlake.bench", "jaxlake.bench.throughput"} <= set(ALL)
    assert {"llm.model.qwen3", "llm.generation.decode", "llm.rl.grpo", "llm.game.prompts",
            "llm.training.stage", "llm.engineer.local", "llm.benchmark.cli"} <= set(ALL)
    # lazy imports inside functions are seen
    assert "llm.training.evaluate" in own_imports("jaxlake.pipeline.stages")
    assert "llm.training.stage" in own_imports("jaxlake.pipeline.student")
    assert "llm.model.hf_io" in own_imports("llm.training.policy")


def test_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"y2"}, "y2": {"y"}}) == ["y", "y2", "y"]


def test_layer_rule_catches_an_upward_import(tmp_path):
    """The rule itself (:func:`layer_violations`, the function the layer test runs): a model
    module importing the trainer lazily, or the simulator, is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import jaxlake.env\ndef f():\n    from llm.training.stage import train_stage\n")
    assert layer_violations("llm.model.bad", bad) == ["llm.training.stage", "jaxlake.env"]
    good = tmp_path / "good.py"
    good.write_text("from llm.model.qwen3 import Qwen3Config\n")
    assert layer_violations("llm.generation.good", good) == []


# ------------------------------------------------------------------------------------ jaxlake
def test_simulator_modules_import_no_language_model_code():
    bad = {}
    for name, path in JAXLAKE_MODULES.items():
        if in_room(name) or name in COMMANDS or in_students(name) or name in STUDENT_COMMANDS:
            continue
        found = sorted(n for n in imports(path, name)
                       if _forbidden(n) or in_room(n) or n in COMMANDS or in_students(n) or n in STUDENT_COMMANDS)
        if found:
            bad[name] = found
    assert not bad, f"simulator modules importing the LLM stack or the orchestration room: {bad}"


def test_only_the_room_imports_llm():
    direct = {name for name, path in JAXLAKE_MODULES.items()
              if any(n.split(".")[0] == "llm" for n in imports(path, name))}
    assert direct and all(in_room(n) for n in direct), sorted(direct)
    for name in COMMANDS:
        mods = own_imports(name)
        assert any(in_room(m) for m in mods), f"{name} should call into {ROOM}"
        assert not any(m.split(".")[0] == "llm" for m in imports(JAXLAKE_MODULES[name], name)), name


def test_importing_the_simulator_loads_no_language_model_code():
    simulator = sorted(n for n in JAXLAKE_MODULES if not in_room(n) and n not in COMMANDS and not in_students(n))
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


def test_only_the_adapters_import_clients_when_imported(tmp_path):
    """Only :data:`ADAPTERS` import a client at import time; elsewhere a client is imported inside
    a function. The scan itself: a lazy import is allowed, a top-level one inside ``try`` is not."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    import jumanji\ntry:\n    from jaxmarl import make\nexcept ImportError:\n    pass\n")
    assert import_time_roots(probe) & CLIENTS == {"jaxmarl"}
    bad = {name: sorted(found) for name, path in JAXLAKE_MODULES.items()
           if not in_adapters(name) and (found := import_time_roots(path) & CLIENTS)}
    assert not bad, f"modules outside {ADAPTERS} importing a client at import time: {bad}"
    assert any(import_time_roots(path) & CLIENTS for name, path in JAXLAKE_MODULES.items() if in_adapters(name))


def test_importing_the_simulator_loads_no_client():
    """``import jaxlake`` and every simulator module outside :data:`ADAPTERS` load none of
    :data:`CLIENTS` (the core works without the ``ecosystem`` extra)."""
    simulator = sorted(n for n in JAXLAKE_MODULES if not in_room(n) and n not in COMMANDS and not in_adapters(n))
    code = (
        "import importlib, sys\n"
        f"for name in {simulator!r}:\n"
        "    importlib.import_module(name)\n"
        f"loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(CLIENTS)!r}))\n"
        "print(loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"importing the simulator loaded {out.stdout.strip()}\n{out.stderr[-3000:]}"


def test_the_bench_is_a_leaf_of_the_simulator():
    """:data:`BENCH` imports the simulator (the simulator rules above already hold for it) and no
    module outside it, of ``jaxlake`` or of ``llm``, imports it, at the top or inside a function."""
    bench = {n for n in JAXLAKE_MODULES if in_bench(n)}
    assert {BENCH, f"{BENCH}.throughput", f"{BENCH}.rollouts", f"{BENCH}.peers", f"{BENCH}.report"} <= bench
    uses = {n for m in bench for n in own_imports(m) if not in_bench(n)}
    assert {"jaxlake.env", "jaxlake.generator"} & uses, f"{BENCH} should measure the simulator: {sorted(uses)}"
    bad = {name: found for name, path in ALL.items()
           if not in_bench(name) and (found := sorted(n for n in imports(path, name) if in_bench(n)))}
    assert not bad, f"modules outside {BENCH} importing it (the benchmark is a leaf): {bad}"


def test_the_student_room_imports_no_policy_stack():
    """The student room and its command import nothing of ``llm``, the orchestration room, its
    commands, ``transformers``, ``torch`` or ``tokenizers``; the command reaches the room."""
    room = {n for n in JAXLAKE_MODULES if in_students(n)}
    assert room, f"no modules in {STUDENTS}"
    bad = {}
    for name in room | STUDENT_COMMANDS:
        found = sorted(n for n in imports(JAXLAKE_MODULES[name], name)
                       if n.split(".")[0] in STUDENT_FORBIDDEN or in_room(n) or n in COMMANDS)
        if found:
            bad[name] = found
    assert not bad, f"the student room importing the policy stack or the orchestration room: {bad}"
    for name in STUDENT_COMMANDS:
        assert any(in_students(m) for m in own_imports(name)), f"{name} should call into {STUDENTS}"


# ---------------------------------------------------------------------------------------- llm
def test_llm_top_level_is_the_public_face_and_commands():
    top = {n for n in LLM_MODULES if layer_of(n) is None}
    assert top == LLM_TOP, f"llm/ top level holds {sorted(top)}; new modules belong in a layer {LLM_LAYERS}"
    assert {p.name for p in LLM.iterdir() if (p / "__init__.py").is_file()} == set(LLM_LAYERS)


@pytest.mark.parametrize("layer", LLM_LAYERS)
def test_llm_layers_import_downwards_only(layer):
    rank = LLM_LAYERS.index(layer)
    bad = {name: found for name in LLM_MODULES if layer_of(name) == layer
           and (found := layer_violations(name, LLM_MODULES[name]))}
    assert not bad, f"llm.{layer} may import only {LLM_LAYERS[:rank + 1]}" + (
        " and no jaxlake" if layer in GAME_FREE else "") + f"; found {bad}"


def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(n for n in ALL if not n.endswith("__main__"))
    code = "import importlib\n" f"for name in {names!r}:\n" "    importlib.import_module(name)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(LLM.parent))
    assert out.returncode == 0, out.stderr[-3000:]


# ------------------------------------------------------------------------------ both packages
def test_cycle_check_sees_a_cycle_through_a_lazy_import(tmp_path):
    """The graph the cycle test searches (:func:`import_graph`) holds an import made inside a
    function: ``a`` imports ``b`` at the top, ``b`` imports ``a`` only when called."""
    (tmp_path / "a.py").write_text("from pkg.b import helper\n")
    (tmp_path / "b.py").write_text("def helper():\n    from pkg.a import thing\n    return thing\n")
    (tmp_path / "c.py").write_text("import pkg.a\n")
    modules = {f"pkg.{n}": tmp_path / f"{n}.py" for n in "abc"}
    graph = import_graph(modules)
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    (tmp_path / "b.py").write_text("def helper():\n    return 1\n")
    assert find_cycle(import_graph(modules)) is None


@pytest.mark.parametrize("scope", ["jaxlake", "llm", "jaxlake and llm"])
def test_no_import_cycle(scope):
    """No cycle among the modules of ``jaxlake``, of ``llm``, nor through both (the room imports
    ``llm``, whose game layers import the simulator), lazy imports counted."""
    modules = {"jaxlake": JAXLAKE_MODULES, "llm": LLM_MODULES}.get(scope, ALL)
    cycle = find_cycle(import_graph(modules))
    assert cycle is None, f"import cycle among the modules of {scope}: {' -> '.join(cycle)}"


# ------------------------------------------------------------------------------------- the layout page
def _layout_block() -> tuple[str, str]:
    """docs/development.md's "Layout" and "Import rules" sections, and the Layout's tree block."""
    text = DEVELOPMENT.read_text()
    section = text.split("\n## Layout", 1)[1].split("\n## Import rules", 1)[0]
    section += text.split("\n## Import rules", 1)[1].split("\n## ", 1)[0]
    return section, re.search(r"```text\n(.*?)```", section, re.S).group(1)


def test_the_layout_page_lists_the_tree():
    section, block = _layout_block()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", block))
    missing = []
    for name, path in ALL.items():
        if name == "jaxlake.conf" or name.endswith(".__main__"):
            continue
        if path.name == "__init__.py":
            if f"{path.parent.name}/" not in block:
                missing.append(name)
        elif path.stem not in words:
            missing.append(name)
    assert "conf/" in block
    for group in sorted(q for q in CONF_DIR.iterdir() if q.is_dir() and q.name != "__pycache__"):
        if f"{group.name}/" not in block:
            missing.append(f"conf/{group.name}/")
    assert not missing, f"docs/development.md's Layout block does not list {missing}"
    assert "test_layering.py" in section
    for layer in LLM_LAYERS:
        assert f"`{layer}`" in section, layer
