"""The package installs anywhere and its entry points run from any folder.

* README starts with two commands (the main job, the tests); the test one is exactly what ``.ci/run`` runs,
  in a fresh virtualenv (then ``.ci/lowest``, the lowest allowed versions).
* A folder of one's own adds configs beside the package's (docs/guides/configs.md, "Your own
  configs"): the page's block runs from an empty folder.
* No module finds its inputs or places its outputs relative to the source tree.
* The configs are one set of files: the top-level ``conf/`` (installed as the package
  ``jaxlake.conf`` through pyproject's ``package-dir``), the package list names every package
  folder, and the checkout, the editable install and Hydra's ``pkg://jaxlake.conf`` all find
  exactly those files.
* (slow) The wheel, built from a copy of the sources, holds every file of the packages and every
  config (the same list as ``conf/``). Installed with ``--no-deps`` into a venv that sees the
  already installed dependencies (``--system-site-packages``: nothing is downloaded or
  reinstalled) but with every distribution that only the extras (dev, torch, ...) bring made
  unimportable, as if not installed, and without the checkout (no PYTHONPATH, no user site; the
  wheel's copy shadows the editable install), its Hydra lookup finds the same configs, its
  declared dependencies are satisfied, and its entry points run from an empty folder:
  ``python -m jaxlake.run --cfg job`` prints the config the repository composes,
  ``python -m jaxlake.bench bench=tiny`` writes its results under that folder, the README's
  own-config block (docs/guides/configs.md) works, the study composes its config, and ``jaxlake.pipeline.report`` /
  ``llm.benchmark.cli`` / ``llm.training.evaluate`` start. (That the index resolves the
  dependencies is what CI's own ``pip install -e ".[dev,torch]"`` shows.)
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
#: the guide page whose "Your own configs" block the tests run as a user would
OWN_CONFIGS = REPO / "docs" / "guides" / "configs.md"

#: Modules allowed to use ``__file__``, and why.
FILE_USERS = {
    "jaxlake/__init__.py": "an uninstalled source checkout finds conf/ beside the package",
    "jaxlake/bench/throughput.py": "git commit of the benchmarked code, only when it is a checkout",
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
    """README's first block: the main job, then the tests; CI runs the second, exactly, in a fresh venv."""
    readme = _commands(_bash_blocks(README.read_text())[0])
    ci = [c for c in _commands(CI.read_text()) if not c.startswith(("set ", "cd ", "trap "))]
    assert len(readme) == 2, f"README must start with two commands (main job, tests), got {readme}"
    run, test = readme
    assert run == "pip install -e . && python -m jaxlake.run", f"the main job needs no extra: {run}"
    assert test.startswith("pip install -e ") and test.endswith("&& python -m pytest"), test
    assert ci == ['venv=$(mktemp -d "${TMPDIR:-/tmp}/jaxlake-ci.XXXXXX")', 'python -m venv "$venv"',
                  'source "$venv/bin/activate"', test, "bash .ci/lowest"], (
        f".ci/run makes a fresh virtualenv, runs README's test command {test!r} in it, then the "
        f"lowest-versions step, and nothing else: {ci}")


def _own_configs_block() -> str:
    section = OWN_CONFIGS.read_text().split("\n## Your own configs\n", 1)[1].split("\n## ", 1)[0]
    return _bash_blocks(section)[0]


def run_own_configs_block(python: str, cwd: Path, env: dict, only: tuple[int, ...] = (0, 1, 2)) -> list[dict]:
    """Run the guide's own-config block in ``cwd``, its ``python -m jaxlake.run`` commands (those of
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
    assert [c["stages"] for c in configs] == [[3, 4, 3][i] for i in only]


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


# ============================================================================ the configs
#: Run by any interpreter: where ``jaxlake`` and ``jaxlake.conf`` come from, every file of the
#: package ``jaxlake.conf`` (importlib.resources, as a wheel or an editable install maps it) and
#: every config Hydra's ``pkg://jaxlake.conf`` source lists (what ``config_path`` lookups see).
CONF_PROBE = r"""
import importlib.resources, json
import jaxlake, jaxlake.conf
from hydra.core.object_type import ObjectType
from hydra.core.plugins import Plugins
from hydra._internal.sources_registry import SourcesRegistry

def files(node, prefix=""):
    out = []
    for child in node.iterdir():
        if child.name.startswith(".") or child.name == "__pycache__":
            continue
        out += files(child, prefix + child.name + "/") if child.is_dir() else [prefix + child.name]
    return out

Plugins.instance()  # registers Hydra's config sources
source = SourcesRegistry.instance().resolve("pkg")(provider="jaxlake-test", path="pkg://jaxlake.conf")

def configs(path=""):
    join = lambda name: f"{path}/{name}" if path else name
    out = [join(c) for c in source.list(path, ObjectType.CONFIG)]
    for group in source.list(path, ObjectType.GROUP):
        out += configs(join(group))
    return out

print(json.dumps({"jaxlake": jaxlake.__file__, "conf": jaxlake.conf.__file__, "available": source.available(),
                  "files": sorted(files(importlib.resources.files("jaxlake.conf"))), "hydra": sorted(configs())}))
"""


def conf_files(root: Path) -> set[str]:
    """Every file of ``root/conf`` (the configs and the package's ``__init__.py``), relative."""
    return {p.relative_to(root / "conf").as_posix() for p in (root / "conf").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith(".")}


def hydra_names(files: set[str]) -> set[str]:
    """The config names Hydra lists for those files (the YAML files, without the suffix)."""
    return {f.removesuffix(".yaml") for f in files if f.endswith(".yaml")}


def probe_confs(python, cwd: Path, env: dict) -> dict:
    out = subprocess.run([str(python), "-c", CONF_PROBE], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def outside_env(**extra) -> dict:
    """The environment without the checkout: no PYTHONPATH (nor other PYTHON* settings), no
    virtualenv marker, no user site."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    env.update(PYTHONNOUSERSITE="1", JAX_PLATFORMS="cpu", **extra)
    return env


def test_the_package_list_names_every_package_folder():
    """pyproject's explicit package list (no discovery) holds every package folder of jaxlake/ and
    llm/, and maps jaxlake.conf to the top-level conf/ (a folder left out would be missing from
    the wheel; the slow wheel test shows the files themselves)."""
    import tomllib

    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {p.parent.relative_to(REPO).as_posix().replace("/", ".") for name in ("jaxlake", "llm")
               for p in (REPO / name).rglob("__init__.py") if "__pycache__" not in p.parts}
    assert set(setup["packages"]) == folders | {"jaxlake.conf"}
    assert setup["package-dir"] == {"jaxlake.conf": "conf"}
    assert not (REPO / "jaxlake" / "conf").exists(), "one copy of the configs: conf/ at the top level"
    assert CONF_DIR == REPO / "conf"  # a checkout reads its own conf/


def test_checkout_and_editable_install_find_the_same_configs(tmp_path):
    """The checkout (this tree on sys.path) and the environment's editable install (no
    PYTHONPATH, run from an empty folder) find, as files of jaxlake.conf and through Hydra's
    ``pkg://jaxlake.conf``, exactly the files of their tree's conf/."""
    want = conf_files(REPO)
    assert {"config.yaml", "bench.yaml", "__init__.py", "hydra/launcher/slurm.yaml"} <= want
    here = probe_confs(sys.executable, REPO, {**os.environ, "JAX_PLATFORMS": "cpu"})
    assert Path(here["conf"]).resolve().parent == REPO / "conf"
    assert set(here["files"]) == want and here["available"] and set(here["hydra"]) == hydra_names(want)

    found = subprocess.run([sys.executable, "-c", "import jaxlake"], cwd=tmp_path, env=outside_env(),
                           capture_output=True, text=True, timeout=120)
    if found.returncode != 0:
        pytest.skip("no installed jaxlake (pip install -e . first)")
    editable = probe_confs(sys.executable, tmp_path, outside_env())
    # the editable install maps jaxlake.conf to its tree's conf/ (in CI: this checkout; beside
    # another work tree: that tree, compared with its own conf/)
    root = Path(editable["jaxlake"]).resolve().parents[1]
    assert Path(editable["conf"]).resolve().parent == root / "conf", editable["conf"]
    assert set(editable["files"]) == conf_files(root)
    assert editable["available"] and set(editable["hydra"]) == hydra_names(conf_files(root))


# ============================================================================ the wheel
def _run(argv, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, argv))} -> {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


def _copy_sources(dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("jaxlake", "llm", "conf"):
        shutil.copytree(REPO / name, dst / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras_only_modules(requires: list[str]) -> tuple[set[str], set[str]]:
    """Given the wheel's ``Requires-Dist`` lines: the installed distributions that only the
    extras bring in (the requirement closure with every extra minus the closure without), and
    the top-level modules that only those distributions provide."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    extras = {m.group(1) for r in requires for m in [re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", r)] if m}

    def closure(with_extras: set[str]) -> set[str]:
        seen: set[str] = set()
        todo = [(r, with_extras) for r in requires]
        while todo:
            line, wanted = todo.pop()
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in wanted | {""}):
                continue
            name = _canon(req.name)
            if name == "jaxlake":  # the package's own extras (dev = jaxlake[tensorboard,wandb])
                todo += [(r, set(req.extras)) for r in requires]
                continue
            if name in seen:
                continue
            try:
                sub = md.requires(req.name) or []
            except md.PackageNotFoundError:
                continue
            seen.add(name)
            todo += [(r, set(req.extras)) for r in sub]
        return seen

    runtime = closure(set())
    only_extras = closure(extras) - runtime
    modules = {mod for mod, dists in md.packages_distributions().items()
               if dists and all(_canon(d) in only_extras for d in dists) and mod.isidentifier()}
    return only_extras, modules


@pytest.mark.slow
def test_wheel_in_a_venv_runs_from_an_empty_folder(tmp_path):
    times: dict[str, float] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        times[name] = round(now - t, 1)
        t = now

    # 1. the wheel, built (in pip's isolated build environment) from a copy of the sources
    #    (the copy's folder is not called src/: setuptools 84 then fails in bdist_wheel)
    src, wheels = tmp_path / "tree", tmp_path / "wheels"
    _copy_sources(src)
    _run([sys.executable, "-m", "pip", "wheel", src, "--no-deps", "-w", wheels, "-q"], timeout=600)
    (wheel,) = wheels.glob("jaxlake-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip() for line in whl.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    want = conf_files(REPO)
    assert "hydra/launcher/slurm.yaml" in want and "__init__.py" in want
    shipped = {n.removeprefix("jaxlake/conf/") for n in names if n.startswith("jaxlake/conf/")}
    assert shipped == want, (f"configs missing from the wheel: {sorted(want - shipped)}; "
                             f"not in conf/: {sorted(shipped - want)}")
    # every file of the two packages (code and data: a new template or data file needs package data)
    files = {p.relative_to(src).as_posix() for name in ("jaxlake", "llm") for p in (src / name).rglob("*")
             if p.is_file() and not p.name.startswith(".")}
    assert files <= names, f"files of the packages missing from the wheel (pyproject package-data): {sorted(files - names)}"
    assert {"jaxlake/run.py", "jaxlake/bench/__main__.py", "llm/benchmark/cli.py", "jaxlake/conf/config.yaml"} <= names
    assert not [n for n in names if n.startswith(("tests/", "notebooks/", "docs/", "conf/"))]
    lap("build wheel")

    # 2. a venv over the installed dependencies; the wheel alone is installed into it. Whatever
    #    only the extras bring (pytest, torch, ...) is made unimportable there by a .pth file
    #    (None in sys.modules: `import torch` fails and find_spec answers None, as when absent)
    only_extras, blocked = extras_only_modules(requires)
    assert {"pytest", "torch"} <= only_extras and {"pytest", "torch"} <= blocked, (only_extras, blocked)
    assert not {"jax", "flax", "hydra", "transformers", "numpy"} & blocked
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv], timeout=300)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-compile", "-q", wheel],
         timeout=600)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    assert site.resolve().is_relative_to(venv.resolve()), site
    outer = running_site_packages()
    if outer:  # run from inside a virtualenv: `--system-site-packages` reaches the base interpreter's
        (site / "00_jaxlake_test_outer_env.pth").write_text("".join(f"{d}\n" for d in outer))
    (site / "zz_jaxlake_test_no_extras.pth").write_text(
        f"import sys; sys.modules.update(dict.fromkeys({sorted(blocked)!r}))\n")
    lap("venv + install")

    env = outside_env()
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
    # the wheel's declared dependencies are all installed, in versions that satisfy it
    checked = venv_run("-c", DEPS_CHECK, json.dumps(requires)).stdout.strip()
    assert checked == "ok", checked
    # the installed package finds exactly conf/'s files, as package files and through Hydra
    seen = probe_confs(python, work, env)
    assert Path(seen["conf"]).resolve().is_relative_to(venv.resolve()), seen["conf"]
    assert set(seen["files"]) == want and seen["available"] and set(seen["hydra"]) == hydra_names(want)

    # 3. the pipeline's config: the installed package composes what the repository does
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        want_cfg = OmegaConf.to_container(compose("config"), resolve=False)
    got = yaml.safe_load(venv_run("-m", "jaxlake.run", "--cfg", "job").stdout)
    assert got == want_cfg
    lap("probes, jaxlake.run --cfg job")

    # 4. the tiny benchmark writes its results under the current folder (one batch size, no
    # autoreset rows: the bench itself is tested in tests/jaxlake/test_bench.py; ~12 s, not ~29 s)
    venv_run("-m", "jaxlake.bench", "bench=tiny", "bench.batch_sizes=[1]", "bench.autoreset.enabled=false")
    (result,) = work.glob("outputs/bench/*/*/bench.json")
    bench = json.loads(result.read_text())
    assert bench["schema"] == "jaxlake.bench/1" and bench["config"]["name"] == "tiny"
    assert bench["results"] and all(r["status"] == "ok" for r in bench["results"])
    assert bench["meta"]["git_commit"] is None  # an installed wheel is no checkout
    assert {p.name for p in result.parent.iterdir()} >= {"bench.csv", "bench.png"}
    lap("jaxlake.bench bench=tiny")

    # 5. the guide's own-config block against the installed package
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


def running_site_packages() -> list[str]:
    """The running interpreter's own site-packages folders when it runs inside a virtualenv, else [].

    A venv made with ``--system-site-packages`` from inside a virtualenv sees the *base*
    interpreter's packages, not the virtualenv's (``python -m venv`` starts from
    ``sys._base_executable``). Listed in a ``.pth`` file of the new venv, these folders come after
    its own site-packages (the wheel's copy still shadows everything) and before the base
    interpreter's. A ``.pth`` line that is a folder only adds it to ``sys.path``: the ``.pth`` files
    inside (the editable install's finder among them) are not run.
    """
    import site

    if sys.prefix == sys.base_prefix:
        return []
    prefix = Path(sys.prefix).resolve()
    return [d for d in site.getsitepackages() if Path(d).resolve().is_relative_to(prefix)]


#: Run in the venv with the wheel's Requires-Dist lines: each requirement that applies without
#: extras is installed in a version its specifier allows.
DEPS_CHECK = r"""
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
bad = []
for line in json.loads(sys.argv[1]):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        bad.append(f"{req.name} missing")
        continue
    if not req.specifier.contains(version, prereleases=True):
        bad.append(f"{req.name} {version} not {req.specifier}")
print("ok" if not bad else "; ".join(bad))
"""


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
