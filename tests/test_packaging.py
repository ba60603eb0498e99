"""pyproject.toml's [project] installs where it claims, and CI's lowest-versions step checks it.

* Every dependency has a floor (``.ci/floors.py`` turns them into the constraints of
  ``.ci/lowest``); the floors that a known break sets stay at least where they are.
* ``.ci/lowest`` checks every core dependency and torch at its floor after its install, in a
  venv under the temp folder that it removes, and runs the live transformers checks.
* torch is a floor, not a pin (a CPU build already installed is kept); the license is an SPDX
  string, with the setuptools that reads one.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
LOWEST = (REPO / ".ci" / "lowest").read_text()

#: Floors set by a known break (package -> (floor, why)).
KNOWN_FLOORS = {
    "optax": ("0.2.5", "optax.tree.norm (llm/rl/optim.py)"),
    "chex": ("0.1.90", "0.1.89 calls jax.util.unzip2, removed in jax 0.7"),
    "orbax-checkpoint": ("0.11.17", "older ones use jax.experimental.layout.DeviceLocalLayout, removed in jax 0.7"),
    "transformers": ("4.57.1", "the oldest the live checks run with (.ci/lowest)"),
    "pytest-xdist": ("3.8", "--no-loadscope-reorder (tests/conftest.py)"),
}


def _floors() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("ci_floors", REPO / ".ci" / "floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.floors(REPO / "pyproject.toml")


def test_every_dependency_has_a_floor_at_least_the_known_ones():
    floors = _floors()
    names = {Requirement(r).name for r in PROJECT["dependencies"]}
    assert names <= set(floors)
    for name, (floor, why) in KNOWN_FLOORS.items():
        assert Version(floors[name]) >= Version(floor), f"{name} >= {floor}: {why}"


def test_python_license_and_torch():
    assert PROJECT["requires-python"] == ">=3.11"  # jax >= 0.7: no jaxlib wheel for 3.10
    assert PROJECT["license"] == "Apache-2.0"  # SPDX (PEP 639) ...
    (setuptools,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert Requirement(setuptools).specifier.contains("77") and not Requirement(setuptools).specifier.contains("76")
    (torch,) = PROJECT["optional-dependencies"]["torch"]
    spec = Requirement(torch).specifier
    # a range, not a pin: any 2.13 build (the CPU one included) and later patch releases, but not
    # the untested 2.14 that a bare floor resolves to on a fresh CI machine (pyproject says why)
    assert spec.contains("2.13.0+cpu", prereleases=False) and spec.contains("2.13.5") and not spec.contains("2.14.1")
    extras = PROJECT["optional-dependencies"]
    assert [Requirement(r).name for r in extras["gpu"] + extras["tpu"]] == ["jax", "jax"]


def test_lowest_step_checks_every_floor_and_cleans_up():
    check = re.search(r"\"\$py\" \.ci/floors\.py --check ((?:[^\n\\]|\\\n)+)", LOWEST).group(1).replace("\\\n", " ").split()
    core = {Requirement(r).name for r in PROJECT["dependencies"]}
    assert core | {"torch"} <= set(check), f".ci/lowest --check misses {sorted(core | {'torch'} - set(check))}"
    assert 'mktemp -d "${TMPDIR:-/tmp}/' in LOWEST and "trap 'rm -rf \"$work\"' EXIT" in LOWEST
    for test in ("test_portable_export.py", "test_hf_io.py", "test_model_equivalence.py"):
        assert f"tests/llm/model/{test}" in LOWEST
    assert "-n 0" in LOWEST  # serial: the main suite's two workers are done by then
