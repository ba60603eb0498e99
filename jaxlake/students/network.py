"""The parameter-shared actor-critic and its masked categorical policy.

:class:`ActorCritic` (flax linen) reads one actor's observation: a ``grid`` (an egocentric
crop ``[G, G, C]`` of :mod:`jaxlake.observations`, the whole canvas, or any feature array),
a vector of ``scalars`` and the ``avail`` mask ``[5]``, with leading batch axes. Optional 3x3
convolutions run over a rank-3 grid; the rest is flattened, joined with the scalars and fed to
two separate MLP torsos (actor and critic, tanh, orthogonal initialisation).

The actor's logits of unavailable actions are replaced by :data:`MASKED` (a large negative
number, not ``-inf``, so that probabilities, log-probabilities and the entropy stay finite): a
masked action has probability exactly 0 in float32 and is never sampled nor chosen greedily.
Every agent uses the same parameters; the channels are egocentric (self, own goal, others),
so no agent id is needed.

**Packed grids.** A ``uint8`` grid of rank 2 per actor (``[G, G']``, channel ``c`` as bit ``c``:
the lakes' rollout, :func:`jaxlake.students.envs.lake_obs`) is unpacked here, channels first
(as :func:`jaxlake.observations.planes`, the fast layout on XLA's CPU backend), and the first
layers read the rows of their kernels in that order: a kernel keeps the float grid's layout
(``[G * G' * C + S, width]``, channels last), so parameters trained on either grid read both
and give the same outputs; the two torsos' first layers run as one product. With ``crop`` set
(an egocentric crop), the ``self`` plane is read at the centre cell only: an actor stands at
the centre of its own crop, so the plane's other cells are always 0 and their rows (which get
no gradient) are skipped, a sixth fewer inputs.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxlake.observations import NUM_CHANNELS, SELF, unpack

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


def _dense(width: int, scale: float, name: str) -> nn.Dense:
    return nn.Dense(width, kernel_init=nn.initializers.orthogonal(scale), bias_init=nn.initializers.zeros, name=name)


class _Planes(nn.Module):
    """A first dense layer's parameters for packed grids: :class:`nn.Dense`'s (kernel
    ``[G * G' * C + S, features]``, the float grid's layout, and its initialisation), returned
    as the kernel's rows in :func:`_packed_inputs`' order (slices, no gather) and the bias."""

    features: int
    scale: float

    @nn.compact
    def __call__(self, shape: tuple, scalars: int, crop: bool) -> tuple[jax.Array, jax.Array]:
        cells = shape[0] * shape[1]
        kernel = self.param("kernel", nn.initializers.orthogonal(self.scale),
                            (cells * NUM_CHANNELS + scalars, self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        by_cell = kernel[:cells * NUM_CHANNELS].reshape(cells, NUM_CHANNELS, self.features)
        centre = _centre(shape)
        rows = [by_cell[centre:centre + 1, c] if crop and c == SELF else by_cell[:, c] for c in range(NUM_CHANNELS)]
        return jnp.concatenate(rows + [kernel[cells * NUM_CHANNELS:]], axis=0), bias


def _centre(shape: tuple) -> int:
    return (shape[0] // 2) * shape[1] + shape[1] // 2


def _packed_inputs(grid: jax.Array, scalars: jax.Array, lead: tuple, crop: bool) -> jax.Array:
    """``[..., F]`` float32: the packed grids' planes, channel by channel (with ``crop``, the
    ``self`` plane's centre cell only), then the scalars."""
    shape = grid.shape[len(lead):]
    flat = grid.reshape(lead + (shape[0] * shape[1],))
    centre = _centre(shape)
    planes = [flat[..., centre:centre + 1] if crop and c == SELF else flat for c in range(NUM_CHANNELS)]
    bits = [((p >> c) & jnp.uint8(1)).astype(jnp.float32) for c, p in enumerate(planes)]
    return jnp.concatenate(bits + [scalars.astype(jnp.float32)], axis=-1)


class ActorCritic(nn.Module):
    """Actor and critic over one actor's observation (any leading batch axes).

    Attributes:
      num_actions: size of the action set (5 for the lakes).
      hidden: hidden widths of each torso.
      conv: channels of the 3x3 convolutions over a rank-3 grid (``()``: none).
      crop: packed grids are egocentric crops (module docstring: the ``self`` plane is read at
        the centre only; the outputs are the same without it).
    """

    num_actions: int = 5
    hidden: Sequence[int] = (128, 128)
    conv: Sequence[int] = ()
    crop: bool = False

    @nn.compact
    def __call__(self, grid: jax.Array, scalars: jax.Array, avail: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(masked logits [..., num_actions], value [...])``."""
        lead = avail.shape[:-1]
        packed = grid.dtype == jnp.uint8 and grid.ndim == len(lead) + 2
        depth = len(self.hidden)
        names = [f"Dense_{i}" for i in range(2 * depth + 2)]  # nn.compact's names: the same parameter tree
        if packed and not self.conv:
            # both torsos' first layers in one product (the same outputs as two)
            shape, first = grid.shape[len(lead):], self.hidden[0]
            ka, ba = _Planes(first, np.sqrt(2), name=names[0])(shape, scalars.shape[-1], self.crop)
            kc, bc = _Planes(first, np.sqrt(2), name=names[depth + 1])(shape, scalars.shape[-1], self.crop)
            h = nn.tanh(_packed_inputs(grid, scalars, lead, self.crop) @ jnp.concatenate([ka, kc], axis=1)
                        + jnp.concatenate([ba, bc]))
            actor, critic = h[..., :first], h[..., first:]
        else:
            x = unpack(grid) if packed else grid.astype(jnp.float32)
            if self.conv:
                x = x.reshape((-1,) + x.shape[len(lead):])
                for ch in self.conv:
                    x = nn.relu(nn.Conv(ch, (3, 3), padding="SAME",
                                        kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
            x = x.reshape(lead + (-1,))
            x = jnp.concatenate([x, scalars.astype(jnp.float32)], axis=-1)
            actor = nn.tanh(_dense(self.hidden[0], np.sqrt(2), names[0])(x))
            critic = nn.tanh(_dense(self.hidden[0], np.sqrt(2), names[depth + 1])(x))

        for i, width in enumerate(self.hidden[1:], start=1):
            actor = nn.tanh(_dense(width, np.sqrt(2), names[i])(actor))
        logits = _dense(self.num_actions, 0.01, names[depth])(actor)

        for i, width in enumerate(self.hidden[1:], start=1):
            critic = nn.tanh(_dense(width, np.sqrt(2), names[depth + 1 + i])(critic))
        value = _dense(1, 1.0, names[2 * depth + 1])(critic)[..., 0]
        return masked_logits(logits, avail), value
