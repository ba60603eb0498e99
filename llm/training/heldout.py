"""The stage's own held-out check: greedy decoding on fixed lakes of its environment.

What ``train_eval.json`` reports before and after GRPO (and GRPO's periodic ``eval`` rows):
success and every reward term (:func:`llm.game.rewards.reward_metrics`). The suite evaluation of a
finished policy is :mod:`llm.training.evaluate`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from llm.game import rewards
from llm.training.completions import sample_completions
from llm.generation.decode import GenerationConfig
from llm.training.policy import Policy
from llm.game.prompter import Prompter
from llm.game.rewards import RewardConfig


def greedy_rewards(policy: Policy, prompter: Prompter, lakes, ref_soc: np.ndarray, reward_config: RewardConfig,
                   max_new_tokens: int, batch_size: int, horizon: int, mesh,
                   key: jax.Array) -> tuple[rewards.RewardResult, list[str], list[int]]:
    """Each lake's greedy completion, scored: ``(rewards, texts, lengths)``, one per lake.

    Decoded in fixed ``[batch_size, P]`` batches (rounded up to the mesh; the last partial batch
    padded by repeating lakes: one compilation). Shared by the stage's held-out check
    (:func:`evaluate_heldout`) and GRPO's greedy screening (:mod:`llm.training.experiments.screen`).
    """
    n = int(np.asarray(lakes.num_agents).shape[0])
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
        texts += out.texts[:keep]
        lengths += out.lengths[:keep].tolist()
        if out.thinking is not None:
            forced += out.thinking.hit_budget[:keep].tolist()
    thinking = prompter.config.reasoning.enabled
    res = rewards.compute_rewards(lakes, texts, key, reward_config, ref_soc=ref_soc, horizon=horizon,
                                  reasoning=thinking, forced_close=np.asarray(forced, bool) if thinking else None)
    return res, texts, lengths


def evaluate_heldout(policy: Policy, prompter: Prompter, lakes, ref_soc: np.ndarray, reward_config: RewardConfig,
             max_new_tokens: int, batch_size: int, horizon: int, mesh, key: jax.Array) -> dict[str, Any]:
    """Greedy decoding on a held-out batch of lakes (:func:`greedy_rewards`): success and every
    reward term."""
    n = int(np.asarray(lakes.num_agents).shape[0])
    if n == 0:
        return {"num_lakes": 0}
    res, texts, lengths = greedy_rewards(policy, prompter, lakes, ref_soc, reward_config, max_new_tokens, batch_size,
                                         horizon, mesh, key)
    m = rewards.reward_metrics(res)
    m["num_lakes"] = n
    m["completion_len"] = float(np.mean(lengths))
    m["examples"] = [{"completion": texts[i], "success": bool(res.success[i])} for i in range(min(4, n))]
    return m
