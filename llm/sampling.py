"""Token selection from logits: greedy, temperature, top-k, top-p (nucleus).

Pure, jittable functions on a ``[..., vocab]`` float array of logits. Filters return logits
of the same shape with the removed tokens set to ``-inf`` (at least one token always stays
finite), so they compose: :func:`sample_token` applies temperature, then top-k, then top-p
(the order of ``transformers``' logits warpers), then draws with
``jax.random.categorical``.

Sampling hyper-parameters are Python numbers (static under ``jit``): the caller's compiled
generation function is cached per setting. ``temperature == 0`` means greedy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


def validate_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Raise ``ValueError`` naming the parameter and its allowed range."""
    if not temperature >= 0.0:
        raise ValueError(f"temperature={temperature} not in [0, inf) (0 means greedy)")
    if not (isinstance(top_k, int) and top_k >= 0):
        raise ValueError(f"top_k={top_k!r} not an integer in [0, vocab] (0 disables top-k)")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p} not in (0, 1] (1 disables top-p)")


def greedy(logits: jax.Array) -> jax.Array:
    """Arg-max token ids ``[...]`` int32 (the first maximum on ties)."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def apply_temperature(logits: jax.Array, temperature: float) -> jax.Array:
    """``logits / temperature`` (``temperature > 0``)."""
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} not in (0, inf) here; use greedy() for 0")
    return logits if temperature == 1.0 else logits / jnp.asarray(temperature, logits.dtype)


def top_k_filter(logits: jax.Array, k: int) -> jax.Array:
    """Keep the ``k`` largest logits per row (ties with the k-th value are kept too).

    ``k <= 0`` or ``k >= vocab`` returns ``logits`` unchanged.
    """
    vocab = logits.shape[-1]
    if k <= 0 or k >= vocab:
        return logits
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    return jnp.where(logits < kth, NEG_INF, logits)


def top_p_filter(logits: jax.Array, p: float) -> jax.Array:
    """Nucleus filter: keep the smallest set of most likely tokens whose mass reaches ``p``.

    A token is kept when the probability mass of the tokens strictly more likely than it is
    below ``p``, so the most likely token is always kept. Tokens tied with the last kept one
    are kept too. A Python ``p >= 1`` returns ``logits`` unchanged; ``p`` may also be a
    traced scalar.
    """
    if isinstance(p, (int, float)) and p >= 1.0:
        return logits
    desc = -jnp.sort(-logits, axis=-1)
    probs = jax.nn.softmax(desc.astype(jnp.float32), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    n_keep = jnp.maximum(jnp.sum(mass_before < p, axis=-1, keepdims=True), 1)
    threshold = jnp.take_along_axis(desc, n_keep - 1, axis=-1)
    return jnp.where(logits < threshold, NEG_INF, logits)


def filter_logits(logits: jax.Array, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """Temperature, then top-k, then top-p (``temperature > 0``)."""
    logits = apply_temperature(logits.astype(jnp.float32), temperature)
    logits = top_k_filter(logits, top_k)
    return top_p_filter(logits, top_p)


def sample_token(
    key: jax.Array, logits: jax.Array, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> jax.Array:
    """Draw one token id per row of ``logits`` ``[..., vocab]`` -> ``[...]`` int32.

    ``temperature == 0`` is greedy (``key`` unused). Deterministic in ``key``.
    """
    validate_sampling(temperature, top_k, top_p)
    if temperature == 0.0:
        return greedy(logits)
    filtered = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)
