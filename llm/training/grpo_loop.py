"""The GRPO phase of a stage: sample, score, update, log and checkpoint, step after step.

One GRPO step is four phases, each a function of this module:

1. :func:`collect` -- sampling rounds (:func:`sample_round`): ``N`` lakes (deterministic in the
   step: ``fold_in(data_key, step)``; a lake picker hook may choose them instead), their prompts
   left-padded to a fixed length ``P`` (:class:`llm.game.prompter.Prompter`), ``G`` completions
   per lake from the KV-cache generator (:func:`llm.training.completions.sample_completions`) at
   ``grpo.temperature`` (no top-k / top-p), scored in the simulator (:mod:`llm.game.rewards`),
   then handed to the round transforms (hooks). With ``grpo.dynamic_sampling`` (DAPO,
   :mod:`llm.rl.dynamic`) rounds repeat on fresh lakes (round ``r`` folds ``r`` into the step's
   keys) until ``N`` groups whose rewards differ are in hand or ``max_rounds`` rounds are spent;
2. :func:`advantages` -- the batch takes ``N`` groups, informative ones first, tied fillers
   masked out; group advantages, sequence masks and global token weights (:mod:`llm.rl.grpo`).
   A batch with no informative group (or no token left in the loss) takes no update at all
   (``update_skipped``);
3. :func:`update` -- the reference's log-probs when ``beta > 0``
   (:func:`llm.rl.updates.make_logprob_fn`, in the update's micro-batches; skipped entirely when
   ``beta == 0``), the auxiliary loss hook's batch (e.g. the supervised anchor,
   :mod:`llm.training.anchor`), then ``mu`` updates (:class:`llm.rl.updates.GRPOIterations`):
   parameters and optimizer state in, new ones out; inside, a ``lax.scan`` over micro-batches
   accumulates the gradient, then optax (warmup + cosine, global-norm clipping, decay by role)
   applies it. No forward pass computes the old log-probs: the first update is on-policy (the
   stop-gradient of its own log-probs, ratio 1) and hands its log-probs to updates 2 .. ``mu``
   as ``old_logp``. Ratio, KL and entropy all refer to the distribution at the sampling
   temperature. Shapes are fixed for the whole stage, so nothing recompiles across steps;
4. :func:`log_row` -- the step's metrics row.

Hooks (:mod:`llm.training.hooks`): a lake picker, round transforms and an auxiliary loss, each
of which may add metrics to the row. ``run_grpo(hooks=None)`` takes the ones the configuration
asks for (:func:`llm.training.experiments.registry.grpo_hooks`: ``grpo.anchor``, and the
experiments ``grpo.screen`` and ``grpo.guidance``).

Data parallelism: a 1-D mesh over every device (:mod:`llm.model.sharding`); batch arrays are
sharded on their leading axis, parameters and optimizer state replicated; XLA inserts the
gradient all-reduce. The same code runs on one CPU and on many accelerators.

Metrics of a step: the reward terms, lengths, ``zero_adv_share`` and thinking statistics of
the step's *first* sampling round (a plain sample of the policy, as without dynamic
sampling, and the policy's own samples whatever a transform wrote); ``kept_share`` and the
loss metrics of the batch trained on; with dynamic sampling ``sampling_rounds``,
``informative_groups`` (found in all rounds) and ``kept_groups`` (in the batch);
``update_skipped`` (1: no optimizer update, and no loss metrics in the row); ``lr`` of the
step's first update, read from the optimizer's own count (a skipped step does not advance the
schedule); then the hooks' keys.

Checkpoints (:class:`llm.training.phase.Checkpoints`) every ``checkpoint_every`` steps and at the end;
restarting resumes from the latest one and truncates the metrics to it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlake.metrics import MetricsWriter
from jaxlake.mixture import Mixture
from llm.game import rewards
from llm.game.lakes import env_horizon
from llm.game.prompter import Prompter
from llm.generation import reasoning as reasoning_mod
from llm.generation.decode import GenerationConfig
from llm.model import sharding as shd
from llm.model.sharding import to_host
from llm.rl import grpo
from llm.rl.batches import GRPOBatch
from llm.rl.dynamic import all_groups, enough, select_groups
from llm.rl.optim import make_optimizer, schedule_value, update_count
from llm.rl.updates import GRPOIterations, make_logprob_fn
from llm.training.completions import sample_completions
from llm.training.config import TrainConfig
from llm.training.hooks import Hook, Hooks, Round, RoundKeys, default_lakes, selected
from llm.training.phase import Checkpoints, PhaseResult, progress_bar
from llm.training.policy import Policy, copy_state, shares_buffers


@dataclasses.dataclass(frozen=True)
class Loop:
    """What every step of a phase shares: settings, the environment, the jitted update, hooks."""

    config: TrainConfig
    env: Mixture
    prompter: Prompter
    mesh: Any
    gen: GenerationConfig
    horizon: int
    keys: tuple  # the phase's data, sample and reward keys (RoundKeys.of)
    hooks: Hooks
    iterations: GRPOIterations
    ref_logprob_fn: Optional[Callable]
    draw: Callable  # (RoundKeys, n) -> lakes when no picker hook chooses them

    @property
    def gc(self):
        return self.config.grpo

    @property
    def reasoning(self):
        return self.prompter.config.reasoning


@dataclasses.dataclass
class StepBatch:
    """The batch a step trains on (host arrays) and what the row reads of it."""

    sel: Any  # llm.rl.dynamic.GroupSelection
    batch: GRPOBatch
    seq_mask: np.ndarray
    skipped: bool
    processed: int  # prompt and completion tokens of the batch


@dataclasses.dataclass
class Updated:
    """The outcome of a step's update: new state, the inner updates' metrics, the timings."""

    state: Any
    opt_state: Any
    inner: list
    aux_metrics: dict
    ref_s: float
    update_s: float


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
    hooks: Optional[Sequence[Hook]] = None,
    extra_hooks: Sequence[Hook] = (),
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
      hooks: the loop's hooks (:mod:`llm.training.hooks`); ``None``: those ``config`` asks for
        (:func:`llm.training.experiments.registry.grpo_hooks`).
      extra_hooks: hooks added after those (the pipeline's engineer self-play).
    """
    gc = config.grpo
    optimizer = make_optimizer(gc.optim, gc.steps * gc.mu)
    if mesh is not None:
        shd.check_divisible(gc.rows // gc.micro_batches, mesh, "grpo rows per micro-batch")
    ckpt = Checkpoints(checkpoint_dir, gc.keep_checkpoints, mesh)
    state, opt_state, start, rng, resumed = ckpt.start(policy, optimizer, config.seed)
    if hooks is None:
        hooks = configured_hooks(config, env, anchor_env, prompter, policy, rng, mesh)
    loop = make_loop(config, env, prompter, mesh, optimizer, Hooks.of(list(hooks) + list(extra_hooks)),
                     policy.graphdef, rng)
    state, opt_state, ref_state = _place(loop, state, opt_state, ref_state)
    metrics.truncate("grpo", start, drop_later=start < gc.steps)
    policy = Policy(policy.graphdef, state, policy.tokenizer)
    end = gc.steps if max_steps is None else min(gc.steps, max_steps)
    bar = progress_bar(gc.steps, start, "grpo", config.progress)
    for step in range(start, end):
        t0 = time.perf_counter()
        rounds = collect(loop, policy, step)
        sb = advantages(loop, rounds)
        lr = schedule_value(gc.optim, gc.steps * gc.mu, update_count(opt_state))
        upd = update(loop, policy, opt_state, ref_state, sb, step)
        policy = Policy(policy.graphdef, upd.state, policy.tokenizer)
        opt_state = upd.opt_state
        row = log_row(loop, step, rounds, sb, upd, lr, time.perf_counter() - t0)
        if eval_fn is not None and _every(gc.eval_every, step) and step + 1 < gc.steps:
            row["eval"] = eval_fn(policy, step + 1)
        metrics.append(row)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.3f}", success=f"{row['success']:.2f}",
                        kl=f"{row.get('kl', float('nan')):.3f}")
        if (step + 1) % gc.checkpoint_every == 0 or step + 1 == gc.steps:
            ckpt.save(policy, opt_state, step + 1, rng, step + 1)
    bar.close()
    return PhaseResult(policy=policy, step=end, resumed_from=resumed)


def _every(k: int, step: int) -> bool:
    """Step ``step`` (0-based) ends a period of ``k`` steps (``k == 0``: never)."""
    return bool(k) and (step + 1) % k == 0


def configured_hooks(config: TrainConfig, env: Mixture, anchor_env: Optional[Mixture], prompter: Prompter,
                     policy: Policy, rng: jax.Array, mesh) -> list[Hook]:
    """The hooks ``config`` asks for (:func:`llm.training.experiments.registry.grpo_hooks`; the
    anchor's key is ``fold_in(rng, 14)`` of the phase's ``rng``)."""
    from llm.training.experiments.registry import grpo_hooks

    return grpo_hooks(config, env=env, anchor_env=anchor_env, prompter=prompter, policy=policy,
                      key=jax.random.fold_in(rng, 14), mesh=mesh)


def make_loop(config: TrainConfig, env: Mixture, prompter: Prompter, mesh, optimizer, hooks: Hooks, graphdef,
              rng: jax.Array) -> Loop:
    """The phase's fixed parts: mesh checks, the jitted updates, generation settings, keys."""
    gc, lc = config.grpo, config.grpo.loss
    if mesh is not None:
        hooks.check_mesh(mesh)
    iterations = GRPOIterations(graphdef, optimizer, lc, mu=gc.mu, micro_batches=gc.micro_batches,
                                compute_entropy=gc.compute_entropy, mesh=mesh, temperature=gc.temperature,
                                logprob_chunk=gc.logprob_chunk, remat=gc.remat,
                                anchor_weight=hooks.aux.weight if hooks.aux is not None else 0.0)
    # the reference's log-probs: the training forward at the sampling temperature, in the update's micro-batches
    ref_logprob_fn = make_logprob_fn(graphdef, temperature=gc.temperature, logprob_chunk=gc.logprob_chunk,
                                     micro_batches=gc.micro_batches, mesh=mesh) if lc.use_reference else None
    gen = GenerationConfig(max_new_tokens=gc.max_new_tokens, temperature=gc.temperature, top_k=gc.top_k,
                           top_p=gc.top_p)
    return Loop(config=config, env=env, prompter=prompter, mesh=mesh, gen=gen, horizon=env_horizon(env),
                keys=tuple(jax.random.fold_in(rng, i) for i in (11, 12, 13)), hooks=hooks, iterations=iterations,
                ref_logprob_fn=ref_logprob_fn, draw=default_lakes(env))


def _place(loop: Loop, state, opt_state, ref_state):
    """The state, optimizer state and reference laid out on the mesh; a reference on the
    state's own buffers gets its own copy."""
    use_reference = loop.gc.loss.use_reference
    if use_reference and shares_buffers(ref_state, state):
        # the update donates the state: a reference on the same buffers (the starting weights,
        # which a fresh phase trains from) gets its own. A resumed phase's state comes from the
        # checkpoint: the reference is used as given, no second copy.
        ref_state = copy_state(ref_state)
    if loop.mesh is not None:
        state, opt_state = shd.place_state(state, loop.mesh), shd.place_opt_state(opt_state, state, loop.mesh)
        if use_reference:
            ref_state = shd.place_state(ref_state, loop.mesh)
    return state, opt_state, ref_state


# ------------------------------------------------------------------------------------ 1. collect
def collect(loop: Loop, policy: Policy, step: int) -> list[Round]:
    """The step's sampling rounds: one, or with dynamic sampling more until ``N`` groups are
    informative or ``max_rounds`` are spent."""
    ds, n = loop.gc.dynamic_sampling, loop.gc.lakes_per_step
    rounds = [sample_round(loop, policy, step, 0)]
    while ds.enabled and len(rounds) < ds.max_rounds and not enough([x.informative for x in rounds], n):
        rounds.append(sample_round(loop, policy, step, len(rounds)))
    return rounds


def sample_round(loop: Loop, policy: Policy, step: int, r: int) -> Round:
    """Round ``r`` of a step: ``N`` lakes, ``G`` completions each, scored, then transformed."""
    n, g, reasoning = loop.gc.lakes_per_step, loop.gc.group_size, loop.reasoning
    keys = RoundKeys.of(loop.keys, step, r)
    extras: dict = {}
    hooks = loop.hooks
    lakes = hooks.picker.pick(policy, keys, n, extras) if hooks.picker is not None else loop.draw(keys, n)
    ids, pmask = loop.prompter.encode(lakes)
    ids, pmask = np.repeat(ids, g, axis=0), np.repeat(pmask, g, axis=0)
    t = time.perf_counter()
    out = sample_completions(policy, ids, pmask, keys.sample, loop.gen, loop.mesh, reasoning=reasoning)
    gen_s = time.perf_counter() - t
    forced = np.asarray(out.thinking.hit_budget, bool) if reasoning.enabled else np.zeros((n * g,), bool)
    score = functools.partial(_score, loop, rewards.repeat_lakes(lakes, g), keys.reward,
                              np.repeat(rewards.reference_costs(lakes), g))
    own = score(out.texts, forced)
    rnd = Round(step=step, index=r, keys=keys, lakes=lakes, ids=ids, pmask=pmask, out=out, own=own, rewards=own,
                texts=list(out.texts), forced=forced,
                truncated=~np.asarray(out.hit_eos, bool) | forced,  # a forced close is a cut by the thinking budget
                tokens=np.asarray(out.tokens_np), mask=np.asarray(to_host(out.mask)),
                train_mask=np.asarray(to_host(out.train_mask)), gen_s=gen_s, score=score, extras=extras)
    for hook in hooks.transforms:
        rnd = hook.transform(rnd)
    return rnd


def _score(loop: Loop, repeated, key, ref_soc, texts: list, forced: np.ndarray):
    """Rewards of a round's ``N * G`` completion texts on its repeated lakes."""
    reasoning = loop.reasoning.enabled
    return rewards.compute_rewards(repeated, texts, key, loop.config.reward, ref_soc=ref_soc, horizon=loop.horizon,
                                   reasoning=reasoning, forced_close=forced if reasoning else None)


# ---------------------------------------------------------------------------------- 2. advantages
def advantages(loop: Loop, rounds: list[Round]) -> StepBatch:
    """The step's batch: ``N`` groups (informative first with dynamic sampling), their
    advantages, sequence masks and global token weights."""
    gc, lc = loop.gc, loop.gc.loss
    ds = gc.dynamic_sampling
    sel = select_groups([x.informative for x in rounds], gc.lakes_per_step) if ds.enabled \
        else all_groups(rounds[0].informative)
    which, rows = sel.rows(gc.group_size)

    def gather(field: str) -> np.ndarray:
        return np.stack([getattr(x, field) for x in rounds])[which, rows]

    grouped = jnp.asarray(selected(rounds, sel, lambda x: x.grouped))
    adv = grpo.group_advantages(grouped, lc.advantage, lc.std_eps, lc.std, lc.negative_weight).reshape(-1)
    seq_mask = grpo.sequence_mask(grouped, jnp.asarray(gather("truncated")), drop_tied=ds.enabled,
                                  overlong_mask=lc.overlong_mask)
    # forced tokens (reasoning mode) are attended to but take no policy-gradient loss
    weights = np.asarray(grpo.token_weights(jnp.asarray(gather("train_mask")), seq_mask, lc.aggregation, lc.max_len))
    batch = GRPOBatch(prompt_ids=gather("ids"), prompt_mask=gather("pmask"), tokens=gather("tokens"),
                      mask=gather("mask"), weights=weights, advantages=np.asarray(adv))
    skipped = (ds.enabled and sel.kept == 0) or not float(weights.sum()) > 0.0
    return StepBatch(sel=sel, batch=batch, seq_mask=np.asarray(seq_mask), skipped=skipped,
                     processed=int(batch.prompt_mask.sum()) + int(np.sum(batch.mask)))


# -------------------------------------------------------------------------------------- 3. update
def update(loop: Loop, policy: Policy, opt_state, ref_state, sb: StepBatch, step: int) -> Updated:
    """``mu`` updates on the step's batch (none when it is skipped), with the reference's
    log-probs when ``beta > 0`` and the auxiliary loss hook's batch."""
    if sb.skipped:
        return Updated(policy.state, opt_state, [], {}, 0.0, 0.0)
    aux, aux_metrics = None, {}
    if loop.hooks.aux is not None:
        aux, aux_metrics = loop.hooks.aux.batch(step, policy)
    t_ref = time.perf_counter()
    # no old_logp: the first update is on-policy and its forward gives the later ones theirs
    batch = shd.shard_batch(sb.batch, loop.mesh) if loop.mesh is not None \
        else jax.tree_util.tree_map(jnp.asarray, sb.batch)
    if loop.ref_logprob_fn is not None:
        batch = batch.replace(ref_logp=loop.ref_logprob_fn(ref_state, *batch.sequences))
    t_upd = time.perf_counter()
    state, opt_state, inner = loop.iterations(policy.state, opt_state, batch, aux)
    inner = jax.device_get(inner)
    return Updated(state, opt_state, inner, aux_metrics, t_upd - t_ref, time.perf_counter() - t_upd)


# ----------------------------------------------------------------------------------------- 4. log
def log_row(loop: Loop, step: int, rounds: list[Round], sb: StepBatch, upd: Updated, lr: float,
            step_s: float) -> dict:
    """The step's metrics row (module docstring), the hooks' keys last."""
    gc, first = loop.gc, rounds[0]
    out, res = first.out, first.own
    row: dict[str, Any] = {"phase": "grpo", "step": step + 1, **rewards.reward_metrics(res)}
    if upd.inner:
        row.update({k: float(v) for k, v in upd.inner[0].items()})  # the first update: ratio == 1
        if gc.mu > 1:
            row.update({f"last/{k}": float(v) for k, v in upd.inner[-1].items()})
    row["update_skipped"] = int(sb.skipped)
    row["zero_adv_share"] = float(np.mean(~first.own_informative))  # the policy's own samples
    row["kept_share"] = 0.0 if sb.skipped else float(np.mean(sb.seq_mask))
    if gc.dynamic_sampling.enabled:
        row.update(sampling_rounds=len(rounds), informative_groups=sb.sel.found, kept_groups=sb.sel.kept)
    row.update(truncated_rate=float(np.mean(~out.hit_eos)), completion_len=float(out.lengths.mean()),
               completion_len_max=int(out.lengths.max()))
    if loop.reasoning.enabled:
        row.update(reasoning_mod.thinking_metrics(out.thinking))
    row.update(reward_std=float(np.std(res.reward)), lr=lr)
    completion_tokens = int(sum(int(x.out.lengths.sum()) for x in rounds))
    generate_s = float(sum(x.gen_s for x in rounds))
    row.update({"time/step_s": step_s, "time/generate_s": generate_s, "time/ref_logp_s": upd.ref_s,
                "time/update_s": upd.update_s, "tokens_per_s": completion_tokens / max(step_s, 1e-9),
                "generate_tokens_per_s": completion_tokens / max(generate_s, 1e-9),
                "train_tokens_per_s": gc.mu * sb.processed / max(upd.update_s, 1e-9) if upd.inner else 0.0})
    row.update(loop.hooks.metrics(rounds, sb.sel))
    row.update(upd.aux_metrics)
    return row
