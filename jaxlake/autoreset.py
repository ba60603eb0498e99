"""Auto-reset from a pool of pre-generated lakes, inside the jitted step, never regenerating.

Jumanji's ``AutoResetWrapper`` under ``vmap`` runs the generator on every step (a
``lax.cond`` becomes a ``select`` that evaluates both branches), which costs ~1000x. Here a
finished episode restarts on a lake that already exists: every instance holds an index into
a shared *pool* (a :class:`~jaxlake.types.Lake` with a leading ``[P]`` axis, e.g. from
``generate_batch``), reads its lake from the pool each step (one gather of a few hundred
bytes), and when its episode is done after a step the index advances and the state becomes
``env.reset`` of the next pool lake. Instances that are not done are left exactly as the
plain step leaves them.

Index rule (deterministic, no randomness): instance ``i`` of a batch of ``B`` starts on pool
lake ``(i * P) // B`` (spread evenly over the pool) and, after each finished episode, moves to
the next lake ``(idx + 1) % P``; so every instance walks the whole pool in order, and
``episodes`` counts how many episodes it has finished.

Public functions:

* :func:`init` ``(pool, batch_size) -> AutoResetState`` (batched)
* :func:`step` ``(pool, ar, actions, key) -> (AutoResetState, StepInfo)`` (one instance;
  ``vmap`` it with ``in_axes=(None, 0, 0, 0)``)
* :func:`step_batch` ``(pool, ar, actions, keys) -> (AutoResetState, StepInfo)`` (batched)
* :func:`current_lakes` ``(pool, ar) -> Lake`` (the lakes the instances are on)
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxlake import env
from jaxlake.types import Lake, State, StepInfo


@struct.dataclass
class AutoResetState:
    """Per-instance auto-reset state (add a leading ``[B]`` axis for a batch).

    Attributes:
      state: the :class:`~jaxlake.types.State` of the current episode.
      pool_idx: ``[]`` int32, index of the current lake in the pool.
      episodes: ``[]`` int32, episodes this instance has finished.
    """

    state: State
    pool_idx: jax.Array
    episodes: jax.Array


def pool_size(pool: Lake) -> int:
    """Number of lakes ``P`` in a pool (the leading axis of its leaves)."""
    chex.assert_rank(pool.holes, 3)
    return pool.holes.shape[0]


def _take(pool: Lake, idx: jax.Array) -> Lake:
    return jax.tree_util.tree_map(lambda x: jnp.take(x, idx, axis=0, mode="clip"), pool)


def start_indices(pool_lakes: int, batch_size: int) -> jax.Array:
    """``[B]`` int32 first pool index of each instance: ``(i * P) // B``."""
    # Exact in NumPy int64, then int32 (an index < P always fits).
    i = np.arange(batch_size, dtype=np.int64)
    return jnp.asarray((i * pool_lakes) // batch_size, dtype=jnp.int32)


def init(pool: Lake, batch_size: int) -> AutoResetState:
    """Batched start: instance ``i`` on pool lake ``(i * P) // B``, freshly reset."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    P = pool_size(pool)
    idx = start_indices(P, batch_size)
    return AutoResetState(
        state=env.reset(_take(pool, idx)),
        pool_idx=idx,
        episodes=jnp.zeros((batch_size,), jnp.int32),
    )


def current_lakes(pool: Lake, ar: AutoResetState) -> Lake:
    """The lake each instance is playing (batched when ``ar`` is)."""
    return _take(pool, ar.pool_idx)


def step(pool: Lake, ar: AutoResetState, actions: jax.Array, key: jax.Array,
         **step_kwargs: Any) -> tuple[AutoResetState, StepInfo]:
    """One auto-resetting step of one instance (``vmap`` over ``ar``, ``actions``, ``key``).

    Steps the instance's pool lake with :func:`jaxlake.env.step`; when the episode is done
    afterwards, the instance moves to pool lake ``(idx + 1) % P`` and its state becomes that
    lake's ``env.reset``. The returned :class:`StepInfo` is the step's own (its ``done`` says
    which instances were restarted). ``step_kwargs`` go to ``env.step`` (rewards).
    """
    P = pool_size(pool)
    lake = _take(pool, ar.pool_idx)
    state, info = env.step(lake, ar.state, actions, key, **step_kwargs)
    done = state.done
    next_idx = jnp.where(done, (ar.pool_idx + 1) % P, ar.pool_idx).astype(jnp.int32)
    fresh = env.reset(_take(pool, next_idx))
    state = jax.tree_util.tree_map(lambda new, old: jnp.where(done, new, old), fresh, state)
    return AutoResetState(state=state, pool_idx=next_idx, episodes=ar.episodes + done.astype(jnp.int32)), info


def step_batch(pool: Lake, ar: AutoResetState, actions: jax.Array, keys: jax.Array,
               **step_kwargs: Any) -> tuple[AutoResetState, StepInfo]:
    """:func:`step` over a batch: ``ar`` ``[B]``, ``actions`` ``[B, A]``, ``keys`` ``[B]``."""
    chex.assert_rank(ar.pool_idx, 1)
    return jax.vmap(lambda a, x, k: step(pool, a, x, k, **step_kwargs))(ar, actions, keys)
