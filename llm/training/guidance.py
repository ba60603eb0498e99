"""Reference guidance for GRPO (on in the default training, ``train.grpo.guidance``): the
planner's completion in a group where no sample succeeded. From the shipped novice it is what
lets the default stages climb past the plain GRPO ceiling (docs/research/novice.md); on the
expert planner it was measured inside the noise (docs/research/tiny-planner.md). The GRPO loop's round transform hook
(:class:`Guidance`, :mod:`llm.training.hooks`); row key ``guided_groups`` (the batch's groups that
hold the planner's completion). The metrics still describe the policy's own samples.

A group whose ``G`` sampled completions all fail has no advantage (:func:`llm.rl.grpo.
group_advantages`): it teaches nothing. From a pretrained policy that is where the errors
are: a nearly deterministic planner (token entropy about 0.04) fails the same way in every
sample, so the groups it most needs to learn from are the tied ones. Guidance (the simplest
form of LUFFY's mixed-policy GRPO, Yan et al. 2025, "Learning to Reason under Off-Policy
Guidance") replaces the last ``rows`` completions of such a group by the reference
planner's completion for its lake: the warm start's target (:func:`llm.training.warmstart.
plan_targets`: the templated think block when the prompt thinks, then the plan), scored in
the simulator like every other completion. The group's rewards then differ, so the guided
rows take a positive advantage and the policy's failures a negative one.

Off-policy, but no importance weight is needed for the first update: it is on-policy by
construction (the ratio of the current log-probs to their own stop-gradient is 1,
:mod:`llm.rl.updates`), so a guided row's gradient is its advantage times the gradient of its
log-likelihood, an advantage-weighted supervised step on the planner's plan. Updates 2 ..
``mu`` clip against the first update's log-probs like every row.

Host-side numpy on a sampling round's arrays (every process holds the same, so the result is
the same everywhere). Shapes: ``N`` lakes x ``G`` completions, rows group-contiguous, ``T``
the round's completion width.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import chex
import numpy as np

from jaxlake.suite import take_lakes
from llm.game.prompter import Prompter
from llm.training.config import TrainConfig
from llm.training.hooks import Round, RoundTransform, selected
from llm.training.warmstart import plan_targets


@dataclasses.dataclass(frozen=True)
class Guided:
    """A sampling round with its all-failed groups guided.

    Attributes:
      tokens: ``[N * G, T]`` int32 completion ids, guided rows replaced.
      mask: ``[N * G, T]`` bool, the completion tokens.
      train_mask: ``[N * G, T]`` bool, the tokens that take the loss (a guided row: all of its).
      texts: ``N * G`` completion texts (a guided row: the planner's).
      rows: ``[N * G]`` bool, the guided rows.
      groups: ``[N]`` bool, the groups holding a guided row.
    """

    tokens: np.ndarray
    mask: np.ndarray
    train_mask: np.ndarray
    texts: list
    rows: np.ndarray
    groups: np.ndarray


def guide_round(lakes: Any, tokens: np.ndarray, mask: np.ndarray, train_mask: np.ndarray, texts: list,
                success: np.ndarray, *, group_size: int, rows: int, tokenizer: Any,
                thinking_tokens: Optional[int], style: str, cell: str) -> Guided:
    """Replace the last ``rows`` completions of every all-failed group by the planner's.

    Args:
      lakes: the round's ``N`` lakes (batched, one per group, not repeated).
      tokens, mask, train_mask: ``[N * G, T]`` the sampled completions (host arrays).
      texts: their ``N * G`` decoded texts.
      success: ``[N * G]`` bool, each completion's outcome in the simulator.
      group_size: ``G``.
      rows: completions replaced per guided group (``1 <= rows < G``).
      tokenizer: the policy's tokenizer.
      thinking_tokens: the think block's budget when the prompt thinks (the planner's
        templated trace is written), else ``None`` (the plan alone).
      style, cell: the think block's form (``prompt.reasoning.warmstart_style``, ``prompt.cell``).

    A group is guided when none of its completions succeeded and the planner's completion of
    its lake exists and fits in ``T`` tokens; the others are returned unchanged.
    """
    tokens, mask, train_mask = (np.array(x) for x in (tokens, mask, train_mask))
    b, width = tokens.shape
    n = b // group_size
    chex.assert_shape(mask, (b, width))
    chex.assert_shape(train_mask, (b, width))
    chex.assert_shape(np.asarray(success), (b,))
    if n * group_size != b or len(texts) != b:
        raise ValueError(f"guide_round: {b} rows and {len(texts)} texts are not {n} groups of {group_size}")
    if not 1 <= rows < group_size:
        raise ValueError(f"grpo.guidance.rows={rows} must be in [1, group_size - 1 = {group_size - 1}]")
    failed = ~np.asarray(success, bool).reshape(n, group_size).any(axis=1)
    groups = np.zeros((n,), bool)
    guided_rows = np.zeros((b,), bool)
    texts = list(texts)
    if failed.any():
        pick = np.flatnonzero(failed)
        sub = take_lakes(lakes, pick)
        ref_tokens, ref_mask, solved, ref_texts = plan_targets(sub, tokenizer, width, thinking_tokens, style=style,
                                                               cell=cell)
        for j, g in enumerate(pick):
            if not solved[j]:
                continue
            groups[g] = True
            for r in range(g * group_size + group_size - rows, (g + 1) * group_size):
                tokens[r], mask[r], train_mask[r] = ref_tokens[j], ref_mask[j], ref_mask[j]
                texts[r] = ref_texts[j]
                guided_rows[r] = True
    return Guided(tokens=tokens, mask=mask, train_mask=train_mask, texts=texts, rows=guided_rows, groups=groups)



class Guidance(RoundTransform):
    """``grpo.guidance``: :func:`guide_round` on every sampling round; the guided rows are scored
    again, with the round's key, for the advantages."""

    def __init__(self, config: TrainConfig, prompter: Prompter, tokenizer: Any):
        reasoning = prompter.config.reasoning
        self.rows, self.group_size, self.tokenizer = config.grpo.guidance.rows, config.grpo.group_size, tokenizer
        # the warm start's target: its think block when the prompt thinks
        self.thinking = reasoning.thinking_tokens if reasoning.enabled and reasoning.warmstart else None
        self.style, self.cell = reasoning.warmstart_style, prompter.config.cell

    def transform(self, rnd: Round) -> Round:
        gd = guide_round(rnd.lakes, rnd.tokens, rnd.mask, rnd.train_mask, rnd.texts, rnd.rewards.success,
                         group_size=self.group_size, rows=self.rows, tokenizer=self.tokenizer,
                         thinking_tokens=self.thinking, style=self.style, cell=self.cell)
        rnd.extras["guided"] = gd.groups
        if not gd.groups.any():
            return rnd
        return dataclasses.replace(rnd, tokens=gd.tokens, mask=gd.mask, train_mask=gd.train_mask, texts=gd.texts,
                                   truncated=rnd.truncated & ~gd.rows,
                                   rewards=rnd.rescore(gd.texts, rnd.forced & ~gd.rows))

    def metrics(self, rounds, sel) -> dict:
        return {"guided_groups": int(np.sum(selected(rounds, sel, lambda x: x.extras["guided"])))}
