"""The rollouts that ``python -m jaxlake.bench`` times (:mod:`jaxlake.bench.throughput` measures them).

* how the random actions and the slip noise are drawn inside the scan (``bench.rng``):
  :func:`random_actions` (``"bits"``, one ``random.bits`` word per agent slot, stepped with
  ``env.step_from_uniforms``) or :func:`keyed_actions` (``"keys"``, ``randint`` and one split
  key per instance, stepped with the keyed ``env.step``); :func:`rng_mode` picks them;
* the observations built every step (``bench.observations``, grids in
  ``bench.observation_dtype``: :data:`OBSERVATION_DTYPES`), kept in the scan's carry so XLA
  builds and writes them;
* :func:`make_rollout` (plain, over a batch of lakes) and :func:`make_autoreset_rollout` (over a
  pool of lakes with :mod:`jaxlake.autoreset`): jitted ``steps``-step scans, the batch sharded
  over ``mesh`` (:mod:`jaxlake.sharding`).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from jaxlake import autoreset, env, observations
from jaxlake.sharding import constrain_batch
from jaxlake.types import NUM_ACTIONS, Lake

__all__ = ["OBSERVATION_DTYPES", "RNG_MODES", "keyed_actions", "make_autoreset_rollout", "make_rollout",
           "observation_dtype", "random_actions", "rng_mode"]

#: How random actions (and slip noise) are drawn inside the rollout (``bench.rng``).
RNG_MODES = ("bits", "keys")  # see _RNG below


def random_actions(key: jax.Array, batch: int, num_slots: int, mesh=None) -> tuple[jax.Array, jax.Array]:
    """``[B, A]`` uniform actions in ``0..4`` and slip uniforms from one ``random.bits`` draw.

    Each 32-bit word gives an action from its low 16 bits (multiply-shift, bias < 1e-4) and a
    uniform in ``[0, 1)`` with 16-bit resolution from its high 16 bits: one threefry block per
    two agent slots, several times cheaper than ``randint`` + a split key per instance.
    """
    bits = jax.random.bits(key, (batch, num_slots), jnp.uint32)
    actions = (((bits & 0xFFFF) * NUM_ACTIONS) >> 16).astype(jnp.int32)
    u = (bits >> 16).astype(jnp.float32) * (1.0 / 65536.0)
    return constrain_batch(actions, mesh), constrain_batch(u, mesh)


def keyed_actions(key: jax.Array, batch: int, num_slots: int, mesh=None) -> tuple[jax.Array, jax.Array]:
    """``[B, A]`` ``randint`` actions and one split key per instance (for the keyed ``env.step``)."""
    k_act, k_step = jax.random.split(key)
    actions = jax.random.randint(k_act, (batch, num_slots), 0, NUM_ACTIONS, dtype=jnp.int32)
    return constrain_batch(actions, mesh), constrain_batch(jax.random.split(k_step, batch), mesh)


def _keyed_env_step(lakes: Lake, state, actions, keys):
    return jax.vmap(env.step)(keys, lakes, state, actions)


def _keyed_autoreset_step(pool: Lake, ar, actions, keys):
    return autoreset.step_batch(keys, pool, ar, actions)


#: ``bench.rng`` -> (draw actions and noise, batched env step, batched auto-reset step); the
#: steps take the noise (uniforms or per-instance keys) last: ``step(lakes, state, actions, noise)``.
_RNG = {
    "bits": (random_actions, jax.vmap(env.step_from_uniforms), autoreset.step_batch_from_uniforms),
    "keys": (keyed_actions, _keyed_env_step, _keyed_autoreset_step),
}


def rng_mode(rng: str) -> tuple[Callable, Callable, Callable]:
    """``(draw, env_step, autoreset_step)`` of ``bench.rng``; a clear error for unknown modes."""
    if rng not in _RNG:
        raise ValueError(f"bench.rng={rng!r} not in {RNG_MODES}")
    return _RNG[rng]


#: ``bench.observation_dtype``: the grids' dtype (one byte a cell, as an environment keeps a
#: frame buffer; ``float32`` is what a network reads, four times the bytes)
OBSERVATION_DTYPES = {"uint8": jnp.uint8, "bool": jnp.bool_, "float32": jnp.float32}


def observation_dtype(observe: bool | str) -> str:
    """The grids' dtype name of ``observe``: ``False``, ``True`` (uint8 grids) or the dtype name."""
    return observe if isinstance(observe, str) else "uint8"


def _observe_batch(lakes, state, dtype: str = "uint8"):
    return jax.vmap(functools.partial(observations.observe, dtype=OBSERVATION_DTYPES[dtype]))(lakes, state)


def _scan(body: Callable, init: tuple, keys: jax.Array, observe_fn: Optional[Callable], mesh) -> tuple:
    """``lax.scan`` of a rollout ``body`` (carry ``(state, reward_sum)``) over ``keys``; returns
    the final ``(state, reward_sum)``.

    With ``observe_fn`` (``bench.observations``) each step first builds the observations of
    the state it starts from, ``observe_fn(state)``, and keeps them in the carry; the reward
    sums then get ``min(sum of the last grids, 0)`` added (exactly 0, as grids are >= 0, but
    not provably so), so XLA builds and writes the observations of every step.
    """
    if observe_fn is None:
        return jax.lax.scan(body, init, keys)[0]

    def with_obs(carry, k):
        inner, _ = carry
        obs = constrain_batch(observe_fn(inner[0]), mesh)
        inner, _ = body(inner, k)
        return (inner, obs), None

    obs0 = jax.tree_util.tree_map(lambda s: constrain_batch(jnp.zeros(s.shape, s.dtype), mesh),
                                  jax.eval_shape(observe_fn, init[0]))
    ((state, total), obs), _ = jax.lax.scan(with_obs, (init, obs0), keys)
    return state, total + jnp.minimum(jnp.sum(obs.grid, axis=tuple(range(1, obs.grid.ndim))), 0.0)


def _jitted_rollout(steps: int, mesh, draw: Callable, step_fn: Callable, batch_of: Callable,
                    observe_of: Optional[Callable]) -> Callable:
    """``(lakes, start, key) -> (end, reward_sum)``: ``steps`` steps ``step_fn(lakes, carry,
    actions, noise)`` of the random actions and noise ``draw`` gives, from ``start`` (a batch of
    ``batch_of(start)`` instances), in a scan; ``observe_of(lakes, carry)``: the observations
    built before each step (None: none)."""

    def rollout(lakes: Lake, start, key):
        batch = batch_of(start)

        def body(carry, k):
            state, total = carry
            actions, noise = draw(k, batch, lakes.max_agents, mesh)
            state, info = step_fn(lakes, state, actions, noise)
            return (constrain_batch(state, mesh), total + jnp.sum(info.reward, axis=-1)), None

        init = (start, constrain_batch(jnp.zeros((batch,), jnp.float32), mesh))
        observe_fn = (lambda s: observe_of(lakes, s)) if observe_of is not None else None
        return _scan(body, init, jax.random.split(key, steps), observe_fn, mesh)

    return jax.jit(rollout)


def make_rollout(steps: int, mesh=None, rng: str = "bits", observe: bool | str = False) -> Callable:
    """``(lakes, state, key) -> (state, reward_sum)``: ``steps`` random-action steps in a scan.

    ``rng="bits"``: actions and slip noise from :func:`random_actions`, stepped with
    ``env.step_from_uniforms``; ``rng="keys"``: ``randint`` actions and one split key per
    instance, stepped with ``env.step`` (the keyed public API; its RNG costs about as much as
    the step on CPU). ``observe``: build every agent's observation of each state before it
    is stepped (``bench.observations``).
    """
    draw, step_fn, _ = rng_mode(rng)
    observe_of = (lambda lakes, s: _observe_batch(lakes, s, observation_dtype(observe))) if observe else None
    return _jitted_rollout(steps, mesh, draw, step_fn, lambda state: state.t.shape[0], observe_of)


def make_autoreset_rollout(steps: int, mesh=None, rng: str = "bits", observe: bool | str = False) -> Callable:
    """``(pool, ar, key) -> (ar, reward_sum)``: ``steps`` auto-reset steps in a scan
    (``observe``: with the observations of :func:`jaxlake.autoreset.observe`'s state, the one
    each step starts from, on the lake it plays)."""
    draw, _, step_fn = rng_mode(rng)
    observe_of = (lambda pool, a: _observe_batch(autoreset.current_lakes(pool, a), autoreset.observe(pool, a),
                                                 observation_dtype(observe))) if observe else None
    return _jitted_rollout(steps, mesh, draw, step_fn, lambda ar: ar.pool_idx.shape[0], observe_of)
