"""MAPF-FrozenLake as a JaxUED ``UnderspecifiedEnv`` (the ``ecosystem`` extra): a level is a
:class:`~jaxlake.types.Lake`.

* ``reset_to_level(rng, lake, params)`` resets the lake (``rng`` is not used: a reset has no
  randomness); ``step(rng, state, action, params)`` plays :func:`jaxlake.env.step` with ``rng``
  as its key (JaxUED's ``step`` passes it through unchanged), so a trajectory stepped with keys
  ``split(k, T)`` equals ``jaxlake.env.rollout(k, lake, plan)``.
* The action is ``[A]`` int32, one per agent slot (any shape of ``A`` integers is taken,
  ``(A, 1)`` too: :func:`jaxlake.adapters.common.joint_actions`); ``action_space(params)`` is
  gymnax's ``Discrete(5)``, each agent's (JaxUED's training loops read its ``n``).
* The observation is a :class:`jaxlake.observations.Observation` (``grid`` ``[A, G, G', C]`` in
  ``dtype``, uint8 by default, or bool or float32; ``scalars`` ``[A, 2]`` float32,
  ``avail_actions`` ``[A, 5]``), built with the level's
  :class:`~jaxlake.observations.ObsCache`, made at the reset and kept in the state; the reward is ``[A]`` float32 per agent,
  ``done`` is True once no agent is ACTIVE, and the info holds ``"terminated"`` and
  ``"truncated"`` (``[A]`` bool, :func:`jaxlake.levels.step_split`).
* The level sampler is the generator: :meth:`MAPFFrozenLake.sample_random_level` (or
  :func:`make_level_generator`) draws a fresh lake from a config or a mixture; the mutator is
  :func:`jaxlake.levels.mutate` (:meth:`MAPFFrozenLake.mutate_level`, :func:`make_level_mutator`),
  JaxUED's ``(rng, level, num_edits) -> level``.

JaxUED 0.0.1 (its only release) calls ``jax.tree_map``, which JAX removed in 0.6: its
``LevelSampler`` and its wrappers (``AutoReplayWrapper``, ``AutoResetWrapper``) fail on the JAX
this project needs. :func:`install_tree_map_shim` sets ``jax.tree_map = jax.tree.map`` (what the
removed function was) when it is missing; call it before using those parts of JaxUED. This
adapter itself needs no shim (it uses only ``UnderspecifiedEnv``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import spaces
from jaxued.environments import UnderspecifiedEnv

from jaxlake import env as core
from jaxlake import levels, observations
from jaxlake.adapters.common import joint_actions, observation_dtype
from jaxlake.adapters.pools import EnvSource, make_level_sampler
from jaxlake.config import LakeConfig
from jaxlake.mixture import Mixture
from jaxlake.types import NUM_ACTIONS, Lake, State

__all__ = ["MAPFFrozenLake", "UEDState", "install_tree_map_shim", "make_level_generator", "make_level_mutator"]


@struct.dataclass
class UEDState:
    """The environment state: the level (lake) being played, its game state and its
    :class:`~jaxlake.observations.ObsCache` (``None``: computed at every observation)."""

    lake: Lake
    state: State
    cache: Optional[observations.ObsCache] = None


def make_level_generator(env: EnvSource) -> Callable[[jax.Array], Lake]:
    """JaxUED's level generator ``rng -> Lake``: a fresh lake of ``env`` (a config or a mixture),
    :func:`jaxlake.adapters.pools.make_level_sampler`."""
    return make_level_sampler(env)


def make_level_mutator(min_dist: Any = 1, max_dist: Optional[Any] = None) -> Callable[..., Lake]:
    """JaxUED's level mutator ``(rng, level, num_edits) -> level``: :func:`jaxlake.levels.mutate`
    with the distance bounds of the config that made the levels."""

    def mutate(rng: jax.Array, level: Lake, num_edits: Union[int, jax.Array] = 1) -> Lake:
        return levels.mutate(rng, level, num_edits, min_dist=min_dist, max_dist=max_dist)

    return mutate


def install_tree_map_shim() -> bool:
    """Set ``jax.tree_map = jax.tree.map`` if JAX has no ``tree_map`` (removed in JAX 0.6; JaxUED
    0.0.1's ``LevelSampler`` and wrappers call it). Returns whether it was set now."""
    if hasattr(jax, "tree_map"):
        return False
    jax.tree_map = jax.tree.map
    return True


class MAPFFrozenLake(UnderspecifiedEnv):
    """MAPF-FrozenLake for JaxUED (module docstring for the conventions).

    Args:
      env: the config or mixture of :meth:`sample_random_level` (``LakeConfig()`` when
        ``None``); its distance bounds are the mutator's (for a mixture: the smallest
        ``min_dist`` and the largest ``max_dist``, none if any component has none).
      radius: ``None`` for the whole canvas, else the egocentric crop radius.
      dtype: the grid's dtype, ``"uint8"`` (default), ``"bool"`` or ``"float32"``.
      arrive_reward: as in :func:`jaxlake.env.step`.
      fall_reward: as in :func:`jaxlake.env.step`.
    """

    def __init__(self, env: Optional[EnvSource] = None, *, radius: Optional[int] = None, dtype: Any = "uint8",
                 arrive_reward: float = 1.0, fall_reward: float = -1.0) -> None:
        super().__init__()
        self.dtype = observation_dtype(dtype)
        self.mixture = Mixture.of(LakeConfig() if env is None else env)
        configs = self.mixture.configs
        self.min_dist = min(c.min_dist for c in configs)
        self.max_dist = None if any(c.max_dist is None for c in configs) else max(c.max_dist for c in configs)
        self.radius = radius
        self.rewards = dict(arrive_reward=float(arrive_reward), fall_reward=float(fall_reward))
        self.sample_random_level = make_level_sampler(self.mixture)
        self.mutate_level = make_level_mutator(self.min_dist, self.max_dist)

    def _observe(self, lake: Lake, state: State, cache: Optional[observations.ObsCache]) -> observations.Observation:
        return observations.observe(lake, state, radius=self.radius, dtype=self.dtype, cache=cache)

    def reset_env_to_level(self, rng: jax.Array, level: Lake, params: Any) -> tuple[observations.Observation, UEDState]:
        state = UEDState(lake=level, state=core.reset(level), cache=observations.make_cache(level))
        return self._observe(level, state.state, state.cache), state

    def step_env(self, rng: jax.Array, state: UEDState, action: jax.Array, params: Any):
        action = joint_actions(action, state.lake.max_agents)
        game, info = core.step(rng, state.lake, state.state, action, **self.rewards)
        terminated, truncated = levels.step_split(info)
        info_out = {"terminated": terminated, "truncated": truncated}
        return (self._observe(state.lake, game, state.cache), state.replace(state=game), info.reward, game.done,
                info_out)

    def action_space(self, params: Any = None) -> spaces.Discrete:
        """Each agent's action space (the step takes ``[A]`` of them)."""
        return spaces.Discrete(NUM_ACTIONS)
