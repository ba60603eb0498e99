"""Print a pip constraints file that pins every dependency of pyproject.toml to its floor.

``pip install -c <this output> ...`` then installs the lowest allowed version of each direct
dependency and the newest compatible version of everything else: the rule of uv's
``--resolution lowest-direct``, with pip (which installs the local CPU build of torch; uv would
fetch the CUDA one). Every requirement must name a floor (``>=`` or ``==``): one without is an
error, so that a new dependency cannot escape this check. The project's own extras
(``jaxlake[...]``) and the accelerator extras (``gpu``, ``tpu``: CUDA/TPU plugins, not
installable on a CPU machine) are skipped.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

SKIP_EXTRAS = ("gpu", "tpu")


def floors(pyproject: Path) -> dict[str, str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra, items in project.get("optional-dependencies", {}).items():
        if extra not in SKIP_EXTRAS:
            reqs += items
    out: dict[str, str] = {}
    for text in reqs:
        req = Requirement(text)
        if req.name == project["name"]:
            continue
        lows = [s.version for s in req.specifier if s.operator in (">=", "==", "~=")]
        if len(lows) != 1:
            raise SystemExit(f"pyproject.toml: {text!r} needs exactly one floor (>=, == or ~=)")
        if out.get(req.name, lows[0]) != lows[0]:
            raise SystemExit(f"pyproject.toml: {req.name} has two floors, {out[req.name]} and {lows[0]}")
        out[req.name] = lows[0]
    return out


def check(pyproject: Path, names: list[str]) -> list[str]:
    """The packages of ``names`` whose installed version is not their floor (local labels such as
    torch's ``+cpu`` aside): what the lowest-versions step must not run with."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    want = floors(pyproject)
    bad = []
    for name in names:
        try:
            got = version(name)
        except PackageNotFoundError:
            bad.append(f"{name}: not installed (floor {want[name]})")
            continue
        if Version(Version(got).public) != Version(want[name]):
            bad.append(f"{name}: {got} installed, floor {want[name]}")
        print(f"  {name}=={got}")
    return bad


if __name__ == "__main__":
    # floors.py [pyproject.toml]          -> the constraints, one `name==floor` a line
    # floors.py --check NAME... (python)  -> exit 1 unless each NAME is installed at its floor
    root = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if sys.argv[1:2] == ["--check"]:
        bad = check(root, sys.argv[2:])
        if bad:
            raise SystemExit("not at the floor of pyproject.toml:\n  " + "\n  ".join(bad))
    else:
        path = Path(sys.argv[1]) if len(sys.argv) > 1 else root
        for name, version in sorted(floors(path).items()):
            print(f"{name}=={version}")
