"""The peers of ``python -m jaxlake.bench`` (``bench.peers``): each peer simulator of
:mod:`jaxlake.peers` run on the maps of our ``bench.envs``, from the ``bench.peer`` settings.

* :func:`peer_spec`: what a peer is asked to run for one of our envs (the same map size, agent
  count, hole density, slip probability and horizon; ``bench.peer``'s batch, timing and
  observation settings; with ``bench.like_for_like`` the Connector's ``modes``);
* :func:`measure_peers`: the peers' result rows, each peer measured in its own subprocess by
  :func:`jaxlake.peers.measure_peer` (a missing peer is a skipped row with a note, never an error).

:func:`jaxlake.bench.report.peer_ratios` then sets them against our rollouts.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from jaxlake.config import LakeConfig

__all__ = ["measure_peers", "peer_spec"]


def peer_spec(config: LakeConfig, settings: Mapping[str, Any], steps: int, seed: int) -> dict:
    """The spec a peer runs for our env ``config`` (``settings``: ``bench.peer``, with
    ``observations`` set from ``bench.observations``)."""
    return {
        "height": config.height, "width": config.width, "num_agents": config.num_agents,
        "hole_density": config.hole_density, "slip_prob": config.slip_prob,
        "max_steps": config.max_steps, "num_envs": int(settings.get("batch_size", 16384)),
        "steps": steps, "seconds": float(settings.get("seconds", 2.0)),
        "repeats": int(settings.get("repeats", 3)), "seed": seed,
        "vector_num_envs": int(settings.get("vector_num_envs", 256)),
        "connector_default": bool(settings.get("jumanji_default", False)),
        "observations": bool(settings.get("observations", False)),
        **({"modes": list(settings["modes"])} if settings.get("modes") else {}),
    }


def measure_peers(peers: Sequence[str], envs: Mapping[str, LakeConfig], settings: Mapping[str, Any],
                  steps: int, seed: int) -> list[dict]:
    """Peer rows for every peer on every env named in ``settings["envs"]``."""
    from jaxlake.peers import measure_peer

    rows = []
    for env_name in settings.get("envs") or list(envs)[:1]:
        if env_name not in envs:
            rows.append({"peer": "*", "status": "skipped", "env": env_name,
                         "note": f"bench.peer.envs names {env_name!r}, not in bench.envs {sorted(envs)}"})
            continue
        spec = peer_spec(envs[env_name], settings, steps, seed)
        for peer in peers:
            print(f"[bench] peer {peer} on {env_name} ...", flush=True)
            for row in measure_peer(peer, spec, root=settings.get("root"),
                                    timeout=float(settings.get("timeout_s", 900))):
                row["env"] = env_name
                rows.append(row)
    return rows
