"""Auto-reset from a pool of pre-generated lakes, inside the jitted step, never regenerating.

Jumanji's ``AutoResetWrapper`` under ``vmap`` runs the generator on every step (a
``lax.cond`` becomes a ``select`` that evaluates both branches), which costs ~1000x. Here a
finished episode restarts on a lake that already exists: every instance holds an index into
a shared *pool* (a :class:`~jaxlake.types.Lake` with a leading ``[P]`` axis, e.g. from
``generate_batch``) and reads its lake from the pool each step (one gather).

Index rule (deterministic, no randomness): instance ``i`` of a batch of ``B`` starts on pool
lake ``(i * P) // B`` (spread evenly over the pool) and, after each finished episode, moves to
the next lake ``(idx + 1) % P``; so every instance walks the whole pool in order, and
``episodes`` counts how many episodes it has finished.

The restart is applied at the start of the next step ("pending" reset), which keeps the
step to a single pool gather (a restart written into the state at the end of the step needs
a second, dependent gather and cost ~20 % on CPU; this way it costs a few per cent):

* after a step that ends an episode, :attr:`AutoResetState.state` is the *terminal* state
  (what gymnasium calls the final observation), ``pool_idx`` already names the next lake and
  ``pending`` is True;
* the next :func:`step` starts from ``env.reset(pool[pool_idx])`` for pending instances, so
  its action applies to the fresh episode - no step is wasted;
* :func:`observe` gives the state the next step starts from (the reset state for pending
  instances, the stepped state otherwise), e.g. to show the policy.

Instances whose episode did not end are left exactly as the plain ``env.step`` leaves them.

Public functions:

* :func:`init` ``(pool, batch_size) -> AutoResetState`` (batched)
* :func:`step` ``(pool, ar, actions, key) -> (AutoResetState, StepInfo)`` (one instance;
  ``vmap`` it with ``in_axes=(None, 0, 0, 0)``)
* :func:`step_batch` ``(pool, ar, actions, keys) -> (AutoResetState, StepInfo)`` (batched)
* :func:`step_from_uniforms` / :func:`step_batch_from_uniforms`: the same with the slip
  uniforms given (as :func:`jaxlake.env.step_from_uniforms`)
* :func:`observe` ``(pool, ar) -> State`` and :func:`current_lakes` ``(pool, ar) -> Lake``
* :func:`step_lake_from_uniforms` ``(lake, ar, actions, u, next_idx)``: the same step with the
  lake and the index after a finished episode chosen by the caller (``jaxlake.levels`` builds
  its sampler-driven reset on it)
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
      state: the :class:`~jaxlake.types.State` after the last step (the terminal state when
        that step ended the episode; see ``pending``).
      pool_idx: ``[]`` int32, index in the pool of the lake the next step plays.
      episodes: ``[]`` int32, episodes this instance has finished.
      pending: ``[]`` bool, the last step ended the episode: the next step starts from
        ``env.reset(pool[pool_idx])`` instead of ``state``.
    """

    state: State
    pool_idx: jax.Array
    episodes: jax.Array
    pending: jax.Array


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
        pending=jnp.zeros((batch_size,), bool),
    )


def current_lakes(pool: Lake, ar: AutoResetState) -> Lake:
    """The lake each instance plays next (batched when ``ar`` is)."""
    return _take(pool, ar.pool_idx)


def _select(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
    def pick(a, b):
        return jnp.where(jnp.reshape(pred, jnp.shape(pred) + (1,) * (jnp.ndim(b) - jnp.ndim(pred))), a, b)

    return jax.tree_util.tree_map(pick, on_true, on_false)


def observe(pool: Lake, ar: AutoResetState) -> State:
    """The state the next step starts from: ``env.reset`` of the next lake where pending."""
    return _select(ar.pending, env.reset(current_lakes(pool, ar)), ar.state)


def step(key: jax.Array, pool: Lake, ar: AutoResetState, actions: jax.Array,
         **step_kwargs: Any) -> tuple[AutoResetState, StepInfo]:
    """One auto-resetting step of one instance (``vmap`` over ``key``, ``ar``, ``actions``);
    the key first, as :func:`jaxlake.env.step`.

    Plays pool lake ``pool_idx`` with :func:`jaxlake.env.step` from :func:`observe`'s state.
    When the episode is done afterwards, ``pool_idx`` moves to ``(idx + 1) % P``,
    ``episodes`` grows by one and ``pending`` is set (``state`` keeps the terminal state).
    The returned :class:`StepInfo` is the step's own. ``step_kwargs`` go to ``env.step``.
    """
    return step_from_uniforms(pool, ar, actions, env.slip_uniforms(key, pool.max_agents), **step_kwargs)


def step_from_uniforms(pool: Lake, ar: AutoResetState, actions: jax.Array, u: jax.Array,
                       **step_kwargs: Any) -> tuple[AutoResetState, StepInfo]:
    """:func:`step` with the slip noise ``u`` (``[A]`` uniforms) given, as
    :func:`jaxlake.env.step_from_uniforms`; ``step(key, pool, ar, a)`` equals
    ``step_from_uniforms(pool, ar, a, jax.random.uniform(key, [A]))``."""
    P = pool_size(pool)
    return step_lake_from_uniforms(_take(pool, ar.pool_idx), ar, actions, u, (ar.pool_idx + 1) % P,
                                   **step_kwargs)


def step_lake_from_uniforms(lake: Lake, ar: AutoResetState, actions: jax.Array, u: jax.Array,
                            next_idx: jax.Array, **step_kwargs: Any) -> tuple[AutoResetState, StepInfo]:
    """The auto-resetting step with the lake and the next index given by the caller (one
    instance): :func:`step_from_uniforms` is this with ``lake = pool[pool_idx]`` and
    ``next_idx = (pool_idx + 1) % P``; :mod:`jaxlake.levels` draws ``next_idx`` from a
    sampler instead.

    Plays ``lake`` (the lake ``ar.pool_idx`` names) from ``env.reset(lake)`` where
    ``ar.pending``, else from ``ar.state``. When the episode is done afterwards, ``pool_idx``
    becomes ``next_idx``, ``episodes`` grows by one and ``pending`` is set.
    """
    start = _select(ar.pending, env.reset(lake), ar.state)
    state, info = env.step_from_uniforms(lake, start, actions, u, **step_kwargs)
    done = state.done
    next_idx = jnp.where(done, next_idx, ar.pool_idx).astype(jnp.int32)
    return AutoResetState(state=state, pool_idx=next_idx, episodes=ar.episodes + done.astype(jnp.int32),
                          pending=done), info


def step_batch(keys: jax.Array, pool: Lake, ar: AutoResetState, actions: jax.Array,
               **step_kwargs: Any) -> tuple[AutoResetState, StepInfo]:
    """:func:`step` over a batch: ``keys`` ``[B]``, ``ar`` ``[B]``, ``actions`` ``[B, A]``."""
    chex.assert_rank(ar.pool_idx, 1)
    return jax.vmap(lambda k, a, x: step(k, pool, a, x, **step_kwargs))(keys, ar, actions)


def step_batch_from_uniforms(pool: Lake, ar: AutoResetState, actions: jax.Array, u: jax.Array,
                             **step_kwargs: Any) -> tuple[AutoResetState, StepInfo]:
    """:func:`step_from_uniforms` over a batch: ``actions`` and ``u`` ``[B, A]``."""
    chex.assert_rank(ar.pool_idx, 1)
    return jax.vmap(lambda a, x, v: step_from_uniforms(pool, a, x, v, **step_kwargs))(ar, actions, u)
