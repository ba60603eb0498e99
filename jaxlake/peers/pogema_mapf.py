"""Peer: POGEMA (multi-agent path finding on random grids, pure Python/NumPy).

``pogema_v0(GridConfig(height, width, num_agents, density=hole_density,
max_episode_steps=max_steps, on_target="finish", seed=None))`` stepped with random joint
actions (NumPy, drawn in chunks); when every agent is done the env is reset, and with
``seed=None`` POGEMA draws a new random map at each reset. Reported: agent-steps/s with those
resets included (as a user sees it), the step rate alone, and the reset (map regeneration)
rate in lakes/s.

POGEMA pins old numpy / gymnasium / pydantic, so it runs in its own virtual environment
(``python -m jaxlake.peers.setup pogema``). Stand-alone:
``<venv>/bin/python -I pogema_mapf.py '<spec json>'`` prints one JSON row.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

PEER = "pogema"
VENV = "pogema"
REQUIREMENTS = ["pogema==1.4.0"]


def _main(spec: dict) -> dict:
    import numpy as np
    import pogema
    from pogema import GridConfig, pogema_v0

    n_agents = int(spec["num_agents"])
    config = GridConfig(
        height=int(spec["height"]),
        width=int(spec["width"]),
        num_agents=n_agents,
        density=float(spec["hole_density"]),
        max_episode_steps=int(spec["max_steps"]),
        on_target="finish",
        seed=None,
    )
    env = pogema_v0(grid_config=config)
    env.reset()
    rng = np.random.default_rng(spec.get("seed", 0))
    rates, cpu_rates, step_only, resets_total = [], [], [], 0
    for _ in range(int(spec.get("repeats", 3))):
        steps, resets, reset_time = 0, 0, 0.0
        start, start_cpu = time.perf_counter(), time.process_time()
        deadline = start + float(spec.get("seconds", 1.0))
        while time.perf_counter() < deadline:
            for joint in rng.integers(0, 5, size=(256, n_agents)).tolist():
                _, _, terminated, truncated, _ = env.step(joint)
                steps += 1
                if all(terminated) or all(truncated):
                    t0 = time.perf_counter()
                    env.reset()
                    reset_time += time.perf_counter() - t0
                    resets += 1
        wall = time.perf_counter() - start
        rates.append(steps * n_agents / wall)
        cpu_rates.append(steps * n_agents / max(time.process_time() - start_cpu, 1e-9))
        step_only.append(steps * n_agents / max(wall - reset_time, 1e-9))
        resets_total += resets
    # Reset (= map regeneration) rate on its own.
    reset_rates = []
    for _ in range(int(spec.get("repeats", 3))):
        count, start = 0, time.perf_counter()
        deadline = start + float(spec.get("seconds", 1.0)) / 2
        while time.perf_counter() < deadline:
            env.reset()
            count += 1
        reset_rates.append(count / (time.perf_counter() - start))
    rate = float(np.median(rates))
    return {
        "peer": PEER,
        "system": f"POGEMA {spec['height']}x{spec['width']}, {n_agents} agents",
        "version": pogema.__version__,
        "height": spec["height"],
        "width": spec["width"],
        "num_agents": n_agents,
        "hole_density": spec["hole_density"],
        "num_envs": 1,
        "env_steps_per_s": rate / n_agents,
        "agent_steps_per_s": rate,
        "agent_steps_per_cpu_s": float(np.median(cpu_rates)),
        "agent_steps_per_s_without_resets": float(np.median(step_only)),
        "resets_per_s": float(np.median(reset_rates)),
        "rates": rates,
        "resets": resets_total,
        "note": "one env from Python; resets (a new random map each) included in agent_steps_per_s",
    }


def measure(spec: dict, *, root=None, timeout: float = 600.0) -> list[dict]:
    """Measure in POGEMA's own virtual environment (skipped with a note when absent)."""
    from jaxlake.peers.runner import run_script, venv_python

    return run_script(PEER, Path(__file__), venv_python(VENV, root), spec, timeout=timeout)


if __name__ == "__main__":
    print(json.dumps(_main(json.loads(sys.argv[1]))))
