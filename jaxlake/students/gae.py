"""Generalised advantage estimation (Schulman et al., 2016) over a rollout, as one reverse scan.

With ``d_t`` the actor's episode ending at step ``t`` (no bootstrap beyond it)::

    delta_t = r_t + gamma * V_{t+1} * (1 - d_t) - V_t
    A_t     = delta_t + gamma * lambda * (1 - d_t) * A_{t+1}

``V_T`` is the value of the observation after the rollout's last step; the targets of the
value loss are ``A_t + V_t``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["gae"]


def gae(rewards: jax.Array, values: jax.Array, dones: jax.Array, last_value: jax.Array, gamma: float,
        lam: float) -> tuple[jax.Array, jax.Array]:
    """``(advantages, targets)``, each shaped like ``rewards`` ``[T, ...]``.

    Args:
      rewards, values, dones: ``[T, ...]`` (``dones`` bool or 0/1).
      last_value: ``[...]``, the value after step ``T - 1``.
      gamma, lam: discount and GAE's lambda.
    """
    not_done = 1.0 - dones.astype(jnp.float32)

    def back(carry, x):
        next_adv, next_value = carry
        r, v, nd = x
        delta = r + gamma * next_value * nd - v
        adv = delta + gamma * lam * nd * next_adv
        return (adv, v), adv

    init = (jnp.zeros_like(last_value, dtype=jnp.float32), last_value.astype(jnp.float32))
    _, adv = jax.lax.scan(back, init, (rewards.astype(jnp.float32), values.astype(jnp.float32), not_done),
                          reverse=True)
    return adv, adv + values
