"""Token log-probs and entropies without the full-vocabulary logits.

The GRPO loss needs, for every completion token, ``log softmax(logits / T)[token]`` and (for
a metric) the entropy of that distribution. Computing them from the model's ``[B, T, V]``
float32 logits holds ``B * T * V * 4`` bytes -- 9.3 GiB for 16 rows x 1024 tokens of Qwen3's
151,936-token vocabulary -- and autodiff keeps several such buffers alive for the backward
pass (the softmax, the entropy's products, their cotangents).

:func:`token_logprobs` instead takes the final hidden states ``[B, T, H]`` and the LM-head
weight and walks over the sequence in chunks of ``chunk`` tokens with ``lax.map``: each
chunk's ``[B, chunk, V]`` logits exist only inside one iteration, and the per-chunk function
is wrapped in ``jax.checkpoint`` so the backward pass recomputes them chunk by chunk instead
of saving them. Peak extra memory is a few ``[B, chunk, V]`` float32 buffers whatever ``T``.

The hidden states come from :meth:`llm.model.qwen3.Qwen3ForCausalLM.hidden_states` (the model's own
forward without the LM head: one layer scan, with its rematerialisation policy and attention
implementation); tests check the pair against the model's own logits.

Shapes: ``B`` rows, ``T`` positions, ``H`` hidden size, ``V`` vocabulary; everything static.
"""

from __future__ import annotations

from typing import Any, Optional

import chex
import jax
import jax.numpy as jnp

#: Default tokens per chunk: ``[B, 128, V]`` float32 is 1.2 GiB for B = 16 and Qwen3's vocabulary.
DEFAULT_CHUNK = 128

def head_weight(model: Any) -> tuple[jax.Array, bool]:
    """``(weight, tied)``: the embedding table ``[V, H]`` when the head is tied, else the
    head kernel ``[H, V]``; in the model's compute dtype (as the model's own head uses them)."""
    dtype = model.config.jnp_dtype
    if model.lm_head is None:
        return model.embed_tokens.embedding[...].astype(dtype), True
    return model.lm_head.kernel[...].astype(dtype), False


def _chunk_stats(h: jax.Array, w: jax.Array, tok: jax.Array, tied: bool, temperature: float, entropy: bool):
    """``h [B, C, H]``, ``tok [B, C]`` -> ``(logp, entropy, argmax == tok)``, each ``[B, C]``."""
    spec = "bch,vh->bcv" if tied else "bch,hv->bcv"
    logits = jnp.einsum(spec, h, w, preferred_element_type=jnp.float32).astype(jnp.float32)
    if temperature != 1.0:
        logits = logits / temperature
    logz = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, tok[..., None], axis=-1)[..., 0]
    logp = target - logz
    if entropy:
        # H = logz - sum_v p_v * logit_v
        ent = logz - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)
    else:
        ent = jnp.zeros_like(logp)
    match = jnp.argmax(logits, axis=-1) == tok
    return logp, ent, match


def token_logprobs(
    hidden: jax.Array,
    weight: jax.Array,
    tokens: jax.Array,
    *,
    tied: bool,
    temperature: float = 1.0,
    chunk: Optional[int] = DEFAULT_CHUNK,
    entropy: bool = True,
) -> tuple[jax.Array, Optional[jax.Array], jax.Array]:
    """Log-probs, entropies and greedy matches of ``tokens`` under ``softmax(hidden @ W / T)``.

    Args:
      hidden: ``[B, T, H]`` final hidden states (``model.hidden_states``); row ``b``, position
        ``t`` predicts ``tokens[b, t]``.
      weight: the head weight from :func:`head_weight` (``[V, H]`` when ``tied``, else
        ``[H, V]``).
      tokens: ``[B, T]`` int token ids.
      tied: the layout of ``weight``.
      temperature: the logits are divided by it (``> 0``): the sampling distribution of a
        sampler at that temperature (1 = the raw model).
      chunk: tokens per chunk (static, ``>= 1``; ``T`` is padded up to a multiple); ``None``
        computes the whole ``[B, T, V]`` logits at once (the reference path).
      entropy: also return the per-token entropies (nats) of the same distribution.

    Returns:
      ``(logp [B, T] float32, entropy [B, T] float32 or None, match [B, T] bool)``.
      Gradients flow to ``hidden`` and ``weight`` (the chunked path recomputes each chunk's
      logits in the backward pass instead of storing them).
    """
    chex.assert_rank([hidden, tokens], [3, 2])
    chex.assert_equal_shape_prefix([hidden, tokens], 2)
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    tokens = tokens.astype(jnp.int32)
    b, t, hdim = hidden.shape
    if chunk is None:
        logp, ent, match = _chunk_stats(hidden, weight, tokens, tied, float(temperature), entropy)
        return logp, (ent if entropy else None), match
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk={chunk!r} must be an integer >= 1 (or None for the full logits)")
    c = min(chunk, t)
    n = -(-t // c)
    pad = n * c - t
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        tokens = jnp.pad(tokens, ((0, 0), (0, pad)))
    hs = jnp.swapaxes(hidden.reshape(b, n, c, hdim), 0, 1)  # [n, B, C, H]
    ts = jnp.swapaxes(tokens.reshape(b, n, c), 0, 1)  # [n, B, C]

    @jax.checkpoint
    def one(xs):
        h, tok = xs
        return _chunk_stats(h, weight, tok, tied, float(temperature), entropy)

    logp, ent, match = jax.lax.map(one, (hs, ts))

    def unchunk(x):
        return jnp.swapaxes(x, 0, 1).reshape(b, n * c)[:, :t]

    return unchunk(logp), (unchunk(ent) if entropy else None), unchunk(match)
