"""Token selection from logits: greedy, temperature, top-k, top-p (nucleus).

Pure, jittable functions on a ``[..., vocab]`` float array of logits. Filters return logits
of the same shape with the removed tokens set to ``-inf`` (at least one token always stays
finite), so they compose: :func:`sample_token` applies temperature, then top-k, then top-p
(the order of ``transformers``' logits warpers), then draws with
``jax.random.categorical``.

Sampling hyper-parameters are Python numbers (static under ``jit``): the caller's compiled
generation function is cached per setting. ``temperature == 0`` means greedy.

:func:`choose_tokens` is the decode loop's sampling head: the same distribution (and, for a
given key, the same tokens) as the filters above followed by ``jax.random.categorical``, but
without their full-vocabulary passes: the filters become one per-row **threshold** (the
smallest kept logit) computed from a bounded candidate set (one ``lax.top_k``; the full sort
only as a ``lax.cond`` fallback when a row's kept set may reach past the candidates), and the
draw, the filter and the Gumbel noise fuse into one arg-max over the vocabulary. Passes over
the ``[B, V]`` float32 logits per step: greedy and unfiltered sampling one arg-max (plus the
log-sum-exp of the reported log-prob, which every path needs); top-k adds one ``top_k`` to
``k + 1`` candidates; top-p adds one ``top_k`` to :data:`TOP_P_CANDIDATES` candidates and,
without top-k, one log-sum-exp of the tempered logits (the nucleus' normaliser).
"""

from __future__ import annotations

import chex
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

    ``temperature == 0`` is greedy (``key`` unused). Deterministic in ``key``; the same
    tokens as ``jax.random.categorical(key, filter_logits(logits, ...))`` (drawn by
    :func:`choose_tokens`, without its full-vocabulary passes).
    """
    validate_sampling(temperature, top_k, top_p)
    if temperature == 0.0:
        return greedy(logits)
    flat = logits.reshape(-1, logits.shape[-1])
    tok, _ = choose_tokens(key, flat, greedy=False, temperature=temperature, top_k=top_k, top_p=top_p,
                           use_top_p=top_p < 1.0)
    return tok.reshape(logits.shape[:-1])


#: Top-p without top-k first looks for the nucleus among this many most likely tokens (one
#: ``lax.top_k``); a step sorts the full vocabulary only when some row's nucleus is not
#: inside them (a flat distribution).
TOP_P_CANDIDATES = 256


def _threshold_full(scaled: jax.Array, top_k: int, top_p, use_top_p: bool) -> jax.Array:
    """Smallest kept tempered logit per row ``[B]`` of :func:`top_k_filter` then
    :func:`top_p_filter` (the kept set is every logit at or above it): the full-sort path."""
    warped = top_k_filter(scaled, top_k)
    if use_top_p:
        warped = top_p_filter(warped, top_p)
    return jnp.min(jnp.where(jnp.isfinite(warped), warped, jnp.inf), axis=-1)


def _threshold_candidates(scaled: jax.Array, top_k: int, top_p, use_top_p: bool) -> tuple[jax.Array, jax.Array]:
    """The same threshold from a bounded candidate set; ``(threshold [B], exact [B] bool)``.

    ``exact`` is False for a row whose kept set may reach past the candidates (a tie of the
    k-th logit with the next one, or a nucleus wider than the candidates); the caller then
    uses :func:`_threshold_full`.
    """
    vocab = scaled.shape[-1]
    with_k = 0 < top_k < vocab
    n_cand = min(top_k + 1 if with_k else TOP_P_CANDIDATES, vocab)
    # [B, C] descending. The barrier keeps XLA:CPU's TopK kernel: slicing single columns of
    # top_k's output lets it rewrite the op into a sort of the whole vocabulary (700x slower)
    vals = jax.lax.optimization_barrier(jax.lax.top_k(scaled, n_cand)[0])
    everything = n_cand == vocab
    if with_k:
        kth = vals[:, top_k - 1]
        exact = vals[:, top_k] < kth if not everything else jnp.ones(kth.shape, bool)
        threshold = kth
        if not use_top_p:
            return threshold, exact
        # the nucleus of the top-k distribution: normalised over the kept candidates
        kept = jnp.where(vals >= kth[:, None], vals, NEG_INF)
        probs = jax.nn.softmax(kept, axis=-1)
    else:
        exact = jnp.ones(vals.shape[:1], bool)
        threshold = jnp.full(vals.shape[:1], NEG_INF, vals.dtype)
        kept = vals
        probs = jnp.exp(vals - jax.nn.logsumexp(scaled, axis=-1, keepdims=True))
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    n_keep = jnp.maximum(jnp.sum(mass_before < top_p, axis=-1), 1)
    p_threshold = jnp.take_along_axis(kept, n_keep[:, None] - 1, axis=-1)[:, 0]
    if not everything:
        # the nucleus ends inside the candidates and no token outside them ties with its edge
        exact = exact & (n_keep < n_cand) & (vals[:, -1] < p_threshold)
    return jnp.maximum(threshold, p_threshold), exact


def choose_tokens(key: jax.Array, logits: jax.Array, *, greedy: bool, temperature=1.0, top_k: int = 0,
                  top_p=1.0, use_top_p: bool = False) -> tuple[jax.Array, jax.Array]:
    """One decode step's head: ``(token ids [B] int32, their raw log-probs [B] float32)``.

    ``logits [B, V]``; the log-prob is under the unmodified model distribution
    (``log_softmax(logits)`` at the token). The token is drawn from the same distribution as
    ``jax.random.categorical(key, filter_logits(logits, ...))`` and, for the same ``key``, is
    the same token: ``categorical`` is the arg-max of ``logits + gumbel(key, [B, V])``, and
    here the filters only decide which logits take part. ``temperature`` and ``top_p`` may be
    traced; ``greedy``, ``top_k`` and ``use_top_p`` (``top_p < 1``) are static.
    """
    chex.assert_rank(logits, 2)
    logits = logits.astype(jnp.float32)
    if greedy:
        tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        scaled = logits / temperature
        if 0 < top_k < logits.shape[-1] or use_top_p:
            threshold, exact = _threshold_candidates(scaled, top_k, top_p, use_top_p)
            threshold = jax.lax.cond(jnp.all(exact), lambda: threshold,
                                     lambda: _threshold_full(scaled, top_k, top_p, use_top_p))
            scaled = jnp.where(scaled >= threshold[:, None], scaled, NEG_INF)
        noise = jax.random.gumbel(key, scaled.shape, scaled.dtype)
        tok = jnp.argmax(scaled + noise, axis=-1).astype(jnp.int32)
    picked = jnp.take_along_axis(logits, tok[:, None], axis=-1)[:, 0]
    return tok, picked - jax.nn.logsumexp(logits, axis=-1)
