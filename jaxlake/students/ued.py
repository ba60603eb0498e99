"""Unsupervised environment design inside IPPO's one jit: domain randomisation, robust PLR and
ACCEL over lakes, scored by regret (``ippo.ued``, :class:`~jaxlake.students.config.UEDConfig`).

Every update of :func:`jaxlake.students.ippo.build` plays a pool of ``ippo.pool_lakes`` levels
(instance ``e`` plays pool level ``e``, then ``e + E``, ...). This module decides which, and
what the update does with their scores (:class:`Levels`, the trainer's hook):

* ``dr``: a fresh pool from the mixture every update, the plain trainer (no hook at all);
* ``plr`` (robust prioritised level replay, Jiang et al. 2021): each update is a *replay* with
  probability ``replay_prob`` once ``min_fill`` of the buffer is filled, else a *new* update on
  a fresh pool. A replay samples the pool from the buffer's replay distribution and updates
  the played levels' scores; a new update scores the fresh levels and inserts them. With
  ``robust`` (the default) only replays update the policy;
* ``accel`` (Parker-Holder et al. 2022): PLR, and every replay is followed by an update on
  mutations of the levels it replayed (:func:`jaxlake.levels.mutate`, ``num_edits`` edits,
  a mutation that lands on a held-out lake is redrawn); the children are scored and inserted.
  With ``robust`` it does not update the policy either.

All of it is pure JAX (no host loop), in the trainer's ``lax.scan``, and ``vmap``-s over seeds.

**Scores** (regret estimates, as JaxUED computes them; :func:`level_scores`), per level of the
pool over the update's valid actor steps on it (every actor, every episode on it, a time
average):

* ``pvl``, positive value loss: the mean of ``max(A_t, 0)`` (the GAE advantages of the update);
* ``maxmc``: the mean of ``R_max - V_t``, ``R_max`` the largest return any actor reached in a
  completed episode on the level, in this update or any earlier one (kept in the buffer).

A level with no valid step in the update (the rollout never reached it) gets no score; with
``maxmc``, neither does a level on which no episode ever ended. JaxUED averages per-episode
means; here each level's steps are pooled (an actor's steps weigh the same in any episode).

**The level buffer** (:class:`LevelBuffer`): ``buffer_size`` lakes with their score, largest
return, the update they were last played at, a hash (:func:`jaxlake.students.lakes.lake_hash`)
and a filled mask. :func:`insert` adds scored levels one at a time: a level already in the
buffer (same hash) gets its new score; otherwise it takes an empty slot, or replaces the
lowest-scored level if it scores higher. :func:`replay_weights` is PLR's distribution:
``(1 - staleness_coef) * P_rank + staleness_coef * P_stale`` over the filled slots, with
``P_rank ~ rank ** (-1 / temperature)`` (rank 1: the highest score) and
``P_stale ~ updates since last played``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import struct

from jaxlake.levels import mutate
from jaxlake.students.config import UEDConfig
from jaxlake.students.lakes import is_held_out, lake_hash
from jaxlake.types import Lake

__all__ = ["MODES", "MUTATE", "NEW", "REPLAY", "LevelBuffer", "Levels", "Plan", "UEDMetrics", "UEDState",
           "empty_buffer", "episode_max_returns", "insert", "level_scores", "make_levels", "max_mc",
           "positive_value_loss", "replay_weights", "sample_replay", "update_played"]

#: An update's kind: a fresh pool (domain randomisation), a replay from the buffer, mutations.
NEW, REPLAY, MUTATE = 0, 1, 2
MODES = ("new", "replay", "mutate")
#: Tries of a mutation before a child that is a held-out lake gives way to its parent.
MUTATION_TRIES = 8


# ============================================================================ scores
def _per_level(x: jax.Array, mask: jax.Array, level: jax.Array, num_levels: int) -> tuple[jax.Array, jax.Array]:
    """``(sum, count)`` of ``x [T, E, K]`` over the masked steps of each level (``level [T, E]``,
    -1: none), each ``[num_levels]``."""
    seg = jnp.where(level >= 0, level, num_levels)
    seg = jnp.broadcast_to(seg[..., None], x.shape).reshape(-1)
    m = mask.astype(jnp.float32).reshape(-1)
    total = jax.ops.segment_sum(x.reshape(-1) * m, seg, num_levels + 1)[:num_levels]
    count = jax.ops.segment_sum(m, seg, num_levels + 1)[:num_levels]
    return total, count


def positive_value_loss(advantages: jax.Array, valid: jax.Array, level: jax.Array,
                        num_levels: int) -> tuple[jax.Array, jax.Array]:
    """``(score [P], played [P])``: the mean of ``max(A, 0)`` over each level's valid actor steps."""
    total, count = _per_level(jnp.maximum(advantages, 0.0), valid, level, num_levels)
    return total / jnp.maximum(count, 1.0), count > 0


def episode_max_returns(rewards: jax.Array, dones: jax.Array, valid: jax.Array, level: jax.Array,
                        num_levels: int) -> jax.Array:
    """``[P]`` the largest undiscounted return an actor reached in an episode that ended in the
    rollout on each level (``-inf``: none ended). ``rewards``, ``dones``, ``valid`` ``[T, E, K]``."""

    def run(g, x):
        r, d, v = x
        g = g + r * v
        return jnp.where(d, 0.0, g), jnp.where(d & v, g, -jnp.inf)

    g0 = jnp.zeros(rewards.shape[1:], jnp.float32)
    _, ends = jax.lax.scan(run, g0, (rewards.astype(jnp.float32), dones.astype(bool), valid.astype(bool)))
    seg = jnp.where(level >= 0, level, num_levels)
    seg = jnp.broadcast_to(seg[..., None], ends.shape).reshape(-1)
    return jax.ops.segment_max(ends.reshape(-1), seg, num_levels + 1)[:num_levels]


def max_mc(values: jax.Array, valid: jax.Array, level: jax.Array, max_returns: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(score [P], played [P])``: the mean of ``R_max[level] - V`` over each level's valid
    actor steps; a level without a finite ``R_max`` is not played (scored)."""
    num_levels = max_returns.shape[0]
    r = jnp.where(jnp.isfinite(max_returns), max_returns, 0.0)
    gap = jnp.take(r, jnp.clip(level, 0, num_levels - 1))[..., None] - values
    total, count = _per_level(gap, valid, level, num_levels)
    return total / jnp.maximum(count, 1.0), (count > 0) & jnp.isfinite(max_returns)


def level_scores(score: str, traj: Any, advantages: jax.Array, prior_max: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(scores, max_returns, played)``, each ``[P]``, of the update's levels from its
    trajectory (``traj.level [T, E]``, ``traj.obs.valid``, ``traj.reward``, ``traj.done``,
    ``traj.value`` ``[T, E, K]``) and GAE ``advantages`` ``[T, E, K]``; ``prior_max [P]`` are
    the largest returns known before (``-inf``: a new level)."""
    num_levels = prior_max.shape[0]
    valid = traj.obs.valid
    seen = episode_max_returns(traj.reward, traj.done, valid, traj.level, num_levels)
    best = jnp.maximum(prior_max, seen)
    if score == "pvl":
        scores, played = positive_value_loss(advantages, valid, traj.level, num_levels)
    else:
        scores, played = max_mc(traj.value, valid, traj.level, best)
    return scores, best, played


# ============================================================================ the buffer
@struct.dataclass
class LevelBuffer:
    """A fixed-capacity level buffer (leaves ``[N, ...]``; ``clock`` counts the updates)."""

    lakes: Lake
    scores: jax.Array
    max_returns: jax.Array
    last_seen: jax.Array
    hashes: jax.Array
    filled: jax.Array
    clock: jax.Array

    @property
    def capacity(self) -> int:
        return self.scores.shape[-1]


def empty_buffer(template: Lake, capacity: int) -> LevelBuffer:
    """An empty buffer of ``capacity`` slots shaped like the unbatched lake ``template``."""
    n = int(capacity)
    lakes = jax.tree_util.tree_map(lambda x: jnp.zeros((n,) + jnp.shape(x), jnp.asarray(x).dtype), template)
    return LevelBuffer(lakes=lakes, scores=jnp.zeros((n,), jnp.float32),
                       max_returns=jnp.full((n,), -jnp.inf, jnp.float32), last_seen=jnp.zeros((n,), jnp.int32),
                       hashes=jnp.zeros((n,), jnp.uint32), filled=jnp.zeros((n,), bool),
                       clock=jnp.zeros((), jnp.int32))


def insert(buf: LevelBuffer, lakes: Lake, scores: jax.Array, max_returns: jax.Array, ok: jax.Array) -> LevelBuffer:
    """Insert the levels ``lakes [P]`` with ``ok`` (scored), one after the other: a level already
    in the buffer (same hash) takes its new score and largest return; a new one fills an empty
    slot, or replaces the lowest score when it scores higher (else it is dropped)."""
    hashes = jax.vmap(lake_hash)(lakes)

    def one(b: LevelBuffer, x):
        lake, score, best, h, good = x
        same = b.filled & (b.hashes == h)
        dup = jnp.any(same)
        ranked = jnp.where(b.filled, b.scores, -jnp.inf)
        low = jnp.argmin(ranked)
        slot = jnp.where(dup, jnp.argmax(same), low)
        write = good & (dup | ~b.filled[low] | (score > ranked[low]))
        best = jnp.where(dup, jnp.maximum(best, b.max_returns[slot]), best)

        def put(arr, v):
            return arr.at[slot].set(jnp.where(write, v, arr[slot]))

        new = b.replace(lakes=jax.tree_util.tree_map(put, b.lakes, lake), scores=put(b.scores, score),
                        max_returns=put(b.max_returns, best), last_seen=put(b.last_seen, b.clock),
                        hashes=put(b.hashes, h), filled=put(b.filled, True))
        return new, None

    buf, _ = jax.lax.scan(one, buf, (lakes, scores.astype(jnp.float32), max_returns.astype(jnp.float32), hashes, ok))
    return buf


def update_played(buf: LevelBuffer, idx: jax.Array, scores: jax.Array, max_returns: jax.Array,
                  ok: jax.Array) -> LevelBuffer:
    """Replayed slots ``idx [P]`` with ``ok`` take their new score and largest return."""
    n = buf.capacity
    where = jnp.where(ok, idx, n)  # out of range: dropped
    return buf.replace(scores=buf.scores.at[where].set(scores, mode="drop"),
                       max_returns=buf.max_returns.at[where].set(max_returns, mode="drop"))


def replay_weights(buf: LevelBuffer, temperature: float, staleness_coef: float) -> jax.Array:
    """``[N]`` PLR's replay distribution (rank prioritisation mixed with staleness); 0 on empty slots."""
    filled = buf.filled
    f = filled.astype(jnp.float32)
    ranked = jnp.where(filled, buf.scores, -jnp.inf)
    rank = jnp.argsort(jnp.argsort(-ranked, stable=True), stable=True) + 1
    h = f * (1.0 / rank.astype(jnp.float32)) ** (1.0 / temperature)
    p_rank = h / jnp.maximum(jnp.sum(h), 1e-30)
    stale = f * (buf.clock - buf.last_seen).astype(jnp.float32)
    total = jnp.sum(stale)
    p_stale = jnp.where(total > 0, stale / jnp.maximum(total, 1e-30), p_rank)
    return (1.0 - staleness_coef) * p_rank + staleness_coef * p_stale


def sample_replay(key: jax.Array, buf: LevelBuffer, n: int, temperature: float,
                  staleness_coef: float) -> tuple[LevelBuffer, jax.Array]:
    """``(buffer, idx [n])``: ``n`` slots drawn with replacement from :func:`replay_weights`
    (only filled slots have weight); the drawn slots are marked as played now."""
    w = replay_weights(buf, temperature, staleness_coef)
    logits = jnp.where(w > 0, jnp.log(jnp.maximum(w, 1e-30)), -jnp.inf)
    idx = jax.random.categorical(key, logits, shape=(int(n),)).astype(jnp.int32)
    return buf.replace(last_seen=buf.last_seen.at[idx].set(buf.clock)), idx


# ============================================================================ the trainer's hook
class UEDState(NamedTuple):
    """The loop state of a UED method: the buffer, the levels of the last replay (ACCEL's
    parents) and the last update's kind."""

    buffer: LevelBuffer
    parents: Lake
    mode: jax.Array


class Plan(NamedTuple):
    """One update's levels: its kind, the pool ``[P]`` and their buffer slots (replay; else -1)."""

    mode: jax.Array
    pool: Lake
    idx: jax.Array


class UEDMetrics(NamedTuple):
    """Per update: its kind (:data:`MODES` index), the mean score of its scored levels, the
    buffer's filled share and mean score."""

    mode: jax.Array
    score: jax.Array
    fill: jax.Array
    buffer_score: jax.Array


class Levels(NamedTuple):
    """The trainer's hook (:func:`jaxlake.students.ippo.build`): ``init(key) -> UEDState``,
    ``start(key, UEDState) -> (UEDState, Plan)`` (the update's levels), ``learns(plan) -> []
    bool`` (the policy is updated) and ``finish(UEDState, plan, traj, advantages) ->
    (UEDState, UEDMetrics)`` (the scores go to the buffer)."""

    config: UEDConfig
    init: Any
    start: Any
    learns: Any
    finish: Any


def _mutant(config: UEDConfig, min_dist: Any, max_dist: Any):
    def child(key: jax.Array, lake: Lake) -> Lake:
        def again(c):
            i, _ = c
            return i + 1, mutate(jax.random.fold_in(key, i), lake, config.num_edits, min_dist=min_dist,
                                 max_dist=max_dist)

        first = again((jnp.int32(0), lake))
        _, out = jax.lax.while_loop(lambda c: is_held_out(c[1]) & (c[0] < MUTATION_TRIES), again, first)
        bad = is_held_out(out)
        return jax.tree_util.tree_map(lambda a, b: jnp.where(bad, b, a), out, lake)

    return child


def make_levels(config: UEDConfig, env: Any, pool_size: int, *, min_dist: Any = 1,
                max_dist: Optional[Any] = None) -> Levels:
    """The hook of ``config`` (``plr`` or ``accel``) for ``env`` (a
    :class:`~jaxlake.students.envs.StudentEnv` with ``draw`` and ``load``): pools of
    ``pool_size`` levels; ``min_dist`` / ``max_dist`` are the bounds mutations keep
    (:func:`jaxlake.levels.mutate`)."""
    if config.method not in ("plr", "accel"):
        raise ValueError(f"make_levels is for plr and accel, not ippo.ued.method={config.method}")
    if env.draw is None or env.load is None:
        raise ValueError("ippo.ued.method needs an environment of levels (StudentEnv.draw and .load)")
    P = int(pool_size)
    need = max(1, math.ceil(config.min_fill * config.buffer_size))
    child = _mutant(config, min_dist, max_dist)

    def init(key: jax.Array) -> UEDState:
        shapes = jax.eval_shape(lambda k: env.draw(k, P), key)
        parents = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        template = jax.tree_util.tree_map(lambda x: x[0], parents)
        return UEDState(empty_buffer(template, config.buffer_size), parents, jnp.int32(NEW))

    def start(key: jax.Array, state: UEDState) -> tuple[UEDState, Plan]:
        k_mode, k_new, k_replay, k_mutate = jax.random.split(key, 4)
        buf = state.buffer.replace(clock=state.buffer.clock + 1)
        can_replay = jnp.sum(buf.filled) >= need
        mode = jnp.where(jax.random.bernoulli(k_mode, config.replay_prob) & can_replay, REPLAY, NEW)
        if config.method == "accel":
            mode = jnp.where(state.mode == REPLAY, MUTATE, mode)
        mode = mode.astype(jnp.int32)
        none = jnp.full((P,), -1, jnp.int32)

        def new(_):
            return buf, env.draw(k_new, P), none

        def replay(_):
            b, idx = sample_replay(k_replay, buf, P, config.temperature, config.staleness_coef)
            return b, jax.tree_util.tree_map(lambda x: x[idx], b.lakes), idx

        def mutated(_):
            return buf, jax.vmap(child)(jax.random.split(k_mutate, P), state.parents), none

        branches = [new, replay] + ([mutated] if config.method == "accel" else [])
        buf, pool, idx = jax.lax.switch(mode, branches, None)
        parents = state.parents
        if config.method == "accel":
            parents = jax.tree_util.tree_map(lambda a, b: jnp.where(mode == REPLAY, a, b), pool, parents)
        return UEDState(buf, parents, mode), Plan(mode, pool, idx)

    def learns(plan: Plan) -> jax.Array:
        return (plan.mode == REPLAY) | (not config.robust)

    def finish(state: UEDState, plan: Plan, traj: Any, advantages: jax.Array) -> tuple[UEDState, UEDMetrics]:
        buf = state.buffer
        replayed = plan.mode == REPLAY
        slot = jnp.clip(plan.idx, 0, buf.capacity - 1)
        prior = jnp.where(replayed, buf.max_returns[slot], -jnp.inf)
        scores, best, played = level_scores(config.score, traj, advantages, prior)
        buf = jax.lax.cond(replayed, lambda b: update_played(b, plan.idx, scores, best, played),
                           lambda b: insert(b, plan.pool, scores, best, played), buf)
        n = jnp.maximum(jnp.sum(played), 1)
        fill = jnp.mean(buf.filled.astype(jnp.float32))
        bscore = jnp.sum(jnp.where(buf.filled, buf.scores, 0.0)) / jnp.maximum(jnp.sum(buf.filled), 1)
        metrics = UEDMetrics(mode=plan.mode.astype(jnp.float32), score=jnp.sum(jnp.where(played, scores, 0.0)) / n,
                             fill=fill, buffer_score=bscore)
        return state._replace(buffer=buf), metrics

    return Levels(config, init, start, learns, finish)
