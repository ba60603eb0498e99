"""The parameter-shared actor-critic and its masked categorical policy.

:class:`ActorCritic` (flax linen) reads one actor's observation: a ``grid`` (an egocentric
crop ``[G, G, C]`` of :mod:`jaxlake.observations`, the whole canvas, or any feature array),
a vector of ``scalars`` and the ``avail`` mask ``[5]``, with leading batch axes. Optional 3x3
convolutions run over a rank-3 grid; the rest is flattened, joined with the scalars and fed to
two separate MLP torsos (actor and critic, tanh, orthogonal initialisation). The actor's
logits of unavailable actions are replaced by :data:`MASKED` (a large negative number, not
``-inf``, so that probabilities, log-probabilities and the entropy stay finite): a masked
action has probability exactly 0 in float32 and is never sampled nor chosen greedily.
Every agent uses the same parameters; the channels are egocentric (self, own goal, others),
so no agent id is needed.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["MASKED", "ActorCritic", "entropy", "greedy", "log_prob", "masked_logits", "sample"]

#: The logit of an unavailable action.
MASKED = -1e9


def masked_logits(logits: jax.Array, avail: jax.Array) -> jax.Array:
    """``logits`` with unavailable actions (``avail`` False) set to :data:`MASKED`."""
    return jnp.where(avail, logits, MASKED)


def log_prob(logits: jax.Array, actions: jax.Array) -> jax.Array:
    """Log-probabilities of ``actions`` (int, the logits' leading shape) under masked ``logits``."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logp, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy(logits: jax.Array) -> jax.Array:
    """Entropy of the categorical of masked ``logits`` (masked actions contribute 0)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def sample(key: jax.Array, logits: jax.Array) -> jax.Array:
    """int32 actions drawn from masked ``logits`` (never a masked action)."""
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def greedy(logits: jax.Array) -> jax.Array:
    """int32 most likely actions of masked ``logits`` (an available one: STAY always is)."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def _dense(width: int, scale: float) -> nn.Dense:
    return nn.Dense(width, kernel_init=nn.initializers.orthogonal(scale), bias_init=nn.initializers.zeros)


class ActorCritic(nn.Module):
    """Actor and critic over one actor's observation (any leading batch axes).

    Attributes:
      num_actions: size of the action set (5 for the lakes).
      hidden: hidden widths of each torso.
      conv: channels of the 3x3 convolutions over a rank-3 grid (``()``: none).
    """

    num_actions: int = 5
    hidden: Sequence[int] = (128, 128)
    conv: Sequence[int] = ()

    @nn.compact
    def __call__(self, grid: jax.Array, scalars: jax.Array, avail: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(masked logits [..., num_actions], value [...])``."""
        lead = avail.shape[:-1]
        x = grid.astype(jnp.float32)
        if self.conv:
            x = x.reshape((-1,) + x.shape[len(lead):])
            for ch in self.conv:
                x = nn.relu(nn.Conv(ch, (3, 3), padding="SAME", kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        x = x.reshape(lead + (-1,))
        x = jnp.concatenate([x, scalars.astype(jnp.float32)], axis=-1)

        actor = x
        for width in self.hidden:
            actor = nn.tanh(_dense(width, np.sqrt(2))(actor))
        logits = _dense(self.num_actions, 0.01)(actor)

        critic = x
        for width in self.hidden:
            critic = nn.tanh(_dense(width, np.sqrt(2))(critic))
        value = _dense(1, 1.0)(critic)[..., 0]
        return masked_logits(logits, avail), value
