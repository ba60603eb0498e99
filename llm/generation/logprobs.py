"""Full-forward sequence log-probs: the per-token log-probs of given completions under a model.

Public API: :func:`sequence_logprobs` (pure and differentiable, no ``jit`` inside: the GRPO
loss calls it). It takes prompts left-padded and completions right-padded as
:func:`llm.generation.text.generate` / :func:`llm.generation.decode.generate_ids` return them,
and gives the log-probs of the raw model distribution those report (temperature 1, no
filters) unless told another temperature. The prompt is prefilled into a KV cache with the
same RoPE positions (:func:`llm.generation.decode.left_pad_positions`) as the cached decoding,
then the completion runs through that cache in one pass (not one step per token).
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from llm.generation.decode import left_pad_positions, split_model

__all__ = ["sequence_logprobs"]


def _as_module(model: Any) -> nnx.Module:
    if isinstance(model, nnx.Module):
        return model
    graphdef, state = split_model(model)
    return nnx.merge(graphdef, state)


def _prefill_all_but_last(model, input_ids, prompt_mask, capacity: int):
    """Write the KV cache of every prompt token but the last; return ``(cache, positions)``.

    The logits of this call are unused, so XLA drops the ``[B, P-1, vocab]`` LM-head
    product (the most expensive part of a prefill for large vocabularies); the caller runs
    the last prompt token (and, for :func:`sequence_logprobs`, the completion) through the
    cache to get exactly the logits it needs.
    """
    batch, prompt_len = input_ids.shape
    positions = left_pad_positions(prompt_mask)
    cache = model.init_cache(batch, capacity)
    if prompt_len > 1:
        _, cache = model(input_ids[:, :-1], positions=positions[:, :-1], attention_mask=prompt_mask[:, :-1],
                         cache=cache)
    return cache, positions


def sequence_logprobs(model: Any, prompt_ids, prompt_mask, completion_ids, completion_mask, *,
                      temperature: float = 1.0) -> jax.Array:
    """Per-token log-probs of completions under the model, in one pass over the sequence.

    Pure and differentiable (no ``jit`` inside; call it inside the GRPO loss). The prompt is
    left-padded and the completion right-padded, exactly as :func:`llm.generation.text.generate` returns them,
    so positions (``cumsum(mask) - 1``) match the cached decoding.

    The pass runs the prompt (all but its last token) into a KV cache, then the last prompt
    token and the completion through that cache: numerically the full causal forward, but the
    LM head is evaluated only at the ``T`` positions that predict completion tokens (no
    ``[B, P, vocab]`` logits, which dominate memory for real Qwen3 vocabularies).

    Args:
      model: ``nnx.Module`` or ``(graphdef, state)``.
      prompt_ids, prompt_mask: ``[B, P]`` left-padded prompts and their mask (the last
        column must be a real token in every row, as left padding guarantees).
      completion_ids, completion_mask: ``[B, T]`` completions and their mask.
      temperature: divide logits by it first (1 = the raw model distribution, the one
        :func:`llm.generation.text.generate` reports).

    Returns:
      ``[B, T]`` float32 log-probs, 0 where ``completion_mask`` is False.
    """
    chex.assert_rank([prompt_ids, completion_ids], 2)
    chex.assert_equal_shape([prompt_ids, prompt_mask])
    chex.assert_equal_shape([completion_ids, completion_mask])
    chex.assert_equal_shape_prefix([prompt_ids, completion_ids], 1)
    module = _as_module(model)
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    completion_ids = jnp.asarray(completion_ids, jnp.int32)
    pmask = jnp.asarray(prompt_mask).astype(bool)
    cmask = jnp.asarray(completion_mask).astype(bool)
    t = completion_ids.shape[1]
    cache, positions = _prefill_all_but_last(module, prompt_ids, pmask, prompt_ids.shape[1] + t)
    # inputs that predict the completion: last prompt token, then completion[:, :-1]
    ids = jnp.concatenate([prompt_ids[:, -1:], completion_ids[:, :-1]], axis=1)
    mask = jnp.concatenate([pmask[:, -1:], cmask[:, :-1]], axis=1)
    pos = positions[:, -1:] + jnp.cumsum(mask.astype(jnp.int32), axis=1) - mask[:, :1].astype(jnp.int32)
    logits, _ = module(ids, positions=pos, attention_mask=mask, cache=cache)
    logits = logits.astype(jnp.float32)
    if temperature != 1.0:
        logits = logits / temperature
    logp = jax.nn.log_softmax(logits, axis=-1)
    out = jnp.take_along_axis(logp, completion_ids[..., None], axis=-1)[..., 0]
    return jnp.where(cmask, out, 0.0)
