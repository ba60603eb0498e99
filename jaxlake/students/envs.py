"""The environments a student trains in, behind one small interface (:class:`StudentEnv`).

A :class:`StudentEnv` runs a batch of ``E`` instances with ``K`` actor slots each, all arrays
batched ``[E, K, ...]``:

* ``init(key, E) -> (state, Obs)``;
* ``refresh(key, state) -> state``: once per update, before the rollout (the lakes' new pool);
* ``step(key, state, actions [E, K]) -> (state, Obs, Outcome)``, auto-resetting.

An environment of levels may also offer the two hooks a level buffer needs
(:mod:`jaxlake.students.ued`): ``draw(key, n) -> levels [n]`` (fresh levels of its
distribution) and ``load(state, levels [P]) -> (state, Obs)`` (every instance restarts on the
given levels; each step's :attr:`Outcome.level` then says which of them it played).

:class:`Obs` holds every actor's ``grid`` (any feature array), ``scalars``, ``avail`` mask and
``valid`` flag (the actor acts in this step, its transition counts in the loss). The same
trainer (:func:`jaxlake.students.ippo.make_train`) runs on any of them: :func:`lake_env` here,
and a JaxMARL environment in :mod:`jaxlake.students.bench`.

**The lakes** (:func:`lake_env`). Observations are :func:`jaxlake.observations.observe`'s:
the egocentric crop of ``radius`` (or the whole canvas) and the two scalars; only the first
``K`` agent slots are actors, ``K`` the largest ``num_agents`` of the mixture (the slots beyond
it are absent in every lake, so no network time is spent on them). An actor is ``valid`` while
its agent is ACTIVE; its ``done`` is set on the step it stops being ACTIVE (arrived, fell or
timed out: the time left is observed, so a time-out is a true end). Instances auto-reset with
:mod:`jaxlake.levels` (the next step starts from the next lake, no step wasted):

* ``pool_lakes > 0``: every update generates a pool of that many fresh lakes
  (:func:`jaxlake.students.lakes.fresh_pool`); instance ``e``'s ``n``-th episode plays pool lake
  ``(e + E n) mod P`` (a new pool restarts the count), so every episode of an update has its
  own lake unless an instance plays more than ``P / E`` episodes in one update;
* ``pool_lakes = 0``: a new lake is generated at every episode end
  (:func:`jaxlake.levels.step_batch` with :func:`jaxlake.students.lakes.train_sampler`).

Either way no held-out lake is ever played (:mod:`jaxlake.students.lakes`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from jaxlake import autoreset, levels
from jaxlake import env as lake_env_core
from jaxlake.mixture import Mixture
from jaxlake.observations import observe
from jaxlake.students.lakes import fresh_pool, train_sampler
from jaxlake.types import ABSENT, ACTIVE, ARRIVED, NUM_ACTIONS, Lake

__all__ = ["LakeState", "Obs", "Outcome", "StudentEnv", "lake_env", "lake_obs"]


class Obs(NamedTuple):
    """Every actor's observation, ``[E, K, ...]``."""

    grid: jax.Array
    scalars: jax.Array
    avail: jax.Array
    valid: jax.Array


class Outcome(NamedTuple):
    """What one step did: ``reward``, ``done`` ``[E, K]``; ``ended`` (an episode ended) and
    ``success`` (it ended with every agent home) ``[E]``; ``level`` ``[E]`` int32 (environments
    with levels): the index, in the pool of the last ``load``, of the level the step played (-1
    when it is not one of them)."""

    reward: jax.Array
    done: jax.Array
    ended: jax.Array
    success: jax.Array
    level: Optional[jax.Array] = None


class StudentEnv(NamedTuple):
    """A batched, auto-resetting environment for the student (see the module docstring)."""

    actors: int
    num_actions: int
    init: Callable[[jax.Array, int], tuple[Any, Obs]]
    refresh: Callable[[jax.Array, Any], Any]
    step: Callable[[jax.Array, Any, jax.Array], tuple[Any, Obs, Outcome]]
    draw: Optional[Callable[[jax.Array, int], Any]] = None
    load: Optional[Callable[[Any, Any], tuple[Any, Obs]]] = None


class LakeState(NamedTuple):
    """The lakes' batch: the auto-reset state, this update's pool, each instance's next pool
    index and the pool index of the lake it plays now (-1: a lake of an earlier pool); the last
    three are ``None`` when every episode end generates a lake."""

    rs: levels.ResetState
    pool: Optional[Lake]
    next_idx: Optional[jax.Array]
    current: Optional[jax.Array] = None


def lake_obs(lakes: Lake, states: Any, actors: int, radius: Optional[int]) -> Obs:
    """:class:`Obs` of a batch of lakes and states (first ``actors`` slots)."""
    o = jax.vmap(lambda lake, st: observe(lake, st, radius=radius))(lakes, states)
    valid = states.status[:, :actors] == ACTIVE
    return Obs(grid=o.grid[:, :actors], scalars=o.scalars[:, :actors], avail=o.avail_actions[:, :actors],
               valid=valid)


def lake_env(mixture: Any, *, radius: Optional[int] = 4, pool_lakes: int = 512, arrive_reward: float = 1.0,
             fall_reward: float = -1.0) -> StudentEnv:
    """The lakes of ``mixture`` (a :class:`~jaxlake.mixture.Mixture`, pairs or one
    :class:`~jaxlake.config.LakeConfig`) as a :class:`StudentEnv` (module docstring)."""
    mixture = Mixture.of(mixture)
    actors = max(int(c.num_agents) for c in mixture.configs)
    pool_lakes = int(pool_lakes)
    rewards = dict(arrive_reward=float(arrive_reward), fall_reward=float(fall_reward))
    generating = train_sampler(mixture)

    def init(key: jax.Array, num_envs: int) -> tuple[LakeState, Obs]:
        k_pool, k_init = jax.random.split(key)
        if pool_lakes:
            if pool_lakes % num_envs:
                raise ValueError(f"pool_lakes={pool_lakes} must be a multiple of num_envs={num_envs}")
            pool = fresh_pool(k_pool, mixture, pool_lakes)
            lakes = jax.tree_util.tree_map(lambda x: x[:num_envs], pool)
            ar = autoreset.AutoResetState(state=lake_env_core.reset(lakes),
                                          pool_idx=jnp.full((num_envs,), -1, jnp.int32),
                                          episodes=jnp.zeros((num_envs,), jnp.int32),
                                          pending=jnp.zeros((num_envs,), bool))
            # instance e plays pool lake e first, then e + E, e + 2E, ...
            next_idx = jnp.arange(num_envs, dtype=jnp.int32) + num_envs
            state = LakeState(levels.ResetState(ar=ar, lake=lakes), pool, next_idx,
                              jnp.arange(num_envs, dtype=jnp.int32))
        else:
            state = LakeState(levels.init(k_init, generating, num_envs), None, None)
        return state, lake_obs(state.rs.lake, levels.observe(state.rs), actors, radius)

    def refresh(key: jax.Array, state: LakeState) -> LakeState:
        if not pool_lakes:
            return state
        num_envs = state.next_idx.shape[0]
        return LakeState(state.rs, fresh_pool(key, mixture, pool_lakes), jnp.arange(num_envs, dtype=jnp.int32),
                         jnp.full((num_envs,), -1, jnp.int32))

    def draw(key: jax.Array, n: int) -> Lake:
        return fresh_pool(key, mixture, n)

    def load(state: LakeState, pool: Lake) -> tuple[LakeState, Obs]:
        """Every instance restarts at once: ``e`` on pool lake ``e``, then ``e + E``, ..."""
        num_envs = state.rs.ar.pending.shape[0]
        if not pool_lakes or autoreset.pool_size(pool) % num_envs:
            raise ValueError(f"load needs a pool of a multiple of num_envs={num_envs} lakes (pool_lakes > 0)")
        first = jnp.arange(num_envs, dtype=jnp.int32)
        lakes = jax.tree_util.tree_map(lambda x: x[:num_envs], pool)
        ar = state.rs.ar.replace(state=lake_env_core.reset(lakes), pending=jnp.zeros((num_envs,), bool))
        new = LakeState(levels.ResetState(ar=ar, lake=lakes), pool, first + num_envs, first)
        return new, lake_obs(lakes, levels.observe(new.rs), actors, radius)

    def step(key: jax.Array, state: LakeState, actions: jax.Array) -> tuple[LakeState, Obs, Outcome]:
        rs, next_idx, current = state.rs, state.next_idx, state.current
        num_envs = rs.ar.pending.shape[0]
        full = jnp.zeros((num_envs, rs.lake.max_agents), jnp.int32).at[:, :actors].set(actions)
        keys = jax.random.split(key, num_envs)
        if pool_lakes:
            def one(k, idx, r, a):
                pick = lambda _key: jax.tree_util.tree_map(lambda x: x[idx], state.pool)  # noqa: E731
                return levels.step(k, pick, r, a, **rewards)

            rs, info = jax.vmap(one)(keys, next_idx, rs, full)
            current = jnp.where(rs.ar.pending, next_idx, current)
            next_idx = jnp.where(rs.ar.pending, (next_idx + num_envs) % pool_lakes, next_idx)
        else:
            rs, info = levels.step_batch(keys, generating, rs, full, **rewards)
        terminal = rs.ar.state.status  # after the step (the terminal state where pending)
        done = terminal[:, :actors] != ACTIVE
        home = jnp.all((terminal == ARRIVED) | (terminal == ABSENT), axis=-1)
        out = Outcome(reward=info.reward[:, :actors], done=done, ended=rs.ar.pending,
                      success=(rs.ar.pending & home).astype(jnp.float32), level=state.current)
        obs = lake_obs(rs.lake, levels.observe(rs), actors, radius)
        return LakeState(rs, state.pool, next_idx, current), obs, out

    return StudentEnv(actors=actors, num_actions=NUM_ACTIONS, init=init, refresh=refresh, step=step,
                      draw=draw if pool_lakes else None, load=load if pool_lakes else None)
