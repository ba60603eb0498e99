"""Peer: gymnasium ``FrozenLake-v1`` as a vector env (``gym.make_vec``, synchronous).

``num_envs`` copies of one random map (see :mod:`jaxlake.peers.gymnasium_frozenlake`) step
together with batched random actions; the vector env resets finished copies itself
(gymnasium's next-step autoreset). ``num_envs`` is capped by the spec's ``vector_num_envs``
(the synchronous vector env loops over copies in Python, so its per-env rate hardly depends
on the count, while building 16k copies takes long).

Stand-alone: ``python -I gymnasium_frozenlake_vector.py '<spec json>'`` prints one JSON row.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

PEER = "gymnasium_vector"


def _random_desc(height, width, hole_density, rng):
    # Same rule as gymnasium_frozenlake.random_desc (kept here: the script runs stand-alone).
    while True:
        grid = [["H" if rng.random() < hole_density else "F" for _ in range(width)] for _ in range(height)]
        grid[0][0], grid[height - 1][width - 1] = "S", "G"
        seen, frontier = {(0, 0)}, [(0, 0)]
        while frontier:
            r, c = frontier.pop()
            for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                nr, nc = r + dr, c + dc
                if 0 <= nr < height and 0 <= nc < width and (nr, nc) not in seen and grid[nr][nc] != "H":
                    seen.add((nr, nc))
                    frontier.append((nr, nc))
        if (height - 1, width - 1) in seen:
            return ["".join(row) for row in grid]


def _main(spec: dict) -> dict:
    import gymnasium as gym
    import numpy as np

    rng = np.random.default_rng(spec.get("seed", 0))
    desc = _random_desc(spec["height"], spec["width"], spec["hole_density"], rng)
    n = int(min(spec.get("num_envs", 256), spec.get("vector_num_envs", 256)))
    envs = gym.make_vec(
        "FrozenLake-v1",
        num_envs=n,
        vectorization_mode="sync",
        desc=desc,
        is_slippery=spec.get("slip_prob", 0.0) > 0,
        max_episode_steps=spec["max_steps"],
    )
    envs.reset(seed=int(spec.get("seed", 0)))
    rates, cpu_rates = [], []
    for _ in range(int(spec.get("repeats", 3))):
        calls, start, start_cpu = 0, time.perf_counter(), time.process_time()
        deadline = start + float(spec.get("seconds", 1.0))
        while time.perf_counter() < deadline:
            for _ in range(8):
                envs.step(rng.integers(0, 4, size=n))
            calls += 8
        rates.append(calls * n / (time.perf_counter() - start))
        cpu_rates.append(calls * n / max(time.process_time() - start_cpu, 1e-9))
    rate = float(np.median(rates))
    return {
        "peer": PEER,
        "system": f"gymnasium FrozenLake-v1 {spec['height']}x{spec['width']} vector env (sync, {n} envs)",
        "version": gym.__version__,
        "height": spec["height"],
        "width": spec["width"],
        "num_agents": 1,
        "hole_density": spec["hole_density"],
        "num_envs": n,
        "env_steps_per_s": rate,
        "agent_steps_per_s": rate,
        "agent_steps_per_cpu_s": float(np.median(cpu_rates)),
        "rates": rates,
        "note": "single agent per env; SyncVectorEnv with its own autoreset",
    }


def measure(spec: dict, *, root=None, timeout: float = 600.0) -> list[dict]:
    """Measure in a subprocess of the project's interpreter (skipped when gymnasium is absent)."""
    from jaxlake.peers.runner import current_python, run_script

    return run_script(PEER, Path(__file__), current_python(), spec, timeout=timeout)


if __name__ == "__main__":
    print(json.dumps(_main(json.loads(sys.argv[1]))))
