"""GRPO's supervised anchor (``train.grpo.anchor``, InstructGPT's PPO-ptx): the loop's auxiliary loss.

With ``anchor.weight > 0`` every GRPO step that trains draws ``anchor.lakes`` fresh lakes of the
warm-start environment and writes the reference planner's completions of them as the warm start
writes them (:func:`llm.training.warmstart.reference_lakes`, :func:`~llm.training.warmstart.
reference_rows`; prompts in a prompt width of their own); every update adds their token NLL at
that weight to the GRPO loss (:class:`llm.rl.updates.GRPOIterations`; metrics ``anchor_nll``,
``anchor_token_acc``). With ``anchor.screen_lakes`` the current policy's greedy failures among that
many come first (:mod:`llm.training.experiments.screen`). Row keys: ``time/anchor_s`` (its lakes,
planner and encoding) and, with its screen, ``anchor_screen_failed_share`` and
``anchor_screen_kept_failed``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxlake.mixture import Mixture
from llm.game.lakes import env_horizon, sample_lakes
from llm.game.prompter import Prompter
from llm.model import sharding as shd
from llm.rl.batches import TokenBatch
from llm.training.config import TrainConfig
from llm.training.hooks import AuxLoss
from llm.training.policy import Policy
from llm.training.warmstart import reference_lakes, reference_rows


def anchor_batches(policy: Policy, config: TrainConfig, env: Mixture, prompter: Prompter, key: jax.Array,
                   mesh) -> Callable[[int, Policy], tuple[TokenBatch, Optional[Any]]]:
    """``(step, policy) -> (TokenBatch, Screened | None)``: the supervised anchor of GRPO step
    ``step`` (``grpo.anchor``): ``anchor.lakes`` fresh lakes of ``env`` (deterministic in the
    step, the same on every process) drawn and written as the warm start draws and writes
    them, weights summing to 1 (the token mean, marks at ``warmstart.mark_weight``). With
    ``anchor.screen_lakes`` the warm start draws that many and ``policy``'s greedy decode
    screens them (:func:`llm.training.experiments.screen.screen_lakes`; the ``Screened`` is
    returned, else ``None``). Its prompts have a width of their own (fitted on 1024 lakes of
    ``env``; a longer prompt grows it, one recompilation), so the GRPO batch's shapes do not
    depend on the anchor's environment."""
    gc, wc = config.grpo, config.warmstart
    reasoning = prompter.config.reasoning
    thinking = reasoning.thinking_tokens if reasoning.enabled and reasoning.warmstart else None
    length = gc.max_new_tokens + (thinking or 0)
    probe_key, data_key = jax.random.split(key)
    probe = sample_lakes(probe_key, env, 1024, split="random")
    anchor_prompter = Prompter.fit(policy.tokenizer, prompter.config, probe, None, prompter.bucket)
    horizon = env_horizon(env)

    def batch(step: int, policy: Policy) -> tuple[TokenBatch, Optional[Any]]:
        key = jax.random.fold_in(data_key, step)
        screened = None
        if gc.anchor.screen_lakes:
            from llm.training.experiments.screen import screen_lakes

            screened = screen_lakes(policy, anchor_prompter, reference_lakes(key, env, gc.anchor.screen_lakes, wc),
                                    gc.anchor.lakes, jax.random.fold_in(key, 1), max_new_tokens=gc.max_new_tokens,
                                    horizon=horizon, reward_config=config.reward, mesh=mesh)
            lakes = screened.lakes
        else:
            lakes = reference_lakes(key, env, gc.anchor.lakes, wc)
        ids, pmask, tokens, mask, scale, _ = reference_rows(lakes, policy.tokenizer, anchor_prompter, length,
                                                            thinking, wc.mark_weight)
        out = TokenBatch(prompt_ids=ids, prompt_mask=pmask, tokens=tokens, mask=mask,
                         weights=(scale / max(float(scale.sum()), 1e-9)).astype(np.float32))
        out = shd.shard_batch(out, mesh) if mesh is not None else jax.tree_util.tree_map(jnp.asarray, out)
        return out, screened

    return batch


class Anchor(AuxLoss):
    """The supervised anchor as the GRPO loop's auxiliary loss (module docstring)."""

    def __init__(self, policy: Policy, config: TrainConfig, env: Mixture, prompter: Prompter, key: jax.Array, mesh):
        self.config = config.grpo.anchor
        self.micro_batches = config.grpo.micro_batches
        self.weight = self.config.weight
        self.draw = anchor_batches(policy, config, Mixture.of(env), prompter, key, mesh)

    def check_mesh(self, mesh) -> None:
        shd.check_divisible(self.config.lakes // self.micro_batches, mesh, "grpo anchor rows per micro-batch")
        if self.config.screen_lakes:
            shd.check_divisible(self.config.screen_lakes, mesh, "grpo anchor screen lakes")

    def batch(self, step: int, policy: Policy) -> tuple[TokenBatch, dict]:
        t = time.perf_counter()
        out, screened = self.draw(step, policy)
        row = {"time/anchor_s": time.perf_counter() - t}
        if screened is not None:
            row["anchor_screen_failed_share"] = float(np.mean(screened.greedy_failed))
            row["anchor_screen_kept_failed"] = screened.kept_failed
        return out, row
