"""The jitted training updates and the forward they differentiate.

* :func:`completion_forward`: one forward over ``[prompt | completion]``, the completion
  tokens' log-probs (and entropies) at the sampling temperature;
* :func:`accumulate_gradients`: loss, metrics and gradients summed over micro-batches in a
  ``lax.scan`` (gradient accumulation; the warm start's update uses it too);
* :func:`make_grpo_update`: the GRPO update ``(state, opt_state, batch) -> (state, opt_state,
  metrics)`` of a :class:`llm.rl.batches.GRPOBatch`, and :func:`make_logprob_fn`, the
  behaviour / reference log-probs of a batch.

Shapes are fixed for a whole stage, so each update compiles once (:func:`trace_counts`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from llm.rl import grpo
from llm.rl.batches import GRPOBatch
from llm.model import logprobs as logprobs_mod
from llm.model import sharding as shd
from llm.generation.decode import left_pad_positions
from llm.rl.grpo import GRPOLossConfig
from llm.model.logprobs import DEFAULT_CHUNK as DEFAULT_LOGPROB_CHUNK
from llm.rl.optim import apply_gradients

#: Traces of the GRPO update in this process. The one counter the trainer keeps: it is bumped
#: in the update's Python body, which runs only while JAX traces it (once per compilation),
#: and tests check that a whole stage compiles the update once.
_TRACES = {"grpo_update": 0}


def trace_counts() -> dict[str, int]:
    """How often the jitted GRPO update was traced (compiled) in this process."""
    return dict(_TRACES)


def completion_forward(
    graphdef: Any,
    state: Any,
    prompt_ids: jax.Array,
    prompt_mask: jax.Array,
    tokens: jax.Array,
    mask: jax.Array,
    *,
    entropy: bool = False,
    temperature: float = 1.0,
    chunk: Optional[int] = DEFAULT_LOGPROB_CHUNK,
    remat: str = "none",
) -> tuple[jax.Array, Optional[jax.Array], jax.Array]:
    """One full forward over ``[prompt | completion]`` (the layout :func:`generate_ids` uses).

    Returns ``(logp [B, T], entropy [B, T] or None, greedy_match [B, T] bool)``: the
    log-probs of the completion tokens under the model's distribution at ``temperature``
    (``softmax(logits / temperature)``: the sampler's distribution, so the GRPO ratio, KL and
    entropy all refer to the policy that drew the tokens), the per-token entropies of that
    distribution and whether each token is the arg-max; all 0/False where ``mask`` is False.

    ``chunk`` tokens at a time go through the LM head (:mod:`llm.model.logprobs`: the ``[B, T, V]``
    float32 logits are never materialised, and the backward pass recomputes each chunk);
    ``None`` computes the full logits at once (the reference path, same values). ``remat``:
    the decoder layers' rematerialisation (:data:`llm.model.qwen3.REMAT_POLICIES`).
    """
    model = nnx.merge(graphdef, state)
    t = tokens.shape[1]
    ids = jnp.concatenate([prompt_ids.astype(jnp.int32), tokens.astype(jnp.int32)], axis=1)
    m = jnp.concatenate([prompt_mask.astype(bool), mask.astype(bool)], axis=1)
    # the LM head only where a completion token is predicted: positions P-1 .. P+T-2
    hidden = model.hidden_states(ids, left_pad_positions(m), m, last=t + 1, remat=remat)[:, :t]
    weight, tied = logprobs_mod.head_weight(model)
    logp, ent, match = logprobs_mod.token_logprobs(hidden, weight, tokens, tied=tied, temperature=temperature,
                                                   chunk=chunk, entropy=entropy)
    valid = mask.astype(bool)
    logp = jnp.where(valid, logp, 0.0)
    if ent is not None:
        ent = jnp.where(valid, ent, 0.0)
    return logp, ent, match & valid


def _micro_split(x: jax.Array, micro: int) -> jax.Array:
    """``[B, ...] -> [M, B/M, ...]``, micro-batch ``m`` = rows ``m, m + M, m + 2M, ...``.

    Taking every ``M``-th row keeps each micro-batch spread evenly over a batch that is
    sharded in contiguous blocks over the devices.
    """
    b = x.shape[0]
    return jnp.swapaxes(x.reshape((b // micro, micro) + x.shape[1:]), 0, 1)


def _constrain_micro(tree: Any, mesh) -> Any:
    if mesh is None:
        return tree
    from jax.sharding import NamedSharding, PartitionSpec

    spec = NamedSharding(mesh, PartitionSpec(None, shd.batch_axes(mesh)))
    return jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(x, spec), tree)


def accumulate_gradients(loss_fn: Callable, state: Any, batch: Any, micro: int, mesh):
    """Sum of loss, metrics and gradients over ``micro`` micro-batches (a ``lax.scan``).

    ``batch``: a pytree of ``[B, ...]`` arrays (a :class:`llm.rl.batches.TokenBatch` or
    :class:`~llm.rl.batches.GRPOBatch`); ``loss_fn(state, micro_batch)`` gets the same record
    with ``B / micro`` rows.

    One micro-batch takes the gradient directly: no zero-initialised accumulator, which would
    hold a second parameter-sized gradient buffer (15 GiB for a 4B model in float32).

    With a ``mesh`` the gradients (and the accumulator) are pinned to the parameters' FSDP
    layout (:func:`llm.model.sharding.constrain_state`): XLA reduce-scatters them instead of
    all-reducing whole gradients.
    """
    if micro == 1:
        (loss, msum), grads = jax.value_and_grad(loss_fn, has_aux=True)(state, batch)
        return loss, msum, shd.constrain_state(grads, mesh)
    mbs = _constrain_micro(jax.tree_util.tree_map(lambda x: _micro_split(x, micro), batch), mesh)
    first = jax.tree_util.tree_map(lambda x: x[0], mbs)
    _, metric_shapes = jax.eval_shape(loss_fn, state, first)
    zeros_m = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
    zeros_g = shd.constrain_state(jax.tree_util.tree_map(jnp.zeros_like, state), mesh)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def body(carry, mb):
        g_acc, m_acc, l_acc = carry
        (loss, m), g = grad_fn(state, mb)
        g = shd.constrain_state(g, mesh)
        return (jax.tree_util.tree_map(jnp.add, g_acc, g), jax.tree_util.tree_map(jnp.add, m_acc, m), l_acc + loss), None

    (grads, msum, loss), _ = jax.lax.scan(body, (zeros_g, zeros_m, jnp.zeros((), jnp.float32)), mbs)
    return loss, msum, shd.constrain_state(grads, mesh)


def make_grpo_update(
    graphdef: Any,
    optimizer: optax.GradientTransformation,
    loss_config: GRPOLossConfig,
    *,
    micro_batches: int = 1,
    compute_entropy: bool = True,
    mesh=None,
    temperature: float = 1.0,
    logprob_chunk: Optional[int] = DEFAULT_LOGPROB_CHUNK,
    remat: str = "full",
) -> Callable:
    """The jitted GRPO update ``(state, opt_state, batch) -> (state, opt_state, metrics)``.

    ``batch``: a :class:`llm.rl.batches.GRPOBatch` (``ref_logp`` given when
    ``loss_config.beta > 0``); its ``weights`` are the global aggregation weights
    (:func:`llm.rl.grpo.token_weights`), so the ``micro_batches`` accumulated gradients sum
    to the full-batch gradient. Metrics are weighted means plus ``loss`` and ``grad_norm``
    (before clipping). Parameters and optimizer state are donated.

    The policy's log-probs and entropies are those of the sampling distribution at
    ``temperature`` (:func:`completion_forward`); ``old_logp`` and ``ref_logp`` must come from
    :func:`make_logprob_fn` at the same temperature, so the ratio is exactly 1 on the first
    inner iteration. ``logprob_chunk`` and ``remat`` (per-layer rematerialisation, default
    ``"full"``): see :func:`completion_forward`.
    """

    def loss_fn(state, mb: GRPOBatch):
        logp, ent, _ = completion_forward(graphdef, state, *mb.sequences, entropy=compute_entropy,
                                          temperature=temperature, chunk=logprob_chunk, remat=remat)
        return grpo.grpo_loss(logp, mb.old_logp, mb.advantages, mb.weights, loss_config, ref_logp=mb.ref_logp,
                              entropy=ent)

    def update(state, opt_state, batch: GRPOBatch):
        if not isinstance(batch, GRPOBatch):
            raise TypeError(f"the GRPO update takes a llm.rl.batches.GRPOBatch, got {type(batch).__name__}")
        _TRACES["grpo_update"] += 1
        loss, msum, grads = accumulate_gradients(loss_fn, state, batch, micro_batches, mesh)
        state, opt_state, gnorm = apply_gradients(optimizer, state, opt_state, grads, mesh)
        metrics = grpo.metric_means(msum)
        metrics["loss"] = loss
        metrics["grad_norm"] = gnorm
        return state, opt_state, metrics

    return jax.jit(update, donate_argnums=(0, 1))


def make_logprob_fn(graphdef: Any, temperature: float = 1.0,
                    logprob_chunk: Optional[int] = DEFAULT_LOGPROB_CHUNK) -> Callable:
    """Jitted ``(state, prompt_ids, prompt_mask, tokens, mask) -> logp [B, T]`` (no grad).

    The log-probs at ``temperature`` (:func:`completion_forward`): with the policy's state
    these are the behaviour log-probs ``old_logp`` of the GRPO batch (recomputed with the
    training forward rather than taken from the sampler), with the reference's the
    ``ref_logp``.
    """

    def fn(state, prompt_ids, prompt_mask, tokens, mask):
        return completion_forward(graphdef, state, prompt_ids, prompt_mask, tokens, mask, temperature=temperature,
                                  chunk=logprob_chunk)[0]

    return jax.jit(fn)

