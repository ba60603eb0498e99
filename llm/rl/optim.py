"""The trainer's optimizer: global-norm clipping then AdamW on a warmup + cosine schedule."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax

from llm.model import sharding as shd


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay to ``lr * min_lr_ratio``; grad clipping."""

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


def make_optimizer(config: OptimConfig, total_updates: int) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on a warmup + cosine schedule over ``total_updates``.

    Weight decay applies to matrices (ndim >= 2) only.
    """
    total = max(int(total_updates), 1)
    warmup = min(config.warmup_steps, max(total - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warmup else config.lr,
        peak_value=config.lr,
        warmup_steps=warmup,
        decay_steps=max(total, warmup + 1),
        end_value=config.lr * config.min_lr_ratio,
    )
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay,
                    mask=lambda p: jax.tree_util.tree_map(lambda x: x.ndim >= 2, p)),
    )


def schedule_value(config: OptimConfig, total_updates: int, count: int) -> float:
    """The learning rate at optimizer update ``count`` (for the metrics)."""
    total = max(int(total_updates), 1)
    warmup = min(config.warmup_steps, max(total - 1, 0))
    sched = optax.warmup_cosine_decay_schedule(0.0 if warmup else config.lr, config.lr, warmup,
                                               max(total, warmup + 1), config.lr * config.min_lr_ratio)
    return float(sched(count))



def apply_gradients(optimizer: optax.GradientTransformation, state: Any, opt_state: Any, grads: Any, mesh=None):
    """One optimizer step: ``(new state, new opt_state, global norm of grads before clipping)``.

    With a ``mesh`` the new state and optimizer state are pinned to the FSDP layout
    (:func:`llm.model.sharding.constrain_state`, :func:`llm.model.sharding.constrain_opt_state`), so a
    jitted update returns them in the layout they came in and compiles once.
    """
    updates, opt_state = optimizer.update(grads, opt_state, state)
    new_state = shd.constrain_state(optax.apply_updates(state, updates), mesh)
    return new_state, shd.constrain_opt_state(opt_state, new_state, mesh), optax.tree.norm(grads)
