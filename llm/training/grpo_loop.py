"""The GRPO phase of a stage: sample, score, update, log and checkpoint, step after step.

One GRPO step:

1. draw ``N`` lakes (deterministic in the step: ``fold_in(data_key, step)``; with
   ``grpo.screen`` draw ``screen.lakes`` and keep ``N``, those whose greedy decode fails
   first: :mod:`llm.training.screen`), render the prompts (:mod:`llm.game.prompts`)
   left-padded to a fixed length ``P`` (:class:`llm.game.prompter.Prompter`);
2. sample ``G`` completions per lake with the KV-cache generator (:func:`llm.training.completions.
   sample_completions`) at ``grpo.temperature`` (no top-k / top-p);
3. score them in the simulator (:mod:`llm.game.rewards`). With ``grpo.dynamic_sampling``
   (DAPO, :mod:`llm.rl.dynamic`) steps 1-3 repeat on fresh lakes (round ``r`` folds ``r`` into
   the step's keys) until ``N`` groups whose rewards differ are in hand or
   ``max_rounds`` rounds are spent; the batch takes ``N`` groups, informative ones first,
   tied fillers masked out; a batch with no informative group (or no token left in the
   loss) takes no update at all (``update_skipped``). With ``grpo.guidance``
   (:mod:`llm.training.guidance`) a group of a round in which no completion succeeded gets
   the reference planner's completion in its last ``rows`` rows before any of this, so it
   is informative; the metrics still describe the policy's own samples;
4. group advantages, sequence masks and global token weights (:mod:`llm.rl.grpo`); the
   reference's log-probs when ``beta > 0`` (:func:`llm.rl.updates.make_logprob_fn`, in the
   update's micro-batches; skipped entirely when ``beta == 0``);
5. with ``grpo.anchor`` (weight > 0): ``anchor.lakes`` fresh lakes of the warm-start
   environment and the reference planner's completions of them, written as the warm start
   writes them (:func:`llm.training.warmstart.reference_lakes`, :func:`~llm.training.warmstart.
   reference_rows`; prompts in a prompt width of their own; with ``anchor.screen_lakes`` the
   current policy's greedy failures among that many first), whose NLL the updates add to the
   GRPO loss at that weight;
6. ``mu`` updates (:class:`llm.rl.updates.GRPOIterations`): parameters and optimizer state in,
   new ones out; inside, a ``lax.scan`` over micro-batches accumulates the gradient, then
   optax (warmup + cosine, global-norm clipping, decay by role) applies it. No forward pass
   computes the old log-probs: the first update is on-policy (the stop-gradient of its own
   log-probs, ratio 1) and hands its log-probs to updates 2 .. ``mu`` as ``old_logp``. Ratio,
   KL and entropy all refer to the distribution at the sampling temperature. Shapes are
   fixed for the whole stage, so nothing recompiles across steps.

Data parallelism: a 1-D mesh over every device (:mod:`llm.model.sharding`); batch arrays are
sharded on their leading axis, parameters and optimizer state replicated; XLA inserts the
gradient all-reduce. The same code runs on one CPU and on many accelerators.

Metrics of a step: the reward terms, lengths, ``zero_adv_share`` and thinking statistics of
the step's *first* sampling round (a plain sample of the policy, as without dynamic
sampling, unguided); ``kept_share`` and the loss metrics of the batch trained on;
``guided_groups`` (with guidance: the batch's groups that hold the planner's completion); with dynamic sampling
``sampling_rounds``, ``informative_groups`` (found in all rounds) and ``kept_groups`` (in the
batch); with the screen ``screen_failed_share`` (the first round's screened lakes the greedy
decode failed), ``screen_kept_failed`` (the batch's groups on such a lake) and
``time/screen_s``; with the anchor ``anchor_nll``, ``anchor_token_acc`` (the update's, before it) and
``time/anchor_s`` (its lakes, planner and encoding; with its screen also
``anchor_screen_failed_share`` and ``anchor_screen_kept_failed``); ``update_skipped`` (1: no optimizer update, and no loss metrics in the row); ``lr``
of the step's first update, read from the optimizer's own count (a skipped step does not
advance the schedule).

Checkpoints (:class:`llm.training.phase.Checkpoints`) every ``checkpoint_every`` steps and at the end;
restarting resumes from the latest one and truncates the metrics to it.
"""

from __future__ import annotations

import dataclasses
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
from llm.rl.dynamic import all_groups, enough, select_groups
from llm.rl.optim import make_optimizer, schedule_value, update_count
from llm.training.guidance import guide_round
from llm.training.screen import Screened, screen_lakes
from llm.training.phase import Checkpoints, PhaseResult, progress_bar
from llm.training.policy import Policy, copy_state, shares_buffers
from llm.game.prompter import Prompter
from llm.model.sharding import to_host
from llm.training.config import TrainConfig
from llm.rl.batches import TokenBatch
from llm.rl.updates import GRPOIterations, make_logprob_fn
from llm.training.warmstart import reference_lakes, reference_rows


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
    anchor_env: Optional[Mixture] = None,
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
      anchor_env: the supervised anchor's environment (``grpo.anchor``; default ``env``): the
        stage's warm-start environment.
    """
    gc = config.grpo
    lc = gc.loss
    total_updates = gc.steps * gc.mu
    optimizer = make_optimizer(gc.optim, total_updates)
    if mesh is not None:
        shd.check_divisible(gc.rows // gc.micro_batches, mesh, "grpo rows per micro-batch")
        if gc.anchor.enabled:
            shd.check_divisible(gc.anchor.lakes // gc.micro_batches, mesh, "grpo anchor rows per micro-batch")
        if gc.screen.enabled:
            shd.check_divisible(gc.screen.lakes, mesh, "grpo screen lakes")
        if gc.anchor.enabled and gc.anchor.screen_lakes:
            shd.check_divisible(gc.anchor.screen_lakes, mesh, "grpo anchor screen lakes")
    ckpt = Checkpoints(checkpoint_dir, gc.keep_checkpoints, mesh)
    state, opt_state, start, rng, resumed = ckpt.start(policy, optimizer, config.seed)
    if lc.use_reference and shares_buffers(ref_state, state):
        # the update donates the state: a reference on the same buffers (the starting weights,
        # which a fresh phase trains from) gets its own. A resumed phase's state comes from the
        # checkpoint: the reference is used as given, no second copy.
        ref_state = copy_state(ref_state)
    metrics.truncate("grpo", start, drop_later=start < gc.steps)
    if mesh is not None:
        state, opt_state = shd.place_state(state, mesh), shd.place_opt_state(opt_state, state, mesh)
        if lc.use_reference:
            ref_state = shd.place_state(ref_state, mesh)
    policy = Policy(policy.graphdef, state, policy.tokenizer)
    iterations = GRPOIterations(policy.graphdef, optimizer, lc, mu=gc.mu, micro_batches=gc.micro_batches,
                                compute_entropy=gc.compute_entropy, mesh=mesh, temperature=gc.temperature,
                                logprob_chunk=gc.logprob_chunk, remat=gc.remat, anchor_weight=gc.anchor.weight)
    # the reference's log-probs: the training forward at the sampling temperature, in the update's micro-batches
    ref_logprob_fn = make_logprob_fn(policy.graphdef, temperature=gc.temperature, logprob_chunk=gc.logprob_chunk,
                                     micro_batches=gc.micro_batches, mesh=mesh) if lc.use_reference else None
    gen = GenerationConfig(max_new_tokens=gc.max_new_tokens, temperature=gc.temperature, top_k=gc.top_k,
                           top_p=gc.top_p)
    reasoning = prompter.config.reasoning
    # guidance writes the warm start's target: its think block when the prompt thinks
    guide_thinking = reasoning.thinking_tokens if reasoning.enabled and reasoning.warmstart else None
    horizon = env_horizon(env)
    data_key, sample_key, reward_key = (jax.random.fold_in(rng, i) for i in (11, 12, 13))
    end = gc.steps if max_steps is None else min(gc.steps, max_steps)
    bar = progress_bar(gc.steps, start, "grpo", config.progress)
    n, g = gc.lakes_per_step, gc.group_size
    ds = gc.dynamic_sampling
    anchor_batch = _anchor_batches(policy, config, Mixture.of(env if anchor_env is None else anchor_env), prompter,
                                   jax.random.fold_in(rng, 14), mesh) if gc.anchor.enabled else None

    def sample_round(step: int, r: int) -> _Round:
        """Round ``r`` of a step: ``N`` fresh lakes, ``G`` completions each, scored."""
        keys = [jax.random.fold_in(k, step) for k in (data_key, sample_key, reward_key)]
        if r:  # round 0 keeps the keys of a step without dynamic sampling
            keys = [jax.random.fold_in(k, r) for k in keys]
        screened, screen_s = None, 0.0
        if gc.screen.enabled:
            t = time.perf_counter()
            screened = screen_lakes(policy, prompter, sample_lakes(keys[0], env, gc.screen.lakes, split="random"), n,
                                    jax.random.fold_in(keys[2], 1), max_new_tokens=gc.max_new_tokens,
                                    horizon=horizon, reward_config=config.reward, mesh=mesh)
            lakes, screen_s = screened.lakes, time.perf_counter() - t
        else:
            lakes = sample_lakes(keys[0], env, n, split="random")
        ref_soc = rewards.reference_costs(lakes)
        ids, pmask = prompter.encode(lakes)
        ids, pmask = np.repeat(ids, g, axis=0), np.repeat(pmask, g, axis=0)
        t = time.perf_counter()
        out = sample_completions(policy, ids, pmask, keys[1], gen, mesh, reasoning=reasoning)
        gen_s = time.perf_counter() - t
        repeated = rewards.repeat_lakes(lakes, g)
        forced = np.asarray(out.thinking.hit_budget, bool) if reasoning.enabled else np.zeros((n * g,), bool)

        def score(texts: list, forced_close: np.ndarray):
            return rewards.compute_rewards(repeated, texts, keys[2], config.reward, ref_soc=np.repeat(ref_soc, g),
                                           horizon=horizon, reasoning=reasoning.enabled,
                                           forced_close=forced_close if reasoning.enabled else None)

        res = score(out.texts, forced)
        truncated = ~np.asarray(out.hit_eos, bool) | forced  # a forced close is a cut by the thinking budget
        tokens, mask = np.asarray(out.tokens_np), np.asarray(to_host(out.mask))
        train_mask = np.asarray(to_host(out.train_mask))
        trained = res  # the rewards the advantages come from (the policy's own: `res`, for the metrics)
        guided_groups = np.zeros((n,), bool)
        if gc.guidance.enabled:
            gd = guide_round(lakes, tokens, mask, train_mask, out.texts, res.success, group_size=g,
                             rows=gc.guidance.rows, tokenizer=policy.tokenizer, thinking_tokens=guide_thinking,
                             style=reasoning.warmstart_style, cell=prompter.config.cell)
            if gd.groups.any():
                tokens, mask, train_mask = gd.tokens, gd.mask, gd.train_mask
                truncated = truncated & ~gd.rows
                trained = score(gd.texts, forced & ~gd.rows)
                guided_groups = gd.groups
        grouped = np.asarray(trained.reward, np.float32).reshape(n, g)
        own = np.asarray(res.reward, np.float32).reshape(n, g)
        return _Round(ids=ids, pmask=pmask, out=out, res=res, grouped=grouped, truncated=truncated,
                      tokens=tokens, mask=mask, train_mask=train_mask,
                      informative=~np.asarray(grpo.zero_variance_groups(jnp.asarray(grouped))),
                      own_informative=~np.asarray(grpo.zero_variance_groups(jnp.asarray(own))),
                      guided=guided_groups, gen_s=gen_s, screened=screened, screen_s=screen_s)

    for step in range(start, end):
        t0 = time.perf_counter()
        rounds = [sample_round(step, 0)]
        while ds.enabled and len(rounds) < ds.max_rounds and not enough([x.informative for x in rounds], n):
            rounds.append(sample_round(step, len(rounds)))
        sel = select_groups([x.informative for x in rounds], n) if ds.enabled else all_groups(rounds[0].informative)
        which, rows = sel.rows(g)

        def gather(field: str) -> np.ndarray:
            return np.stack([getattr(x, field) for x in rounds])[which, rows]

        grouped = jnp.asarray(gather_groups(rounds, sel))
        adv = grpo.group_advantages(grouped, lc.advantage, lc.std_eps, lc.std, lc.negative_weight).reshape(-1)
        seq_mask = grpo.sequence_mask(grouped, jnp.asarray(gather("truncated")), drop_tied=ds.enabled,
                                      overlong_mask=lc.overlong_mask)
        # forced tokens (reasoning mode) are attended to but take no policy-gradient loss
        weights = np.asarray(grpo.token_weights(jnp.asarray(gather("train_mask")), seq_mask, lc.aggregation,
                                                lc.max_len))
        ids, pmask = gather("ids"), gather("pmask")
        skipped = (ds.enabled and sel.kept == 0) or not float(weights.sum()) > 0.0
        lr = schedule_value(gc.optim, total_updates, update_count(opt_state))
        anchor, anchor_s, anchor_screened = None, 0.0, None
        if anchor_batch is not None and not skipped:
            t_anchor = time.perf_counter()
            anchor, anchor_screened = anchor_batch(step, policy)
            anchor_s = time.perf_counter() - t_anchor
        t_upd = t_ref = time.perf_counter()
        inner = []
        if not skipped:
            # no old_logp: the first update is on-policy and its forward gives the later ones theirs
            batch = GRPOBatch(prompt_ids=ids, prompt_mask=pmask, tokens=gather("tokens"), mask=gather("mask"),
                              weights=weights, advantages=np.asarray(adv))
            if mesh is not None:
                batch = shd.shard_batch(batch, mesh)
            else:
                batch = jax.tree_util.tree_map(jnp.asarray, batch)
            if ref_logprob_fn is not None:
                batch = batch.replace(ref_logp=ref_logprob_fn(ref_state, *batch.sequences))
            t_upd = time.perf_counter()
            state, opt_state, inner = iterations(state, opt_state, batch, anchor)
            inner = jax.device_get(inner)
            policy = Policy(policy.graphdef, state, policy.tokenizer)
        t_end = time.perf_counter()

        first = rounds[0]
        out, res = first.out, first.res
        lengths = out.lengths
        completion_tokens = int(sum(int(x.out.lengths.sum()) for x in rounds))
        processed = int(pmask.sum()) + int(np.sum(gather("mask")))
        row: dict[str, Any] = {"phase": "grpo", "step": step + 1}
        row.update(rewards.reward_metrics(res))
        if inner:
            row.update({k: float(v) for k, v in inner[0].items()})  # the first update: ratio == 1
            if gc.mu > 1:
                row.update({f"last/{k}": float(v) for k, v in inner[-1].items()})
        row["update_skipped"] = int(skipped)
        row["zero_adv_share"] = float(np.mean(~first.own_informative))  # the policy's own samples, unguided
        if gc.guidance.enabled:
            row["guided_groups"] = int(np.sum(np.stack([x.guided for x in rounds])[sel.round, sel.group]))
        row["kept_share"] = 0.0 if skipped else float(np.mean(np.asarray(seq_mask)))
        if gc.screen.enabled:
            # the share of the first round's screened lakes the greedy decode failed, and the
            # batch's groups on such a lake
            row["screen_failed_share"] = float(np.mean(first.screened.greedy_failed))
            kept_failed = np.stack([x.screened.kept_greedy_failed for x in rounds])[sel.round, sel.group]
            row["screen_kept_failed"] = int(kept_failed.sum())
            row["time/screen_s"] = float(sum(x.screen_s for x in rounds))
        if ds.enabled:
            row["sampling_rounds"] = len(rounds)
            row["informative_groups"] = sel.found
            row["kept_groups"] = sel.kept
        row["truncated_rate"] = float(np.mean(~out.hit_eos))
        row["completion_len"] = float(lengths.mean())
        row["completion_len_max"] = int(lengths.max())
        if reasoning.enabled:
            row.update(reasoning_mod.thinking_metrics(out.thinking))
        row["reward_std"] = float(np.std(res.reward))
        row["lr"] = lr
        row["time/step_s"] = t_end - t0
        row["time/generate_s"] = float(sum(x.gen_s for x in rounds))
        row["time/ref_logp_s"] = t_upd - t_ref
        if anchor is not None:
            row["time/anchor_s"] = anchor_s
        if anchor_screened is not None:
            row["anchor_screen_failed_share"] = float(np.mean(anchor_screened.greedy_failed))
            row["anchor_screen_kept_failed"] = anchor_screened.kept_failed
        row["time/update_s"] = t_end - t_upd
        row["tokens_per_s"] = completion_tokens / max(t_end - t0, 1e-9)
        row["generate_tokens_per_s"] = completion_tokens / max(row["time/generate_s"], 1e-9)
        row["train_tokens_per_s"] = (gc.mu * processed / max(t_end - t_upd, 1e-9)) if inner else 0.0
        if eval_fn is not None and gc.eval_every and (step + 1) % gc.eval_every == 0 and step + 1 < gc.steps:
            row["eval"] = eval_fn(policy, step + 1)
        metrics.append(row)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.3f}", success=f"{row['success']:.2f}",
                        kl=f"{row.get('kl', float('nan')):.3f}")
        if (step + 1) % gc.checkpoint_every == 0 or step + 1 == gc.steps:
            ckpt.save(policy, opt_state, step + 1, rng, step + 1)
    bar.close()
    return PhaseResult(policy=policy, step=end, resumed_from=resumed)


def _anchor_batches(policy: Policy, config: TrainConfig, env: Mixture, prompter: Prompter, key: jax.Array,
                    mesh) -> Callable[[int, Policy], tuple[TokenBatch, Optional[Screened]]]:
    """``(step, policy) -> (TokenBatch, Screened | None)``: the supervised anchor of GRPO step
    ``step`` (``grpo.anchor``): ``anchor.lakes`` fresh lakes of ``env`` (deterministic in the
    step, the same on every process) drawn and written as the warm start draws and writes
    them, weights summing to 1 (the token mean, marks at ``warmstart.mark_weight``). With
    ``anchor.screen_lakes`` the warm start draws that many and ``policy``'s greedy decode
    screens them (:func:`llm.training.screen.screen_lakes`; the ``Screened`` is returned, else
    ``None``). Its prompts have a width of their own
    (fitted on 1024 lakes of ``env``; a longer prompt grows it, one recompilation), so the
    GRPO batch's shapes do not depend on the anchor's environment."""
    gc, wc = config.grpo, config.warmstart
    reasoning = prompter.config.reasoning
    thinking = reasoning.thinking_tokens if reasoning.enabled and reasoning.warmstart else None
    length = gc.max_new_tokens + (thinking or 0)
    probe_key, data_key = jax.random.split(key)
    probe = sample_lakes(probe_key, env, 1024, split="random")
    anchor_prompter = Prompter.fit(policy.tokenizer, prompter.config, probe, None, prompter.bucket)

    horizon = env_horizon(env)

    def batch(step: int, policy: Policy) -> tuple[TokenBatch, Optional[Screened]]:
        key = jax.random.fold_in(data_key, step)
        screened = None
        if gc.anchor.screen_lakes:
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


@dataclasses.dataclass
class _Round:
    """One sampling round of a step, on the host: ``N * G`` rows (group ``n``'s contiguous)."""

    ids: np.ndarray  # [N * G, P] prompt ids (left-padded)
    pmask: np.ndarray  # [N * G, P]
    out: Any  # the Completions
    res: Any  # the RewardResult
    grouped: np.ndarray  # [N, G] rewards
    truncated: np.ndarray  # [N * G] bool: cut by a token budget
    tokens: np.ndarray  # [N * G, T]
    mask: np.ndarray  # [N * G, T] completion tokens
    train_mask: np.ndarray  # [N * G, T] tokens that take the policy-gradient loss
    informative: np.ndarray  # [N] bool: rewards not all equal (after guidance)
    own_informative: np.ndarray  # [N] bool: the policy's own rewards not all equal
    guided: np.ndarray  # [N] bool: the group holds the planner's completion (grpo.guidance)
    gen_s: float
    screened: Optional[Screened] = None  # grpo.screen: the round's screening (else None)
    screen_s: float = 0.0  # its greedy decode and scoring


def gather_groups(rounds: list[_Round], sel) -> np.ndarray:
    """``[N, G]`` rewards of the selected groups (:class:`llm.rl.dynamic.GroupSelection`)."""
    return np.stack([x.grouped for x in rounds])[sel.round, sel.group]
