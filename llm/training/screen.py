"""Greedy screening: which of a round's lakes a GRPO step samples its groups on.

The suite scores a policy's *greedy* decode. A pretrained planner's greedy decode solves most
lakes of its environment, and the groups GRPO samples on those lakes mostly agree with it:
their informative groups are lakes where a sample strays from a greedy plan that already
works, and their gradient makes the sampled policy more like its greedy decode without
moving the greedy decode. The lakes where the greedy choice is the wrong one are a few in a
hundred, and those are where a successful sample's positive advantage would move it.

With ``train.grpo.screen.lakes = M`` (:class:`llm.training.config.ScreenConfig`) a sampling
round draws ``M`` lakes instead of ``N``, decodes each once greedily (one row per lake, no
sampling), scores the ``M`` plans in the simulator, and keeps ``N`` of them: the lakes the
greedy decode fails first, in drawing order, then the others in drawing order
(:func:`screen_order`). This is prioritised level replay (Jiang et al. 2021) within a stage,
scored by the greedy decode's failure instead of a regret estimate, and a fresh draw every
round instead of a buffer.

Cost: one greedy decode of ``M`` rows per round, about what sampling ``M`` completions
costs. Host-side selection (the rewards come from the simulator on the host); every process
holds the same lakes and plans, so it picks the same rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import jax
import numpy as np

from jaxlake.suite import take_lakes
from llm.game import rewards
from llm.game.prompter import Prompter
from llm.training.heldout import greedy_rewards
from llm.training.policy import Policy


@dataclasses.dataclass(frozen=True)
class Screened:
    """The ``N`` lakes a round keeps out of the ``M`` it screened.

    Attributes:
      lakes: the kept lakes, batched, leading axis ``N`` (greedy failures first).
      index: ``[N]`` int, their rows among the ``M`` screened lakes.
      greedy_failed: ``[M]`` bool, the screened lakes whose greedy plan did not succeed.
    """

    lakes: Any
    index: np.ndarray
    greedy_failed: np.ndarray

    @property
    def kept_greedy_failed(self) -> np.ndarray:
        """``[N]`` bool: the kept lakes the greedy decode failed."""
        return self.greedy_failed[self.index]

    @property
    def kept_failed(self) -> int:
        """How many kept lakes the greedy decode failed."""
        return int(self.kept_greedy_failed.sum())


def screen_order(greedy_failed: np.ndarray, n: int) -> np.ndarray:
    """``[n]`` rows of ``M`` screened lakes: the failed ones first, then the rest, each in
    drawing order (a stable sort on success).

    >>> screen_order(np.array([False, True, False, True]), 3).tolist()
    [1, 3, 0]
    """
    failed = np.asarray(greedy_failed, bool)
    chex.assert_rank(failed, 1)
    if not 0 < n <= failed.shape[0]:
        raise ValueError(f"screen: cannot keep {n} of {failed.shape[0]} lakes")
    return np.argsort(~failed, kind="stable")[:n]


def screen_lakes(policy: Policy, prompter: Prompter, lakes: Any, n: int, key: jax.Array, *, max_new_tokens: int,
                 horizon: int, reward_config: rewards.RewardConfig, mesh=None) -> Screened:
    """Decode ``M`` lakes greedily and score the plans (:func:`llm.training.heldout.greedy_rewards`,
    one batch of ``M``), then keep ``n``: :func:`screen_order`.

    Args:
      policy: the current policy (its greedy decode is what is screened).
      prompter: the round's prompt encoder (the same prompt width the groups sample with).
      lakes: ``M`` batched lakes.
      n: lakes to keep (``lakes_per_step``).
      key: the simulator's key (slippery lakes).
      max_new_tokens: the decode budget (``grpo.max_new_tokens``; the answer budget when the
        prompt thinks).
      horizon: the rollout horizon of the environment.
      reward_config: the reward's settings (only success is read).
      mesh: the ``(data, fsdp)`` mesh or ``None``; ``M`` must divide over it.
    """
    m = int(np.asarray(lakes.num_agents).shape[0])
    # success does not read the reference's sum of costs: -1 ("none found") spares the planner
    res, _, _ = greedy_rewards(policy, prompter, lakes, np.full((m,), -1, np.int32), reward_config, max_new_tokens,
                               m, horizon, mesh, key)
    failed = ~np.asarray(res.success, bool)
    index = screen_order(failed, n)
    return Screened(lakes=take_lakes(lakes, index), index=index, greedy_failed=failed)
