"""Create the peers' private virtual environments: ``python -m jaxlake.peers.setup [peer ...]``.

POGEMA pins old numpy / gymnasium / pydantic and Jumanji brings its own JAX, so neither is
installed next to the project. This command makes ``<root>/<venv>-venv`` (root:
``~/.cache/jaxlake/peers`` or ``$JAXLAKE_PEERS_ROOT`` or ``--root``) with the interpreter that
runs it and pip-installs the peer's pinned requirements there. The gymnasium peers need no
set-up (gymnasium is a dev dependency of the project). Idempotent: an environment whose
interpreter already imports the peer is left alone unless ``--force``.

Examples::

    python -m jaxlake.peers.setup                    # all peers with a venv
    python -m jaxlake.peers.setup pogema             # just POGEMA
    python -m jaxlake.peers.setup --root /tmp/peers jumanji_connector
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import venv
from typing import Optional, Sequence

from jaxlake.peers import VENV_PEERS
from jaxlake.peers.runner import peers_root, venv_python

#: Module each venv peer must be able to import once installed.
IMPORT_CHECK = {"pogema": "pogema", "jumanji_connector": "jumanji"}


def is_installed(peer: str, root: Optional[str] = None) -> bool:
    """True when the peer's venv exists and imports the peer package."""
    module = VENV_PEERS[peer]
    python = venv_python(module.VENV, root)
    if not python.exists():
        return False
    check = subprocess.run([str(python), "-I", "-c", f"import {IMPORT_CHECK[peer]}"], capture_output=True)
    return check.returncode == 0


def install(peer: str, root: Optional[str] = None, *, force: bool = False) -> bool:
    """Create the venv of ``peer`` and pip-install its requirements; True on success."""
    if peer not in VENV_PEERS:
        raise SystemExit(f"peer={peer!r} needs no venv or is unknown; venv peers: {sorted(VENV_PEERS)}")
    module = VENV_PEERS[peer]
    if not force and is_installed(peer, root):
        print(f"[peers] {peer}: already installed at {venv_python(module.VENV, root).parent.parent}")
        return True
    path = peers_root(root) / f"{module.VENV}-venv"
    print(f"[peers] {peer}: creating {path} and installing {module.REQUIREMENTS}", flush=True)
    venv.EnvBuilder(with_pip=True, clear=force).create(path)
    cmd = [str(path / "bin" / "python"), "-m", "pip", "install", *module.REQUIREMENTS]
    ok = subprocess.run(cmd).returncode == 0 and is_installed(peer, root)
    print(f"[peers] {peer}: {'ok' if ok else 'FAILED'}", flush=True)
    return ok


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxlake.peers.setup", description=__doc__.splitlines()[0])
    parser.add_argument("peers", nargs="*", help=f"peers to install (default: all of {sorted(VENV_PEERS)})")
    parser.add_argument("--root", default=None, help="folder for the venvs (default ~/.cache/jaxlake/peers)")
    parser.add_argument("--force", action="store_true", help="recreate existing venvs")
    args = parser.parse_args(argv)
    results = [install(p, args.root, force=args.force) for p in (args.peers or sorted(VENV_PEERS))]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
