"""Run a peer's measuring script in a subprocess and read the JSON it prints.

Every peer module under :mod:`jaxlake.peers` is also a stand-alone script: run with the
peer's interpreter (the project's own Python for gymnasium, a private virtual environment
for POGEMA and Jumanji, see :mod:`jaxlake.peers.setup`), it takes one JSON argument (the
spec, see :data:`SPEC_FIELDS`), measures, and prints one JSON object on its last stdout line.
The script imports nothing from ``jaxlake``, so it runs in an environment that lacks the
project. It is started with ``python -I`` so that the script's own folder is not put on
``sys.path`` (a peer module named like the library it measures would shadow it).

A peer that is not installed or fails is never an error for the benchmark: :func:`run_script`
returns a row with ``status="skipped"`` and a ``note`` saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

#: Fields of a peer spec (all sent as JSON to the peer script).
SPEC_FIELDS = {
    "height": "grid rows",
    "width": "grid columns",
    "num_agents": "agents per env",
    "hole_density": "share of obstacle/hole cells",
    "slip_prob": "slip probability (gymnasium: is_slippery when > 0)",
    "max_steps": "episode horizon",
    "num_envs": "batch size for vectorised peers",
    "steps": "scan length per timed call (JAX peers)",
    "seconds": "wall-clock budget per timed window (Python peers)",
    "repeats": "timed windows; the median is reported",
    "seed": "random seed",
    "observations": "JAX peers: keep every step's observation (bench.observations); Python peers always build it",
    "modes": "Jumanji Connector: what each row keeps of a step (none, returned, relabel, relabel_autoreset)",
}

#: Environment variable that moves the folder holding the peers' virtual environments.
ROOT_ENV = "JAXLAKE_PEERS_ROOT"


def peers_root(root: Optional[str] = None) -> Path:
    """Folder of the peers' virtual environments (``~/.cache/jaxlake/peers`` by default)."""
    if root:
        return Path(os.path.expanduser(str(root)))
    env = os.environ.get(ROOT_ENV)
    if env:
        return Path(os.path.expanduser(env))
    return Path.home() / ".cache" / "jaxlake" / "peers"


def venv_python(venv: str, root: Optional[str] = None) -> Path:
    """The interpreter of the peer virtual environment ``<root>/<venv>-venv``."""
    return peers_root(root) / f"{venv}-venv" / "bin" / "python"


def skipped(peer: str, note: str, **extra: Any) -> dict:
    """A result row for a peer that could not be measured."""
    return {"peer": peer, "status": "skipped", "note": note, **extra}


def run_script(
    peer: str,
    script: Path,
    python: Path | str,
    spec: Mapping[str, Any],
    *,
    timeout: float = 600.0,
    env: Optional[Mapping[str, str]] = None,
) -> list[dict]:
    """Run ``python -I script '<spec json>'`` and return its result rows.

    The script prints a JSON object (one row) or a list of them as its last stdout line.
    Returns ``[skipped(...)]`` when the interpreter is missing, the script exits non-zero,
    times out, or prints no JSON.
    """
    python = Path(python)
    if not python.exists():
        return [skipped(peer, f"interpreter {python} not found; run `python -m jaxlake.peers.setup {peer}`")]
    run_env = dict(os.environ)
    run_env.update(env or {})
    try:
        proc = subprocess.run(
            [str(python), "-I", str(script), json.dumps(dict(spec))],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=run_env,
        )
    except subprocess.TimeoutExpired:
        return [skipped(peer, f"timed out after {timeout:.0f} s")]
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return [skipped(peer, f"exit code {proc.returncode}: {' | '.join(tail)}")]
    lines = [line for line in proc.stdout.strip().splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return [skipped(peer, "printed no JSON result")]
    rows = result if isinstance(result, list) else [result]
    for row in rows:
        row.setdefault("peer", peer)
        row.setdefault("status", "ok")
    return rows


def current_python() -> Path:
    """The interpreter running the benchmark (used for peers installed with the project)."""
    return Path(sys.executable)
