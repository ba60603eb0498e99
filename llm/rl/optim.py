"""The trainer's optimizer: global-norm clipping then AdamW on a warmup + cosine schedule.

* :func:`lr_schedule` -- the learning rate of update ``k`` (0-based): a linear warmup whose
  *first* update already moves the weights (``lr * 1 / W``, reaching ``lr`` at update
  ``W - 1``), then a cosine decay to ``lr * min_lr_ratio`` at the last update;
* :func:`decay_mask` -- weight decay by parameter *role*, not by rank (:data:`DECAYED_ROLES`);
* :func:`make_optimizer`, :func:`apply_gradients`, :func:`update_count`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from llm.model import sharding as shd
from llm.rl.reuse import reused


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay to ``lr * min_lr_ratio``; grad clipping.

    ``weight_decay`` applies to the parameters of :data:`DECAYED_ROLES` only (the projection
    matrices and the embedding table; never a norm or a bias).
    """

    lr: float = 1e-3
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    b1: float = 0.9
    b2: float = 0.99
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr={self.lr} must be > 0")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps={self.warmup_steps!r} must be an integer >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio={self.min_lr_ratio} not in [0, 1]")
        if not self.max_grad_norm > 0:
            raise ValueError(f"optim.max_grad_norm={self.max_grad_norm} must be > 0")
        if not self.weight_decay >= 0:
            raise ValueError(f"optim.weight_decay={self.weight_decay} must be >= 0")


# ----------------------------------------------------------------------------- schedule
def lr_schedule(config: OptimConfig, total_updates: int) -> Callable[[Any], Any]:
    """``count -> lr`` of update ``count`` (0-based) of a run of ``total_updates`` updates.

    With ``W = min(warmup_steps, total_updates)``:

    * warmup, ``k < W``: ``lr * (k + 1) / W`` -- the first update takes ``lr / W``, not 0 (a
      warmup that starts at 0 spends a whole forward and backward on an update that changes
      nothing, and with ``mu`` inner iterations it would be the on-policy one), and update
      ``W - 1`` takes the full ``lr``;
    * then a cosine from ``lr`` at update ``max(W - 1, 0)`` to ``lr * min_lr_ratio`` at the
      last update ``total_updates - 1`` (constant when ``min_lr_ratio == 1``); later counts
      stay at the end value.
    """
    total = max(int(total_updates), 1)
    warmup = min(int(config.warmup_steps), total)
    peak, end = float(config.lr), float(config.lr) * float(config.min_lr_ratio)
    start = max(warmup - 1, 0)
    span = max(total - 1 - start, 1)

    def schedule(count):
        k = jnp.asarray(count, jnp.float32)
        warm = peak * (k + 1.0) / max(warmup, 1)
        progress = jnp.clip((k - start) / span, 0.0, 1.0)
        cosine = end + (peak - end) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
        return jnp.where(k < start, warm, cosine) if warmup else cosine

    return schedule


def schedule_value(config: OptimConfig, total_updates: int, count: int) -> float:
    """The learning rate of optimizer update ``count`` (0-based; for the metrics)."""
    return float(lr_schedule(config, total_updates)(count))


# ----------------------------------------------------------------------------- weight decay
#: Leaf names (the last key of a parameter's path) and their role; a ``weight`` or ``scale``
#: is a norm's gain when its module's name contains ``norm`` (:func:`parameter_role`). Decay
#: reaches :data:`DECAYED_ROLES` only.
ROLES = {"kernel": "matrix", "embedding": "embedding", "bias": "bias"}
NORM_GAINS = ("weight", "scale")
#: Roles that take weight decay: every projection matrix (attention, MLP, an untied LM head)
#: and the token embedding. Not decayed: the RMSNorm gains -- the per-layer ``input_layernorm``,
#: ``post_attention_layernorm``, ``q_norm`` and ``k_norm`` (stacked ``[L, d]``, so a rank
#: rule would decay them) and the final ``norm`` -- and biases: decaying a gain pulls it
#: towards 0, not towards the identity 1. The embedding is decayed as Hugging Face's Trainer
#: (and so TRL's GRPOTrainer) does: in Qwen3 it is tied to the LM head, a projection matrix.
DECAYED_ROLES = ("matrix", "embedding")


def _names(path) -> list[str]:
    """The dict keys (module and parameter names) of a pytree key path, outermost first
    (``nnx.State`` paths end in the variable's ``.value`` attribute, which is skipped)."""
    return [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]


def parameter_role(path) -> str:
    """The role of the parameter at ``path`` (a pytree key path): ``"matrix"``,
    ``"embedding"``, ``"norm"``, ``"bias"`` or ``"other"`` (no decay)."""
    names = _names(path)
    if not names:
        return "other"
    if names[-1] in NORM_GAINS:
        return "norm" if len(names) > 1 and "norm" in names[-2].lower() else "other"
    return ROLES.get(names[-1], "other")


def decay_mask(params: Any) -> Any:
    """Tree of bools like ``params``: True where the parameter's role is in
    :data:`DECAYED_ROLES`."""
    return jax.tree_util.tree_map_with_path(lambda p, _: parameter_role(p) in DECAYED_ROLES, params)


# ----------------------------------------------------------------------------- optimizer
@reused
def make_optimizer(config: OptimConfig, total_updates: int) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on :func:`lr_schedule` over ``total_updates``, with
    weight decay on :func:`decay_mask`'s parameters."""
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(lr_schedule(config, total_updates), b1=config.b1, b2=config.b2, eps=config.eps,
                    weight_decay=config.weight_decay, mask=decay_mask),
    )


def update_count(opt_state: Any) -> int:
    """Updates the optimizer has applied (its AdamW step count): the schedule's position."""
    counts = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    return int(jax.device_get(counts[0][1])) if counts else 0


def apply_gradients(optimizer: optax.GradientTransformation, state: Any, opt_state: Any, grads: Any, mesh=None):
    """One optimizer step: ``(new state, new opt_state, global norm of grads before clipping)``.

    With a ``mesh`` the new state and optimizer state are pinned to the FSDP layout
    (:func:`llm.model.sharding.constrain_state`, :func:`llm.model.sharding.constrain_opt_state`), so a
    jitted update returns them in the layout they came in and compiles once.
    """
    updates, opt_state = optimizer.update(grads, opt_state, state)
    new_state = shd.constrain_state(optax.apply_updates(state, updates), mesh)
    return new_state, shd.constrain_opt_state(opt_state, new_state, mesh), optax.tree.norm(grads)
