"""The PPO update: the clipped loss over valid samples, and epochs of shuffled minibatches.

A *sample* is one actor's step of the rollout. Samples whose actor did not act (``valid``
False: an agent that arrived, fell or timed out, waiting for its lake to reset) weigh 0 in
every mean; advantages are normalised per minibatch over the valid samples.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxlake.students.network import entropy, log_prob

__all__ = ["Batch", "LossInfo", "ppo_loss", "update_epochs"]


class Batch(NamedTuple):
    """Flat samples ``[N, ...]`` of one rollout."""

    grid: jax.Array
    scalars: jax.Array
    avail: jax.Array
    valid: jax.Array
    action: jax.Array
    logp: jax.Array
    value: jax.Array
    advantage: jax.Array
    target: jax.Array


class LossInfo(NamedTuple):
    """Means over valid samples (each ``[]``)."""

    loss: jax.Array
    policy_loss: jax.Array
    value_loss: jax.Array
    entropy: jax.Array
    approx_kl: jax.Array
    clip_frac: jax.Array


def _mean(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)


def ppo_loss(params: Any, apply: Callable, batch: Batch, *, clip_eps: float, vf_coef: float,
             ent_coef: float) -> tuple[jax.Array, LossInfo]:
    """PPO's clipped surrogate, the clipped value loss and the entropy bonus, over valid samples."""
    w = batch.valid.astype(jnp.float32)
    logits, value = apply(params, batch.grid, batch.scalars, batch.avail)
    logp = log_prob(logits, batch.action)
    ratio = jnp.exp(logp - batch.logp)
    adv = batch.advantage
    mu = _mean(adv, w)
    std = jnp.sqrt(_mean((adv - mu) ** 2, w))
    adv = (adv - mu) / (std + 1e-8)
    policy = -_mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv), w)
    v_clipped = batch.value + jnp.clip(value - batch.value, -clip_eps, clip_eps)
    v_loss = 0.5 * _mean(jnp.maximum((value - batch.target) ** 2, (v_clipped - batch.target) ** 2), w)
    ent = _mean(entropy(logits), w)
    loss = policy + vf_coef * v_loss - ent_coef * ent
    kl = _mean((ratio - 1) - (logp - batch.logp), w)
    clip_frac = _mean((jnp.abs(ratio - 1) > clip_eps).astype(jnp.float32), w)
    return loss, LossInfo(loss, policy, v_loss, ent, kl, clip_frac)


def update_epochs(key: jax.Array, params: Any, opt_state: Any, batch: Batch, *, apply: Callable, tx: Any,
                  epochs: int, minibatches: int, clip_eps: float, vf_coef: float,
                  ent_coef: float) -> tuple[Any, Any, LossInfo]:
    """``epochs`` passes over ``batch``, each over ``minibatches`` shuffled minibatches, one
    optimiser step each. Returns the new parameters, optimiser state and the mean
    :class:`LossInfo` over all steps."""
    n = batch.action.shape[0]
    grad_fn = jax.value_and_grad(
        lambda p, b: ppo_loss(p, apply, b, clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef), has_aux=True)

    def minibatch_step(carry, mb):
        params, opt_state = carry
        (_, info), grads = grad_fn(params, mb)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
        return (params, opt_state), info

    def epoch(carry, k):
        perm = jax.random.permutation(k, n)
        mbs = jax.tree_util.tree_map(lambda x: x[perm].reshape((minibatches, n // minibatches) + x.shape[1:]), batch)
        return jax.lax.scan(minibatch_step, carry, mbs)

    (params, opt_state), infos = jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, epochs))
    return params, opt_state, jax.tree_util.tree_map(jnp.mean, infos)
