"""The GRPO phase of a stage: sample, score, update, log and checkpoint, step after step.

One GRPO step:

1. draw ``N`` lakes (deterministic in the step: ``fold_in(data_key, step)``), render the
   prompts (:mod:`llm.game.prompts`) left-padded to a fixed length ``P`` (:class:`llm.game.prompter.
   Prompter`);
2. sample ``G`` completions per lake with the KV-cache generator (:func:`llm.training.completions.
   sample_completions`) at ``grpo.temperature`` (no top-k / top-p);
3. score them in the simulator (:mod:`llm.game.rewards`), group advantages, sequence masks and
   global token weights (:mod:`llm.rl.grpo`);
4. the *old* (behaviour) log-probs, recomputed with the training forward at the sampling
   temperature (:func:`llm.rl.updates.make_logprob_fn`), and the reference's when ``beta > 0``
   (skipped entirely when ``beta == 0``): ratio, KL and entropy all refer to the
   distribution that drew the tokens;
5. ``mu`` calls of ONE jitted update function (:func:`llm.rl.updates.make_grpo_update`):
   parameters and optimizer state in, new ones out; inside, a ``lax.scan`` over
   micro-batches accumulates the gradient (gradient accumulation), then optax (warmup +
   cosine, global-norm clipping) applies it. Shapes are fixed for the whole stage, so nothing
   recompiles across steps.

Data parallelism: a 1-D mesh over every device (:mod:`llm.model.sharding`); batch arrays are
sharded on their leading axis, parameters and optimizer state replicated; XLA inserts the
gradient all-reduce. The same code runs on one CPU and on many accelerators.

Checkpoints (:class:`llm.training.phase.Checkpoints`) every ``checkpoint_every`` steps and at the end;
restarting resumes from the latest one and truncates the metrics to it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxlake.metrics import MetricsWriter
from jaxlake.mixture import Mixture
from llm.rl import grpo
from llm.rl.batches import GRPOBatch
from llm.game import rewards
from llm.generation import reasoning as reasoning_mod
from llm.model import sharding as shd
from llm.training.completions import sample_completions
from llm.generation.decode import GenerationConfig
from llm.game.lakes import env_horizon, sample_lakes
from llm.rl.optim import make_optimizer, schedule_value
from llm.training.phase import Checkpoints, PhaseResult, progress_bar
from llm.training.policy import Policy, copy_state
from llm.game.prompter import Prompter
from llm.model.sharding import to_host
from llm.training.config import TrainConfig
from llm.rl.updates import make_grpo_update, make_logprob_fn


def run_grpo(
    policy: Policy,
    ref_state: Any,
    config: TrainConfig,
    env: Mixture,
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
      mesh: the ``(data, fsdp)`` mesh (``None``: plain single-device arrays); parameters,
        optimizer state and the reference are laid out FSDP-style on it (:mod:`llm.model.sharding`).
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
    ckpt = Checkpoints(checkpoint_dir, gc.keep_checkpoints, mesh)
    state, opt_state, start, rng, resumed = ckpt.start(policy, optimizer, config.seed)
    if lc.use_reference:
        ref_state = copy_state(ref_state)  # the update donates its input: never consume the caller's arrays
    metrics.truncate("grpo", start, drop_later=start < gc.steps)
    if mesh is not None:
        state, opt_state = shd.place_state(state, mesh), shd.place_opt_state(opt_state, state, mesh)
        if lc.use_reference:
            ref_state = shd.place_state(ref_state, mesh)
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
    bar = progress_bar(gc.steps, start, "grpo", config.progress)
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
        res = rewards.compute_rewards(rewards.repeat_lakes(lakes, g), out.texts, jax.random.fold_in(reward_key, step),
                                      config.reward, ref_soc=np.repeat(ref_soc, g), horizon=horizon,
                                      reasoning=reasoning.enabled,
                                      forced_close=out.thinking.hit_budget if reasoning.enabled else None)
        grouped = jnp.asarray(res.reward).reshape(n, g)
        adv = grpo.group_advantages(grouped, lc.advantage, lc.std_eps).reshape(-1)
        truncated = ~out.hit_eos
        if reasoning.enabled:  # a forced close is a cut by the thinking budget
            truncated = truncated | out.thinking.hit_budget
        seq_mask = grpo.sequence_mask(grouped, jnp.asarray(truncated), dynamic_sampling=lc.dynamic_sampling,
                                      overlong_mask=lc.overlong_mask)
        cmask = out.mask
        # forced tokens (reasoning mode) are attended to but take no policy-gradient loss
        weights = grpo.token_weights(jnp.asarray(to_host(out.train_mask)), seq_mask, lc.aggregation,
                                     lc.max_len)
        # old_logp is a placeholder until the policy's forward below fills it in
        batch = GRPOBatch(prompt_ids=ids, prompt_mask=pmask, tokens=out.tokens_np, mask=to_host(cmask),
                          weights=np.asarray(weights), advantages=np.asarray(adv), old_logp=None)
        if mesh is not None:
            batch = shd.shard_batch(batch, mesh)
        else:
            batch = jax.tree_util.tree_map(jnp.asarray, batch)
        # recomputed, not the sampler's: same forward and temperature as the update (ratio 1 at first)
        batch = batch.replace(old_logp=logprob_fn(state, *batch.sequences),
                              ref_logp=logprob_fn(ref_state, *batch.sequences) if lc.use_reference else None)
        t_upd = time.perf_counter()
        inner = []
        for _ in range(gc.mu):
            state, opt_state, m = update(state, opt_state, batch)
            inner.append(m)
        inner = jax.device_get(inner)
        policy = Policy(policy.graphdef, state, policy.tokenizer)
        t_end = time.perf_counter()

        lengths = out.lengths
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
        row["truncated_rate"] = float(np.mean(~out.hit_eos))
        row["completion_len"] = float(lengths.mean())
        row["completion_len_max"] = int(lengths.max())
        if reasoning.enabled:
            row.update(reasoning_mod.thinking_metrics(out.thinking))
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

