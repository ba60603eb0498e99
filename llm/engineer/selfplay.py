"""The engineer's role learned by proposing (``train.engineer_selfplay``): the checkpoint that
plays also proposes, in the same GRPO steps, and each proposal is rewarded by how learnable it
is for the policy as it is now.

Absolute Zero, R-Zero and SPICE train one model to propose tasks and to solve them, a
proposal rewarded by the solver's **learnability**: highest where the solver succeeds about
half the time. Here the tasks are environments and the solver is the plan policy:

* the **context** is the engineer's prompt of the stage's last summary (the previous stage's,
  or the starting policy's before stage 1; :func:`selfplay_context`), built as the run's
  ``policy`` engineer builds it (:meth:`llm.engineer.local.LLMEngineer.prompt_turns`);
* every ``every``-th step that trains, the current policy answers it ``proposals`` times,
  sampled at ``temperature`` (constrained decoding's choices, and its analysis first when it
  reasons): valid edits by construction;
* each proposal's **reward** is ``4 p (1 - p)`` averaged over ``lakes`` fresh lakes of the
  mixture it proposes, ``p`` the success of ``samples`` sampled plans of the current policy on
  a lake (all proposals' lakes in one batch of rollouts, no training);
* the rewards, z-scored among the proposals (0 when they tie: nothing to learn from), weight
  each answer's token log-likelihood (divided by its length and the number of proposals):
  ``-sum_j A_j mean_t log pi(answer_j)``, a REINFORCE term with the group's mean as its
  baseline. It is the loop's auxiliary batch (:class:`llm.training.hooks.AuxLoss`): the GRPO
  update adds it at ``weight``, one optimizer step on both roles' gradient, each role with its
  own advantages. Its rows share one prompt (``TokenBatch.shared_prompt``): the update runs
  the context once and the answers after it (:func:`llm.rl.updates.shared_prompt_forward`,
  the same gradient as the full rows).

Row keys: ``selfplay/learnability`` (mean reward), ``selfplay/learnability_max``,
``selfplay/success`` (the rollouts' mean success), ``selfplay/distinct`` (distinct proposals),
``selfplay/answer_tokens``, ``time/selfplay_s`` (the batch's making: ``time/selfplay_propose_s``
the proposals, ``time/selfplay_rollouts_s`` their rollouts; the engineer rows' share of the
update is in the update's own time); steps without a self-play batch add nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxlake.engineers import EngineerContext, space_from_conf
from jaxlake.mixture import Mixture
from llm.engineer.examples import example_rows
from llm.engineer.prompt import chat_text
from llm.game.lakes import env_horizon, sample_lakes
from llm.game.prompter import Prompter
from llm.model import sharding as shd
from llm.training.config import SelfPlayConfig
from llm.training.evaluate import plan_token_budget, run_modes
from llm.training.hooks import AuxLoss

#: Answer room beyond the analysis budget (the JSON of an edit that adds two configs is ~100 game tokens).
ANSWER_TOKENS = 160


def learnability(success: np.ndarray) -> float:
    """``mean(4 p (1 - p))`` over lakes of per-lake success rates ``p`` (PLR's and ``sfl``'s
    :func:`jaxlake.engineers.plr.learnability`, scaled to [0, 1]): 1 where every lake is won
    half the time, 0 where each is always or never won."""
    from jaxlake.engineers.plr import learnability as one

    rates = np.asarray(success, np.float64).reshape(-1)
    return float(np.mean([4.0 * one(p) for p in rates])) if rates.size else 0.0


def proposal_advantages(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """The proposals' rewards z-scored among them (population std); all 0 when they tie."""
    r = np.asarray(rewards, np.float64)
    sd = r.std()
    return np.zeros_like(r) if sd < eps else (r - r.mean()) / (sd + eps)


def _concat(trees: list) -> Any:
    return jax.tree_util.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs], axis=0), *trees)


class EngineerSelfPlay(AuxLoss):
    """The self-play term of the GRPO update (module docstring).

    Args:
      config: ``train.engineer_selfplay``.
      context: the engineer's context this stage re-answers (:func:`selfplay_context`).
      engineer: the run's LLM engineer (its prompt, space and reasoning settings); a copy
        samples at ``config.temperature`` with no retries.
      prompt_cfg: the plan prompt's settings (``train.prompt``) for the rollouts.
      tokenizer: the policy's tokenizer.
      micro_batches: the GRPO update's (the rows split evenly).
      mesh: the run's mesh (the batch laid out on it), or None.
      seed: the run's seed (proposals and rollouts are deterministic in it and the step).
    """

    def __init__(self, config: SelfPlayConfig, context: EngineerContext, engineer: Any, prompt_cfg: Any,
                 tokenizer: Any, micro_batches: int = 1, mesh=None, seed: int = 0, pool: Any = None):
        if config.contexts == "scripted" and pool is None:
            raise ValueError("engineer_selfplay.contexts=scripted needs a ContextPool (pool=...)")
        self.config, self.context, self.mesh, self.seed = config, context, mesh, int(seed)
        self.pool = pool if config.contexts == "scripted" else None
        self.weight = float(config.weight)
        self.micro_batches = int(micro_batches)
        eng = copy.copy(engineer)
        eng.temperature, eng.retries = float(config.temperature), 0
        eng.reasoning = {**eng.reasoning, "temperature": float(config.temperature)}
        self.engineer = eng
        self.tokenizer = tokenizer
        space = space_from_conf(context.base, eng.space_node)
        largest = {name: max(space.values[name]) for name in ("height", "width", "num_agents", "hole_density")
                   if name in space.editable}
        probe = sample_lakes(jax.random.PRNGKey(0), context.base.replace(**largest), 16, split="random")
        self.prompter = Prompter.fit(tokenizer, prompt_cfg, probe, None, 16)
        self.plan_tokens = plan_token_budget(tokenizer, context.base.max_agents, int(context.base.max_steps))
        self._prompt: Optional[tuple] = None  # (context, its prompt_of)

    def check_mesh(self, mesh) -> None:
        shd.check_divisible(self.config.proposals // self.micro_batches, mesh, "engineer self-play rows per micro-batch")

    def _prompt_text(self, model: Any, context: Optional[EngineerContext] = None) -> tuple[str, bool, int, int]:
        """The engineer's chat prompt of ``context`` (default: the stage's, the same every step),
        whether it reasons, the answer room and the prompt's row width (its tokens rounded up to
        64; to 256 for scripted contexts, whose prompts differ, so that the update compiles for
        few widths): computed once per context."""
        context = self.context if context is None else context
        if self._prompt is None or self._prompt[0] is not context:
            ctx = dataclasses.replace(context, load_model=lambda which: (model, self.tokenizer))
            thinking = self.engineer.reasons(ctx)
            system, user = self.engineer.prompt_turns(ctx, model, self.tokenizer)
            text = chat_text(self.tokenizer, system, user, thinking)
            if thinking:
                from llm.generation.reasoning import THINK_OPEN

                text += THINK_OPEN + "\n"
            room = ANSWER_TOKENS + (int(self.engineer.reasoning["thinking_tokens"]) if thinking else 0)
            step = 256 if self.pool is not None else 64
            width = -(-len(self.tokenizer.encode(text, add_special_tokens=False)) // step) * step
            self._prompt = (context, (text, thinking, room, width))
        return self._prompt[1]

    def propose(self, model: Any, step: int, context: Optional[EngineerContext] = None) -> list[tuple[Mixture, str]]:
        """``proposals`` sampled answers of the current model to ``context`` (default: the
        stage's): ``(mixture, answer text)``."""
        from llm.generation.reasoning import THINK_OPEN

        context = self.context if context is None else context
        thinking = self._prompt_text(model, context)[1]
        ctxs = [dataclasses.replace(context, seed=self.seed * 1_000_003 + int(step) * 97 + j,
                                    load_model=lambda which: (model, self.tokenizer))
                for j in range(self.config.proposals)]
        out = []
        for p in self.engineer.propose_many(ctxs):  # side by side: one forward pass a choice
            raw = p.record.get("raw_output") or ""
            if thinking and raw.startswith(THINK_OPEN):
                raw = raw[len(THINK_OPEN):].lstrip("\n")
            out.append((Mixture.of(p.mixture), raw))
        return out

    def rewards(self, policy: Any, mixtures: list[Mixture], step: int) -> tuple[np.ndarray, float]:
        """Each mixture's learnability for ``policy`` and the rollouts' mean success: one batch
        of ``samples`` sampled plans on ``lakes`` fresh lakes of each."""
        c = self.config
        key = jax.random.fold_in(jax.random.PRNGKey(self.seed + 424_242), int(step))
        lakes = _concat([sample_lakes(jax.random.fold_in(key, j), m, c.lakes, split="random")
                         for j, m in enumerate(mixtures)])
        horizon = max(env_horizon(m) for m in mixtures)
        n = c.lakes * len(mixtures)
        mode = ("sampled", {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "num_samples": c.samples})
        episodes = run_modes(policy, self.prompter, lakes, modes=[mode], cells_of=np.zeros(n, np.int64), opt_soc=None,
                             max_new_tokens=self.plan_tokens, batch_size=n * c.samples, horizon=horizon,
                             seed=self.seed + int(step))
        wins = np.zeros(n)
        for e in episodes:
            wins[e["lake"]] += bool(e["success"])
        p = (wins / c.samples).reshape(len(mixtures), c.lakes)
        return np.asarray([learnability(row) for row in p]), float(p.mean())

    def scripted_rewards(self, scripted: Any, mixtures: list[Mixture], step: int) -> tuple[np.ndarray, float]:
        """Each mixture's learnability for the scripted policy a context describes
        (:meth:`jaxlake.engineers.contexts.ContextPool.learnability` on ``lakes x samples``
        fresh lakes) and that policy's mean expected success on them (the log's
        ``selfplay/success``)."""
        n = self.config.lakes * self.config.samples
        seed = self.seed * 7_919 + int(step)
        p = np.stack([self.pool.success_on(scripted, m, n, seed=seed) for m in mixtures])
        return np.mean(4.0 * p * (1.0 - p), axis=1), float(p.mean())

    def scripted_context(self, step: int) -> tuple[EngineerContext, Any]:
        """Step ``step``'s scripted context and the scripted policy it describes."""
        from jaxlake.engineers.contexts import ScriptedPolicy

        ctx, label = self.pool.context(self.seed * 1_000_003 + int(step))
        return ctx, ScriptedPolicy(float(label["skill"]), tuple(label["profile"]))

    def batch(self, step: int, policy: Any):
        if step % self.config.every:
            return None, {}
        from flax import nnx

        t = time.perf_counter()
        model = nnx.merge(policy.graphdef, policy.state)
        context, scripted = self.scripted_context(step) if self.pool is not None else (self.context, None)
        text, _, room, width = self._prompt_text(model, context)
        proposals = self.propose(model, step, context)
        t_propose = time.perf_counter()
        if scripted is not None:
            r, success = self.scripted_rewards(scripted, [m for m, _ in proposals], step)
        else:
            r, success = self.rewards(policy, [m for m, _ in proposals], step)
        t_rollouts = time.perf_counter()
        adv = proposal_advantages(r)
        rows = example_rows([{"prompt": text, "answer": a} for _, a in proposals], self.tokenizer, width, room)
        lengths = np.maximum(rows.mask.sum(1), 1)
        weights = rows.mask * (adv / (len(proposals) * lengths))[:, None]
        rows = rows.replace(weights=weights.astype(np.float32), shared_prompt=True)  # one context: run once
        rows = shd.shard_batch(rows, self.mesh) if self.mesh is not None else jax.tree_util.tree_map(jnp.asarray, rows)
        metrics = {"selfplay/learnability": float(r.mean()), "selfplay/learnability_max": float(r.max()),
                   "selfplay/success": success, "selfplay/distinct": len({a for _, a in proposals}),
                   "selfplay/answer_tokens": float(lengths.mean()), "time/selfplay_s": time.perf_counter() - t,
                   "time/selfplay_propose_s": t_propose - t, "time/selfplay_rollouts_s": t_rollouts - t_propose}
        return rows, metrics
