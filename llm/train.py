"""GRPO training of the Flax Qwen3 policy on MAPF-FrozenLake (one stage), with resume.

One GRPO step:

1. draw ``N`` lakes (deterministic in the step: ``fold_in(data_key, step)``), render the
   prompts (:mod:`llm.prompts`) left-padded to a fixed length ``P``;
2. sample ``G`` completions per lake with the KV-cache generator (:func:`llm.generate.
   generate_ids`: tokens, masks) at ``grpo.temperature`` (no top-k / top-p);
3. score them in the simulator (:mod:`llm.rewards`), group advantages, sequence masks and
   global token weights (:mod:`llm.grpo`);
4. the *old* (behaviour) log-probs, recomputed with the training forward at the sampling
   temperature (:func:`make_logprob_fn`), and the reference's when ``beta > 0`` (skipped
   entirely when ``beta == 0``): ratio, KL and entropy all refer to the distribution that
   drew the tokens;
5. ``mu`` calls of ONE jitted update function (:func:`make_grpo_update`): parameters and
   optimizer state in, new ones out; inside, a ``lax.scan`` over micro-batches accumulates
   the gradient (gradient accumulation), then optax (warmup + cosine, global-norm clipping)
   applies it. Shapes are fixed for the whole stage, so nothing recompiles across steps.

Data parallelism: a 1-D mesh over every device (:mod:`llm.sharding`); batch arrays are
sharded on their leading axis, parameters and optimizer state replicated; XLA inserts the
gradient all-reduce. The same code runs on one CPU and on many accelerators.

Checkpoints: ``llm.checkpoint`` format (orbax) every ``checkpoint_every`` steps and at the
end, with the optimizer state, step, RNG and data position in ``extra``. Restarting the same
command resumes from the latest checkpoint and truncates ``metrics.jsonl`` to it, so no
metrics row is lost or repeated.

Stage layout (``train_stage``)::

    <stage_dir>/warmstart/      orbax checkpoints of the supervised warm start
    <stage_dir>/checkpoint/     orbax checkpoints of GRPO (the stage's policy)
    <stage_dir>/policy/         the final policy as a Hugging Face folder (export_hf)
    <stage_dir>/metrics.jsonl   one row per step (phase "warmstart" / "grpo" / "eval")
    <stage_dir>/train_eval.json held-out success before GRPO (after the warm start) and after
                                (``eval.json`` is left to the suite evaluation, llm/evaluate.py)
    <stage_dir>/curves.png      learning curves
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlake.config import cfg_get, to_plain
from jaxlake.io import write_json
from jaxlake.metrics import JsonlWriter, LoggerConfig, MetricsWriter, build_writer
from llm import grpo, prompts, rewards
from llm import logprobs as logprobs_mod
from llm import sharding as shd
from llm.generate import GenerationConfig, generate_ids, left_pad_positions
from llm.grpo import GRPOLossConfig
from llm.logprobs import DEFAULT_CHUNK as DEFAULT_LOGPROB_CHUNK
from llm.prompts import PromptConfig
from llm.rewards import RewardConfig
from llm.sharding import to_host
from llm.tokenizer import eos_and_pad
from llm import reasoning as reasoning_mod
from llm.reasoning import ReasoningConfig

#: Traces of the GRPO update in this process. The one counter the trainer keeps: it is bumped
#: in the update's Python body, which runs only while JAX traces it (once per compilation),
#: and tests check that a whole stage compiles the update once.
_TRACES = {"grpo_update": 0}


def trace_counts() -> dict[str, int]:
    """How often the jitted GRPO update was traced (compiled) in this process."""
    return dict(_TRACES)


# ============================================================================ configuration
def _from_mapping(cls, values: Optional[Mapping[str, Any]], where: str):
    """Build a dataclass from a mapping; unknown keys raise naming the section."""
    values = dict(values or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {where} field(s) {unknown}; known: {sorted(known)}")
    return cls(**values)


def _positive_int(where: str, value: Any, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where}={value!r} must be an integer >= {low}")


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
        _positive_int("optim.warmup_steps", self.warmup_steps, 0)
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio={self.min_lr_ratio} not in [0, 1]")
        if not self.max_grad_norm > 0:
            raise ValueError(f"optim.max_grad_norm={self.max_grad_norm} must be > 0")
        if not self.weight_decay >= 0:
            raise ValueError(f"optim.weight_decay={self.weight_decay} must be >= 0")


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """Supervised warm start on reference-planner plans (see :mod:`llm.warmstart`).

    ``batch_size`` lakes per step; ``micro_batches`` for gradient accumulation; lakes the
    planner cannot solve take no loss.
    """

    enabled: bool = True
    steps: int = 300
    batch_size: int = 32
    micro_batches: int = 1
    optim: OptimConfig = OptimConfig(lr=3e-3, warmup_steps=20)
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    log_every: int = 1

    def __post_init__(self) -> None:
        _positive_int("warmstart.steps", self.steps, 0)
        _positive_int("warmstart.batch_size", self.batch_size)
        _positive_int("warmstart.micro_batches", self.micro_batches)
        _positive_int("warmstart.checkpoint_every", self.checkpoint_every)
        _positive_int("warmstart.keep_checkpoints", self.keep_checkpoints)
        if self.batch_size % self.micro_batches:
            raise ValueError(f"warmstart.batch_size={self.batch_size} must be divisible by micro_batches={self.micro_batches}")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """GRPO settings: ``lakes_per_step`` groups of ``group_size`` completions per step."""

    enabled: bool = True
    steps: int = 30
    lakes_per_step: int = 8
    group_size: int = 8
    mu: int = 1
    micro_batches: int = 1
    optim: OptimConfig = OptimConfig(lr=1e-4, warmup_steps=3)
    loss: GRPOLossConfig = GRPOLossConfig()
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    compute_entropy: bool = True
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    eval_every: int = 0
    logprob_chunk: int = DEFAULT_LOGPROB_CHUNK
    remat: str = "full"

    def __post_init__(self) -> None:
        _positive_int("grpo.steps", self.steps, 0)
        _positive_int("grpo.lakes_per_step", self.lakes_per_step)
        _positive_int("grpo.group_size", self.group_size, 2)
        _positive_int("grpo.mu", self.mu)
        _positive_int("grpo.micro_batches", self.micro_batches)
        _positive_int("grpo.max_new_tokens", self.max_new_tokens)
        _positive_int("grpo.checkpoint_every", self.checkpoint_every)
        _positive_int("grpo.keep_checkpoints", self.keep_checkpoints)
        _positive_int("grpo.eval_every", self.eval_every, 0)
        _positive_int("grpo.logprob_chunk", self.logprob_chunk)
        if self.remat not in logprobs_mod.REMAT_POLICIES:
            raise ValueError(f"grpo.remat={self.remat!r} not in {logprobs_mod.REMAT_POLICIES}")
        if not self.temperature > 0:
            raise ValueError(f"grpo.temperature={self.temperature} must be > 0 (GRPO samples; 0 is greedy)")
        if self.top_k != 0 or self.top_p != 1.0:
            # the loss would need the filtered distribution's log-probs (a renormalised
            # support per token); GRPO trains on the temperature-scaled distribution only
            raise ValueError(f"grpo.top_k={self.top_k} / grpo.top_p={self.top_p}: GRPO samples from the "
                             "temperature-scaled distribution only (top_k=0, top_p=1.0), so the ratio, KL "
                             "and entropy refer to the distribution that drew the tokens")
        rows = self.lakes_per_step * self.group_size
        if rows % self.micro_batches:
            raise ValueError(
                f"grpo.lakes_per_step * group_size = {rows} must be divisible by micro_batches={self.micro_batches}"
            )

    @property
    def rows(self) -> int:
        return self.lakes_per_step * self.group_size


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: ``num_lakes`` lakes of the stage's environment, greedy decoding."""

    num_lakes: int = 64
    batch_size: int = 64
    seed: int = 1_000_003
    max_new_tokens: Optional[int] = None  # None: grpo.max_new_tokens

    def __post_init__(self) -> None:
        _positive_int("eval.num_lakes", self.num_lakes, 0)
        _positive_int("eval.batch_size", self.batch_size)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one stage needs besides the environment and the model."""

    seed: int = 0
    warmstart: WarmStartConfig = WarmStartConfig()
    grpo: GRPOConfig = GRPOConfig()
    eval: EvalConfig = EvalConfig()
    reward: RewardConfig = RewardConfig()
    prompt: PromptConfig = PromptConfig()
    max_prompt_tokens: Optional[int] = None
    prompt_bucket: int = 16
    progress: bool = True
    export_hf: bool = True
    plot: bool = True
    distributed: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, train: Mapping[str, Any], reward: Optional[Mapping[str, Any]] = None,
                  prompt: Optional[Mapping[str, Any]] = None) -> "TrainConfig":
        """From the Hydra groups ``train``, ``reward`` and ``prompt`` (plain mappings)."""
        t = dict(train)
        ws = dict(t.pop("warmstart", {}) or {})
        if "optim" in ws:
            ws["optim"] = _from_mapping(OptimConfig, ws["optim"], "train.warmstart.optim")
        g = dict(t.pop("grpo", {}) or {})
        if "optim" in g:
            g["optim"] = _from_mapping(OptimConfig, g["optim"], "train.grpo.optim")
        if "loss" in g:
            g["loss"] = _from_mapping(GRPOLossConfig, g["loss"], "train.grpo.loss")
        ev = dict(t.pop("eval", {}) or {})
        t["distributed"] = dict(t.get("distributed") or {})
        out = _from_mapping(cls, t, "train")
        return dataclasses.replace(
            out,
            warmstart=_from_mapping(WarmStartConfig, ws, "train.warmstart"),
            grpo=_from_mapping(GRPOConfig, g, "train.grpo"),
            eval=_from_mapping(EvalConfig, ev, "train.eval"),
            reward=RewardConfig.from_dict(reward or {}),
            prompt=PromptConfig.from_dict(prompt) if prompt is not None else PromptConfig(),
        )


# ============================================================================ optimizer
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


# ============================================================================ policy state
@dataclasses.dataclass
class Policy:
    """A model split for jitted training: static ``graphdef`` and the parameter ``state``."""

    graphdef: Any
    state: Any
    tokenizer: Any

    @classmethod
    def from_model(cls, model: nnx.Module, tokenizer: Any) -> "Policy":
        graphdef, state = nnx.split(model)
        kinds = {type(v).__name__ for v in jax.tree_util.tree_leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))}
        if kinds - {"Param"}:
            raise ValueError(f"the model holds non-parameter variables {sorted(kinds - {'Param'})}; "
                             "the trainer expects parameters only")
        return cls(graphdef, state, tokenizer)

    def module(self) -> nnx.Module:
        return nnx.merge(self.graphdef, self.state)

    @property
    def config(self):
        return self.module().config


# ============================================================================ forward
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

    ``chunk`` tokens at a time go through the LM head (:mod:`llm.logprobs`: the ``[B, T, V]``
    float32 logits are never materialised, and the backward pass recomputes each chunk);
    ``None`` computes the full logits at once (the reference path, same values). ``remat``:
    the decoder layers' rematerialisation (:data:`llm.logprobs.REMAT_POLICIES`).
    """
    model = nnx.merge(graphdef, state)
    t = tokens.shape[1]
    ids = jnp.concatenate([prompt_ids.astype(jnp.int32), tokens.astype(jnp.int32)], axis=1)
    m = jnp.concatenate([prompt_mask.astype(bool), mask.astype(bool)], axis=1)
    # the LM head only where a completion token is predicted: positions P-1 .. P+T-2
    hidden = logprobs_mod.hidden_states(model, ids, left_pad_positions(m), m, last=t + 1, remat=remat)[:, :t]
    weight, tied = logprobs_mod.head_weight(model)
    logp, ent, match = logprobs_mod.token_logprobs(hidden, weight, tokens, tied=tied, temperature=temperature,
                                                   chunk=chunk, entropy=entropy)
    valid = mask.astype(bool)
    logp = jnp.where(valid, logp, 0.0)
    if ent is not None:
        ent = jnp.where(valid, ent, 0.0)
    return logp, ent, match & valid


def _copy(tree: Any) -> Any:
    """Fresh device buffers for every leaf (safe to donate)."""
    return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tree)


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

    spec = NamedSharding(mesh, PartitionSpec(None, shd.DATA_AXIS))
    return jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(x, spec), tree)


def _accumulate(loss_fn: Callable, state: Any, batch: Mapping[str, jax.Array], micro: int, mesh):
    """Sum of loss, metrics and gradients over ``micro`` micro-batches (a ``lax.scan``).

    One micro-batch takes the gradient directly: no zero-initialised accumulator, which would
    hold a second parameter-sized gradient buffer (15 GiB for a 4B model in float32).
    """
    if micro == 1:
        (loss, msum), grads = jax.value_and_grad(loss_fn, has_aux=True)(state, dict(batch))
        return loss, msum, grads
    mbs = _constrain_micro(jax.tree_util.tree_map(lambda x: _micro_split(x, micro), dict(batch)), mesh)
    first = jax.tree_util.tree_map(lambda x: x[0], mbs)
    _, metric_shapes = jax.eval_shape(loss_fn, state, first)
    zeros_m = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
    zeros_g = jax.tree_util.tree_map(jnp.zeros_like, state)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def body(carry, mb):
        g_acc, m_acc, l_acc = carry
        (loss, m), g = grad_fn(state, mb)
        return (jax.tree_util.tree_map(jnp.add, g_acc, g), jax.tree_util.tree_map(jnp.add, m_acc, m), l_acc + loss), None

    (grads, msum, loss), _ = jax.lax.scan(body, (zeros_g, zeros_m, jnp.zeros((), jnp.float32)), mbs)
    return loss, msum, grads


def _apply(optimizer, state, opt_state, grads):
    updates, opt_state = optimizer.update(grads, opt_state, state)
    return optax.apply_updates(state, updates), opt_state, optax.tree.norm(grads)


GRPO_BATCH_KEYS = ("prompt_ids", "prompt_mask", "tokens", "mask", "old_logp", "advantages", "weights")


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

    ``batch`` holds ``[B, ...]`` arrays :data:`GRPO_BATCH_KEYS` (plus ``ref_logp`` when
    ``loss_config.beta > 0``); ``weights`` are the global aggregation weights
    (:func:`llm.grpo.token_weights`), so the ``micro_batches`` accumulated gradients sum
    to the full-batch gradient. Metrics are weighted means plus ``loss`` and ``grad_norm``
    (before clipping). Parameters and optimizer state are donated.

    The policy's log-probs and entropies are those of the sampling distribution at
    ``temperature`` (:func:`completion_forward`); ``old_logp`` and ``ref_logp`` must come from
    :func:`make_logprob_fn` at the same temperature, so the ratio is exactly 1 on the first
    inner iteration. ``logprob_chunk`` and ``remat`` (per-layer rematerialisation, default
    ``"full"``): see :func:`completion_forward`.
    """

    def loss_fn(state, mb):
        logp, ent, _ = completion_forward(graphdef, state, mb["prompt_ids"], mb["prompt_mask"], mb["tokens"],
                                          mb["mask"], entropy=compute_entropy, temperature=temperature,
                                          chunk=logprob_chunk, remat=remat)
        return grpo.grpo_loss(logp, mb["old_logp"], mb["advantages"], mb["weights"], loss_config,
                              ref_logp=mb.get("ref_logp"), entropy=ent)

    def update(state, opt_state, batch):
        _TRACES["grpo_update"] += 1
        loss, msum, grads = _accumulate(loss_fn, state, batch, micro_batches, mesh)
        state, opt_state, gnorm = _apply(optimizer, state, opt_state, grads)
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


# ============================================================================ metrics file
PHASES = ("warmstart", "grpo")


class MetricsLog(JsonlWriter):
    """The stage's ``metrics.jsonl``: the JSONL back end (:class:`jaxlake.metrics.JsonlWriter`)
    with the phase order ``warmstart`` -> ``grpo`` (truncated on resume to the checkpointed step)."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path, PHASES)


# ============================================================================ checkpoints
class Checkpoints:
    """Orbax checkpoints in the ``llm.checkpoint`` format with the training state in ``extra``.

    ``extra`` = ``{"opt_state": [leaves], "rng": uint32[2], "step": int64, "data_position":
    int64}``; the optimizer state is stored as its flat leaf list and rebuilt with the
    template's tree structure.
    """

    def __init__(self, directory: str | os.PathLike, keep: int):
        self.directory = Path(directory)
        self.keep = keep

    def latest(self) -> Optional[int]:
        from llm.checkpoint import latest_step

        return latest_step(self.directory)

    def save(self, policy: Policy, opt_state: Any, step: int, rng: jax.Array, data_position: int) -> None:
        from llm.checkpoint import save_checkpoint

        extra = {
            "opt_state": [to_host(x) for x in jax.tree_util.tree_leaves(opt_state)],
            "rng": np.asarray(jax.device_get(rng)),
            "step": np.asarray(step, np.int64),
            "data_position": np.asarray(data_position, np.int64),
        }
        model = nnx.merge(policy.graphdef, jax.tree_util.tree_map(to_host, policy.state))
        save_checkpoint(self.directory, model, int(step), extra=extra, max_to_keep=self.keep)

    def start(self, policy: Policy, optimizer: optax.GradientTransformation, seed: int):
        """A phase's starting point: ``(state, opt_state, step, rng, resumed)``, fresh (step 0,
        ``rng = PRNGKey(seed)``, ``resumed`` None) or from the latest checkpoint (``resumed``
        = its step). ``state`` is a copy: the updates donate their inputs."""
        state = _copy(policy.state)
        opt_state = optimizer.init(state)
        if self.latest() is None:
            return state, opt_state, 0, jax.random.PRNGKey(seed), None
        state, opt_state, step, rng, _ = self.restore(policy, opt_state)
        return state, opt_state, step, rng, step

    def restore(self, policy: Policy, opt_template: Any, step: Optional[int] = None):
        """``(state, opt_state, step, rng, data_position)`` of ``step`` (default latest)."""
        from llm.checkpoint import restore_checkpoint

        leaves, treedef = jax.tree_util.tree_flatten(opt_template)
        template = {
            "opt_state": [np.zeros(np.shape(x), np.asarray(x).dtype) for x in leaves],
            "rng": np.zeros((2,), np.uint32),
            "step": np.zeros((), np.int64),
            "data_position": np.zeros((), np.int64),
        }
        restored = restore_checkpoint(self.directory, nnx.merge(policy.graphdef, jax.device_get(policy.state)),
                                      step=step, extra=template)
        extra = restored.extra
        opt_state = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(x) for x in extra["opt_state"]])
        _, state = nnx.split(restored.model)
        return state, opt_state, int(extra["step"]), jnp.asarray(extra["rng"], jnp.uint32), int(extra["data_position"])


# ============================================================================ environment
EnvSpec = Any  # a LakeConfig or a mixture [(weight, LakeConfig), ...]


@functools.lru_cache(maxsize=None)
def _vmapped_generate():
    from jaxlake.generator import generate

    return jax.jit(jax.vmap(generate))


def sample_lakes(key: jax.Array, env: EnvSpec, n: int):
    """``n`` lakes of ``env`` (a ``LakeConfig`` or a list of ``(weight, LakeConfig)``).

    Deterministic in ``key``. Uses ``jaxlake.generator.generate_batch`` /
    ``generate_mixture`` when present, else one jitted ``vmap(generate)`` over a stacked
    config (a mixture picks each lake's config by weight).
    """
    from jaxlake import generator
    from jaxlake.config import repeat_config, stack_configs

    if isinstance(env, (list, tuple)):
        if hasattr(generator, "generate_mixture"):
            return generator.generate_mixture(key, list(env), n)
        weights = np.asarray([float(w) for w, _ in env], np.float64)
        pick_key, key = jax.random.split(key)
        choice = np.asarray(jax.random.choice(pick_key, len(env), (n,), p=jnp.asarray(weights / weights.sum())))
        configs = stack_configs([env[int(i)][1] for i in choice])
    else:
        if hasattr(generator, "generate_batch"):
            return generator.generate_batch(key, env, n)
        configs = repeat_config(env, n)
    return _vmapped_generate()(jax.random.split(key, n), configs)


def env_horizon(env: EnvSpec) -> int:
    """Largest ``max_steps`` of the environment (the rollout horizon)."""
    if isinstance(env, (list, tuple)):
        return max(int(c.max_steps) for _, c in env)
    return int(env.max_steps)


# ============================================================================ sampling
@dataclasses.dataclass
class Prompter:
    """Renders and pads prompts to one fixed length ``P`` for the whole stage."""

    tokenizer: Any
    config: PromptConfig
    length: int
    bucket: int = 16

    @classmethod
    def fit(cls, tokenizer, config: PromptConfig, probe_lakes, max_tokens: Optional[int], bucket: int) -> "Prompter":
        """Fixed length: ``max_tokens`` or the longest probe prompt rounded up to ``bucket``."""
        if max_tokens is not None:
            return cls(tokenizer, config, int(max_tokens), bucket)
        texts = prompts.render_prompts(probe_lakes, tokenizer, config)
        longest = max(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts)
        return cls(tokenizer, config, -(-(longest + 1) // bucket) * bucket, bucket)

    def encode(self, lakes) -> tuple[np.ndarray, np.ndarray]:
        texts = prompts.render_prompts(lakes, self.tokenizer, self.config)
        try:
            return prompts.encode_prompts(texts, self.tokenizer, self.length)
        except prompts.PromptError:
            longest = max(len(self.tokenizer.encode(t, add_special_tokens=False)) for t in texts)
            new = -(-(longest + 1) // self.bucket) * self.bucket
            print(f"[train] a prompt has {longest} tokens > prompt length {self.length}; growing it to {new} "
                  "(one recompilation)", file=sys.stderr)
            self.length = new
            return prompts.encode_prompts(texts, self.tokenizer, self.length)


def sample_completions(policy: Policy, ids: np.ndarray, mask: np.ndarray, key: jax.Array,
                       gen: GenerationConfig, mesh, reasoning: Optional[ReasoningConfig] = None) -> dict[str, Any]:
    """Sample one completion per prompt row; arrays sharded over the mesh, texts decoded.

    With ``reasoning.enabled`` the rows think first (:func:`llm.reasoning.generate_with_thinking`:
    ``gen.max_new_tokens`` is the answer budget), ``texts`` are the whole completions (think
    block included) and the result also holds ``answers`` (the text after ``</think>``),
    ``loss_mask`` (the mask without forced tokens) and ``thinking`` (the sample).
    """
    eos, pad = eos_and_pad(policy.tokenizer)
    ids_d, mask_d = shd.shard_batch((ids, mask), mesh) if mesh is not None else (ids, mask)
    if reasoning is not None and reasoning.enabled:
        close = reasoning_mod.close_token_id(policy.tokenizer)
        forced = policy.tokenizer.encode(reasoning.close_text, add_special_tokens=False)
        place = (lambda x: shd.shard_batch(x, mesh)) if mesh is not None else (lambda x: x)
        s = reasoning_mod.generate_with_thinking((policy.graphdef, policy.state), ids_d, mask_d, key, gen, reasoning,
                                                 close_id=close, forced_ids=forced, eos_token_ids=eos,
                                                 pad_token_id=pad, place=place, to_host=to_host)
        texts = policy.tokenizer.batch_decode([s.tokens[b, : s.lengths[b]].tolist() for b in range(s.tokens.shape[0])],
                                              skip_special_tokens=True)
        return dict(tokens=s.tokens, mask=s.mask, loss_mask=s.loss_mask, lengths=s.lengths, logp=s.logprobs,
                    hit_eos=s.hit_eos, texts=texts, answers=[reasoning_mod.strip_thinking(t) for t in texts],
                    tokens_np=s.tokens, thinking=s)
    tokens, cmask, lengths, logp, hit_eos = generate_ids((policy.graphdef, policy.state), ids_d, mask_d, key, gen,
                                                         eos_token_ids=eos, pad_token_id=pad)
    tok_np, len_np = to_host(tokens), to_host(lengths)
    texts = policy.tokenizer.batch_decode([tok_np[b, : len_np[b]].tolist() for b in range(tok_np.shape[0])],
                                          skip_special_tokens=True)
    return dict(tokens=tokens, mask=cmask, lengths=len_np, logp=logp, hit_eos=to_host(hit_eos), texts=texts,
                tokens_np=tok_np)


# ============================================================================ evaluation
def evaluate(policy: Policy, prompter: Prompter, lakes, ref_soc: np.ndarray, reward_config: RewardConfig,
             max_new_tokens: int, batch_size: int, horizon: int, mesh, key: jax.Array) -> dict[str, Any]:
    """Greedy decoding on a held-out batch of lakes: success and every reward term.

    The last partial batch is padded by repeating lakes (fixed shapes: one compilation).
    """
    n = int(np.asarray(lakes.num_agents).shape[0])
    if n == 0:
        return {"num_lakes": 0}
    if mesh is not None:
        batch_size = -(-batch_size // mesh.devices.size) * mesh.devices.size
    gen = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    texts: list[str] = []
    lengths: list[int] = []
    forced: list[bool] = []
    for start in range(0, n, batch_size):
        idx = np.arange(start, start + batch_size) % n
        sub = jax.tree_util.tree_map(lambda x: np.asarray(x)[idx], lakes)
        ids, mask = prompter.encode(sub)
        out = sample_completions(policy, ids, mask, key, gen, mesh, reasoning=prompter.config.reasoning)
        keep = min(batch_size, n - start)
        texts += out["texts"][:keep]
        lengths += out["lengths"][:keep].tolist()
        if "thinking" in out:
            forced += out["thinking"].hit_budget[:keep].tolist()
    thinking = prompter.config.reasoning.enabled
    res = rewards.compute_rewards(lakes, texts, key, reward_config, ref_soc=ref_soc, horizon=horizon,
                                  reasoning=thinking, forced_close=np.asarray(forced, bool) if thinking else None)
    m = rewards.reward_metrics(res)
    m["num_lakes"] = n
    m["completion_len"] = float(np.mean(lengths))
    m["examples"] = [{"completion": texts[i], "success": bool(res.success[i])} for i in range(min(4, n))]
    return m


# ============================================================================ GRPO loop
@dataclasses.dataclass
class PhaseResult:
    policy: Policy
    step: int
    resumed_from: Optional[int]


def _progress(total: int, initial: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True, file=sys.stderr)


def run_grpo(
    policy: Policy,
    ref_state: Any,
    config: TrainConfig,
    env: EnvSpec,
    checkpoint_dir: str | os.PathLike,
    metrics: MetricsWriter,
    prompter: Prompter,
    mesh=None,
    eval_fn: Optional[Callable[[Policy, int], dict]] = None,
    max_steps: Optional[int] = None,
) -> PhaseResult:
    """Run (or resume) the GRPO phase; returns the final policy.

    Args:
      policy: the starting policy (ignored when a checkpoint exists: it resumes).
      ref_state: the frozen reference parameters (used only when ``beta > 0``).
      config: training settings (``config.grpo``, ``config.reward``, ``config.seed``).
      env: the environment (a ``LakeConfig`` or a mixture).
      checkpoint_dir: orbax directory of this phase.
      metrics: the stage's metrics file (rows ``phase="grpo"``).
      prompter: fixed-length prompt encoder.
      mesh: data-parallel mesh (``None``: plain single-device arrays).
      eval_fn: optional ``(policy, step) -> metrics`` called every ``grpo.eval_every`` steps.
      max_steps: stop after this many steps (for tests of kill-and-resume); the schedule
        still spans ``grpo.steps``.
    """
    gc = config.grpo
    lc = gc.loss
    total_updates = gc.steps * gc.mu
    optimizer = make_optimizer(gc.optim, total_updates)
    if mesh is not None:
        shd.check_divisible(gc.rows // gc.micro_batches, mesh, "grpo rows per micro-batch")
    ckpt = Checkpoints(checkpoint_dir, gc.keep_checkpoints)
    state, opt_state, start, rng, resumed = ckpt.start(policy, optimizer, config.seed)
    if lc.use_reference:
        ref_state = _copy(ref_state)  # the update donates its input: never consume the caller's arrays
    metrics.truncate("grpo", start, drop_later=start < gc.steps)
    if mesh is not None:
        state, opt_state = shd.replicate(state, mesh), shd.replicate(opt_state, mesh)
        if lc.use_reference:
            ref_state = shd.replicate(ref_state, mesh)
    policy = Policy(policy.graphdef, state, policy.tokenizer)
    update = make_grpo_update(policy.graphdef, optimizer, lc, micro_batches=gc.micro_batches,
                              compute_entropy=gc.compute_entropy, mesh=mesh, temperature=gc.temperature,
                              logprob_chunk=gc.logprob_chunk, remat=gc.remat)
    # behaviour (old) and reference log-probs: the training forward at the sampling temperature
    logprob_fn = make_logprob_fn(policy.graphdef, temperature=gc.temperature, logprob_chunk=gc.logprob_chunk)
    gen = GenerationConfig(max_new_tokens=gc.max_new_tokens, temperature=gc.temperature, top_k=gc.top_k,
                           top_p=gc.top_p)
    reasoning = prompter.config.reasoning
    horizon = env_horizon(env)
    data_key, sample_key, reward_key = (jax.random.fold_in(rng, i) for i in (11, 12, 13))
    end = gc.steps if max_steps is None else min(gc.steps, max_steps)
    bar = _progress(gc.steps, start, "grpo", config.progress)
    n, g = gc.lakes_per_step, gc.group_size
    for step in range(start, end):
        t0 = time.perf_counter()
        lakes = sample_lakes(jax.random.fold_in(data_key, step), env, n)
        ref_soc = rewards.reference_costs(lakes)
        ids, pmask = prompter.encode(lakes)
        ids, pmask = np.repeat(ids, g, axis=0), np.repeat(pmask, g, axis=0)
        t_gen = time.perf_counter()
        out = sample_completions(policy, ids, pmask, jax.random.fold_in(sample_key, step), gen, mesh,
                                 reasoning=reasoning)
        t_rew = time.perf_counter()
        res = rewards.compute_rewards(rewards.repeat_lakes(lakes, g), out["texts"], jax.random.fold_in(reward_key, step),
                                      config.reward, ref_soc=np.repeat(ref_soc, g), horizon=horizon,
                                      reasoning=reasoning.enabled,
                                      forced_close=out["thinking"].hit_budget if reasoning.enabled else None)
        grouped = jnp.asarray(res.reward).reshape(n, g)
        adv = grpo.group_advantages(grouped, lc.advantage, lc.std_eps).reshape(-1)
        truncated = ~out["hit_eos"]
        if reasoning.enabled:  # a forced close is a cut by the thinking budget
            truncated = truncated | out["thinking"].hit_budget
        seq_mask = grpo.sequence_mask(grouped, jnp.asarray(truncated), dynamic_sampling=lc.dynamic_sampling,
                                      overlong_mask=lc.overlong_mask)
        cmask = out["mask"]
        # forced tokens (reasoning mode) are attended to but take no policy-gradient loss
        weights = grpo.token_weights(jnp.asarray(to_host(out.get("loss_mask", cmask))), seq_mask, lc.aggregation,
                                     lc.max_len)
        host_batch = {"advantages": np.asarray(adv), "weights": np.asarray(weights)}
        batch = {"prompt_ids": ids, "prompt_mask": pmask, "tokens": out["tokens_np"], "mask": to_host(cmask),
                 **host_batch}
        if mesh is not None:
            batch = shd.shard_batch(batch, mesh)
        else:
            batch = {k: jnp.asarray(v) for k, v in batch.items()}
        seq = (batch["prompt_ids"], batch["prompt_mask"], batch["tokens"], batch["mask"])
        # recomputed, not the sampler's: same forward and temperature as the update (ratio 1 at first)
        batch["old_logp"] = logprob_fn(state, *seq)
        if lc.use_reference:
            batch["ref_logp"] = logprob_fn(ref_state, *seq)
        t_upd = time.perf_counter()
        inner = []
        for _ in range(gc.mu):
            state, opt_state, m = update(state, opt_state, batch)
            inner.append(m)
        inner = jax.device_get(inner)
        policy = Policy(policy.graphdef, state, policy.tokenizer)
        t_end = time.perf_counter()

        lengths = out["lengths"]
        completion_tokens = int(lengths.sum())
        processed = int(pmask.sum()) + completion_tokens
        row: dict[str, Any] = {"phase": "grpo", "step": step + 1}
        row.update(rewards.reward_metrics(res))
        row.update({k: float(v) for k, v in inner[0].items()})  # first inner iteration: ratio == 1 for mu == 1
        if gc.mu > 1:
            row.update({f"last/{k}": float(v) for k, v in inner[-1].items()})
        zero = np.asarray(grpo.zero_variance_groups(grouped))
        row["zero_adv_share"] = float(zero.mean())
        row["kept_share"] = float(np.mean(np.asarray(seq_mask)))
        row["truncated_rate"] = float(np.mean(~out["hit_eos"]))
        row["completion_len"] = float(lengths.mean())
        row["completion_len_max"] = int(lengths.max())
        if reasoning.enabled:
            row.update(reasoning_mod.thinking_metrics(out["thinking"]))
        row["reward_std"] = float(np.std(res.reward))
        row["lr"] = schedule_value(gc.optim, total_updates, step * gc.mu)
        row["time/step_s"] = t_end - t0
        row["time/generate_s"] = t_rew - t_gen
        row["time/update_s"] = t_end - t_upd
        row["tokens_per_s"] = completion_tokens / max(t_end - t0, 1e-9)
        row["generate_tokens_per_s"] = completion_tokens / max(t_rew - t_gen, 1e-9)
        row["train_tokens_per_s"] = gc.mu * processed / max(t_end - t_upd, 1e-9)
        if eval_fn is not None and gc.eval_every and (step + 1) % gc.eval_every == 0 and step + 1 < gc.steps:
            row["eval"] = eval_fn(policy, step + 1)
        metrics.append(row)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.3f}", success=f"{row['success']:.2f}", kl=f"{row['kl']:.3f}")
        if (step + 1) % gc.checkpoint_every == 0 or step + 1 == gc.steps:
            ckpt.save(policy, opt_state, step + 1, rng, step + 1)
    bar.close()
    return PhaseResult(policy=policy, step=end, resumed_from=resumed)


# ============================================================================ one stage
@dataclasses.dataclass
class StageResult:
    """What :func:`train_stage` produced.

    Attributes:
      stage_dir: the stage folder.
      checkpoint_dir: orbax directory of the final policy (GRPO, or the warm start when GRPO
        is disabled); pass it as ``init_from`` of the next stage.
      policy_dir: the final policy as a Hugging Face folder (``None`` without export_hf).
      metrics_path / eval_path / curves_path: files written (``eval_path`` is
        ``train_eval.json``).
      eval_before: held-out metrics before GRPO (after the warm start).
      eval_after: held-out metrics of the final policy.
      warmstart_steps / grpo_steps: steps done in each phase.
      resumed: whether any phase resumed from a checkpoint.
      wall_s: seconds this call took.
    """

    stage_dir: Path
    checkpoint_dir: Path
    policy_dir: Optional[Path]
    metrics_path: Path
    eval_path: Path
    curves_path: Optional[Path]
    eval_before: Optional[dict]
    eval_after: Optional[dict]
    warmstart_steps: int
    grpo_steps: int
    resumed: bool
    wall_s: float


def load_policy(model_cfg: Any, init_from: Optional[str | os.PathLike] = None, seed: int = 0) -> Policy:
    """The starting policy of a stage.

    * ``init_from``: a Hugging Face folder (has ``config.json``) or an orbax checkpoint
      directory of a previous stage (``llm.checkpoint`` format; the tokenizer then comes from
      ``model_cfg``);
    * else ``model_cfg.path``: a Hugging Face Qwen3 folder (model and tokenizer);
    * else the embedded default (``llm.default.load_default()``).

    Raises ``FileNotFoundError`` when ``init_from`` does not exist.
    """
    tokenizer = None
    path = cfg_get(model_cfg, "path")
    if init_from is not None:
        init = Path(init_from)
        if not init.exists():
            raise FileNotFoundError(f"checkpoint {str(init)!r} does not exist")
        if (init / "config.json").is_file():
            from llm.hf_io import from_pretrained

            model, tokenizer = from_pretrained(init, **_precision(model_cfg))
            return Policy.from_model(model, tokenizer)
        from llm.checkpoint import restore_checkpoint

        restored = restore_checkpoint(init)
        return Policy.from_model(restored.model, _tokenizer_for(model_cfg))
    if path:
        from llm.hf_io import from_pretrained

        model, tokenizer = from_pretrained(path, **_precision(model_cfg))
        return Policy.from_model(model, tokenizer)
    from llm import default as default_model
    from llm.model import Qwen3Config, Qwen3ForCausalLM

    model, tokenizer = default_model.load_default()
    arch = {f.name: cfg_get(model_cfg, f.name) for f in dataclasses.fields(Qwen3Config)}
    arch = {k: v for k, v in arch.items() if v is not None and k not in ("bos_token_id", "eos_token_id", "pad_token_id")}
    base = model.config
    if any(getattr(base, k) != v for k, v in arch.items() if k != "vocab_size") or arch.get("vocab_size", 0) > base.vocab_size:
        # another architecture than the embedded default: fresh weights, the game tokenizer
        config = dataclasses.replace(base, **{**arch, "vocab_size": max(int(arch.get("vocab_size", 0)), len(tokenizer))})
        model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed))
    return Policy.from_model(model, tokenizer)


def _precision(model_cfg: Any) -> dict[str, str]:
    """``dtype`` / ``param_dtype`` overrides of a Hugging Face load from the model config.

    ``dtype`` is the compute dtype, ``param_dtype`` the storage (master) dtype of the
    parameters, which the AdamW moments follow: the ``qwen3_*`` presets train bfloat16
    compute on float32 master weights and moments (12 bytes per parameter of state, see the
    README's Precision section); unset fields follow the checkpoint's ``config.json``.
    """
    out = {k: cfg_get(model_cfg, k) for k in ("dtype", "param_dtype")}
    return {k: str(v) for k, v in out.items() if v}


def _tokenizer_for(model_cfg: Any):
    """The tokenizer of ``model_cfg`` (its ``path`` folder, else the embedded default's),
    without building a model."""
    from llm import default as default_model
    from llm.hf_io import load_tokenizer

    return load_tokenizer(cfg_get(model_cfg, "path") or default_model.default_model_dir())


def _env_description(env: EnvSpec) -> Any:
    if isinstance(env, (list, tuple)):
        return [{"weight": float(w), **c.to_dict()} for w, c in env]
    return env.to_dict()


def train_stage(
    cfg: Any,
    env_config: EnvSpec,
    stage_dir: str | os.PathLike,
    init_from: Optional[str | os.PathLike] = None,
    *,
    policy: Optional[Policy] = None,
    mesh=None,
    max_steps: Optional[Mapping[str, int]] = None,
) -> StageResult:
    """Train one stage: (optional) supervised warm start, then GRPO; resumable.

    Args:
      cfg: the Hydra config (or a mapping) with groups ``train``, ``reward``, ``prompt`` and
        ``model`` (see ``conf/``).
      env_config: the stage's environment: a ``LakeConfig`` or a mixture
        ``[(weight, LakeConfig), ...]``.
      stage_dir: output folder (created); rerunning with the same folder resumes.
      init_from: start from this policy (orbax checkpoint dir or HF folder) instead of
        ``cfg.model``.
      policy: start from this in-memory :class:`Policy` (wins over both).
      mesh: data-parallel mesh (default: every device).
      max_steps: ``{"warmstart": k, "grpo": k}`` stop early (simulates a killed run in tests).

    Metrics go to the back ends of ``cfg.logger`` (:mod:`jaxlake.metrics`; default
    ``[jsonl]``: ``<stage_dir>/metrics.jsonl``; ``tensorboard``: ``<stage_dir>/tb/<phase>/``;
    ``wandb``: ``<stage_dir>/wandb/``, settings in ``cfg.wandb``); on resume each drops or
    hides what came after the checkpoint as far as it can (:mod:`jaxlake.metrics`).

    Returns:
      :class:`StageResult`.
    """
    stage_dir = Path(stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    run_config = {"train": to_plain(cfg_get(cfg, "train", {})), "env": _env_description(env_config)}
    with build_writer(LoggerConfig.from_cfg(cfg), stage_dir, phases=PHASES, name=stage_dir.name,
                      run_config=run_config) as metrics:
        return _train_stage(cfg, env_config, stage_dir, init_from, policy, mesh, max_steps, metrics)


def _train_stage(cfg: Any, env_config: EnvSpec, stage_dir: Path, init_from: Optional[str | os.PathLike],
                 policy: Optional[Policy], mesh, max_steps: Optional[Mapping[str, int]],
                 metrics: MetricsWriter) -> StageResult:
    """:func:`train_stage` with its metrics writer open."""
    t_start = time.perf_counter()
    tcfg = TrainConfig.from_dict(to_plain(cfg_get(cfg, "train", {})) or {}, to_plain(cfg_get(cfg, "reward")),
                                 to_plain(cfg_get(cfg, "prompt")))
    stage_dir = Path(stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    max_steps = dict(max_steps or {})
    mesh = shd.make_mesh() if mesh is None else mesh
    if policy is None:
        policy = load_policy(cfg_get(cfg, "model"), init_from, tcfg.seed)
    ec, gc, wc = tcfg.eval, tcfg.grpo, tcfg.warmstart

    eval_lakes = sample_lakes(jax.random.PRNGKey(ec.seed), env_config, max(ec.num_lakes, 1))
    prompter = Prompter.fit(policy.tokenizer, tcfg.prompt, eval_lakes, tcfg.max_prompt_tokens, tcfg.prompt_bucket)
    eval_ref = rewards.reference_costs(eval_lakes)
    horizon = env_horizon(env_config)
    eval_tokens = ec.max_new_tokens or gc.max_new_tokens

    def run_eval(pol: Policy) -> dict:
        if ec.num_lakes == 0:
            return {"num_lakes": 0}
        return evaluate(pol, prompter, eval_lakes, eval_ref, tcfg.reward, eval_tokens, ec.batch_size, horizon, mesh,
                        jax.random.PRNGKey(ec.seed + 1))

    resumed = False
    ws_steps = 0
    ckpt_dir = stage_dir / "checkpoint"
    if wc.enabled and wc.steps > 0:
        res = run_warmstart_phase(policy, tcfg, env_config, stage_dir / "warmstart", metrics, prompter,
                                  gc.max_new_tokens, mesh, max_steps.get("warmstart"))
        policy, ws_steps, resumed = res.policy, res.step, res.resumed_from is not None
        if ws_steps < wc.steps:  # stopped early on purpose
            return StageResult(stage_dir, stage_dir / "warmstart", None, metrics.path, stage_dir / "train_eval.json", None,
                               None, None, ws_steps, 0, resumed, time.perf_counter() - t_start)
        if not gc.enabled or gc.steps == 0:
            ckpt_dir = stage_dir / "warmstart"

    before_path = stage_dir / "eval_before_grpo.json"
    eval_before = None
    grpo_steps = 0
    if gc.enabled and gc.steps > 0:
        if before_path.is_file():
            eval_before = json.loads(before_path.read_text(encoding="utf-8"))
        else:
            eval_before = run_eval(policy)
            write_json(before_path, eval_before)

        def periodic(pol: Policy, step: int) -> dict:
            m = run_eval(pol)
            return {k: v for k, v in m.items() if k != "examples"}

        res = run_grpo(policy, policy.state, tcfg, env_config, ckpt_dir, metrics, prompter, mesh, periodic,
                       max_steps.get("grpo"))
        policy, grpo_steps = res.policy, res.step
        resumed = resumed or res.resumed_from is not None
        if grpo_steps < gc.steps:
            return StageResult(stage_dir, ckpt_dir, None, metrics.path, stage_dir / "train_eval.json", None, eval_before,
                               None, ws_steps, grpo_steps, resumed, time.perf_counter() - t_start)
    elif not (wc.enabled and wc.steps > 0):
        ckpt = Checkpoints(ckpt_dir, 1)
        if ckpt.latest() is None:
            ckpt.save(policy, make_optimizer(gc.optim, 1).init(policy.state), 0, jax.random.PRNGKey(tcfg.seed), 0)

    eval_after = run_eval(policy)
    write_json(stage_dir / "train_eval.json", {
        "env": _env_description(env_config),
        "num_lakes": ec.num_lakes,
        "eval_seed": ec.seed,
        "decoding": "greedy",
        "before_grpo": eval_before,
        "final": eval_after,
        "warmstart_steps": ws_steps,
        "grpo_steps": grpo_steps,
    })
    policy_dir = None
    if tcfg.export_hf and jax.process_index() == 0:
        from llm.hf_io import save_pretrained

        policy_dir = save_pretrained(nnx.merge(policy.graphdef, jax.device_get(policy.state)), policy.tokenizer,
                                     stage_dir / "policy")
    curves = None
    if tcfg.plot and metrics.rows():
        from llm.plots import plot_metrics

        curves = plot_metrics(metrics.path, stage_dir / "curves.png")
    return StageResult(stage_dir, ckpt_dir, policy_dir, metrics.path, stage_dir / "train_eval.json", curves, eval_before,
                       eval_after, ws_steps, grpo_steps, resumed, time.perf_counter() - t_start)


def run_warmstart_phase(*args, **kwargs) -> PhaseResult:
    """:func:`llm.warmstart.run_warmstart` (imported lazily: it imports this module)."""
    from llm.warmstart import run_warmstart

    return run_warmstart(*args, **kwargs)
