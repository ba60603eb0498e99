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

**The lakes** (:func:`lake_env`). Observations (:func:`lake_obs`) are packed: the ``grid`` is
``[E, K, G, G]`` uint8, channel ``c`` of :mod:`jaxlake.observations` as bit ``c`` (the network
unpacks it, :mod:`jaxlake.students.network`), the egocentric crop of ``radius`` (or the whole
canvas), each actor's window of the lake's shared map (:func:`jaxlake.observations.shared_map`)
built from the lake's :class:`~jaxlake.observations.ObsCache`, which is computed once per lake
(for the whole pool at each refresh) and kept in the state. The crop is the configured
``radius`` whatever lakes are observed (the network's input width, so a policy reads the
evaluation's lakes, of any canvas, as it read the training lakes). Only the
first ``K`` agent slots are actors, ``K`` the largest ``num_agents`` of the mixture (the slots
beyond it are absent in every lake): no observation is built and no network time is spent on
the others. An actor is ``valid`` while
its agent is ACTIVE; its ``done`` is set on the step it stops being ACTIVE (arrived, fell or
timed out: the time left is observed, so a time-out is a true end). Instances auto-reset with
:mod:`jaxlake.levels` (the next step starts from the next lake, no step wasted):

* ``pool_lakes > 0``: every update generates a pool of that many fresh lakes
  (:func:`jaxlake.students.lakes.fresh_pool`); instance ``e``'s ``n``-th episode plays pool lake
  ``(e + E n) mod P`` (a new pool restarts the count), so every episode of an update has its
  own lake unless an instance plays more than ``P / E`` episodes in one update; the pool's lakes
  and caches are gathered only on steps where some episode ended (``lax.cond``);
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
from jaxlake.observations import (AGENT_SHIFT, GOAL, GOAL_SHIFT, ID_BITS, OTHER_GOALS, OTHERS, SELF, ObsCache,
                                  avail_actions, global_scalars, make_cache, packed_grids, shared_map)
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
    crop: bool = False  # the grids are packed egocentric crops (ActorCritic's ``crop``)


class LakeState(NamedTuple):
    """The lakes' batch: the auto-reset state, this update's pool, each instance's next pool
    index and the pool index of the lake it plays now (-1: a lake of an earlier pool); the last
    three are ``None`` when every episode end generates a lake. ``cache``: the
    :class:`~jaxlake.observations.ObsCache` of each instance's lake, ``pool_cache`` the pool's."""

    rs: levels.ResetState
    pool: Optional[Lake]
    next_idx: Optional[jax.Array]
    current: Optional[jax.Array] = None
    cache: Optional[ObsCache] = None
    pool_cache: Optional[ObsCache] = None


def _where(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
    """Per-instance select of two pytrees (``pred`` ``[B]``)."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred.reshape(pred.shape + (1,) * (b.ndim - 1)), a, b),
                                  on_true, on_false)


def _relabel(cells: jax.Array, agent: jax.Array, goal: jax.Array, me: jax.Array) -> jax.Array:
    """Packed channels of agents ``me`` (slot + 1) from a window's static bits and its agent and
    goal codes (:func:`jaxlake.observations.shared_map`'s fields)."""
    u8 = jnp.uint8
    base = cells | ((agent != 0).astype(u8) << OTHERS) | ((goal != 0).astype(u8) << OTHER_GOALS)
    return (base ^ jnp.where(agent == me, u8((1 << SELF) | (1 << OTHERS)), u8(0))
            ^ jnp.where(goal == me, u8((1 << GOAL) | (1 << OTHER_GOALS)), u8(0)))


def _crops(lake: Lake, state: Any, cache: ObsCache, actors: int, radius: int) -> jax.Array:
    """``[K, 2r + 1, 2r + 1]`` uint8: the first ``actors`` agents' packed crops (one unbatched lake),
    :func:`jaxlake.observations.crop_packed`'s windows of the shared map for those slots only."""
    H, W = lake.canvas_shape
    grid = shared_map(lake, state, cache)
    offsets = jnp.arange(-radius, radius + 1, dtype=jnp.int32)
    pos = state.pos[:actors].astype(jnp.int32)
    zero = jnp.uint16(0)
    rows = jnp.arange(H)[None, None, :] == (pos[:, 0, None] + offsets[None, :])[..., None]  # [K, S, H]
    strips = jnp.sum(jnp.where(rows[..., None], grid[None, None], zero), axis=2, dtype=jnp.uint16)  # [K, S, W]
    cols = jnp.arange(W)[None, None, :] == (pos[:, 1, None] + offsets[None, :])[..., None]  # [K, S, W]
    win = jnp.sum(jnp.where(cols[:, None], strips[:, :, None], zero), axis=-1, dtype=jnp.uint16)  # [K, S, S]
    me = jnp.arange(1, actors + 1, dtype=jnp.uint8)[:, None, None]
    return _relabel((win & 3).astype(jnp.uint8), ((win >> AGENT_SHIFT) & ID_BITS).astype(jnp.uint8),
                    ((win >> GOAL_SHIFT) & ID_BITS).astype(jnp.uint8), me)


def lake_obs(lakes: Lake, states: Any, actors: int, radius: Optional[int], cache: Optional[ObsCache] = None) -> Obs:
    """:class:`Obs` of a batch of lakes and states, the first ``actors`` slots: packed grids
    ``[B, K, G, G']`` uint8 (module docstring),
    scalars, masks; ``cache``: the lakes' :class:`~jaxlake.observations.ObsCache` (``None``:
    computed here)."""
    if cache is None:
        cache = jax.vmap(make_cache)(lakes)
    r = None if radius is None else int(radius)

    def one(lake, st, c):
        grid = packed_grids(lake, st, c)[:actors] if r is None else _crops(lake, st, c, actors, r)
        scalars = jnp.broadcast_to(global_scalars(lake, st)[None], (actors, 2))
        return grid, scalars, avail_actions(lake, st, c)[:actors]

    grid, scalars, avail = jax.vmap(one)(lakes, states, cache)
    return Obs(grid=grid, scalars=scalars, avail=avail, valid=states.status[:, :actors] == ACTIVE)


def lake_env(mixture: Any, *, radius: Optional[int] = 4, pool_lakes: int = 512, arrive_reward: float = 1.0,
             fall_reward: float = -1.0) -> StudentEnv:
    """The lakes of ``mixture`` (a :class:`~jaxlake.mixture.Mixture`, pairs or one
    :class:`~jaxlake.config.LakeConfig`) as a :class:`StudentEnv` (module docstring)."""
    mixture = Mixture.of(mixture)
    actors = max(int(c.num_agents) for c in mixture.configs)
    pool_lakes = int(pool_lakes)
    rewards = dict(arrive_reward=float(arrive_reward), fall_reward=float(fall_reward))
    generating = train_sampler(mixture)

    caches = jax.vmap(make_cache)

    def observe_state(state: LakeState) -> Obs:
        return lake_obs(state.rs.lake, levels.observe(state.rs), actors, radius, state.cache)

    def init(key: jax.Array, num_envs: int) -> tuple[LakeState, Obs]:
        k_pool, k_init = jax.random.split(key)
        if pool_lakes:
            if pool_lakes % num_envs:
                raise ValueError(f"pool_lakes={pool_lakes} must be a multiple of num_envs={num_envs}")
            pool = fresh_pool(k_pool, mixture, pool_lakes)
            pool_cache = caches(pool)
            first = lambda x: x[:num_envs]  # noqa: E731
            lakes = jax.tree_util.tree_map(first, pool)
            ar = autoreset.AutoResetState(state=lake_env_core.reset(lakes),
                                          pool_idx=jnp.full((num_envs,), -1, jnp.int32),
                                          episodes=jnp.zeros((num_envs,), jnp.int32),
                                          pending=jnp.zeros((num_envs,), bool))
            # instance e plays pool lake e first, then e + E, e + 2E, ...
            next_idx = jnp.arange(num_envs, dtype=jnp.int32) + num_envs
            state = LakeState(levels.ResetState(ar=ar, lake=lakes), pool, next_idx,
                              jnp.arange(num_envs, dtype=jnp.int32), jax.tree_util.tree_map(first, pool_cache),
                              pool_cache)
        else:
            rs = levels.init(k_init, generating, num_envs)
            state = LakeState(rs, None, None, cache=caches(rs.lake))
        return state, observe_state(state)

    def refresh(key: jax.Array, state: LakeState) -> LakeState:
        if not pool_lakes:
            return state
        num_envs = state.next_idx.shape[0]
        pool = fresh_pool(key, mixture, pool_lakes)
        return state._replace(pool=pool, next_idx=jnp.arange(num_envs, dtype=jnp.int32),
                              current=jnp.full((num_envs,), -1, jnp.int32), pool_cache=caches(pool))

    def draw(key: jax.Array, n: int) -> Lake:
        return fresh_pool(key, mixture, n)

    def load(state: LakeState, pool: Lake) -> tuple[LakeState, Obs]:
        """Every instance restarts at once: ``e`` on pool lake ``e``, then ``e + E``, ..."""
        num_envs = state.rs.ar.pending.shape[0]
        if not pool_lakes or autoreset.pool_size(pool) % num_envs:
            raise ValueError(f"load needs a pool of a multiple of num_envs={num_envs} lakes (pool_lakes > 0)")
        first = jnp.arange(num_envs, dtype=jnp.int32)
        head = lambda x: x[:num_envs]  # noqa: E731
        lakes = jax.tree_util.tree_map(head, pool)
        pool_cache = caches(pool)
        ar = state.rs.ar.replace(state=lake_env_core.reset(lakes), pending=jnp.zeros((num_envs,), bool))
        new = LakeState(levels.ResetState(ar=ar, lake=lakes), pool, first + num_envs, first,
                        jax.tree_util.tree_map(head, pool_cache), pool_cache)
        return new, observe_state(new)

    def step(key: jax.Array, state: LakeState, actions: jax.Array) -> tuple[LakeState, Obs, Outcome]:
        rs, next_idx, current, cache = state.rs, state.next_idx, state.current, state.cache
        num_envs = rs.ar.pending.shape[0]
        full = jnp.zeros((num_envs, rs.lake.max_agents), jnp.int32).at[:, :actors].set(actions)
        keys = jax.random.split(key, num_envs)
        if pool_lakes:
            # levels.step's play and slip noise; the next pool lake fetched only where an episode ended
            u = jax.vmap(lambda k: lake_env_core.slip_uniforms(k, rs.lake.max_agents))(keys)
            ar, info = jax.vmap(lambda lake, a, x, v: autoreset.step_lake_from_uniforms(
                lake, a, x, v, a.pool_idx, **rewards))(rs.lake, rs.ar, full, u)
            ended = ar.pending

            def fetch(_):
                take = lambda x: jnp.take(x, next_idx, axis=0)  # noqa: E731
                return (jax.tree_util.tree_map(take, state.pool), jax.tree_util.tree_map(take, state.pool_cache))

            new_lake, new_cache = jax.lax.cond(jnp.any(ended), fetch, lambda _: (rs.lake, cache), None)
            rs = levels.ResetState(ar=ar, lake=_where(ended, new_lake, rs.lake))
            cache = _where(ended, new_cache, cache)
            current = jnp.where(ended, next_idx, current)
            next_idx = jnp.where(ended, (next_idx + num_envs) % pool_lakes, next_idx)
        else:
            rs, info = levels.step_batch(keys, generating, rs, full, **rewards)
            cache = jax.lax.cond(jnp.any(rs.ar.pending), lambda _: caches(rs.lake), lambda _: cache, None)
        terminal = rs.ar.state.status  # after the step (the terminal state where pending)
        done = terminal[:, :actors] != ACTIVE
        home = jnp.all((terminal == ARRIVED) | (terminal == ABSENT), axis=-1)
        out = Outcome(reward=info.reward[:, :actors], done=done, ended=rs.ar.pending,
                      success=(rs.ar.pending & home).astype(jnp.float32), level=state.current)
        new = LakeState(rs, state.pool, next_idx, current, cache, state.pool_cache)
        return new, observe_state(new), out

    return StudentEnv(actors=actors, num_actions=NUM_ACTIONS, init=init, refresh=refresh, step=step,
                      draw=draw if pool_lakes else None, load=load if pool_lakes else None, crop=radius is not None)
