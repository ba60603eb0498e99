"""The package installs anywhere and its entry points run from any folder.

* README starts with two commands (the main job, the tests); the test one is exactly what ``.ci/run`` runs
  first (then ``.ci/lowest``, the lowest allowed versions).
* A folder of one's own adds configs beside the package's (README, "Your own configs"): the
  README block runs from an empty folder.
* No module finds its inputs or places its outputs relative to the source tree.
* (slow) The wheel, built from a copy of the sources, holds every config; installed into a
  fresh venv (no system site-packages, no user site, no editable install, no PYTHONPATH),
  its entry points run from an empty folder: ``python -m jaxlake.run --cfg job`` prints the
  config the repository composes, ``python -m jaxlake.bench bench=tiny`` writes its results
  under that folder, the README's own-config block works, the study composes its config, and
  ``jaxlake.pipeline.report`` / ``llm.benchmark.cli`` / ``llm.training.evaluate`` start. Dependencies come from the
  package index as configured for pip (``--prefer-binary``; ``--no-compile`` skips
  byte-compiling the dependencies, most of the install time).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

import jaxlake
import llm
from jaxlake.conf import CONF_DIR

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CI = REPO / ".ci" / "run"

#: Modules allowed to use ``__file__``, and why.
FILE_USERS = {
    "jaxlake/__init__.py": "an uninstalled source checkout finds conf/ beside the package",
    "jaxlake/bench.py": "git commit of the benchmarked code, only when it is a checkout",
    "jaxlake/peers/gymnasium_frozenlake.py": "runs its own peer script",
    "jaxlake/peers/gymnasium_frozenlake_vector.py": "runs its own peer script",
    "jaxlake/peers/jumanji_connector.py": "runs its own peer script",
    "jaxlake/peers/pogema_mapf.py": "runs its own peer script",
}


def _commands(block: str) -> list[str]:
    """Shell commands of a block: comments and blank lines dropped."""
    out = []
    for line in block.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def test_readme_first_commands_are_what_ci_runs():
    readme = _commands(_bash_blocks(README.read_text())[0])
    ci = [c for c in _commands(CI.read_text()) if not c.startswith(("set ", "cd "))]
    assert len(readme) == 2, f"README must start with two commands (main job, tests), got {readme}"
    run, test = readme
    assert run.startswith("pip install -e ") and run.endswith("&& python -m jaxlake.run"), run
    assert test.startswith("pip install -e ") and test.endswith("&& python -m pytest -q"), test
    assert run.split(" && ")[0] == test.split(" && ")[0], "both README commands install the same extras"
    assert ci[:1] == [test], f"README's test command {test!r} differs from .ci/run's first {ci}"
    assert ci[1:] == ["bash .ci/lowest"], f".ci/run runs the lowest-versions step after it, and nothing else: {ci}"


def _own_configs_block() -> str:
    section = README.read_text().split("\n## Your own configs\n", 1)[1].split("\n## ", 1)[0]
    return _bash_blocks(section)[0]


def run_own_configs_block(python: str, cwd: Path, env: dict, only: tuple[int, ...] = (0, 1, 2)) -> list[dict]:
    """Run README's own-config block in ``cwd``, its ``python -m jaxlake.run`` commands (those of
    index ``only``) with ``--cfg job``; their configs."""
    lines = _own_configs_block().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("python -m "))
    setup = "\n".join(lines[:first]) + "\n"
    subprocess.run(["bash", "-euc", setup], cwd=cwd, env=env, check=True, timeout=60)
    configs = []
    commands = _commands("\n".join(lines[first:]))
    assert len(commands) == 3, commands
    for command in (commands[i] for i in only):
        argv = shlex.split(command)
        assert argv[:3] == ["python", "-m", "jaxlake.run"], command
        out = subprocess.run([python, *argv[1:], "--cfg", "job"], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, f"{command}\n{out.stderr[-3000:]}"
        configs.append(yaml.safe_load(out.stdout))
    return configs


def check_own_configs(configs: list[dict], only: tuple[int, ...] = (0, 1, 2)) -> None:
    assert len(configs) == len(only)
    for cfg in configs:  # the user's env option, composed with the package's groups
        assert (cfg["env"]["height"], cfg["env"]["width"], cfg["env"]["max_width"]) == (3, 7, 8), cfg["env"]
        assert cfg["model"]["hidden_size"] > 0 and "grpo" in cfg["train"] and cfg["engineer"]["name"]
    assert [c["experiment"] for c in configs] == [["default", "wide3", "default"][i] for i in only]
    assert [c["stages"] for c in configs] == [[2, 3, 2][i] for i in only]


def test_own_config_folder_from_an_empty_folder(tmp_path):
    """The primary config of one's own on the package's (the wheel test runs all three commands)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    check_own_configs(run_own_configs_block(sys.executable, tmp_path, env, only=(1,)), only=(1,))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_conf"]  # --cfg job writes nothing


def test_no_module_resolves_paths_from_the_source_tree():
    """Inputs come from the package (``jaxlake.conf.CONF_DIR``), outputs go to the current folder."""
    bad = []
    for pkg in (Path(jaxlake.__file__).parent, Path(llm.__file__).parent):
        for path in sorted(pkg.rglob("*.py")):
            rel = path.relative_to(pkg.parent).as_posix()
            tree = ast.parse(path.read_text(), filename=rel)
            uses = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "__file__"]
            if uses and rel not in FILE_USERS:
                bad.append(f"{rel}:{uses}")
    assert not bad, f"modules resolving paths from their own location (use CONF_DIR or the current folder): {bad}"


# ============================================================================ the wheel
def _run(argv, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, argv))} -> {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


def _copy_sources(dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("jaxlake", "llm"):
        shutil.copytree(REPO / name, dst / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_runs_from_an_empty_folder(tmp_path):
    times: dict[str, float] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        times[name] = round(now - t, 1)
        t = now

    # 1. the wheel, built (in pip's isolated build environment) from a copy of the sources
    src, wheels = tmp_path / "src", tmp_path / "wheels"
    _copy_sources(src)
    _run([sys.executable, "-m", "pip", "wheel", src, "--no-deps", "-w", wheels, "-q"], timeout=600)
    (wheel,) = wheels.glob("jaxlake-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"conf/{p.relative_to(CONF_DIR).as_posix()}" for p in CONF_DIR.rglob("*.yaml")}
    assert "conf/hydra/launcher/slurm.yaml" in configs
    assert configs <= names, f"configs missing from the wheel: {sorted(configs - names)}"
    # every file of the two packages (code and data: a new template or data file needs package data)
    files = {p.relative_to(src).as_posix() for name in ("jaxlake", "llm") for p in (src / name).rglob("*")
             if p.is_file() and not p.name.startswith(".")}
    assert files <= names, f"files of the packages missing from the wheel (pyproject package-data): {sorted(files - names)}"
    assert {"jaxlake/run.py", "jaxlake/bench.py", "llm/benchmark/cli.py", "conf/__init__.py"} <= names
    assert not [n for n in names if n.startswith(("tests/", "notebooks/", "docs/"))]
    lap("build wheel")

    # 2. a fresh venv: no system site-packages; the wheel and its dependencies only
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], timeout=300)
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--prefer-binary", "--no-compile", "-q",
          wheel], timeout=1800)
    lap("venv + install")

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    env.update(PYTHONNOUSERSITE="1", JAX_PLATFORMS="cpu")
    work = tmp_path / "work"
    work.mkdir()

    def venv_run(*args, **kw) -> subprocess.CompletedProcess:
        return _run([python, *args], cwd=work, env=env, timeout=600, **kw)

    probe = venv_run("-c", "import importlib.util as u, jaxlake, llm\n"
                           "print(jaxlake.__file__); print(llm.__file__)\n"
                           "print([m for m in ('pytest', 'torch') if u.find_spec(m) is not None])")
    jl, lm, extra = probe.stdout.strip().splitlines()
    assert Path(jl).resolve().is_relative_to(venv.resolve()), jl  # the installed copy, not the checkout
    assert Path(lm).resolve().is_relative_to(venv.resolve()), lm
    assert extra == "[]", f"the venv sees the development environment's {extra}"

    # 3. the pipeline's config: the installed package composes what the repository does
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        want = OmegaConf.to_container(compose("config"), resolve=False)
    got = yaml.safe_load(venv_run("-m", "jaxlake.run", "--cfg", "job").stdout)
    assert got == want
    lap("jaxlake.run --cfg job")

    # 4. the tiny benchmark writes its results under the current folder
    venv_run("-m", "jaxlake.bench", "bench=tiny")
    (result,) = work.glob("outputs/bench/*/*/bench.json")
    bench = json.loads(result.read_text())
    assert bench["schema"] == "jaxlake.bench/1" and bench["config"]["name"] == "tiny"
    assert bench["results"] and all(r["status"] == "ok" for r in bench["results"])
    assert bench["meta"]["git_commit"] is None  # an installed wheel is no checkout
    assert {p.name for p in result.parent.iterdir()} >= {"bench.csv", "bench.png"}
    lap("jaxlake.bench bench=tiny")

    # 5. README's own-config block against the installed package
    own = tmp_path / "own"
    own.mkdir()
    check_own_configs(run_own_configs_block(str(python), own, env))
    lap("own configs")

    # 6. the other entry points start from here; the study composes its config from the package
    study = _run_rc(python, ["-m", "jaxlake.study", "--no-run", "--", "runs_dir=runs"], work, env)
    assert study.returncode == 1 and "run the sweep first" in study.stderr, study.stderr[-3000:]
    helps = venv_run("-c", HELP_ALL).stdout  # one interpreter: `python -m <module> --help` for each
    for module in HELP_MODULES:
        assert f"[{module}] usage:" in helps, helps[-3000:]
    assert sorted(p.name for p in work.iterdir()) == ["outputs"]  # nothing else written here
    lap("study, report, benchmark, evaluate")
    print(f"\n[test_install] seconds per step: {times}, total {sum(times.values()):.0f}")


HELP_MODULES = ("jaxlake.pipeline.report", "llm.benchmark.cli", "llm.training.evaluate", "jaxlake.pipeline.study")
HELP_ALL = f"""
import contextlib, io, runpy, sys
for module in {HELP_MODULES!r}:
    sys.argv = [module, "--help"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            assert stop.code in (0, None), (module, stop.code)
    print(f"[{{module}}] " + buf.getvalue().lstrip())
"""


def _run_rc(python: Path, args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
