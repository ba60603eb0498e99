"""The student's closed-loop plays of given lakes, as the joint plans it carried out.

:func:`play_plans` plays a batch of lakes step by step with a trained network, greedily or by
sampling, and returns what every agent did at every step, ``[N, max_agents, T]`` action codes:
a plan that :func:`jaxlake.env.rollout` replays *exactly* (the slip of lake ``i`` at step ``t``
draws from ``split(keys[i], T)[t]``, as :func:`~jaxlake.env.rollout` draws it, and an agent that
is no longer active is written as STAY). So the student's episodes are scored by the suite's own
scorer (:func:`jaxlake.suite.score_texts`, on the plans' text) and read by the summaries and the
records like any policy's: per-lake success, falls, conflicts, time-outs and their first events.

The staged pipeline's IPPO student (``python -m jaxlake.run student=ippo``) evaluates its stage
policies on the held-out suite this way.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from jaxlake import env as lake_env_core
from jaxlake.students.envs import lake_obs
from jaxlake.students.network import greedy, sample
from jaxlake.types import STAY, Lake

__all__ = ["play_plans"]


def play_plans(params: Any, apply: Callable, lakes: Lake, keys: jax.Array, *, actors: int, radius: Optional[int],
               horizon: int, sample_key: Optional[jax.Array] = None) -> jax.Array:
    """``[N, max_agents, horizon]`` int32: the actions the policy took on each lake (jittable
    with ``actors``, ``radius``, ``horizon`` static).

    Args:
      params, apply: the network's parameters and ``apply(params, grid, scalars, avail)``.
      lakes: ``N`` lakes (batched leaves).
      keys: ``[N]`` slip keys, one per lake (:func:`jaxlake.env.rollout`'s ``key`` of that lake).
      actors: actor slots (the lakes' largest ``num_agents``).
      radius: the observation's crop radius (``None``: the whole canvas).
      horizon: steps played (at least every lake's ``max_steps``).
      sample_key: ``None``: the most likely available action (greedy); a key: actions sampled
        from the policy (a fresh key per step).
    """
    n = jax.tree_util.tree_leaves(lakes)[0].shape[0]
    max_agents = lakes.max_agents
    step_keys = jnp.swapaxes(jax.vmap(lambda k: jax.random.split(k, horizon))(keys), 0, 1)  # [T, N, 2]
    act_keys = jax.random.split(jax.random.PRNGKey(0) if sample_key is None else sample_key, horizon)

    def one(states, xs):
        slip, k_act = xs
        obs = lake_obs(lakes, states, actors, radius)
        logits, _ = apply(params, obs.grid, obs.scalars, obs.avail)
        chosen = greedy(logits) if sample_key is None else sample(k_act, logits)
        chosen = jnp.where(obs.valid, chosen, STAY)
        actions = jnp.full((n, max_agents), STAY, jnp.int32).at[:, :actors].set(chosen)
        states, _ = jax.vmap(lake_env_core.step)(slip, lakes, states, actions)
        return states, actions

    _, actions = jax.lax.scan(one, lake_env_core.reset(lakes), (step_keys, act_keys))
    return jnp.transpose(actions, (1, 2, 0))
