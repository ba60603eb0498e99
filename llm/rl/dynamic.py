"""DAPO's dynamic sampling: which sampled groups fill a GRPO step's batch.

A group whose ``G`` rewards are all equal has zero advantage in every mode
(:func:`llm.rl.grpo.group_advantages`): it adds no policy gradient, only tokens to the token
mean's divisor. DAPO (Yu et al. 2025, "dynamic sampling") over-samples instead: it keeps
sampling and drops such groups until the batch is full of groups whose rewards differ.

Here the trainer (:func:`llm.training.grpo_loop.run_grpo`) samples the step's ``N`` groups in
*rounds* of the same shape (``N`` fresh lakes x ``G`` completions, so the sampler compiles
once), at most :attr:`DynamicSamplingConfig.max_rounds` of them, and stops as soon as ``N``
informative groups are in hand. :func:`select_groups` then fills the ``N`` slots of the batch
-- always exactly ``N``, so the update keeps its static shape and compiles once:

* informative groups first, in sampling order (round by round, group by group); those
  beyond ``N`` are dropped (DAPO drops the surplus of its last generation batch the same way);
* if the rounds ran out first, the remaining slots take tied groups in the same order. Their
  sequence mask is 0 (:func:`llm.rl.grpo.sequence_mask` with ``drop_tied``), so their token
  weights are 0: they add nothing to the loss or its divisor, and the token mean is the mean
  over the informative groups' tokens only (the batch is *reweighted*, not diluted);
* with no informative group at all, the step takes no optimizer update (no AdamW moment
  update, no weight decay, no schedule step) and logs ``update_skipped = 1``.

Host-side numpy (the rewards come from the simulator on the host); no ``jaxlake`` import.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class DynamicSamplingConfig:
    """``train.grpo.dynamic_sampling``.

    Attributes:
      enabled: refill the batch with informative groups (rewards not all equal), drop the
        tied ones from the loss, and skip the update of a batch without any informative group.
        Off: one sampling round, every group trains (tied groups have zero advantage but their
        tokens count in the token mean), and an all-tied batch still takes its AdamW step.
      max_rounds: sampling rounds per step at most (``>= 1``), each of ``lakes_per_step`` fresh
        lakes: up to ``max_rounds x`` the sampling of a step. ``1`` only masks the tied groups
        (no refill).
    """

    enabled: bool = False
    max_rounds: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"grpo.dynamic_sampling.enabled={self.enabled!r} must be true or false")
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) or self.max_rounds < 1:
            raise ValueError(f"grpo.dynamic_sampling.max_rounds={self.max_rounds!r} must be an integer >= 1")

    def rounds_cap(self) -> int:
        """Rounds a step may sample: ``max_rounds`` when enabled, else 1."""
        return self.max_rounds if self.enabled else 1


@dataclasses.dataclass(frozen=True)
class GroupSelection:
    """The ``N`` groups of a step's batch, slot by slot.

    Attributes:
      round: ``[N]`` int, the sampling round each slot's group comes from.
      group: ``[N]`` int, its index among that round's ``N`` groups.
      informative: ``[N]`` bool, whether its rewards differ (False: a tied filler).
      found: informative groups in all rounds sampled (may exceed ``N``).
    """

    round: np.ndarray
    group: np.ndarray
    informative: np.ndarray
    found: int

    @property
    def kept(self) -> int:
        """Informative groups in the batch."""
        return int(np.sum(self.informative))

    def rows(self, group_size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(round [N * G], row [N * G])``: the round and the row within that round's
        ``N * G`` rows of each row of the batch (group ``n``'s completions contiguous)."""
        offsets = np.arange(group_size)
        return (np.repeat(self.round, group_size),
                (self.group[:, None] * group_size + offsets[None, :]).reshape(-1))


def enough(informative: Sequence[np.ndarray], groups: int) -> bool:
    """Whether the rounds so far hold ``groups`` informative groups."""
    return int(sum(int(np.sum(x)) for x in informative)) >= groups


def all_groups(informative: np.ndarray) -> GroupSelection:
    """Every group of one round, in order (dynamic sampling off)."""
    flags = np.asarray(informative, bool).reshape(-1)
    n = flags.shape[0]
    return GroupSelection(round=np.zeros((n,), np.int32), group=np.arange(n, dtype=np.int32), informative=flags,
                          found=int(flags.sum()))


def select_groups(informative: Sequence[np.ndarray], groups: int) -> GroupSelection:
    """Fill ``groups`` slots from the sampling rounds (see the module docstring).

    Args:
      informative: one ``[groups]`` bool array per round sampled (at least one): whether each
        group's rewards differ (``~llm.rl.grpo.zero_variance_groups``).
      groups: the batch's groups ``N``.
    """
    if not informative:
        raise ValueError("select_groups needs at least one sampling round")
    flags = [np.asarray(x, bool).reshape(-1) for x in informative]
    for r, f in enumerate(flags):
        if f.shape != (groups,):
            raise ValueError(f"round {r} has {f.shape[0]} groups, the batch {groups}")
    pairs = [(r, n) for r, f in enumerate(flags) for n in range(groups)]
    good = [p for p in pairs if flags[p[0]][p[1]]]
    tied = [p for p in pairs if not flags[p[0]][p[1]]]
    chosen = (good + tied)[:groups]
    return GroupSelection(round=np.array([p[0] for p in chosen], np.int32),
                          group=np.array([p[1] for p in chosen], np.int32),
                          informative=np.array([flags[r][n] for r, n in chosen], bool),
                          found=len(good))
