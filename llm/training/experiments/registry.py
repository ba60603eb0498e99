"""The GRPO hooks a configuration asks for (:func:`grpo_hooks`)."""

from __future__ import annotations

from typing import Any, Optional

import jax

from jaxlake.mixture import Mixture
from llm.game.prompter import Prompter
from llm.training.config import TrainConfig
from llm.training.hooks import Hook


def grpo_hooks(config: TrainConfig, *, env: Mixture, anchor_env: Optional[Mixture], prompter: Prompter,
               policy: Any, key: jax.Array, mesh=None) -> list[Hook]:
    """The hooks of ``config.grpo``, in the order the loop runs them: the supervised anchor
    (``anchor.weight > 0``, on ``anchor_env``, default ``env``; :mod:`llm.training.anchor`),
    greedy screening (``screen.lakes > 0``) and guidance (``guidance.enabled``). ``key``: the
    anchor's (``fold_in(phase rng, 14)``). None of them by default."""
    gc = config.grpo
    hooks: list[Hook] = []
    if gc.anchor.enabled:
        from llm.training.anchor import Anchor

        hooks.append(Anchor(policy, config, env if anchor_env is None else anchor_env, prompter, key, mesh))
    if gc.screen.enabled:
        from llm.training.experiments.screen import ScreenPicker

        hooks.append(ScreenPicker(config, env, prompter, mesh))
    if gc.guidance.enabled:
        from llm.training.guidance import Guidance

        hooks.append(Guidance(config, prompter, policy.tokenizer))
    return hooks
