"""GRPO loss math: advantages, masks, the clipped surrogate, KL estimators, aggregation.

Everything here is a pure function over arrays with static shapes, so it traces once inside
the trainer's jitted update. Shapes:

* ``N`` groups (one lake each) of ``G`` completions; flat batch ``B = N * G`` with the
  ``G`` completions of a group contiguous (row ``n * G + g``).
* ``T`` completion tokens per row (right-padded); ``mask [B, T]`` is 1 on real completion
  tokens.

Loss aggregation is expressed as *token weights* (:func:`token_weights`) computed once over
the whole (global) batch: the loss is ``sum(per_token_loss * weights)``. Splitting the batch
into micro-batches for gradient accumulation and summing their losses therefore gives exactly
the full-batch loss and gradient, whatever the aggregation mode.

Modes (see the docstrings for the exact formulas):

* advantages: ``"grpo"`` group z-score (default), ``"dr_grpo"`` mean-only, ``"rloo"``
  leave-one-out baseline; the z-score divides by the *sample* standard deviation (ddof 1)
  plus ``std_eps = 1e-4`` by default, as Hugging Face TRL's GRPOTrainer does, so learning
  curves compare with TRL's; ``std="population"`` (ddof 0) is the other choice. The sample
  std is ``sqrt(G / (G - 1))`` times the population one (1.069x at G = 8, 1.41x at G = 2), and
  the larger ``std_eps`` keeps a near-tied group small: rewards ``[0, 0, 0, 1e-5]`` get
  advantages of about ``+-0.07``, where the population std + 1e-6 gives ``+-1.41`` (a
  rounding-level reward difference would weigh as much as a real one);
* aggregation: ``"token_mean"`` (DAPO), ``"seq_mean_token_mean"`` (original GRPO),
  ``"constant"`` (Dr. GRPO: divide by ``B * max_len``, ``B`` the number of sequences in the
  batch whatever is masked: a fixed constant);
* KL penalty, a loss term ``beta * k`` on tokens sampled from ``pi`` (see
  :func:`kl_estimate`): ``"k2"`` (``1/2 (log pi - log ref)^2``, its expected gradient is the
  gradient of ``KL(pi || ref)``) or ``"k3"`` (``exp(ref - pi) - (ref - pi) - 1``, its
  expected gradient is the gradient of the *reverse* ``KL(ref || pi)``, as in DeepSeekMath's
  GRPO). ``"k1"`` (``log pi - log ref``) is rejected: as a loss term its expected gradient is
  ``E_pi[k1 * 0 + grad log pi] = 0``, a penalty that is pure noise (k1 belongs in the reward,
  PPO-RLHF style, which this trainer does not do). ``beta == 0`` means the reference is never
  evaluated (the trainer skips its forward pass). The ``kl`` metric is the k3 value, an
  unbiased non-negative estimate of ``KL(pi || ref)`` whatever the estimator.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import chex
import jax
import jax.numpy as jnp

ADVANTAGE_MODES = ("grpo", "dr_grpo", "rloo")
ADVANTAGE_STDS = ("sample", "population")
AGGREGATION_MODES = ("token_mean", "seq_mean_token_mean", "constant")
KL_ESTIMATORS = ("k2", "k3")


def _check_estimator(estimator: str) -> None:
    if estimator == "k1":
        raise ValueError("kl_estimator='k1' (log pi - log ref) has zero expected gradient as a loss term "
                         "(E_pi[grad log pi] = 0), so the penalty would be pure noise; use 'k2' "
                         "(gradient of KL(pi||ref)) or 'k3' (gradient of KL(ref||pi), DeepSeekMath)")
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator={estimator!r} not in {KL_ESTIMATORS}")


@dataclasses.dataclass(frozen=True)
class GRPOLossConfig:
    """Static settings of the GRPO objective (hashable: usable as a jit static argument).

    Attributes:
      advantage: ``"grpo"`` | ``"dr_grpo"`` | ``"rloo"``.
      aggregation: ``"token_mean"`` | ``"seq_mean_token_mean"`` | ``"constant"``.
      eps_low: lower clip range, ratio clipped at ``1 - eps_low`` (in ``[0, 1)``).
      eps_high: upper clip range, ratio clipped at ``1 + eps_high`` (``>= 0``; DAPO's
        "clip-higher" uses ``eps_high > eps_low``).
      beta: KL coefficient (``>= 0``); 0 skips the reference model entirely.
      kl_estimator: ``"k2"`` (gradient of ``KL(pi || ref)``) | ``"k3"`` (gradient of
        ``KL(ref || pi)``, DeepSeekMath); ``"k1"`` raises (zero expected gradient as a loss).
      max_len: the constant completion length of the ``"constant"`` aggregation (tokens);
        ``None`` means the padded length ``T`` of the batch.
      std: the z-score's group standard deviation: ``"sample"`` (ddof 1, TRL's) or
        ``"population"`` (ddof 0).
      std_eps: added to the group standard deviation in the z-score (TRL: 1e-4).
      overlong_mask: mask out completions that were truncated at the token limit.
      negative_weight: the factor of negative advantages, in ``[0, 1]`` (:func:`group_advantages`):
        1 is GRPO; 0 trains on the group's better-than-mean completions only (positive sample
        reinforcement, Zhu et al. 2025, "The Surprising Effectiveness of Negative
        Reinforcement in LLM Reasoning").

    Dynamic sampling (DAPO) is a setting of the trainer, not of the loss:
    ``train.grpo.dynamic_sampling`` (:class:`llm.rl.dynamic.DynamicSamplingConfig`).
    """

    advantage: str = "grpo"
    aggregation: str = "token_mean"
    eps_low: float = 0.2
    eps_high: float = 0.28
    beta: float = 0.0
    kl_estimator: str = "k3"
    max_len: Optional[int] = None
    std: str = "sample"
    std_eps: float = 1e-4
    overlong_mask: bool = False
    negative_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGE_MODES:
            raise ValueError(f"advantage={self.advantage!r} not in {ADVANTAGE_MODES}")
        if self.aggregation not in AGGREGATION_MODES:
            raise ValueError(f"aggregation={self.aggregation!r} not in {AGGREGATION_MODES}")
        _check_estimator(self.kl_estimator)
        if not 0.0 <= self.eps_low < 1.0:
            raise ValueError(f"eps_low={self.eps_low} not in [0, 1)")
        if not self.eps_high >= 0.0:
            raise ValueError(f"eps_high={self.eps_high} must be >= 0")
        if not self.beta >= 0.0:
            raise ValueError(f"beta={self.beta} must be >= 0")
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"max_len={self.max_len} must be >= 1 (or None)")
        if self.std not in ADVANTAGE_STDS:
            raise ValueError(f"std={self.std!r} not in {ADVANTAGE_STDS}")
        if not self.std_eps > 0.0:
            raise ValueError(f"std_eps={self.std_eps} must be > 0")
        if isinstance(self.negative_weight, bool) or not isinstance(self.negative_weight, (int, float)) \
                or not 0.0 <= self.negative_weight <= 1.0:
            raise ValueError(f"negative_weight={self.negative_weight!r} not a number in [0, 1]")

    @property
    def use_reference(self) -> bool:
        """Whether the reference model's log-probs are needed at all."""
        return self.beta > 0.0


# ----------------------------------------------------------------------------- advantages
def group_advantages(rewards: jax.Array, mode: str = "grpo", std_eps: float = 1e-4,
                     std: str = "sample", negative_weight: float = 1.0) -> jax.Array:
    """Advantages from grouped rewards.

    Args:
      rewards: ``[N, G]`` float rewards, one row per group (``G >= 2``).
      mode: ``"grpo"``: ``(r - mean) / (std + std_eps)``;
        ``"dr_grpo"``: ``r - mean`` (no std division, Dr. GRPO);
        ``"rloo"``: ``r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean)``.
      std_eps: stabiliser of the z-score.
      std: ``"sample"`` (ddof 1, as TRL) or ``"population"`` (ddof 0) standard deviation.
      negative_weight: negative advantages are multiplied by this (``[0, 1]``; 1: unchanged).

    Returns:
      ``[N, G]`` float32 advantages; a group whose rewards are all equal gets zeros in every
      mode.
    """
    chex.assert_rank(rewards, 2)
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage mode={mode!r} not in {ADVANTAGE_MODES}")
    if std not in ADVANTAGE_STDS:
        raise ValueError(f"advantage std={std!r} not in {ADVANTAGE_STDS}")
    group = rewards.shape[1]
    if group < 2:
        raise ValueError(f"group size G={group} must be >= 2 for group-relative advantages")
    rewards = rewards.astype(jnp.float32)
    centred = rewards - jnp.mean(rewards, axis=1, keepdims=True)
    if mode == "grpo":
        ddof = 1 if std == "sample" else 0
        adv = centred / (jnp.std(rewards, axis=1, keepdims=True, ddof=ddof) + std_eps)
    elif mode == "dr_grpo":
        adv = centred
    else:
        adv = centred * (group / (group - 1.0))
    return adv if negative_weight == 1.0 else jnp.where(adv < 0, adv * negative_weight, adv)


def zero_variance_groups(rewards: jax.Array, atol: float = 1e-6) -> jax.Array:
    """``[N]`` bool: groups whose ``G`` rewards are all equal (within ``atol``)."""
    chex.assert_rank(rewards, 2)
    return (jnp.max(rewards, axis=1) - jnp.min(rewards, axis=1)) <= atol


def sequence_mask(
    rewards: jax.Array,
    truncated: jax.Array,
    *,
    drop_tied: bool,
    overlong_mask: bool,
    atol: float = 1e-6,
) -> jax.Array:
    """``[N * G]`` float32 1/0: which completions take part in the loss.

    Args:
      rewards: ``[N, G]`` rewards.
      truncated: ``[N * G]`` bool, the completion hit the token limit without an end token
        (the length is counted in tokens, not characters).
      drop_tied: drop every completion of a group whose rewards are all equal (dynamic
        sampling: such a group has zero advantage, and dropped it also leaves the token mean's
        divisor).
      overlong_mask: drop truncated completions.
    """
    n, g = rewards.shape
    chex.assert_shape(truncated, (n * g,))
    keep = jnp.ones((n * g,), dtype=bool)
    if drop_tied:
        keep &= jnp.repeat(~zero_variance_groups(rewards, atol), g)
    if overlong_mask:
        keep &= ~truncated.astype(bool)
    return keep.astype(jnp.float32)


# ----------------------------------------------------------------------------- aggregation
def token_weights(
    mask: jax.Array,
    seq_mask: jax.Array,
    aggregation: str = "token_mean",
    max_len: Optional[int] = None,
) -> jax.Array:
    """Per-token weights whose weighted sum of per-token losses is the aggregated loss.

    Args:
      mask: ``[B, T]`` 1 on real completion tokens.
      seq_mask: ``[B]`` 1 for completions that take part (see :func:`sequence_mask`).
      aggregation: ``"token_mean"``: ``m / sum(m)`` over the batch;
        ``"seq_mean_token_mean"``: ``m / len_i / K`` (mean over each sequence's tokens,
        then over the ``K`` kept non-empty sequences);
        ``"constant"``: ``m / (B * max_len)`` (Dr. GRPO; ``B`` the number of sequences in the
        batch -- dropped ones included, so the divisor does not depend on dynamic sampling
        or overlong masking --, ``max_len`` defaulting to ``T``).
      max_len: constant length of the ``"constant"`` mode.

    Returns:
      ``[B, T]`` float32 weights (``m = mask * seq_mask``); all zeros when nothing is kept.
    """
    chex.assert_rank(mask, 2)
    chex.assert_shape(seq_mask, mask.shape[:1])
    if aggregation not in AGGREGATION_MODES:
        raise ValueError(f"aggregation={aggregation!r} not in {AGGREGATION_MODES}")
    m = mask.astype(jnp.float32) * seq_mask.astype(jnp.float32)[:, None]
    lengths = jnp.sum(m, axis=1)
    if aggregation == "token_mean":
        return m / jnp.maximum(jnp.sum(m), 1.0)
    kept = jnp.sum((lengths > 0).astype(jnp.float32))
    if aggregation == "seq_mean_token_mean":
        return m / jnp.maximum(lengths, 1.0)[:, None] / jnp.maximum(kept, 1.0)
    length = mask.shape[1] if max_len is None else max_len
    return m / (float(mask.shape[0]) * float(length))


# ----------------------------------------------------------------------------- per token
def kl_estimate(logp: jax.Array, ref_logp: jax.Array, estimator: str = "k3") -> jax.Array:
    """Per-token KL penalty term for tokens sampled from ``pi`` (``logp``) against ``ref``.

    With ``d = logp - ref_logp`` and the expectation over tokens drawn from ``pi`` (the
    gradient does not flow through the sampling):

    * ``"k2"``: ``d^2 / 2``; gradient ``d * grad log pi``, whose expectation
      ``sum_x pi (log pi - log ref) grad log pi`` is exactly ``grad KL(pi || ref)``. Its value
      is a biased (second-order) estimate of that KL.
    * ``"k3"``: ``exp(-d) + d - 1`` (>= 0); value: an unbiased estimate of ``KL(pi || ref)``;
      gradient ``(1 - ref / pi) grad log pi``, whose expectation ``-sum_x ref grad log pi`` is
      ``grad KL(ref || pi)`` -- the *reverse* KL (the estimator DeepSeekMath's GRPO uses).

    ``"k1"`` (``d``) is an unbiased *value* of ``KL(pi || ref)`` but its expected gradient is
    ``E_pi[grad log pi] = 0``, so it is rejected as a loss term (ValueError).
    """
    _check_estimator(estimator)
    d = logp - ref_logp
    if estimator == "k2":
        return 0.5 * d * d
    return jnp.exp(-d) + d - 1.0


@jax.custom_jvp
def on_policy_ratio(logp: jax.Array) -> jax.Array:
    """``exp(logp - stop_gradient(logp))`` as it should be: exactly 1, with derivative 1.

    The importance ratio of the first update after sampling, where the current policy *is*
    the behaviour policy. Written as the subtraction, the value could come out at ``1 +-
    1e-7`` (XLA may compute the two operands in different fusions); here the value is 1 by
    construction and the gradient is ``grad logp``, the gradient of ``exp(logp - old_logp)``
    at ``old_logp = logp``.
    """
    return jnp.ones_like(logp)


@on_policy_ratio.defjvp
def _on_policy_ratio_jvp(primals, tangents):
    (logp,), (dlogp,) = primals, tangents
    return jnp.ones_like(logp), dlogp


def clipped_surrogate(
    logp: jax.Array,
    old_logp: Optional[jax.Array],
    advantages: jax.Array,
    eps_low: float,
    eps_high: float,
    on_policy: Optional[jax.Array] = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """PPO-style clipped per-token loss (to minimise).

    ``loss = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))`` with ``r = exp(logp -
    old_logp)`` and the sequence advantage ``A`` broadcast over its tokens. On-policy -- with
    ``old_logp=None`` (known when tracing) or where the traced bool scalar ``on_policy`` is
    True (``old_logp`` then ignored) -- ``r`` is :func:`on_policy_ratio`: 1, derivative 1.

    Returns:
      ``(loss [B, T], ratio [B, T], clipped_low [B, T] bool, clipped_high [B, T] bool)``;
      ``clipped_*`` mark tokens where the clipped term is active (no gradient):
      ``r < 1 - eps_low`` with ``A < 0`` and ``r > 1 + eps_high`` with ``A > 0``.
    """
    adv = advantages.astype(jnp.float32)[:, None]
    if old_logp is None:
        ratio = on_policy_ratio(logp)
    else:
        chex.assert_equal_shape([logp, old_logp])
        ratio = jnp.exp(logp - old_logp)
        if on_policy is not None:
            chex.assert_rank(on_policy, 0)
            ratio = jnp.where(on_policy, on_policy_ratio(logp), ratio)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = jnp.maximum(unclipped, clipped)
    clipped_low = (ratio < 1.0 - eps_low) & (adv < 0)
    clipped_high = (ratio > 1.0 + eps_high) & (adv > 0)
    return loss, ratio, clipped_low, clipped_high


def token_entropy(logits: jax.Array) -> jax.Array:
    """``[..., V] -> [...]`` entropy (nats) of the softmax of ``logits``."""
    logz = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    logprobs = logits - logz
    return -jnp.sum(jnp.exp(logprobs) * logprobs, axis=-1)


def grpo_loss(
    logp: jax.Array,
    old_logp: Optional[jax.Array],
    advantages: jax.Array,
    weights: jax.Array,
    config: GRPOLossConfig,
    ref_logp: Optional[jax.Array] = None,
    entropy: Optional[jax.Array] = None,
    on_policy: Optional[jax.Array] = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The GRPO objective of one (micro-)batch.

    Args:
      logp: ``[B, T]`` log-probs of the completion tokens under the current policy.
      old_logp: ``[B, T]`` log-probs under the policy that sampled them, or ``None`` when
        ``logp`` *is* that policy's (the first update after sampling: ``mu == 1``, or the
        first of ``mu`` inner iterations): ``stop_gradient(logp)`` stands in for it, the
        ratio is exactly 1 and its gradient ``grad logp`` (:func:`on_policy_ratio`), so
        loss, metrics and gradient are those of the stored old log-probs, without their
        forward pass (TRL skips it the same way).
      advantages: ``[B]`` per-sequence advantages.
      weights: ``[B, T]`` aggregation weights from :func:`token_weights` (computed over the
        *global* batch, so summing micro-batch losses gives the full-batch loss).
      config: the loss settings.
      ref_logp: ``[B, T]`` reference log-probs; required when ``config.beta > 0`` and ignored
        (may be ``None``) when it is 0.
      entropy: optional ``[B, T]`` per-token entropies for the metric.
      on_policy: optional traced bool scalar: where True, the batch is on-policy as with
        ``old_logp=None`` and the given ``old_logp`` is ignored -- one compiled update serves
        the first (on-policy) and the later inner iterations
        (:class:`llm.rl.updates.GRPOIterations`).

    Returns:
      ``(loss, metrics)``; every metric is a weighted *sum* with the same weights, so metrics
      of micro-batches add up to the full-batch value, and :func:`metric_means` turns the
      sums into weighted means: ``pg_loss``, ``kl``, ``clip_frac``, ``clip_frac_low``,
      ``clip_frac_high``, ``ratio_mean``, ``entropy`` (if given), and ``weight`` (the sum of
      the weights).
    """
    chex.assert_rank([logp, weights], 2)
    chex.assert_equal_shape([logp, weights] + ([] if old_logp is None else [old_logp]))
    chex.assert_shape(advantages, logp.shape[:1])
    pg, ratio, low, high = clipped_surrogate(logp, old_logp, advantages, config.eps_low, config.eps_high, on_policy)
    per_token = pg
    metrics: dict[str, jax.Array] = {}
    if config.use_reference:
        if ref_logp is None:
            raise ValueError(f"beta={config.beta} > 0 needs ref_logp")
        chex.assert_equal_shape([logp, ref_logp])
        kl = kl_estimate(logp, ref_logp, config.kl_estimator)
        per_token = per_token + config.beta * kl
        # the metric: k3's value, an unbiased non-negative estimate of KL(pi || ref)
        kl_value = kl if config.kl_estimator == "k3" else kl_estimate(logp, ref_logp, "k3")
        metrics["kl"] = jnp.sum(jax.lax.stop_gradient(kl_value) * weights)
        metrics["kl_penalty"] = jnp.sum(jax.lax.stop_gradient(kl) * weights)
    else:
        metrics["kl"] = jnp.zeros((), jnp.float32)
        metrics["kl_penalty"] = jnp.zeros((), jnp.float32)
    loss = jnp.sum(per_token * weights)
    w = jax.lax.stop_gradient(weights)
    metrics["pg_loss"] = jnp.sum(jax.lax.stop_gradient(pg) * w)
    metrics["clip_frac_low"] = jnp.sum(low * w)
    metrics["clip_frac_high"] = jnp.sum(high * w)
    metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
    metrics["ratio_mean"] = jnp.sum(jax.lax.stop_gradient(ratio) * w)
    if entropy is not None:
        chex.assert_equal_shape([logp, entropy])
        metrics["entropy"] = jnp.sum(jax.lax.stop_gradient(entropy) * w)
    metrics["weight"] = jnp.sum(w)
    return loss, metrics


def metric_means(sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Weighted sums from :func:`grpo_loss` (added over micro-batches) -> weighted means.

    ``weight`` itself is dropped; with nothing kept every mean is 0.
    """
    total = jnp.maximum(sums["weight"], 1e-12)
    return {k: v / total for k, v in sums.items() if k != "weight"}
