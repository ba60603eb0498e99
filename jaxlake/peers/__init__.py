"""Peers measured side by side with ``jaxlake`` by ``python -m jaxlake.bench bench.peers=[...]``.

One module per peer; each measures random-action throughput on a map of the same size,
agent count and hole density as a ``jaxlake`` config and returns result rows (dicts with at
least ``peer``, ``status`` and, when ``status == "ok"``, ``agent_steps_per_s``):

==================== ======================================= ================================
name                 module                                  runs in
==================== ======================================= ================================
``gymnasium``        :mod:`~jaxlake.peers.gymnasium_frozenlake`        project interpreter
``gymnasium_vector`` :mod:`~jaxlake.peers.gymnasium_frozenlake_vector` project interpreter
``pogema``           :mod:`~jaxlake.peers.pogema_mapf`                 own venv (``pogema``)
``jumanji_connector`` :mod:`~jaxlake.peers.jumanji_connector`          own venv (``jumanji``)
==================== ======================================= ================================

Every measurement runs in a subprocess (:mod:`jaxlake.peers.runner`), so peers never share
the benchmark's process, threads or dependencies. Venvs are made by
``python -m jaxlake.peers.setup``; a missing peer gives a ``status="skipped"`` row with a
note, never an error.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from jaxlake.peers import gymnasium_frozenlake, gymnasium_frozenlake_vector, jumanji_connector, pogema_mapf
from jaxlake.peers.runner import skipped

#: Peer name -> module with ``measure(spec, *, root, timeout) -> list[dict]``.
PEERS = {
    "gymnasium": gymnasium_frozenlake,
    "gymnasium_vector": gymnasium_frozenlake_vector,
    "pogema": pogema_mapf,
    "jumanji_connector": jumanji_connector,
}

#: Peers that live in their own virtual environment (``VENV`` and ``REQUIREMENTS`` attributes).
VENV_PEERS = {"pogema": pogema_mapf, "jumanji_connector": jumanji_connector}


def measure_peer(
    name: str, spec: Mapping[str, Any], *, root: Optional[str] = None, timeout: float = 600.0
) -> list[dict]:
    """Result rows of peer ``name`` on ``spec`` (an unknown name is a skipped row)."""
    if name not in PEERS:
        return [skipped(name, f"unknown peer {name!r}; known: {sorted(PEERS)}")]
    return PEERS[name].measure(dict(spec), root=root, timeout=timeout)
