"""Completion texts -> simulator rollouts -> reward terms.

Pipeline for a batch of ``B`` completions, each paired with its lake:

1. host: :func:`jaxlake.text.parse_plan_batch` reads every completion into a ``[A, T]``
   plan and a malformed flag (never raises);
2. device: one jitted ``vmap`` of :func:`jaxlake.env.rollout` runs all plans at once
   (compiled once per batch size and horizon);
3. device: the reward terms, each ``[B]`` float32, and their weighted sum.

Terms (weights from ``conf/reward/default.yaml``, :class:`RewardConfig`):

* ``arrived``: share of the lake's agents that reached their goal;
* ``all_arrived``: 1 when every agent arrived (success);
* ``fell``: share of agents that fell into a hole;
* ``conflict``: moves cancelled by vertex, swap or blocking conflicts, per agent;
* ``malformed``: 1 when the completion was off format;
* ``efficiency``: on success, the reference planner's sum of costs divided by the plan's
  (clipped to ``[0, 1]``); 0 on failure or when the planner found no plan.

Reasoning mode (``compute_rewards(..., reasoning=True)``, :mod:`llm.generation.reasoning`): the plan is
read from the answer after ``</think>`` (:func:`llm.generation.reasoning.split_completion`) and four
format terms are added (:data:`THINK_TERMS`, each 0/1):

* ``think_unclosed``: the policy did not close the block within the thinking budget (the
  close was forced, or the turn ended or was cut inside the block);
* ``think_format``: the block is missing, nested, repeated or misplaced;
* ``answer_empty``: nothing follows ``</think>`` (an unparsable answer is ``malformed``);
* ``trailing_text``: text follows the plan (also ``malformed``: a stray line).

Completions cut by the token budget: the thinking budget forces the close (``think_unclosed``
penalises it) and an answer cut at ``max_new_tokens`` is scored as written (a cut plan leaves
agents short of their goals), so by default both are *penalised* through the reward rather
than masked: masking (``grpo.loss.overlong_mask: true``, which drops every completion that hit
either budget) would hide from the policy the one signal that teaches it to think shorter.

Besides the terms, :class:`RewardResult` carries outcome statistics for the metrics
(success, timeout share, plan sum of costs, ...).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Optional, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxlake import env as lake_env
from jaxlake import planner
from jaxlake.config import reject_unknown
from jaxlake.text import parse_plan_batch
from jaxlake.types import Lake
from llm.generation.reasoning import split_completion

TERMS = ("arrived", "all_arrived", "fell", "conflict", "malformed", "efficiency")
#: Format terms of reasoning mode (present in :attr:`RewardResult.terms` only then).
THINK_TERMS = ("think_unclosed", "think_format", "answer_empty", "trailing_text")
ALL_TERMS = TERMS + THINK_TERMS


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """Weights of the reward terms (the reward is ``sum(weight * term)``)."""

    arrived: float = 1.0
    all_arrived: float = 1.0
    fell: float = -1.0
    conflict: float = -0.1
    malformed: float = -0.5
    efficiency: float = 0.5
    think_unclosed: float = -0.25
    think_format: float = -0.25
    answer_empty: float = -0.5
    trailing_text: float = -0.1

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "RewardConfig":
        """From a mapping (Hydra node); unknown keys are an error naming them."""
        values = dict(values)
        reject_unknown("reward", values, ALL_TERMS, ValueError)
        for k, v in values.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"reward.{k}={v!r} must be a number")
        return cls(**{k: float(v) for k, v in values.items()})

    def weights(self) -> dict[str, float]:
        return {t: float(getattr(self, t)) for t in ALL_TERMS}


@chex.dataclass(frozen=True)
class RewardResult:
    """Rewards of ``B`` completions (all ``[B]`` arrays, numpy on the host).

    Attributes:
      reward: float32 weighted sum of the terms.
      terms: ``{term: [B] float32}`` unweighted terms (keys :data:`TERMS`, plus
        :data:`THINK_TERMS` in reasoning mode).
      success: bool, every agent arrived.
      timed_out: float32 share of agents that timed out.
      malformed: bool.
      sum_of_costs: int32, sum over arrived agents of their arrival step.
      conflicts: int32 cancelled moves, all agents together.
    """

    reward: np.ndarray
    terms: dict
    success: np.ndarray
    timed_out: np.ndarray
    malformed: np.ndarray
    sum_of_costs: np.ndarray
    conflicts: np.ndarray


def reference_costs(lakes: Lake, **solve_kwargs: Any) -> np.ndarray:
    """``[N]`` int32 sum of costs of the reference planner's plan per lake (-1: none found).

    Host-side (one :func:`jaxlake.planner.solve` per lake); compute once per lake and repeat
    for its ``G`` completions.
    """
    return np.asarray(planner.solve_batch(lakes, **solve_kwargs).sum_of_costs, dtype=np.int32)


@functools.partial(jax.jit, static_argnames=("horizon",))
def _rollout_terms(lakes: Lake, plans: jax.Array, keys: jax.Array, malformed: jax.Array,
                   ref_soc: jax.Array, horizon: int) -> dict[str, jax.Array]:
    """Device part: vmapped rollouts and unweighted terms, all ``[B]``."""
    roll = jax.vmap(functools.partial(lake_env.rollout, horizon=horizon))(keys, lakes, plans)
    out = roll.outcome
    n = jnp.maximum(lakes.num_agents.astype(jnp.float32), 1.0)
    in_play = lakes.agent_mask

    def share(x):
        return jnp.sum((x & in_play).astype(jnp.float32), axis=-1) / n

    conflicts = jnp.sum((out.vertex_conflicts + out.swap_conflicts + out.blocks) * in_play, axis=-1)
    soc = jnp.sum(jnp.where(out.arrived & in_play, out.steps, 0), axis=-1)
    success = out.success
    eff = jnp.where(
        success & (ref_soc > 0),
        jnp.clip(ref_soc.astype(jnp.float32) / jnp.maximum(soc, 1).astype(jnp.float32), 0.0, 1.0),
        0.0,
    )
    return {
        "arrived": share(out.arrived),
        "all_arrived": success.astype(jnp.float32),
        "fell": share(out.fell),
        "conflict": conflicts.astype(jnp.float32) / n,
        "malformed": malformed.astype(jnp.float32),
        "efficiency": eff,
        "timed_out": share(out.timed_out),
        "success": success,
        "sum_of_costs": soc.astype(jnp.int32),
        "conflicts": conflicts.astype(jnp.int32),
    }


def compute_rewards(
    lakes: Lake,
    texts: Sequence[str],
    key: jax.Array,
    config: RewardConfig,
    ref_soc: Optional[np.ndarray] = None,
    horizon: Optional[int] = None,
    reasoning: bool = False,
    forced_close: Optional[np.ndarray] = None,
) -> RewardResult:
    """Rewards of ``B`` completions.

    Args:
      lakes: batched lake, leading axis ``B`` (row ``b`` is the lake of ``texts[b]``; repeat
        a group's lake ``G`` times).
      texts: ``B`` completion texts.
      key: PRNG key for slippery lakes (split per completion).
      config: term weights.
      ref_soc: ``[B]`` reference sum of costs (:func:`reference_costs`, repeated); ``None``
        computes it here (slow on large batches: planner per row).
      horizon: rollout length (static; ``>=`` every lake's ``max_steps``); default the
        batch's largest ``max_steps``.
      reasoning: the texts are reasoning-mode completions (think block, then the plan):
        the plan is read after ``</think>`` and :data:`THINK_TERMS` are added.
      forced_close: ``[B]`` bool, the sampler forced the close at the thinking budget
        (:attr:`llm.generation.reasoning.ThinkingSample.hit_budget`); counts as ``think_unclosed``.
    """
    texts = list(texts)
    b = len(texts)
    num_agents = np.asarray(lakes.num_agents)
    chex.assert_shape(num_agents, (b,))
    if horizon is None:
        horizon = int(np.max(np.asarray(lakes.max_steps)))
    think_terms = None
    if reasoning:
        split = [split_completion(t) for t in texts]
        forced = np.zeros((b,), bool) if forced_close is None else np.asarray(forced_close, bool)
        chex.assert_shape(forced, (b,))
        texts = [s.answer for s in split]
        think_terms = {
            "think_unclosed": np.asarray([s.thinking is not None and not s.closed for s in split]) | forced,
            "think_format": np.asarray([s.think_format for s in split]),
            "answer_empty": np.asarray([s.answer_empty for s in split]),
            "trailing_text": np.asarray([s.trailing_text for s in split]),
        }
    elif forced_close is not None:
        raise ValueError("forced_close is given but reasoning=False")
    plans, malformed = parse_plan_batch(texts, num_agents, lakes.max_agents, horizon)
    if ref_soc is None:
        ref_soc = reference_costs(lakes)
    ref_soc = np.asarray(ref_soc, dtype=np.int32)
    chex.assert_shape(ref_soc, (b,))
    keys = jax.random.split(key, b)
    raw = jax.device_get(_rollout_terms(lakes, jnp.asarray(plans), keys, jnp.asarray(malformed),
                                        jnp.asarray(ref_soc), horizon=horizon))
    terms = {t: np.asarray(raw[t], np.float32) for t in TERMS}
    if think_terms is not None:
        terms.update({t: np.asarray(v, np.float32).reshape(b) for t, v in think_terms.items()})
    reward = np.zeros((b,), np.float32)
    for t, w in config.weights().items():
        if t in terms:
            reward += np.float32(w) * terms[t]
    return RewardResult(
        reward=reward,
        terms=terms,
        success=np.asarray(raw["success"], bool),
        timed_out=np.asarray(raw["timed_out"], np.float32),
        malformed=np.asarray(malformed, bool),
        sum_of_costs=np.asarray(raw["sum_of_costs"], np.int32),
        conflicts=np.asarray(raw["conflicts"], np.int32),
    )


def repeat_lakes(lakes: Lake, times: int) -> Lake:
    """Repeat every lake ``times`` times in place (``[N] -> [N * times]``, groups contiguous)."""
    return jax.tree_util.tree_map(lambda x: jnp.repeat(jnp.asarray(x), times, axis=0), lakes)


def reward_metrics(result: RewardResult) -> dict[str, float]:
    """Batch means for the metrics file: reward, each term, success and outcome rates."""
    m = {"reward": float(np.mean(result.reward))}
    for t in ALL_TERMS:
        if t in result.terms:
            m[f"term/{t}"] = float(np.mean(result.terms[t]))
    m["success"] = float(np.mean(result.success))
    m["arrived_rate"] = m["term/arrived"]
    m["fall_rate"] = m["term/fell"]
    m["timeout_rate"] = float(np.mean(result.timed_out))
    m["malformed_rate"] = float(np.mean(result.malformed))
    m["conflict_rate"] = float(np.mean(result.conflicts > 0))
    m["conflicts_per_plan"] = float(np.mean(result.conflicts))
    return m
