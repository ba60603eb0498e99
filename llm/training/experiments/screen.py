"""Greedy screening (an experiment, off by default): which of a round's lakes a GRPO step samples
its groups on. Measured inside the noise (README's research notes); the GRPO loop's lake picker
hook (:class:`ScreenPicker`, :mod:`llm.training.hooks`).

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

Row keys: ``screen_failed_share`` (the first round's screened lakes the greedy decode failed),
``screen_kept_failed`` (the batch's groups on such a lake) and ``time/screen_s``. The supervised
anchor screens its own lakes with :func:`screen_lakes` too (``grpo.anchor.screen_lakes``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import chex
import jax
import numpy as np

from jaxlake.suite import take_lakes
from llm.game import rewards
from llm.game.lakes import env_horizon, sample_lakes
from llm.game.prompter import Prompter
from llm.model import sharding as shd
from llm.training.config import TrainConfig
from llm.training.heldout import greedy_rewards
from llm.training.hooks import LakePicker, RoundKeys, selected
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


class ScreenPicker(LakePicker):
    """``grpo.screen``: a round draws ``screen.lakes`` lakes of the stage's environment and keeps
    ``N``, the greedy decode's failures first (module docstring)."""

    def __init__(self, config: TrainConfig, env: Any, prompter: Prompter, mesh=None):
        self.lakes, self.max_new_tokens = config.grpo.screen.lakes, config.grpo.max_new_tokens
        self.env, self.prompter, self.mesh, self.reward = env, prompter, mesh, config.reward
        self.horizon = env_horizon(env)

    def check_mesh(self, mesh) -> None:
        shd.check_divisible(self.lakes, mesh, "grpo screen lakes")

    def pick(self, policy: Policy, keys: RoundKeys, n: int, extras: dict) -> Any:
        t = time.perf_counter()
        screened = screen_lakes(policy, self.prompter, sample_lakes(keys.data, self.env, self.lakes, split="random"), n,
                                jax.random.fold_in(keys.reward, 1), max_new_tokens=self.max_new_tokens,
                                horizon=self.horizon, reward_config=self.reward, mesh=self.mesh)
        extras["screened"], extras["screen_s"] = screened, time.perf_counter() - t
        return screened.lakes

    def metrics(self, rounds, sel) -> dict:
        kept_failed = selected(rounds, sel, lambda x: x.extras["screened"].kept_greedy_failed)
        return {"screen_failed_share": float(np.mean(rounds[0].extras["screened"].greedy_failed)),
                "screen_kept_failed": int(kept_failed.sum()),
                "time/screen_s": float(sum(x.extras["screen_s"] for x in rounds))}
