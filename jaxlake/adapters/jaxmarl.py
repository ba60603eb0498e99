"""MAPF-FrozenLake as a JaxMARL ``MultiAgentEnv`` (the ``ecosystem`` extra).

``reset(key)`` draws a lake from a pre-generated pool (by ``weights``, uniform by default, one
random number a draw: :func:`jaxlake.adapters.pools.make_pool_draw`) and resets it; ``step`` is JaxMARL's own: it splits the key,
plays :meth:`MAPFFrozenLake.step_env` with the first half and, when ``dones["__all__"]``, returns
the reset of a fresh pool lake drawn with the second half instead of the terminal state.

* Agents: one per slot of the pool's capacity ``A = max_agents``, named ``"agent_0"`` ...
  (JaxMARL's names); slots beyond a lake's ``num_agents`` are ABSENT: done from the start, only
  ``STAY`` available, reward 0.
* Observations (per agent, :mod:`jaxlake.observations`): the agent's grid channels (the whole
  canvas, or the egocentric crop of ``radius``) and its two scalars (time left, slip
  probability), as one vector ``[C * G * G' + 2]`` (``flatten=True``: the ``C`` channel planes,
  each ``G x G'`` row by row, then the two scalars; channels first, as XLA's CPU backend writes
  it about ten times as fast as channels last) or a grid ``[G, G', C + 2]`` whose last two
  channels are the scalars as constant planes. In ``dtype``
  ``uint8`` (the default: one byte a value) the channels are 0/1 and the scalars
  ``round(255 * x)``, ``Box(0, 255)``; in ``float32`` everything is exact, ``Box(0, 1)``.
  Actions: ``Discrete(5)`` (``STAY UP DOWN LEFT RIGHT``); each agent's action may come in any
  shape of one integer (a scalar, or ``(1,)`` as JaxMARL's IPPO baselines send it under
  ``jax.vmap(env.step)``; :func:`jaxlake.adapters.common.agent_action`).
* ``get_avail_actions``: :func:`jaxlake.observations.avail_actions` per agent (``[5]`` bool).
* Rewards per agent: :func:`jaxlake.env.step`'s. Dones per agent: the agent is no longer
  ACTIVE (arrived, fell, timed out, or absent); ``"__all__"``: no agent is ACTIVE.
* Infos: ``"terminated"`` and ``"truncated"`` (:func:`jaxlake.levels.step_split`) and
  ``"level"`` (the pool index of the lake played), each ``[A]``, as JaxMARL's training loops
  reshape infos per agent.
* :meth:`MAPFFrozenLake.world_state`: the global state for a centralised critic
  (:func:`jaxlake.observations.global_state` and its scalars, flattened).
* Speed: every pool lake's :class:`jaxlake.observations.ObsCache` is built once, at
  construction, and travels in the state (``LakeEnvState.cache``); ``step`` is JaxMARL's, but it
  picks the next state (the stepped one or, at the episode's end, the reset one) first and
  builds one observation of it, where JaxMARL's builds both and keeps one.

Keys: ``step_env(key, ...)`` passes ``key`` to :func:`jaxlake.env.step` unchanged, so a
trajectory of ``step_env`` with keys ``split(k, T)`` equals ``jaxlake.env.rollout(k, ...)``; the
public ``step(key, ...)`` plays ``step_env`` with ``split(key)[0]`` (JaxMARL's discipline).
"""

from __future__ import annotations

import io
import sys
from functools import partial
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
from flax import struct

from jaxlake import env as core
from jaxlake import levels, observations
from jaxlake.adapters.common import agent_action, observation_dtype, quantize_scalars
from jaxlake.adapters.pools import EnvSource, make_pool, make_pool_draw
from jaxlake.types import ACTIVE, NUM_ACTIONS, Lake, State



def _import_jaxmarl():
    """Import JaxMARL's base class and spaces, leaving the caller's streams as they were.

    JaxMARL 0.2.0's package ``__init__`` imports every environment: its MABrax module sets
    ``sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__`` (undoing any redirection: pytest's
    capture, ``contextlib.redirect_stdout``), then two lines about its optional "submoduled"
    environments are printed to ``sys.__stdout__``. The streams (and ``sys.__stdout__``, to a sink
    during the import, so that those lines are dropped) are restored afterwards.
    """
    saved = sys.stdout, sys.stderr, sys.__stdout__
    sys.stdout = sys.__stdout__ = io.StringIO()
    try:
        from jaxmarl.environments.multi_agent_env import MultiAgentEnv
        from jaxmarl.environments.spaces import Box, Discrete
    finally:
        sys.stdout, sys.stderr, sys.__stdout__ = saved
    return MultiAgentEnv, Box, Discrete


MultiAgentEnv, Box, Discrete = _import_jaxmarl()

__all__ = ["LakeEnvState", "MAPFFrozenLake"]


@struct.dataclass
class LakeEnvState:
    """The environment state: the lake being played, its game state and its pool index.

    Attributes:
      lake: the unbatched :class:`~jaxlake.types.Lake`.
      state: its :class:`~jaxlake.types.State`.
      level: ``[]`` int32, the lake's index in the pool.
      cache: the lake's :class:`~jaxlake.observations.ObsCache` (``reset`` sets it; ``None``:
        computed at every observation, and a state built without one keeps none).
    """

    lake: Lake
    state: State
    level: jax.Array
    cache: Optional[observations.ObsCache] = None


class MAPFFrozenLake(MultiAgentEnv):
    """MAPF-FrozenLake for JaxMARL (module docstring for the conventions).

    Args:
      pool: a batch of lakes (leading ``[P]`` axis) to draw from; or
      env: a :class:`~jaxlake.config.LakeConfig` or a mixture to generate ``pool_size`` lakes
        from (seed ``seed``); ``LakeConfig()`` when neither is given.
      weights: ``[P]`` draw weights of the pool lakes (uniform when ``None``).
      radius: ``None`` for the whole canvas, else the egocentric crop radius.
      flatten: observations as vectors (``True``) or grids with scalar planes.
      dtype: the observations' dtype, ``"uint8"`` (default) or ``"float32"``.
      arrive_reward: as in :func:`jaxlake.env.step`.
      fall_reward: as in :func:`jaxlake.env.step`.
    """

    def __init__(self, pool: Optional[Lake] = None, *, env: Optional[EnvSource] = None, pool_size: int = 256,
                 seed: int = 0, weights: Optional[Sequence[float]] = None, radius: Optional[int] = None,
                 flatten: bool = True, dtype: Any = "uint8", arrive_reward: float = 1.0,
                 fall_reward: float = -1.0) -> None:
        self.dtype = observation_dtype(dtype, ("uint8", "float32"))
        self.pool = make_pool(pool, env=env, size=pool_size, seed=seed)
        self.pool_cache = jax.jit(jax.vmap(observations.make_cache))(self.pool)
        self.draw = make_pool_draw(self.pool.num_agents.shape[0], weights)
        self.sampler = (levels.PoolSampler.uniform(self.pool) if weights is None
                        else levels.PoolSampler(pool=self.pool, weights=jnp.asarray(weights, jnp.float32)))
        super().__init__(num_agents=self.pool.max_agents)
        self.radius = radius
        self.flatten = bool(flatten)
        self.rewards = dict(arrive_reward=float(arrive_reward), fall_reward=float(fall_reward))
        H, W = self.pool.canvas_shape
        G, G2 = (H, W) if radius is None else (2 * int(radius) + 1,) * 2
        C, S = observations.NUM_CHANNELS, observations.NUM_SCALARS
        shape = (G * G2 * C + S,) if self.flatten else (G, G2, C + S)
        high = 255 if self.dtype == jnp.uint8 else 1.0
        self.observation_spaces = {a: Box(0, high, shape, self.dtype) for a in self.agents}
        self.action_spaces = {a: Discrete(NUM_ACTIONS) for a in self.agents}

    # ------------------------------------------------------------------ the MultiAgentEnv API
    def _reset_state(self, key: jax.Array) -> LakeEnvState:
        level = self.draw(key)
        lake, cache = jax.tree_util.tree_map(lambda x: jnp.take(x, level, axis=0, mode="clip"),
                                             (self.pool, self.pool_cache))
        return LakeEnvState(lake=lake, state=core.reset(lake), level=level, cache=cache)

    @partial(jax.jit, static_argnums=(0,))
    def reset(self, key: jax.Array) -> tuple[dict[str, jax.Array], LakeEnvState]:
        state = self._reset_state(key)
        return self.get_obs(state), state

    def _transition(self, key: jax.Array, state: LakeEnvState, actions: dict[str, Any]):
        joint = jnp.stack([agent_action(actions[a], f"actions[{a!r}]") for a in self.agents])
        game, info = core.step(key, state.lake, state.state, joint, **self.rewards)
        state = state.replace(state=game)
        terminated, truncated = levels.step_split(info)
        agent_done = game.status != ACTIVE
        rewards = {a: info.reward[i] for i, a in enumerate(self.agents)}
        dones = {a: agent_done[i] for i, a in enumerate(self.agents)}
        dones["__all__"] = game.done
        infos = {"terminated": terminated, "truncated": truncated,
                 "level": jnp.broadcast_to(state.level, (self.num_agents,))}
        return state, rewards, dones, infos

    def step_env(self, key: jax.Array, state: LakeEnvState, actions: dict[str, Any]):
        state, rewards, dones, infos = self._transition(key, state, actions)
        return self.get_obs(state), state, rewards, dones, infos

    @partial(jax.jit, static_argnums=(0,))
    def step(self, key: jax.Array, state: LakeEnvState, actions: dict[str, Any],
             reset_state: Optional[LakeEnvState] = None):
        """JaxMARL's ``step``: :meth:`step_env` with ``split(key)[0]`` and, once
        ``dones["__all__"]``, the reset with ``split(key)[1]`` (or ``reset_state``) instead;
        one observation, of the state returned."""
        key, key_reset = jax.random.split(key)
        stepped, rewards, dones, infos = self._transition(key, state, actions)
        fresh = self._reset_state(key_reset) if reset_state is None else reset_state
        if state.cache is None:  # a state built without a cache keeps none
            fresh = fresh.replace(cache=None)
        elif fresh.cache is None:
            fresh = fresh.replace(cache=observations.make_cache(fresh.lake))
        state = jax.tree_util.tree_map(lambda x, y: jax.lax.select(dones["__all__"], x, y), fresh, stepped)
        return self.get_obs(state), state, rewards, dones, infos

    def get_obs(self, state: LakeEnvState) -> dict[str, jax.Array]:
        lake, game, cache = state.lake, state.state, state.cache
        scalars = observations.agent_scalars(lake, game)
        scalars = scalars if self.dtype == jnp.float32 else quantize_scalars(scalars)
        if self.flatten:  # the channel planes, then the scalars, in one concatenation
            packed = (observations.packed_grids(lake, game, cache) if self.radius is None
                      else observations.crop_packed(lake, game, self.radius, cache))
            per_agent = jnp.concatenate(observations.planes(packed, self.dtype) + [scalars], axis=-1)
        else:
            obs = observations.observe(lake, game, radius=self.radius, dtype=self.dtype, cache=cache)
            A, G, G2, _ = obs.grid.shape
            planes = jnp.broadcast_to(scalars[:, None, None, :], (A, G, G2, scalars.shape[-1]))
            per_agent = jnp.concatenate([obs.grid, planes], axis=-1)
        return {a: per_agent[i] for i, a in enumerate(self.agents)}

    @partial(jax.jit, static_argnums=(0,))
    def get_avail_actions(self, state: LakeEnvState) -> dict[str, jax.Array]:
        avail = observations.avail_actions(state.lake, state.state, state.cache)
        return {a: avail[i] for i, a in enumerate(self.agents)}

    def world_state(self, state: LakeEnvState) -> jax.Array:
        """``[H * W * (2 + 2A) + 2]`` float32: the global state for a centralised critic."""
        grid = observations.global_state(state.lake, state.state)
        return jnp.concatenate([grid.reshape(-1), observations.global_scalars(state.lake, state.state)])

    @property
    def name(self) -> str:
        return "MAPFFrozenLake"

    @property
    def agent_classes(self) -> dict[str, list[str]]:
        """One class: every agent plays the same game (parameter sharing)."""
        return {"agent": list(self.agents)}
