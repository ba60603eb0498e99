"""The jitted training updates and the forward they differentiate.

* :func:`completion_forward`: one forward over ``[prompt | completion]``, the completion
  tokens' log-probs (and entropies) at the sampling temperature;
* :func:`accumulate_gradients`: loss, metrics and gradients summed over micro-batches in a
  ``lax.scan`` (gradient accumulation; the warm start's update uses it too);
* :func:`make_grpo_update`: the GRPO update ``(state, opt_state, batch) -> (state, opt_state,
  metrics)`` of a :class:`llm.rl.batches.GRPOBatch`; :class:`GRPOIterations`, the ``mu``
  updates of one sampled batch without a separate old log-prob forward (one compiled
  update for all of them); the optional *supervised anchor* of that update (``anchor_weight``:
  :func:`token_nll` of a :class:`llm.rl.batches.TokenBatch` of reference completions added to
  the GRPO loss, InstructGPT's PPO-ptx); and
  :func:`make_logprob_fn`, the reference (or behaviour) log-probs of a batch, in
  micro-batches.

Shapes are fixed for a whole stage, so each update compiles once (:func:`trace_counts`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from llm.rl import grpo
from llm.rl.batches import GRPOBatch, TokenBatch
from llm.model import logprobs as logprobs_mod
from llm.model import sharding as shd
from llm.generation.decode import left_pad_positions
from llm.rl.grpo import GRPOLossConfig
from llm.model.logprobs import DEFAULT_CHUNK as DEFAULT_LOGPROB_CHUNK
from llm.rl.optim import apply_gradients
from llm.rl.reuse import reused

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
    the decoder layers' rematerialisation (:data:`llm.model.config.REMAT_POLICIES`).
    """
    model = nnx.merge(graphdef, state)
    hidden = _completion_hidden(model, prompt_ids, prompt_mask, tokens, mask, remat)
    return _completion_head(model, hidden, tokens, mask, entropy=entropy, temperature=temperature, chunk=chunk)


def _completion_hidden(model: Any, prompt_ids, prompt_mask, tokens, mask, remat: str) -> jax.Array:
    """The decoder's last hidden states where a completion token is predicted (positions
    ``P-1 .. P+T-2`` of ``[prompt | completion]``): ``[B, T, d]``."""
    t = tokens.shape[1]
    ids = jnp.concatenate([prompt_ids.astype(jnp.int32), tokens.astype(jnp.int32)], axis=1)
    m = jnp.concatenate([prompt_mask.astype(bool), mask.astype(bool)], axis=1)
    return model.hidden_states(ids, left_pad_positions(m), m, last=t + 1, remat=remat)[:, :t]


def _completion_head(model: Any, hidden, tokens, mask, *, entropy: bool, temperature: float, chunk: Optional[int]):
    """:func:`completion_forward`'s outputs from the hidden states of :func:`_completion_hidden`."""
    weight, tied = logprobs_mod.head_weight(model)
    logp, ent, match = logprobs_mod.token_logprobs(hidden, weight, tokens, tied=tied, temperature=temperature,
                                                   chunk=chunk, entropy=entropy)
    valid = mask.astype(bool)
    logp = jnp.where(valid, logp, 0.0)
    if ent is not None:
        ent = jnp.where(valid, ent, 0.0)
    return logp, ent, match & valid


def joint_forward(graphdef: Any, state: Any, first: tuple, second: tuple, *, entropy: bool = False,
                  temperature: float = 1.0, chunk: Optional[int] = DEFAULT_LOGPROB_CHUNK, remat: str = "none"):
    """:func:`completion_forward` of two row sets through ONE pass of the decoder layers:
    ``first`` and ``second`` are ``(prompt_ids, prompt_mask, tokens, mask)`` of their own
    widths; the prompts are left-padded to the wider and the completions right-padded to the
    longer (padding is masked and moves no position), the rows stacked, and the LM head
    applied to each set apart: ``first`` at ``temperature`` (with ``entropy``), ``second`` at
    1. Returns ``(first's (logp, entropy, match), second's (logp, None, match))`` at their own
    widths, equal to two forwards; its backward holds one gradient of the layers, not two.
    """
    p = max(first[0].shape[1], second[0].shape[1])
    t = max(first[2].shape[1], second[2].shape[1])

    def widen(seq):
        ids, pmask, tokens, mask = seq
        left, right = ((0, 0), (p - ids.shape[1], 0)), ((0, 0), (0, t - tokens.shape[1]))
        return (jnp.pad(ids, left), jnp.pad(pmask, left), jnp.pad(tokens, right), jnp.pad(mask, right))

    a, b = widen(first), widen(second)
    rows = first[0].shape[0]
    model = nnx.merge(graphdef, state)
    hidden = _completion_hidden(model, *(jnp.concatenate([x, y], axis=0) for x, y in zip(a, b)), remat)
    ta, tb = first[2].shape[1], second[2].shape[1]
    out_a = _completion_head(model, hidden[:rows, :ta], first[2], first[3], entropy=entropy, temperature=temperature,
                             chunk=chunk)
    out_b = _completion_head(model, hidden[rows:, :tb], second[2], second[3], entropy=False, temperature=1.0,
                             chunk=chunk)
    return out_a, out_b


def shared_prompt_forward(graphdef: Any, state: Any, prompt_ids: jax.Array, prompt_mask: jax.Array,
                          tokens: jax.Array, mask: jax.Array, *,
                          chunk: Optional[int] = DEFAULT_LOGPROB_CHUNK) -> tuple[jax.Array, None, jax.Array]:
    """:func:`completion_forward` (temperature 1, no entropy) of rows that all hold the same
    prompt: row 0's prompt ``[1, P]`` goes through the layers once, into a key/value cache, and
    the ``B`` completions ``[B, T]`` after it, each attending to that cache (broadcast to the
    rows) and to its own earlier tokens. Same log-probs and the same gradient as the ``B``
    full rows (the cache is part of the differentiated graph: the prompt's keys and values
    take the completions' gradient), at the cost of one prompt and ``B`` completions instead
    of ``B`` prompts: the engineer self-play's answers to one 1,000-token context. The cached
    path has no rematerialisation (``remat``): fine for a few short answers, not for long rows.
    Returns ``(logp [B, T], None, greedy_match [B, T])`` as :func:`completion_forward`.
    """
    model = nnx.merge(graphdef, state)
    b, t = tokens.shape
    p = prompt_ids.shape[1]
    ids, pmask = prompt_ids[:1].astype(jnp.int32), prompt_mask[:1].astype(bool)
    cache = model.init_cache(1, p + t - 1) if t > 1 else None
    last, cache = model(ids, left_pad_positions(pmask), pmask, cache, kv_len=p if t > 1 else None,
                        logits_to_keep=1, hidden_only=True)  # [1, 1, d]: predicts completion token 0
    hidden = jnp.broadcast_to(last, (b, 1, last.shape[-1]))
    if t > 1:
        def rows(x):
            return jnp.broadcast_to(x, (x.shape[0], b) + x.shape[2:])

        wide = cache.replace(k=rows(cache.k), v=rows(cache.v), mask=jnp.broadcast_to(cache.mask, (b, p + t - 1)))
        positions = jnp.sum(pmask, dtype=jnp.int32) + jnp.broadcast_to(jnp.arange(t - 1, dtype=jnp.int32), (b, t - 1))
        rest, _ = model(tokens[:, : t - 1].astype(jnp.int32), positions, mask[:, : t - 1].astype(bool), wide,
                        kv_len=p + t - 1, hidden_only=True)  # [B, T-1, d]: predict tokens 1 .. T-1
        hidden = jnp.concatenate([hidden, rest], axis=1)
    return _completion_head(model, hidden, tokens, mask, entropy=False, temperature=1.0, chunk=chunk)


def apart(first: tuple, second: tuple) -> bool:
    """Whether two row sets go through the layers in two passes rather than one
    (:func:`joint_forward`): when padding both to the wider would more than double the
    tokens of either (the engineer's 1,000-token prompts beside 100-token plan prompts).
    Decided from static shapes, at trace time."""
    def width(seq):
        return int(seq[0].shape[1]) + int(seq[2].shape[1])

    joint = max(width(first), width(second))
    return joint > 2 * min(width(first), width(second))


def _micro_split(x: jax.Array, micro: int) -> jax.Array:
    """``[B, ...] -> [M, B/M, ...]``, micro-batch ``m`` = rows ``m, m + M, m + 2M, ...``.

    Taking every ``M``-th row keeps each micro-batch spread evenly over a batch that is
    sharded in contiguous blocks over the devices.
    """
    b = x.shape[0]
    return jnp.swapaxes(x.reshape((b // micro, micro) + x.shape[1:]), 0, 1)


def _micro_merge(x: jax.Array) -> jax.Array:
    """The inverse of :func:`_micro_split`: ``[M, B/M, ...] -> [B, ...]``."""
    micro, per = x.shape[:2]
    return jnp.swapaxes(x, 0, 1).reshape((micro * per,) + x.shape[2:])


def _constrain_micro(tree: Any, mesh) -> Any:
    if mesh is None:
        return tree
    from jax.sharding import NamedSharding, PartitionSpec

    spec = NamedSharding(mesh, PartitionSpec(None, shd.batch_axes(mesh)))
    return jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(x, spec), tree)


def _constrain_rows(tree: Any, mesh) -> Any:
    """Pin ``[B, ...]`` arrays to the batch layout (rows over the mesh's batch axes)."""
    if mesh is None:
        return tree
    from jax.sharding import NamedSharding, PartitionSpec

    spec = NamedSharding(mesh, PartitionSpec(shd.batch_axes(mesh)))
    return jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(x, spec), tree)


def _check_micro(rows: int, micro: int, what: str) -> None:
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        raise ValueError(f"micro_batches={micro!r} must be an integer >= 1")
    if rows % micro:
        raise ValueError(f"{what}: {rows} rows must be divisible by micro_batches={micro}")


def accumulate_gradients(loss_fn: Callable, state: Any, batch: Any, micro: int, mesh, *, per_row: bool = False):
    """Sum of loss, metrics and gradients over ``micro`` micro-batches (a ``lax.scan``).

    ``batch``: a pytree of ``[B, ...]`` arrays (a :class:`llm.rl.batches.TokenBatch` or
    :class:`~llm.rl.batches.GRPOBatch`); ``loss_fn(state, micro_batch)`` gets the same record
    with ``B / micro`` rows and returns ``(loss, metrics)``, or with ``per_row`` ``(loss,
    (metrics, rows))`` where ``rows`` is a pytree of ``[B / micro, ...]`` arrays (no gradient)
    that comes back whole, ``[B, ...]`` in the batch's row order, as a fourth output.

    One micro-batch takes the gradient directly: no zero-initialised accumulator, which would
    hold a second parameter-sized gradient buffer (15 GiB for a 4B model in float32).

    With a ``mesh`` the gradients (and the accumulator) are pinned to the parameters' FSDP
    layout (:func:`llm.model.sharding.constrain_state`): XLA reduce-scatters them instead of
    all-reducing whole gradients.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if micro == 1:
        (loss, aux), grads = grad_fn(state, batch)
        msum, rows = aux if per_row else (aux, None)
        out = (loss, msum, shd.constrain_state(grads, mesh))
        return out + (_constrain_rows(rows, mesh),) if per_row else out
    mbs = _constrain_micro(jax.tree_util.tree_map(lambda x: _micro_split(x, micro), batch), mesh)
    first = jax.tree_util.tree_map(lambda x: x[0], mbs)
    _, aux_shapes = jax.eval_shape(loss_fn, state, first)
    metric_shapes = aux_shapes[0] if per_row else aux_shapes
    zeros_m = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
    zeros_g = shd.constrain_state(jax.tree_util.tree_map(jnp.zeros_like, state), mesh)

    def body(carry, mb):
        g_acc, m_acc, l_acc = carry
        (loss, aux), g = grad_fn(state, mb)
        m, rows = aux if per_row else (aux, None)
        g = shd.constrain_state(g, mesh)
        carry = (jax.tree_util.tree_map(jnp.add, g_acc, g), jax.tree_util.tree_map(jnp.add, m_acc, m), l_acc + loss)
        return carry, rows

    (grads, msum, loss), rows = jax.lax.scan(body, (zeros_g, zeros_m, jnp.zeros((), jnp.float32)), mbs)
    out = (loss, msum, shd.constrain_state(grads, mesh))
    if not per_row:
        return out
    return out + (_constrain_rows(jax.tree_util.tree_map(_micro_merge, rows), mesh),)


def token_nll(graphdef: Any, state: Any, batch: TokenBatch, *, chunk: Optional[int] = DEFAULT_LOGPROB_CHUNK,
              remat: str = "none") -> tuple[jax.Array, dict]:
    """``(loss, {"token_acc": ...})`` of a :class:`~llm.rl.batches.TokenBatch`: the weighted
    negative log-likelihood of its completion tokens (``-sum(logp * weights)``; weights that sum
    to 1 over the batch make it the weighted token mean) and the weighted share of tokens that
    are the forward's arg-max. The warm start's loss, and the GRPO update's anchor (which
    passes the update's ``chunk`` and ``remat``: :func:`completion_forward`)."""
    logp, _, match = completion_forward(graphdef, state, *batch.sequences, chunk=chunk, remat=remat)
    return weighted_nll(logp, match, batch.weights)


def weighted_nll(logp: jax.Array, match: jax.Array, weights: jax.Array) -> tuple[jax.Array, dict]:
    """``(-sum(logp * weights), {"token_acc": sum(match * weights)})``: the supervised loss and
    arg-max accuracy of target tokens from their log-probs, whatever forward made them."""
    return -jnp.sum(logp * weights), {"token_acc": jnp.sum(match * weights)}


@reused
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
    return_logp: bool = False,
    anchor_weight: float = 0.0,
) -> Callable:
    """The jitted GRPO update ``(state, opt_state, batch[, on_policy, anchor]) -> (state, opt_state, metrics)``.

    ``batch``: a :class:`llm.rl.batches.GRPOBatch` (``ref_logp`` given when
    ``loss_config.beta > 0``); its ``weights`` are the global aggregation weights
    (:func:`llm.rl.grpo.token_weights`), so the ``micro_batches`` accumulated gradients sum
    to the full-batch gradient. Metrics are weighted means plus ``loss`` and ``grad_norm``
    (before clipping). Parameters and optimizer state are donated.

    On-policy batches (``state`` sampled them: the first update after sampling) need no old
    log-probs: with ``batch.old_logp=None``, or ``on_policy`` a True bool scalar (a traced
    argument, ``old_logp`` then ignored), the loss takes the stop-gradient of the log-probs
    this forward computes (ratio exactly 1, :func:`llm.rl.grpo.on_policy_ratio`): the loss and
    gradient of stored old log-probs without their forward pass. ``return_logp``: also return
    those log-probs, ``(state, opt_state, metrics, logp [B, T])`` in the batch layout -- the
    old log-probs of the later inner iterations (:class:`GRPOIterations`).

    The policy's log-probs and entropies are those of the sampling distribution at
    ``temperature`` (:func:`completion_forward`); a given ``old_logp`` / ``ref_logp`` must
    come from this forward or :func:`make_logprob_fn` at the same temperature.
    ``logprob_chunk`` and ``remat`` (per-layer rematerialisation, default ``"full"``): see
    :func:`completion_forward`.

    **Supervised anchor** (``anchor_weight > 0`` and an ``anchor`` batch, a
    :class:`~llm.rl.batches.TokenBatch` of reference completions whose weights sum to 1): the
    update descends ``GRPO loss + anchor_weight * token_nll(anchor)``, one optimizer step on
    the summed gradient (InstructGPT's PPO-ptx objective: the policy-gradient step may not
    trade away what supervision taught on lakes the stage does not sample). Each micro-batch
    takes its share of the anchor's rows (a multiple of ``micro_batches``) through the same
    pass of the decoder layers as its GRPO rows (:func:`joint_forward`: one gradient of the
    layers, not a second one to add; the anchor's log-probs at temperature 1), or through a
    pass of their own when their widths are far apart (:func:`apart`); its NLL and
    token accuracy are the metrics ``anchor_nll`` and ``anchor_token_acc``; ``loss`` stays the
    GRPO loss and ``grad_norm`` is the summed gradient's.
    """
    if not anchor_weight >= 0.0:
        raise ValueError(f"anchor_weight={anchor_weight} must be >= 0")

    def grpo_terms(logp, ent, mb: GRPOBatch, on_policy):
        """``(loss, metrics, aux rows)`` of the GRPO rows' log-probs and entropies."""
        loss, metrics = grpo.grpo_loss(logp, mb.old_logp, mb.advantages, mb.weights, loss_config,
                                       ref_logp=mb.ref_logp, entropy=ent, on_policy=on_policy)
        return loss, metrics, jax.lax.stop_gradient(logp)

    def loss_fn(state, mb: GRPOBatch, on_policy):
        logp, ent, _ = completion_forward(graphdef, state, *mb.sequences, entropy=compute_entropy,
                                          temperature=temperature, chunk=logprob_chunk, remat=remat)
        loss, metrics, rows = grpo_terms(logp, ent, mb, on_policy)
        return (loss, (metrics, rows)) if return_logp else (loss, metrics)

    def anchored_loss(state, pair, on_policy):
        """GRPO loss + ``anchor_weight`` x the anchor's NLL of one micro-batch ``(GRPO rows,
        anchor rows)``, both through one pass of the layers (:func:`joint_forward`); the aux
        holds the GRPO metrics and, apart, the two losses."""
        mb, amb = pair
        # a pass each when the aux rows share one prompt (self-play: run it once) or their widths are
        # far apart (two passes cost less than one padded); else one pass of both
        if amb.shared_prompt or apart(mb.sequences, amb.sequences):
            logp, ent, _ = completion_forward(graphdef, state, *mb.sequences, entropy=compute_entropy,
                                              temperature=temperature, chunk=logprob_chunk, remat=remat)
            if amb.shared_prompt:
                alogp, _, amatch = shared_prompt_forward(graphdef, state, *amb.sequences, chunk=logprob_chunk)
            else:
                alogp, _, amatch = completion_forward(graphdef, state, *amb.sequences, entropy=False,
                                                      temperature=1.0, chunk=logprob_chunk, remat=remat)
        else:
            (logp, ent, _), (alogp, _, amatch) = joint_forward(
                graphdef, state, mb.sequences, amb.sequences, entropy=compute_entropy, temperature=temperature,
                chunk=logprob_chunk, remat=remat)
        loss, metrics, rows = grpo_terms(logp, ent, mb, on_policy)
        nll, am = weighted_nll(alogp, amatch, amb.weights)
        extra = {"grpo_loss": loss, "anchor_nll": nll, "anchor_token_acc": am["token_acc"]}
        return loss + anchor_weight * nll, (((metrics, extra), rows) if return_logp else (metrics, extra))

    def update(state, opt_state, batch: GRPOBatch, on_policy=None, anchor: Optional[TokenBatch] = None):
        if not isinstance(batch, GRPOBatch):
            raise TypeError(f"the GRPO update takes a llm.rl.batches.GRPOBatch, got {type(batch).__name__}")
        if anchor is not None and not isinstance(anchor, TokenBatch):
            raise TypeError(f"the GRPO update's anchor is a llm.rl.batches.TokenBatch, got {type(anchor).__name__}")
        _check_micro(batch.rows, micro_batches, "the GRPO update")
        _TRACES["grpo_update"] += 1
        if anchor is None or anchor_weight == 0.0:
            out = accumulate_gradients(lambda st, mb: loss_fn(st, mb, on_policy), state, batch, micro_batches, mesh,
                                       per_row=return_logp)
            loss, msum, grads = out[:3]
            metrics = grpo.metric_means(msum)
        else:  # each micro-batch takes its share of the anchor's rows: one gradient of the sum, no second tree
            _check_micro(anchor.rows, micro_batches, "the GRPO update's anchor")
            out = accumulate_gradients(lambda st, pair: anchored_loss(st, pair, on_policy), state, (batch, anchor),
                                       micro_batches, mesh, per_row=return_logp)
            msum, extra = out[1]
            loss = extra.pop("grpo_loss")
            metrics = {**grpo.metric_means(msum), **extra}
            grads = out[2]
        state, opt_state, gnorm = apply_gradients(optimizer, state, opt_state, grads, mesh)
        metrics["loss"] = loss
        metrics["grad_norm"] = gnorm
        return (state, opt_state, metrics, out[3]) if return_logp else (state, opt_state, metrics)

    return jax.jit(update, donate_argnums=(0, 1))


class GRPOIterations:
    """The ``mu`` inner updates of one sampled batch, as the trainer runs them.

    ``iterations(state, opt_state, batch) -> (state, opt_state, [metrics of each update])``
    for a batch that ``state`` sampled (``batch.old_logp`` is ignored; the batch's arrays in
    their final layout). No forward pass computes the old log-probs: the first update is
    on-policy (``on_policy=True``: the stop-gradient of its own log-probs, ratio 1) and
    returns its log-probs, the sampling policy's, which updates 2 .. ``mu`` take as
    ``old_logp`` (``on_policy=False``). All ``mu`` are calls of ONE jitted update
    (:attr:`update`, :func:`make_grpo_update` with ``return_logp``; the first one gets a zero
    ``old_logp`` of the same layout), so it compiles once whatever ``mu``.

    Keyword arguments: those of :func:`make_grpo_update` (``micro_batches``, ``mesh``, ...).
    """

    def __init__(self, graphdef: Any, optimizer: optax.GradientTransformation, loss_config: GRPOLossConfig, *,
                 mu: int = 1, **update_kwargs):
        if isinstance(mu, bool) or not isinstance(mu, int) or mu < 1:
            raise ValueError(f"mu={mu!r} must be an integer >= 1")
        self.mu = mu
        self.update = make_grpo_update(graphdef, optimizer, loss_config, return_logp=True, **update_kwargs)

    @staticmethod
    def placeholder(batch: GRPOBatch) -> Any:
        """A zero ``old_logp`` for the first, on-policy update: ``[B, T]`` float32 in the
        layout of ``batch.mask`` -- its sharding, and committed to it only if the mask is --,
        so the later updates, whose ``old_logp`` comes out of the update in that layout, reuse
        the first one's compilation (and nothing downstream sees newly committed arrays)."""
        return jnp.zeros_like(batch.mask, dtype=jnp.float32)

    def __call__(self, state: Any, opt_state: Any, batch: GRPOBatch, anchor: Optional[TokenBatch] = None):
        """``anchor``: the step's supervised anchor batch (``anchor_weight``), in every one of
        the ``mu`` updates."""
        logp = self.placeholder(batch)
        out = []
        for i in range(self.mu):
            extra = () if anchor is None else (anchor,)
            state, opt_state, metrics, new = self.update(state, opt_state, batch.replace(old_logp=logp),
                                                         jnp.asarray(i == 0), *extra)
            if i == 0:
                logp = new  # the sampling policy's log-probs: old_logp of updates 2 .. mu
            out.append(metrics)
        return state, opt_state, out


@reused
def make_logprob_fn(graphdef: Any, temperature: float = 1.0,
                    logprob_chunk: Optional[int] = DEFAULT_LOGPROB_CHUNK, *, micro_batches: int = 1,
                    mesh=None) -> Callable:
    """Jitted ``(state, prompt_ids, prompt_mask, tokens, mask) -> logp [B, T]`` (no grad).

    The log-probs at ``temperature`` (:func:`completion_forward`): with the reference's state
    the ``ref_logp`` of the GRPO batch (``beta > 0``); with the policy's, the behaviour
    log-probs (which the trainer no longer computes apart: :class:`GRPOIterations`).

    ``micro_batches``: the rows go through the forward in that many blocks, one after the
    other (a ``lax.map`` over the update's micro-batch split, :func:`_micro_split`), so the
    forward's temporaries (activations, one log-prob chunk's logits) are those of ``B /
    micro_batches`` rows; the log-probs are the same as in one block. The trainer passes
    ``grpo.micro_batches``, the update's split. With a ``mesh`` each block stays spread over
    the batch axes, and the result comes back in the batch layout.
    """

    def one(state, seq):
        return completion_forward(graphdef, state, *seq, temperature=temperature, chunk=logprob_chunk)[0]

    def fn(state, prompt_ids, prompt_mask, tokens, mask):
        seq = (prompt_ids, prompt_mask, tokens, mask)
        _check_micro(int(tokens.shape[0]), micro_batches, "the log-prob forward")
        if micro_batches == 1:
            return one(state, seq)
        blocks = _constrain_micro(jax.tree_util.tree_map(lambda x: _micro_split(x, micro_batches), seq), mesh)
        return _constrain_rows(_micro_merge(jax.lax.map(lambda b: one(state, b), blocks)), mesh)

    return jax.jit(fn)
