"""Peer: gymnasium ``FrozenLake-v1``, one environment stepped from Python (1 agent).

The map is a random ``height x width`` FrozenLake whose cells are holes with probability
``hole_density`` (redrawn until the goal is reachable, as gymnasium's
``generate_random_map`` does, but for rectangles too); ``is_slippery`` is on when
``slip_prob > 0``. Random actions are drawn by NumPy in chunks, so the time is the
environment's. An episode that ends is reset (same map: gymnasium does not regenerate).

Run by :func:`measure` in the project's interpreter as a subprocess (gymnasium is a dev
dependency); stand-alone: ``python -I gymnasium_frozenlake.py '<spec json>'`` prints one
JSON row.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

PEER = "gymnasium"


def random_desc(height: int, width: int, hole_density: float, rng) -> list[str]:
    """A random FrozenLake map (``S`` top-left, ``G`` bottom-right) with a frozen S-G path."""
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
    desc = random_desc(spec["height"], spec["width"], spec["hole_density"], rng)
    env = gym.make(
        "FrozenLake-v1",
        desc=desc,
        is_slippery=spec.get("slip_prob", 0.0) > 0,
        max_episode_steps=spec["max_steps"],
    )
    env.reset(seed=int(spec.get("seed", 0)))
    chunk = 4096
    rates, cpu_rates, resets = [], [], 0
    for _ in range(int(spec.get("repeats", 3))):
        steps, start, start_cpu = 0, time.perf_counter(), time.process_time()
        deadline = start + float(spec.get("seconds", 1.0))
        while time.perf_counter() < deadline:
            for a in rng.integers(0, 4, size=chunk).tolist():
                _, _, terminated, truncated, _ = env.step(a)
                if terminated or truncated:
                    env.reset()
                    resets += 1
            steps += chunk
        rates.append(steps / (time.perf_counter() - start))
        cpu_rates.append(steps / max(time.process_time() - start_cpu, 1e-9))
    rate = float(np.median(rates))
    return {
        "peer": PEER,
        "system": f"gymnasium FrozenLake-v1 {spec['height']}x{spec['width']} (gym.make, one env)",
        "version": gym.__version__,
        "height": spec["height"],
        "width": spec["width"],
        "num_agents": 1,
        "hole_density": spec["hole_density"],
        "num_envs": 1,
        "env_steps_per_s": rate,
        "agent_steps_per_s": rate,
        "agent_steps_per_cpu_s": float(np.median(cpu_rates)),
        "rates": rates,
        "resets": resets,
        "note": "single agent; episodes reset on the same map (gymnasium does not regenerate)",
    }


def measure(spec: dict, *, root=None, timeout: float = 600.0) -> list[dict]:
    """Measure in a subprocess of the project's interpreter (skipped when gymnasium is absent)."""
    from jaxlake.peers.runner import current_python, run_script

    return run_script(PEER, Path(__file__), current_python(), spec, timeout=timeout)


if __name__ == "__main__":
    print(json.dumps(_main(json.loads(sys.argv[1]))))
