"""Peer: Jumanji ``Connector`` (multi-agent routing in JAX), raw jitted step under vmap.

``Connector(RandomWalkGenerator(grid_size, num_agents), time_limit=max_steps)``: ``num_envs``
instances reset by ``jit(vmap(reset))`` and stepped by a ``lax.scan`` of ``vmap(step)`` with
random actions drawn inside the scan exactly as ``jaxlake.bench`` draws ours (one
``random.bits`` word per agent);
compile time excluded, median of ``repeats`` timed calls (``block_until_ready``). Connector
grids are square and have no holes: the matched row uses ``grid_size = max(height, width)``
and the spec's agent count; with ``connector_default`` the registered ``Connector-v3`` setting
(10x10, 10 agents) is measured too. The generator rate (``jit(vmap(reset))``, lakes/s) is
reported beside it. With ``observations`` in the spec (``bench.observations``) every step's
observation (the agent-centric grids and action masks) is kept in the scan's carry, as the
benchmark keeps ours; without, the observation is dead code that XLA removes. No auto-reset: Jumanji's ``AutoResetWrapper`` under vmap runs the
generator on every step.

Jumanji runs in its own virtual environment (``python -m jaxlake.peers.setup
jumanji_connector``) so that it never constrains the project's JAX. Stand-alone:
``<venv>/bin/python -I jumanji_connector.py '<spec json>'`` prints a JSON list of rows.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

PEER = "jumanji_connector"
VENV = "jumanji"
REQUIREMENTS = ["jumanji==1.1.2"]


def _measure_one(grid_size: int, num_agents: int, spec: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import jumanji
    import numpy as np
    from jumanji.environments import Connector
    from jumanji.environments.routing.connector.generator import RandomWalkGenerator

    env = Connector(
        generator=RandomWalkGenerator(grid_size=grid_size, num_agents=num_agents),
        time_limit=int(spec["max_steps"]),
    )
    batch, steps = int(spec["num_envs"]), int(spec.get("steps", 64))
    reset = jax.jit(jax.vmap(env.reset))
    keys = jax.random.split(jax.random.PRNGKey(int(spec.get("seed", 0))), batch)

    observe = bool(spec.get("observations", False))

    def body(s, k):
        # Same draw as jaxlake.bench.rollouts.random_actions: one random word per agent, action from its
        # low 16 bits by multiply-shift.
        bits = jax.random.bits(k, (batch, num_agents), jnp.uint32)
        actions = (((bits & 0xFFFF) * 5) >> 16).astype(jnp.int32)
        return jax.vmap(env.step)(s, actions)

    def roll(state, key):
        keys = jax.random.split(key, steps)
        if not observe:  # the step's observation is dead code: XLA drops it

            def plain(s, k):
                s, ts = body(s, k)
                return s, jnp.sum(ts.reward)

            return jax.lax.scan(plain, state, keys)

        # spec["observations"] (bench.observations): every step's observation is kept in the
        # carry, as jaxlake.bench keeps ours, so XLA builds and writes it
        def keep(carry, k):
            s, ts = body(carry[0], k)
            return (s, ts.observation), jnp.sum(ts.reward)

        obs0 = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype),
                                      jax.eval_shape(body, state, key)[1].observation)
        (s, obs), rewards = jax.lax.scan(keep, (state, obs0), keys)
        kept = sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree_util.tree_leaves(obs))
        return s, rewards + jnp.minimum(kept, 0.0)

    t0 = time.perf_counter()
    reset_c = reset.lower(keys).compile()
    state, _ = reset_c(keys)
    roll_c = jax.jit(roll).lower(state, jax.random.PRNGKey(1)).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(roll_c(state, jax.random.PRNGKey(2)))  # warm-up

    times, cpu_times, gen_times = [], [], []
    for r in range(int(spec.get("repeats", 3))):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(roll_c(state, jax.random.PRNGKey(10 + r)))
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        t0 = time.perf_counter()
        jax.block_until_ready(reset_c(jax.random.split(jax.random.PRNGKey(100 + r), batch)))
        gen_times.append(time.perf_counter() - t0)
    env_rate = batch * steps / float(np.median(times))
    return {
        "peer": PEER,
        "system": f"Jumanji Connector {grid_size}x{grid_size}, {num_agents} agents (raw step, vmap+scan)",
        "version": jumanji.__version__,
        "jax_version": jax.__version__,
        "height": grid_size,
        "width": grid_size,
        "num_agents": num_agents,
        "hole_density": 0.0,
        "num_envs": batch,
        "steps": steps,
        "env_steps_per_s": env_rate,
        "agent_steps_per_s": env_rate * num_agents,
        "agent_steps_per_cpu_s": batch * steps * num_agents / max(float(np.median(cpu_times)), 1e-12),
        "resets_per_s": batch / float(np.median(gen_times)),
        "compile_s": compile_s,
        "times_s": times,
        "observations": observe,
        "note": "no holes in Connector; square grid" + ("; observations kept every step" if observe else ""),
    }


def _main(spec: dict) -> list[dict]:
    size = max(int(spec["height"]), int(spec["width"]))
    rows = [_measure_one(size, int(spec["num_agents"]), spec)]
    if spec.get("connector_default") and (size, int(spec["num_agents"])) != (10, 10):
        rows.append(_measure_one(10, 10, spec))
    return rows


def measure(spec: dict, *, root=None, timeout: float = 600.0) -> list[dict]:
    """Measure in Jumanji's own virtual environment (skipped with a note when absent)."""
    from jaxlake.peers.runner import run_script, venv_python

    return run_script(PEER, Path(__file__), venv_python(VENV, root), spec, timeout=timeout)


if __name__ == "__main__":
    print(json.dumps(_main(json.loads(sys.argv[1]))))
