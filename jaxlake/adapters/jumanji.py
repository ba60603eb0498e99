"""MAPF-FrozenLake as a Jumanji ``Environment`` (the ``ecosystem`` extra), registered as
:data:`ENV_ID` (``"MAPFFrozenLake-v0"``) when this module is imported::

    import jumanji
    import jaxlake.adapters.jumanji  # registers the id
    env = jumanji.make("MAPFFrozenLake-v0", pool_size=64)

``reset(key)`` draws a lake from a pre-generated pool (by ``weights``, one random number a draw:
:func:`jaxlake.adapters.pools.make_pool_draw`) and
``step(state, action)`` plays one joint step; Jumanji's ``AutoResetWrapper`` /
``VmapAutoResetWrapper`` reset with the state's ``key``, as for its own environments.

* Observation (:class:`Observation`, a named tuple): ``grid`` ``[A, G, G', C]`` in ``dtype``
  (uint8 by default, or bool or float32; every agent's 0/1 channels of
  :mod:`jaxlake.observations`, the whole canvas or the egocentric crop of ``radius``),
  ``scalars`` ``[A, 2]`` float32 (time left, slip probability) and ``action_mask`` ``[A, 5]``
  bool (:func:`jaxlake.observations.avail_actions`).
* Action: ``[A]`` int32, a ``MultiDiscreteArray`` of ``5`` values per agent slot (absent slots'
  actions are ignored); any shape of ``A`` integers is taken (``(A, 1)`` too,
  :func:`jaxlake.adapters.common.joint_actions`).
* The lake's :class:`jaxlake.observations.ObsCache` is built once per pool lake, at
  construction, and travels in the state.
* Reward and discount: ``[A]`` float32 per agent. The discount is 0 for an agent whose episode
  has terminated (arrived, fell) or that is absent, and 1 while it is ACTIVE or once it timed
  out (a truncation: bootstrap). The step type is ``LAST`` once no agent is ACTIVE.
* Extras: ``"terminated"`` and ``"truncated"`` (``[A]`` bool, :func:`jaxlake.levels.step_split`;
  all False at a reset) and ``"level"`` (the pool index of the lake played).

Keys: ``reset(key)`` draws the lake with ``split(key)[0]`` and keeps ``split(key)[1]`` as
``state.key``; a step plays :func:`jaxlake.env.step` with ``split(state.key)[0]`` and keeps
``split(state.key)[1]``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import jumanji
from flax import struct
from jumanji import specs
from jumanji.env import Environment
from jumanji.types import StepType, TimeStep, restart

from jaxlake import env as core
from jaxlake import levels, observations
from jaxlake.adapters.common import joint_actions, observation_dtype
from jaxlake.adapters.pools import EnvSource, make_pool, make_pool_draw
from jaxlake.text import render_text
from jaxlake.types import ACTIVE, NUM_ACTIONS, TIMED_OUT, Lake, State

__all__ = ["ENV_ID", "JumanjiState", "MAPFFrozenLake", "Observation", "register"]

#: The id this module registers with ``jumanji.register``.
ENV_ID = "MAPFFrozenLake-v0"


class Observation(NamedTuple):
    """What the agents see (shapes in the module docstring)."""

    grid: jax.Array
    scalars: jax.Array
    action_mask: jax.Array


@struct.dataclass
class JumanjiState:
    """The environment state.

    Attributes:
      lake: the unbatched :class:`~jaxlake.types.Lake` being played.
      state: its :class:`~jaxlake.types.State`.
      level: ``[]`` int32, the lake's index in the pool.
      key: the PRNG key of the next step (and of Jumanji's auto-reset).
      cache: the lake's :class:`~jaxlake.observations.ObsCache` (``reset`` sets it; ``None``:
        computed at every observation).
    """

    lake: Lake
    state: State
    level: jax.Array
    key: jax.Array
    cache: Optional[observations.ObsCache] = None


class MAPFFrozenLake(Environment[JumanjiState, specs.MultiDiscreteArray, Observation]):
    """MAPF-FrozenLake for Jumanji (module docstring for the conventions).

    Args:
      pool: a batch of lakes (leading ``[P]`` axis) to draw from; or
      env: a :class:`~jaxlake.config.LakeConfig` or a mixture to generate ``pool_size`` lakes
        from (seed ``seed``); ``LakeConfig()`` when neither is given.
      weights: ``[P]`` draw weights of the pool lakes (uniform when ``None``).
      radius: ``None`` for the whole canvas, else the egocentric crop radius.
      dtype: the grid's dtype, ``"uint8"`` (default), ``"bool"`` or ``"float32"``.
      arrive_reward: as in :func:`jaxlake.env.step`.
      fall_reward: as in :func:`jaxlake.env.step`.
    """

    def __init__(self, pool: Optional[Lake] = None, *, env: Optional[EnvSource] = None, pool_size: int = 256,
                 seed: int = 0, weights: Optional[Sequence[float]] = None, radius: Optional[int] = None,
                 dtype: Any = "uint8", arrive_reward: float = 1.0, fall_reward: float = -1.0) -> None:
        self.dtype = observation_dtype(dtype)
        self.pool = make_pool(pool, env=env, size=pool_size, seed=seed)
        self.pool_cache = jax.jit(jax.vmap(observations.make_cache))(self.pool)
        self.draw = make_pool_draw(self.pool.num_agents.shape[0], weights)
        self.sampler = (levels.PoolSampler.uniform(self.pool) if weights is None
                        else levels.PoolSampler(pool=self.pool, weights=jnp.asarray(weights, jnp.float32)))
        self.num_agents = self.pool.max_agents
        self.radius = radius
        self.rewards = dict(arrive_reward=float(arrive_reward), fall_reward=float(fall_reward))
        super().__init__()

    def __repr__(self) -> str:
        H, W = self.pool.canvas_shape
        return f"MAPFFrozenLake(pool of {self.sampler.weights.shape[0]} lakes, {H}x{W}, {self.num_agents} agent slots)"

    # ------------------------------------------------------------------ dynamics
    def _observe(self, lake: Lake, state: State, cache: Optional[observations.ObsCache] = None) -> Observation:
        obs = observations.observe(lake, state, radius=self.radius, dtype=self.dtype, cache=cache)
        return Observation(grid=obs.grid, scalars=obs.scalars, action_mask=obs.avail_actions)

    def reset(self, key: jax.Array) -> tuple[JumanjiState, TimeStep[Observation]]:
        k_level, k_next = jax.random.split(key)
        level = self.draw(k_level)
        lake, cache = jax.tree_util.tree_map(lambda x: jnp.take(x, level, axis=0, mode="clip"),
                                             (self.pool, self.pool_cache))
        game = core.reset(lake)
        state = JumanjiState(lake=lake, state=game, level=level, key=k_next, cache=cache)
        none = jnp.zeros((self.num_agents,), bool)
        extras = {"terminated": none, "truncated": none, "level": level}
        return state, restart(self._observe(lake, game, cache), extras, shape=(self.num_agents,), dtype=jnp.float32)

    def step(self, state: JumanjiState, action: jax.Array) -> tuple[JumanjiState, TimeStep[Observation]]:
        k_step, k_next = jax.random.split(state.key)
        action = joint_actions(action, self.num_agents)
        game, info = core.step(k_step, state.lake, state.state, action, **self.rewards)
        terminated, truncated = levels.step_split(info)
        discount = ((game.status == ACTIVE) | (game.status == TIMED_OUT)).astype(jnp.float32)
        timestep = TimeStep(
            step_type=jnp.where(game.done, StepType.LAST, StepType.MID),
            reward=info.reward,
            discount=discount,
            observation=self._observe(state.lake, game, state.cache),
            extras={"terminated": terminated, "truncated": truncated, "level": state.level},
        )
        return state.replace(state=game, key=k_next), timestep

    def render(self, state: JumanjiState) -> str:
        """The state as text (:func:`jaxlake.text.render_text`)."""
        return render_text(state.lake, state.state)

    # ------------------------------------------------------------------ specs
    @cached_property
    def observation_spec(self) -> specs.Spec[Observation]:
        A = self.num_agents
        H, W = self.pool.canvas_shape
        G, G2 = (H, W) if self.radius is None else (2 * int(self.radius) + 1,) * 2
        return specs.Spec(
            Observation,
            "ObservationSpec",
            grid=specs.BoundedArray((A, G, G2, observations.NUM_CHANNELS), self.dtype, False if self.dtype == jnp.bool_
                                    else 0, True if self.dtype == jnp.bool_ else 1, "grid"),
            scalars=specs.BoundedArray((A, observations.NUM_SCALARS), jnp.float32, 0.0, 1.0, "scalars"),
            action_mask=specs.BoundedArray((A, NUM_ACTIONS), bool, False, True, "action_mask"),
        )

    @cached_property
    def action_spec(self) -> specs.MultiDiscreteArray:
        return specs.MultiDiscreteArray(jnp.full((self.num_agents,), NUM_ACTIONS, jnp.int32), name="action")

    @cached_property
    def reward_spec(self) -> specs.Array:
        return specs.Array((self.num_agents,), jnp.float32, "reward")

    @cached_property
    def discount_spec(self) -> specs.BoundedArray:
        return specs.BoundedArray((self.num_agents,), jnp.float32, 0.0, 1.0, "discount")


def register() -> None:
    """Register :data:`ENV_ID` with ``jumanji.register`` (done on import; again, nothing)."""
    if ENV_ID not in jumanji.registered_environments():
        jumanji.register(ENV_ID, entry_point=f"{__name__}:MAPFFrozenLake")


register()
