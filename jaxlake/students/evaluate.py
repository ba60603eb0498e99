"""Greedy evaluation on held-out lakes: closed loop, step by step, the most likely available
action of every agent at every step.

Every lake is reset and played for the mixture's longest horizon (an episode that is done
stays as it is, docs/rules.md#conventions); slips, when a lake has them, draw from a fixed
key. A lake is a *success* when every agent in play arrived (the suite's definition).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from jaxlake import env as lake_env_core
from jaxlake.students.envs import lake_obs
from jaxlake.students.network import greedy
from jaxlake.types import ABSENT, ARRIVED, FELL, TIMED_OUT, Lake

__all__ = ["EvalResult", "evaluate_greedy"]


class EvalResult(NamedTuple):
    """Held-out results: means over lakes (``[]``) and the per-lake ``success`` ``[N]``."""

    success: jax.Array
    arrived: jax.Array
    fell: jax.Array
    timed_out: jax.Array
    per_lake: jax.Array


def evaluate_greedy(params: Any, apply: Callable, lakes: Lake, *, actors: int, radius: Optional[int],
                    horizon: int, key: jax.Array) -> EvalResult:
    """Play ``lakes`` (leaves ``[N, ...]``) greedily for ``horizon`` steps (jittable).

    Args:
      params, apply: the network's parameters and ``apply(params, grid, scalars, avail)``.
      lakes: the held-out lakes.
      actors: actor slots (the mixture's largest ``num_agents``).
      radius: the observation's crop radius (``None``: the whole canvas).
      horizon: static number of steps (at least every lake's ``max_steps``).
      key: the slip noise's key.
    """
    n = jax.tree_util.tree_leaves(lakes)[0].shape[0]
    max_agents = lakes.max_agents

    def one(states, k):
        obs = lake_obs(lakes, states, actors, radius)
        logits, _ = apply(params, obs.grid, obs.scalars, obs.avail)
        actions = jnp.zeros((n, max_agents), jnp.int32).at[:, :actors].set(greedy(logits))
        states, _ = jax.vmap(lake_env_core.step)(jax.random.split(k, n), lakes, states, actions)
        return states, None

    states, _ = jax.lax.scan(one, lake_env_core.reset(lakes), jax.random.split(key, int(horizon)))
    status = states.status
    in_play = status != ABSENT
    agents = jnp.maximum(jnp.sum(in_play, axis=-1), 1)
    per_lake = jnp.all((status == ARRIVED) | ~in_play, axis=-1).astype(jnp.float32)

    def share(code):
        return jnp.mean(jnp.sum(status == code, axis=-1) / agents)

    return EvalResult(success=jnp.mean(per_lake), arrived=share(ARRIVED), fell=share(FELL),
                      timed_out=share(TIMED_OUT), per_lake=per_lake)
