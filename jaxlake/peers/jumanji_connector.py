"""Peer: Jumanji ``Connector`` (multi-agent routing in JAX), raw jitted step under vmap.

``Connector(RandomWalkGenerator(grid_size, num_agents), time_limit=max_steps)``: ``num_envs``
instances reset by ``jit(vmap(reset))`` and stepped by a ``lax.scan`` of ``vmap(step)`` with
random actions drawn inside the scan exactly as ``jaxlake.bench`` draws ours (one
``random.bits`` word per agent);
compile time excluded, median of ``repeats`` timed calls (``block_until_ready``). Connector
grids are square and have no holes: the matched row uses ``grid_size = max(height, width)``
and the spec's agent count; with ``connector_default`` the registered ``Connector-v3`` setting
(10x10, 10 agents) is measured too. The generator rate (``jit(vmap(reset))``, lakes/s) is
reported beside it.

What a row keeps of each step (``obs_mode``; the spec's ``modes``, one row each, else
``returned`` with ``observations`` in the spec and ``none`` without):

* ``none``: nothing; the step's observation is dead code that XLA removes;
* ``returned``: Connector's returned observation, kept in the scan's carry as the benchmark keeps
  ours: ``Observation(grid, action_mask, step_count)``, where ``grid`` is the one shared
  ``[G, G]`` int32 grid of the environment copied out of its state (agent ``i``'s path,
  position and target as ``1 + 3i``, ``2 + 3i``, ``3 + 3i``);
* ``relabel``: that observation with its grid relabelled per agent, ``[N, G, G, 2]`` float32
  (:func:`relabel`: the arithmetic of ``process_grid``, which Jumanji runs in the Connector's
  network, not in the environment), kept;
* ``relabel_autoreset``: the same under Jumanji's ``AutoResetWrapper`` (under vmap its
  ``lax.cond`` becomes a select: the generator runs on every step).

``obs_bytes_per_lake_step``: the bytes of what is kept, per environment.

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


#: What a row keeps of each step (spec ``modes``; ``bench.like_for_like``, see :mod:`jaxlake.bench.kinds`).
MODES = ("none", "returned", "relabel", "relabel_autoreset")


def relabel(grid, num_agents: int):
    """``[G, G]`` Connector grid -> ``[N, G, G, 2]`` float32: the per-agent relabel Jumanji's
    Connector network applies to the observation (``process_grid`` in its actor-critic), written
    out: channel 0 holds agent ``i``'s own path / position / target as 1 / 2 / 3, channel 1 every
    other agent's, collapsed to 1 / 2 / 3 alike."""
    import jax.numpy as jnp

    ids = jnp.arange(num_agents, dtype=grid.dtype)[:, None, None]
    cell = grid[None]
    mine = (cell == 1 + 3 * ids) | (cell == 2 + 3 * ids) | (cell == 3 + 3 * ids)  # path, position, target
    own = jnp.where(mine, cell - 3 * ids, 0)
    others = jnp.where(mine | (cell == 0), 0, 1 + (cell - 1) % 3)
    return jnp.stack([own, others], axis=-1).astype(jnp.float32)


def _measure_one(grid_size: int, num_agents: int, spec: dict, mode: str) -> dict:
    import jax
    import jax.numpy as jnp
    import jumanji
    import numpy as np
    from jumanji.environments import Connector
    from jumanji.environments.routing.connector.generator import RandomWalkGenerator
    from jumanji.wrappers import AutoResetWrapper

    if mode not in MODES:
        raise ValueError(f"mode={mode!r} not in {MODES}")
    env = Connector(
        generator=RandomWalkGenerator(grid_size=grid_size, num_agents=num_agents),
        time_limit=int(spec["max_steps"]),
    )
    if mode == "relabel_autoreset":
        env = AutoResetWrapper(env)
    batch, steps = int(spec["num_envs"]), int(spec.get("steps", 64))
    reset = jax.jit(jax.vmap(env.reset))
    keys = jax.random.split(jax.random.PRNGKey(int(spec.get("seed", 0))), batch)

    def body(s, k):
        # Same draw as jaxlake.bench.rollouts.random_actions: one random word per agent, action from its
        # low 16 bits by multiply-shift.
        bits = jax.random.bits(k, (batch, num_agents), jnp.uint32)
        actions = (((bits & 0xFFFF) * 5) >> 16).astype(jnp.int32)
        return jax.vmap(env.step)(s, actions)

    def kept(ts):
        obs = ts.observation
        if mode == "returned":
            return obs
        return obs._replace(grid=jax.vmap(lambda g: relabel(g, num_agents))(obs.grid))

    def roll(state, key):
        keys = jax.random.split(key, steps)
        if mode == "none":  # the step's observation is dead code: XLA drops it

            def plain(s, k):
                s, ts = body(s, k)
                return s, jnp.sum(ts.reward)

            return jax.lax.scan(plain, state, keys)

        # every step's observation (returned, or relabelled) is kept in the carry, as
        # jaxlake.bench keeps ours, so XLA builds and writes it
        def keep(carry, k):
            s, ts = body(carry[0], k)
            return (s, kept(ts)), jnp.sum(ts.reward)

        obs0 = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype),
                                      jax.eval_shape(lambda s, k: kept(body(s, k)[1]), state, key))
        (s, obs), rewards = jax.lax.scan(keep, (state, obs0), keys)
        total = sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree_util.tree_leaves(obs))
        return s, rewards + jnp.minimum(total, 0.0)

    t0 = time.perf_counter()
    reset_c = reset.lower(keys).compile()
    state, _ = reset_c(keys)
    roll_c = jax.jit(roll).lower(state, jax.random.PRNGKey(1)).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(roll_c(state, jax.random.PRNGKey(2)))  # warm-up
    obs_bytes = None
    if mode != "none":
        leaves = jax.tree_util.tree_leaves(jax.eval_shape(lambda s, k: kept(body(s, k)[1]), state,
                                                          jax.random.PRNGKey(0)))
        obs_bytes = sum(x.size * np.dtype(x.dtype).itemsize for x in leaves) / batch

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
    what = {"none": "raw step", "returned": "returned observation kept",
            "relabel": "returned observation + per-agent relabel kept",
            "relabel_autoreset": "AutoResetWrapper, observation + per-agent relabel kept"}[mode]
    return {
        "peer": PEER,
        "system": f"Jumanji Connector {grid_size}x{grid_size}, {num_agents} agents ({what}, vmap+scan)",
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
        "observations": mode != "none",
        "obs_mode": mode,
        "obs_bytes_per_lake_step": obs_bytes,
        "note": "no holes in Connector; square grid" + (f"; {what}" if mode != "none" else ""),
    }


def _main(spec: dict) -> list[dict]:
    size = max(int(spec["height"]), int(spec["width"]))
    modes = spec.get("modes") or ["returned" if spec.get("observations") else "none"]
    rows = [_measure_one(size, int(spec["num_agents"]), spec, mode) for mode in modes]
    if spec.get("connector_default") and (size, int(spec["num_agents"])) != (10, 10):
        rows.extend(_measure_one(10, 10, spec, mode) for mode in modes)
    return rows


def measure(spec: dict, *, root=None, timeout: float = 600.0) -> list[dict]:
    """Measure in Jumanji's own virtual environment (skipped with a note when absent)."""
    from jaxlake.peers.runner import run_script, venv_python

    return run_script(PEER, Path(__file__), venv_python(VENV, root), spec, timeout=timeout)


if __name__ == "__main__":
    print(json.dumps(_main(json.loads(sys.argv[1]))))
