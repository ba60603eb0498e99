"""IPPO (independent PPO with parameter sharing) trained in one jit, in PureJaxRL's shape.

``make_train(config, mixture)`` returns one pure ``train(key)``: every actor of every lake acts
with the same :class:`~jaxlake.students.network.ActorCritic` on its own observation and learns
from its own reward. The loop's state (:class:`RunnerState`) is threaded through ``lax.scan``;
an update is four phases, each a function of its own:

1. :func:`collect` -- ``num_steps`` steps of ``num_envs`` auto-resetting lakes, one
   :class:`Transition` per step;
2. :func:`advantages` -- GAE (:func:`jaxlake.students.gae.gae`) and flat samples;
3. the PPO epochs (:func:`jaxlake.students.update.update_epochs`);
4. :func:`log` -- the update's :class:`UpdateMetrics` (and, with ``log_every``, a progress line
   through ``jax.debug.callback``; off by default).

Updates run in *chunks* of ``eval_every``; each chunk ends with a greedy evaluation on the
held-out lakes (:mod:`jaxlake.students.evaluate`, :mod:`jaxlake.students.lakes`), so
``train(key)`` returns the whole learning curve, ``[num_chunks]`` :class:`ChunkMetrics`.
:func:`build` exposes the pieces (``init``, one jitted ``chunk``) for the entry point, which
checkpoints between chunks; chaining ``init`` and ``chunk`` gives exactly ``train``.

Which levels an update plays is the ``levels`` hook's (:mod:`jaxlake.students.ued`,
``ippo.ued``): none (domain randomisation, ``dr``: a fresh pool every update, the loop above)
or a PLR / ACCEL level buffer, which picks each update's pool, may skip its policy update
(robust PLR) and takes the pool's regret scores after the rollout, or SFL's learnable levels
(scored by the policy's rollouts every ``sfl_every`` updates of a chunk).

**Budgets and the learning rate.** With ``ippo.ued.budget=grad_steps`` (the default) a step of
the loop is one *policy* update: the plays without one (a robust method's new levels, ACCEL's
children) run before it in a ``lax.while_loop``, so every method makes ``num_updates``
gradient updates and Adam's count, which only policy updates advance, runs the learning-rate
schedule (linear to 0 over ``num_updates`` updates) to its end, as ``dr``'s does; the lake
steps played differ (:class:`~jaxlake.students.ued.UEDMetrics` counts them). With
``lake_steps`` a step is one play, trained or not (every method plays the same lake steps),
and a play without a policy update advances the schedule's count (not Adam's moments), so the
learning rate again reaches 0 at the end of the run.

Pure and device-agnostic: no host callback in the hot path (``log_every=0``), so
``jax.vmap(train)(keys)`` trains several seeds at once and it runs on CPU, GPU and TPU alike.
The same code trains on any :class:`~jaxlake.students.envs.StudentEnv` (the benchmark runs it
on a JaxMARL environment, :mod:`jaxlake.students.bench`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from jaxlake.mixture import Mixture
from jaxlake.config import ConfigError
from jaxlake.students.config import IPPOConfig, StudentConfigError
from jaxlake.students.envs import Obs, StudentEnv, lake_env
from jaxlake.students.evaluate import EvalResult, evaluate_greedy
from jaxlake.students.gae import gae
from jaxlake.students.lakes import heldout_lakes
from jaxlake.students.network import ActorCritic, log_prob, sample
from jaxlake.students.ued import Levels, UEDMetrics, make_levels, success_rates
from jaxlake.students.update import Batch, LossInfo, update_epochs

__all__ = ["IPPO", "ChunkMetrics", "RunnerState", "Transition", "UpdateMetrics", "advance_schedule", "advantages",
           "build", "collect", "eval_mixture", "lake_student", "log", "make_train", "progress"]


class RunnerState(NamedTuple):
    """The training loop's state, threaded through every scan."""

    params: Any
    opt_state: Any
    env_state: Any
    obs: Obs
    key: jax.Array
    update: jax.Array
    ued: Any = None


class Transition(NamedTuple):
    """One step of the rollout (``[E, K]`` per actor, ``[E]`` per instance)."""

    obs: Obs
    action: jax.Array
    logp: jax.Array
    value: jax.Array
    reward: jax.Array
    done: jax.Array
    ended: jax.Array
    success: jax.Array
    level: Optional[jax.Array] = None


class UpdateMetrics(NamedTuple):
    """One update: episodes ended in its rollout, their success rate, the mean reward per
    actor step, the loss terms (:class:`~jaxlake.students.update.LossInfo`) and, with a UED
    method, its :class:`~jaxlake.students.ued.UEDMetrics`."""

    episodes: jax.Array
    success: jax.Array
    reward: jax.Array
    loss: LossInfo
    ued: Optional[UEDMetrics] = None


class ChunkMetrics(NamedTuple):
    """One chunk: its updates' metrics ``[eval_every]`` and the greedy held-out result after it."""

    updates: UpdateMetrics
    heldout: EvalResult


class IPPO(NamedTuple):
    """The trainer's pieces (:func:`build`): ``init(key)``, ``chunk(state)`` (``eval_every``
    updates then a held-out evaluation), ``train(key)`` (both, scanned over every chunk),
    ``evaluate(params)`` and the ``network``."""

    config: IPPOConfig
    env: StudentEnv
    network: ActorCritic
    init: Callable[[jax.Array], RunnerState]
    chunk: Callable[[RunnerState], tuple[RunnerState, ChunkMetrics]]
    train: Callable[[jax.Array], tuple[RunnerState, ChunkMetrics]]
    evaluate: Callable[[Any], EvalResult]


# ============================================================================ the phases
def collect(runner: RunnerState, env: StudentEnv, apply: Callable, num_steps: int) -> tuple[RunnerState, Transition]:
    """Phase 1: ``num_steps`` steps of every instance under the current policy."""

    def one(carry: RunnerState, _):
        key, k_act, k_env = jax.random.split(carry.key, 3)
        logits, value = apply(carry.params, carry.obs.grid, carry.obs.scalars, carry.obs.avail)
        action = sample(k_act, logits)
        env_state, obs, out = env.step(k_env, carry.env_state, action)
        tr = Transition(carry.obs, action, log_prob(logits, action), value, out.reward, out.done, out.ended,
                        out.success, out.level)
        return carry._replace(env_state=env_state, obs=obs, key=key), tr

    return jax.lax.scan(one, runner, None, num_steps)


def advantages(traj: Transition, last_value: jax.Array, config: IPPOConfig) -> Batch:
    """Phase 2: GAE over the rollout, then the flat samples ``[T * E * K]`` of the update."""
    adv, target = gae(traj.reward, traj.value, traj.done, last_value, config.gamma, config.gae_lambda)

    n = traj.action.size

    def flat(x: jax.Array) -> jax.Array:
        return x.reshape((n,) + x.shape[3:])

    o = traj.obs
    return Batch(grid=flat(o.grid), scalars=flat(o.scalars), avail=flat(o.avail), valid=flat(o.valid),
                 action=flat(traj.action), logp=flat(traj.logp), value=flat(traj.value), advantage=flat(adv),
                 target=flat(target))


def log(traj: Transition, loss: LossInfo, update: jax.Array, log_every: int) -> UpdateMetrics:
    """Phase 4: the update's metrics; every ``log_every`` updates (0: never) a progress line
    printed through ``jax.debug.callback`` (the only host callback, off by default)."""
    episodes = jnp.sum(traj.ended)
    success = jnp.sum(traj.success) / jnp.maximum(episodes, 1)
    valid = traj.obs.valid.astype(jnp.float32)
    reward = jnp.sum(traj.reward * valid) / jnp.maximum(jnp.sum(valid), 1.0)
    metrics = UpdateMetrics(episodes=episodes.astype(jnp.float32), success=success, reward=reward, loss=loss)
    progress(metrics, update, log_every)
    return metrics


def progress(metrics: UpdateMetrics, update: jax.Array, log_every: int) -> None:
    """Every ``log_every`` updates (0: never) a progress line through ``jax.debug.callback``."""
    if not log_every:
        return

    def show(u, s, n, l):
        print(f"[ippo] update {int(u)}: train success {float(s):.3f} over {int(n)} episodes, loss {float(l):.4f}",
              flush=True)

    jax.lax.cond(update % log_every == 0,
                 lambda: jax.debug.callback(show, update, metrics.success, metrics.episodes, metrics.loss.loss),
                 lambda: None)


def advance_schedule(opt_state: Any, steps: int) -> Any:
    """``opt_state`` with the learning-rate schedule's count advanced by ``steps`` (Adam's own
    count and moments untouched): an update that trains nothing still moves the schedule on."""
    def bump(x):
        if isinstance(x, optax.ScaleByScheduleState):
            return x._replace(count=x.count + jnp.asarray(steps, x.count.dtype))
        return x

    return jax.tree_util.tree_map(bump, opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))


# ============================================================================ the loop
def build(config: IPPOConfig, env: StudentEnv, *, heldout: Optional[Callable[[Any], EvalResult]] = None,
          levels: Optional[Levels] = None) -> IPPO:
    """The trainer of ``config`` on ``env``; ``heldout(params) -> EvalResult`` ends every chunk
    (``None``: NaNs, e.g. for an environment without held-out levels). ``levels``: the UED
    hook (``None``: ``ippo.ued.method=dr``'s, else :func:`~jaxlake.students.ued.make_levels`
    of ``config.ued`` with the default distance bounds)."""
    config.check_batch(env.actors)
    if levels is None and config.ued.method != "dr":
        levels = make_levels(config.ued, env, config.pool_lakes)
    network = ActorCritic(num_actions=env.num_actions, hidden=config.hidden, conv=config.conv, crop=env.crop)
    apply = network.apply
    steps_per_update = config.update_epochs * config.num_minibatches
    lr = (optax.linear_schedule(config.lr, 0.0, config.num_updates * steps_per_update) if config.anneal_lr
          else config.lr)
    tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(lr, eps=1e-5))
    by_grad_steps = config.ued.budget == "grad_steps"

    def init(key: jax.Array) -> RunnerState:
        k_env, k_net, key = jax.random.split(key, 3)
        env_state, obs = env.init(k_env, config.num_envs)
        params = network.init(k_net, obs.grid[0], obs.scalars[0], obs.avail[0])
        ued = None if levels is None else levels.init(jax.random.fold_in(key, 0x0ED))
        return RunnerState(params, tx.init(params), env_state, obs, key, jnp.zeros((), jnp.int32), ued)

    def learn(k_update: jax.Array, runner: RunnerState, batch: Batch):
        return update_epochs(
            k_update, runner.params, runner.opt_state, batch, apply=apply, tx=tx, epochs=config.update_epochs,
            minibatches=config.num_minibatches, clip_eps=config.clip_eps, vf_coef=config.vf_coef,
            ent_coef=config.ent_coef)

    def skip(k, r, b):
        shapes = jax.eval_shape(learn, k, r, b)[2]
        opt_state = r.opt_state if by_grad_steps else advance_schedule(r.opt_state, steps_per_update)
        return r.params, opt_state, jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def play(runner: RunnerState) -> tuple[RunnerState, UpdateMetrics, jax.Array]:
        """One play of the hook's levels: its pool, the rollout, the policy update if the plan
        learns, the scores to the buffer (the update counter is not advanced)."""
        key, k_refresh, k_update = jax.random.split(runner.key, 3)
        ued, plan = levels.start(k_refresh, runner.ued)
        env_state, obs = env.load(runner.env_state, plan.pool)  # every instance restarts on the pool
        runner = runner._replace(env_state=env_state, obs=obs, key=key, ued=ued)
        runner, traj = collect(runner, env, apply, config.num_steps)
        _, last_value = apply(runner.params, runner.obs.grid, runner.obs.scalars, runner.obs.avail)
        batch = advantages(traj, last_value, config)
        learns = levels.learns(plan)
        params, opt_state, loss = jax.lax.cond(learns, learn, skip, k_update, runner, batch)
        ued, ued_metrics = levels.finish(runner.ued, plan, traj, batch.advantage.reshape(traj.reward.shape))
        metrics = log(traj, loss, runner.update + 1, 0)._replace(ued=ued_metrics)
        return runner._replace(params=params, opt_state=opt_state, ued=ued), metrics, learns

    def update_step(runner: RunnerState, i: jax.Array) -> tuple[RunnerState, UpdateMetrics]:
        if levels is None:
            key, k_refresh, k_update = jax.random.split(runner.key, 3)
            runner = runner._replace(env_state=env.refresh(k_refresh, runner.env_state), key=key)
            runner, traj = collect(runner, env, apply, config.num_steps)
            _, last_value = apply(runner.params, runner.obs.grid, runner.obs.scalars, runner.obs.avail)
            batch = advantages(traj, last_value, config)
            params, opt_state, loss = learn(k_update, runner, batch)
            metrics = log(traj, loss, runner.update + 1, config.log_every)
            return runner._replace(params=params, opt_state=opt_state, update=runner.update + 1), metrics

        scored = jnp.zeros((), jnp.float32)
        if levels.refresh is not None:  # i is the update's index in its chunk: a real cond, even under vmap
            due = i % levels.period == 0
            key, k_score = jax.random.split(runner.key)
            ued = jax.lax.cond(due, lambda u: levels.refresh(k_score, u, runner.params), lambda u: u, runner.ued)
            runner = runner._replace(key=key, ued=ued)
            scored = jnp.where(due, jnp.float32(levels.refresh_steps), scored)
        if by_grad_steps:  # plays without a policy update first, then the one with it
            def body(carry):
                r, _, plays, _ = carry
                r, m, learned = play(r)
                return r, m, plays + 1.0, learned

            shapes = jax.eval_shape(play, runner)[1]
            zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
            runner, metrics, plays, _ = jax.lax.while_loop(
                lambda c: ~c[3], body, (runner, zeros, jnp.zeros((), jnp.float32), jnp.zeros((), bool)))
        else:
            runner, metrics, _ = play(runner)
            plays = jnp.ones((), jnp.float32)
        metrics = metrics._replace(ued=metrics.ued._replace(plays=plays, scored_steps=scored))
        progress(metrics, runner.update + 1, config.log_every)
        return runner._replace(update=runner.update + 1), metrics

    def evaluate(params: Any) -> EvalResult:
        if heldout is None:
            nan = jnp.full((), jnp.nan, jnp.float32)
            return EvalResult(nan, nan, nan, nan, jnp.zeros((0,), jnp.float32))
        return heldout(params)

    def chunk(runner: RunnerState) -> tuple[RunnerState, ChunkMetrics]:
        runner, updates = jax.lax.scan(update_step, runner, jnp.arange(config.eval_every, dtype=jnp.int32))
        return runner, ChunkMetrics(updates, evaluate(runner.params))

    def train(key: jax.Array) -> tuple[RunnerState, ChunkMetrics]:
        return jax.lax.scan(lambda r, _: chunk(r), init(key), None, config.num_chunks)

    return IPPO(config, env, network, init, chunk, train, evaluate)


def eval_mixture(config: IPPOConfig, mixture: Mixture, actors: int) -> Mixture:
    """The mixture of the held-out lakes: ``mixture``, with ``config.eval_env``'s fields set on
    every component (at most ``actors`` agents a lake)."""
    if config.eval_env is None:
        return mixture
    try:
        suite = Mixture([(w, c.replace(**config.eval_env)) for w, c in mixture])
    except ConfigError as err:
        raise StudentConfigError(f"ippo.eval_env: {err}") from None
    most = max(int(c.num_agents) for c in suite.configs)
    if most > actors:
        raise StudentConfigError(f"ippo.eval_env: num_agents={most} must be at most the training lakes' {actors}")
    return suite


def lake_student(config: IPPOConfig, mixture: Any) -> IPPO:
    """The trainer on the lakes of ``mixture``, scored on its held-out lakes
    (``config.eval_lakes`` of them, seed ``config.eval_seed``)."""
    mixture = Mixture.of(mixture)
    env = lake_env(mixture, radius=config.radius, pool_lakes=config.pool_lakes,
                   arrive_reward=config.arrive_reward, fall_reward=config.fall_reward)
    network = ActorCritic(num_actions=env.num_actions, hidden=config.hidden, conv=config.conv, crop=env.crop)
    levels = None
    if config.ued.method != "dr":  # mutations keep the loosest distance bounds of the mixture
        uncapped = any(c.max_dist is None for c in mixture.configs)
        ued = config.ued

        def success(params: Any, lakes: Any, key: jax.Array) -> jax.Array:
            return success_rates(params, network.apply, lakes, actors=env.actors, radius=config.radius,
                                 horizon=mixture.horizon, key=key, repeats=ued.sfl_repeats)

        levels = make_levels(ued, env, config.pool_lakes, min_dist=min(int(c.min_dist) for c in mixture.configs),
                             max_dist=None if uncapped else max(int(c.max_dist) for c in mixture.configs),
                             success=success, scored_steps=ued.sfl_levels * ued.sfl_repeats * mixture.horizon)
    suite = eval_mixture(config, mixture, env.actors)
    lakes, _ = heldout_lakes(suite, config.eval_lakes, config.eval_seed)
    eval_key = jax.random.fold_in(jax.random.PRNGKey(config.eval_seed), 1)

    def heldout(params: Any) -> EvalResult:
        return evaluate_greedy(params, network.apply, lakes, actors=env.actors, radius=config.radius,
                               horizon=suite.horizon, key=eval_key)

    return build(config, env, heldout=heldout, levels=levels)


def make_train(config: IPPOConfig, mixture: Any) -> Callable[[jax.Array], tuple[RunnerState, ChunkMetrics]]:
    """PureJaxRL's entry: one pure ``train(key) -> (final RunnerState, ChunkMetrics [num_chunks])``
    on the lakes of ``mixture`` (jit it; vmap it over keys for several seeds)."""
    return lake_student(config, mixture).train
