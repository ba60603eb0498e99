"""Unsupervised environment design inside IPPO's one jit: domain randomisation, robust PLR,
ACCEL and SFL over lakes (``ippo.ued``, :class:`~jaxlake.students.config.UEDConfig`).

Every update of :func:`jaxlake.students.ippo.build` plays a pool of ``ippo.pool_lakes`` levels
(instance ``e`` plays pool level ``e``, then ``e + E``, ...). This module decides which, and
what the update does with their scores (:class:`Levels`, the trainer's hook):

* ``dr``: a fresh pool from the mixture every update, the plain trainer (no hook at all);
* ``plr`` (robust prioritised level replay, Jiang et al. 2021): each update is a *replay* with
  probability ``replay_prob`` (JaxUED's example's 0.8) once ``min_fill`` of the buffer is
  filled, else a *new* update on a fresh pool. A replay samples the pool from the buffer's
  replay distribution and updates the played levels' scores; a new update scores the fresh
  levels and inserts them. With ``robust`` (the default) only replays update the policy;
* ``accel`` (Parker-Holder et al. 2022): PLR, and every replay is followed by an update on
  children of the buffer's top-scored levels (one child each of the ``P`` best, fewer when the
  buffer holds fewer): each child makes 1 to ``num_edits`` edits of
  :func:`jaxlake.levels.mutate` with :data:`jaxlake.levels.IN_SUPPORT_KINDS` and
  ``keep_conflicts`` (no-op, move a hole, a start or a goal; starts and goals stay frozen,
  distinct and reachable, the hole count and the conflicting pairs are the parent's, so a
  child is a lake the training generator could have made); a child that lands on a held-out
  lake is redrawn. The children are scored and inserted. With ``robust`` they do not update
  the policy either;
* ``sfl`` (sampling for learnability, Rutherford et al. 2024, "No Regrets"): every
  ``sfl_every`` updates the current policy plays ``sfl_levels`` fresh levels ``sfl_repeats``
  times each (sampled actions, one episode each, rollouts only), and the ``sfl_buffer`` levels
  of highest learnability ``p (1 - p)`` (``p`` the success rate) are kept
  (:func:`learnability`); every update then trains on a pool of ``sfl_ratio`` of them (drawn
  uniformly) and fresh levels, shuffled.

All of it is pure JAX (no host loop), in the trainer's ``lax.scan``, and ``vmap``-s over seeds.
``ippo.ued.budget`` says what ``ippo.num_updates`` counts (gradient steps: updates without a
policy update come on top; or every update): see :func:`jaxlake.students.ippo.build`.

**Scores** (regret estimates, as JaxUED computes them; :func:`level_scores`), per level of the
pool over the update's valid actor steps on it (every actor, every episode on it, a time
average):

* ``pvl``, positive value loss: the mean of ``max(A_t, 0)`` (the GAE advantages of the update);
* ``maxmc``: the mean of ``R_max - V_t``, ``R_max`` the largest return any actor reached on the
  level, in this update or any earlier one (kept in the buffer). An episode the rollout cut off
  counts with its partial return, so a level whose only episode ran past the rollout's end (a
  long, hard one) is scored too.

A level with no valid step in the update (the rollout never reached it) gets no score and is
not marked as played. JaxUED averages per-episode means; here each level's steps are pooled
(an actor's steps weigh the same in any episode).

**The level buffer** (:class:`LevelBuffer`): ``buffer_size`` lakes with their score, largest
return, the update they were last played at, a hash (:func:`jaxlake.students.lakes.lake_hash`)
and a filled mask. :func:`insert` adds scored levels one at a time: a level already in the
buffer (same hash) gets its new score; otherwise it takes an empty slot, or, as JaxUED's
sampler does, replaces the slot of lowest replay *weight* (not of lowest score) if it scores
higher than that slot. :func:`replay_weights` is PLR's distribution:
``(1 - staleness_coef) * P_rank + staleness_coef * P_stale`` over the filled slots, with
``P_rank ~ rank ** (-1 / temperature)`` (rank 1: the highest score) and
``P_stale ~ updates since last played``; only the levels an update actually played are marked
as played (:func:`update_played`, :func:`insert`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import struct

from jaxlake import env as lake_env_core
from jaxlake.levels import IN_SUPPORT_KINDS, mutate
from jaxlake.students.config import UEDConfig
from jaxlake.students.envs import lake_obs
from jaxlake.students.lakes import is_held_out, lake_hash
from jaxlake.students.network import sample
from jaxlake.types import ABSENT, ARRIVED, Lake

__all__ = ["MODES", "MUTATE", "NEW", "REPLAY", "LevelBuffer", "Levels", "Plan", "UEDMetrics", "UEDState",
           "empty_buffer", "episode_max_returns", "insert", "learnability", "level_scores", "make_levels", "max_mc",
           "positive_value_loss", "replay_weights", "sample_replay", "success_rates", "top_slots", "update_played"]

#: An update's kind: a fresh pool (domain randomisation), a replay from the buffer, mutations.
NEW, REPLAY, MUTATE = 0, 1, 2
MODES = ("new", "replay", "mutate")
#: Tries of a mutation before a child that is a held-out lake gives way to its parent.
MUTATION_TRIES = 8
#: ``fold_in`` constant of the key that draws a child's edit count (the tries use 0, 1, ...).
_EDITS_STREAM = 0xED175


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
    """``[P]`` the largest undiscounted return an actor reached on each level in the rollout
    (``-inf``: the level was not played): the return of every episode that ended, and the
    partial return of every episode the rollout's end cut off (an actor still valid at the
    last step). ``rewards``, ``dones``, ``valid`` ``[T, E, K]``."""

    def run(g, x):
        r, d, v = x
        g = g + r * v
        return jnp.where(d, 0.0, g), jnp.where(d & v, g, -jnp.inf)

    g0 = jnp.zeros(rewards.shape[1:], jnp.float32)
    valid = valid.astype(bool)
    dones = dones.astype(bool)
    g_end, ends = jax.lax.scan(run, g0, (rewards.astype(jnp.float32), dones, valid))
    cut = jnp.where(valid[-1] & ~dones[-1], g_end, -jnp.inf)  # [E, K] episodes running at the end
    seg = jnp.where(level >= 0, level, num_levels)
    seg_all = jnp.concatenate([jnp.broadcast_to(seg[..., None], ends.shape).reshape(-1),
                               jnp.broadcast_to(seg[-1][..., None], cut.shape).reshape(-1)])
    vals = jnp.concatenate([ends.reshape(-1), cut.reshape(-1)])
    return jax.ops.segment_max(vals, seg_all, num_levels + 1)[:num_levels]


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


def _ranks(buf: LevelBuffer) -> jax.Array:
    """``[N]`` int32 rank of every slot by score (1: the highest; ties by slot), the filled first."""
    ranked = jnp.where(buf.filled, buf.scores, -jnp.inf)
    return (jnp.argsort(jnp.argsort(-ranked, stable=True), stable=True) + 1).astype(jnp.int32)


def insert(buf: LevelBuffer, lakes: Lake, scores: jax.Array, max_returns: jax.Array, ok: jax.Array,
           temperature: float = 0.3, staleness_coef: float = 0.3) -> LevelBuffer:
    """Insert the levels ``lakes [P]`` with ``ok`` (played and scored), one after the other, as
    JaxUED's sampler does: a level already in the buffer (same hash) takes its new score and
    largest return; a new one fills an empty slot, or replaces the filled slot of lowest replay
    weight (:func:`replay_weights` of ``temperature`` and ``staleness_coef``, exact before every
    insertion: the ranks are kept up to date in O(N), no sort per level) when it scores higher
    than that slot (else it is dropped). Every written slot is marked as played now."""
    hashes = jax.vmap(lake_hash)(lakes)
    slots = jnp.arange(buf.capacity)
    inv_t = 1.0 / temperature

    def ahead(score, slot, others_score):
        """The key ``(score, slot)`` ranks ahead of every slot's own key."""
        return (score > others_score) | ((score == others_score) & (slot < slots))

    def behind(score, slot, others_score):
        return (others_score > score) | ((others_score == score) & (slots < slot))

    def weights(b: LevelBuffer, rank: jax.Array) -> jax.Array:
        f = b.filled.astype(jnp.float32)
        h = f * (1.0 / rank.astype(jnp.float32)) ** inv_t
        p_rank = h / jnp.maximum(jnp.sum(h), 1e-30)
        stale = f * (b.clock - b.last_seen).astype(jnp.float32)
        total = jnp.sum(stale)
        p_stale = jnp.where(total > 0, stale / jnp.maximum(total, 1e-30), p_rank)
        return jnp.where(b.filled, (1.0 - staleness_coef) * p_rank + staleness_coef * p_stale, jnp.inf)

    def one(carry, x):
        b, rank = carry
        lake, score, best, h, good = x
        same = b.filled & (b.hashes == h)
        dup = jnp.any(same)
        empty = ~b.filled
        has_empty = jnp.any(empty)
        low = jnp.where(has_empty, jnp.argmax(empty), jnp.argmin(weights(b, rank)))
        slot = jnp.where(dup, jnp.argmax(same), low)
        write = good & (dup | has_empty | (score > b.scores[low]))
        best = jnp.where(dup, jnp.maximum(best, b.max_returns[slot]), best)
        # the ranks after the write: the slot's old key leaves, its new key enters
        others = b.filled & (slots != slot)
        was = b.filled[slot]
        moved = (rank - (others & was & ahead(b.scores[slot], slot, b.scores)).astype(jnp.int32)
                 + (others & ahead(score, slot, b.scores)).astype(jnp.int32))
        moved = moved.at[slot].set(1 + jnp.sum(others & behind(score, slot, b.scores)).astype(jnp.int32))
        rank = jnp.where(write, moved, rank)

        def put(arr, v):
            return arr.at[slot].set(jnp.where(write, v, arr[slot]))

        new = b.replace(lakes=jax.tree_util.tree_map(put, b.lakes, lake), scores=put(b.scores, score),
                        max_returns=put(b.max_returns, best), last_seen=put(b.last_seen, b.clock),
                        hashes=put(b.hashes, h), filled=put(b.filled, True))
        return (new, rank), None

    (buf, _), _ = jax.lax.scan(one, (buf, _ranks(buf)), (lakes, scores.astype(jnp.float32),
                                                          max_returns.astype(jnp.float32), hashes, ok))
    return buf


def update_played(buf: LevelBuffer, idx: jax.Array, scores: jax.Array, max_returns: jax.Array,
                  ok: jax.Array) -> LevelBuffer:
    """Replayed slots ``idx [P]`` with ``ok`` (played) take their new score and largest return,
    and are marked as played now; the drawn slots no rollout reached keep their staleness."""
    n = buf.capacity
    where = jnp.where(ok, idx, n)  # out of range: dropped
    return buf.replace(scores=buf.scores.at[where].set(scores, mode="drop"),
                       max_returns=buf.max_returns.at[where].set(max_returns, mode="drop"),
                       last_seen=buf.last_seen.at[where].set(buf.clock, mode="drop"))


def replay_weights(buf: LevelBuffer, temperature: float, staleness_coef: float) -> jax.Array:
    """``[N]`` PLR's replay distribution (rank prioritisation mixed with staleness); 0 on empty slots."""
    filled = buf.filled
    f = filled.astype(jnp.float32)
    rank = _ranks(buf)
    h = f * (1.0 / rank.astype(jnp.float32)) ** (1.0 / temperature)
    p_rank = h / jnp.maximum(jnp.sum(h), 1e-30)
    stale = f * (buf.clock - buf.last_seen).astype(jnp.float32)
    total = jnp.sum(stale)
    p_stale = jnp.where(total > 0, stale / jnp.maximum(total, 1e-30), p_rank)
    return (1.0 - staleness_coef) * p_rank + staleness_coef * p_stale


def sample_replay(key: jax.Array, buf: LevelBuffer, n: int, temperature: float, staleness_coef: float) -> jax.Array:
    """``idx [n]``: ``n`` slots drawn with replacement from :func:`replay_weights` (only filled
    slots have weight). Drawing marks nothing: :func:`update_played` marks the slots the
    update's rollout played."""
    w = replay_weights(buf, temperature, staleness_coef)
    logits = jnp.where(w > 0, jnp.log(jnp.maximum(w, 1e-30)), -jnp.inf)
    return jax.random.categorical(key, logits, shape=(int(n),)).astype(jnp.int32)


def top_slots(buf: LevelBuffer, n: int) -> jax.Array:
    """``idx [n]``: the ``n`` filled slots of highest score, best first (ACCEL's parents); with
    fewer filled slots, the filled ones cycle."""
    n, cap = int(n), buf.capacity
    ranked = jnp.where(buf.filled, buf.scores, -jnp.inf)
    _, idx = jax.lax.top_k(ranked, min(n, cap))
    count = jnp.maximum(jnp.minimum(jnp.sum(buf.filled), min(n, cap)), 1)
    return idx[jnp.arange(n) % count].astype(jnp.int32)


# ============================================================================ SFL's learnability
def success_rates(params: Any, apply: Any, lakes: Lake, *, actors: int, radius: Optional[int], horizon: int,
                  key: jax.Array, repeats: int) -> jax.Array:
    """``[N]`` each lake's success rate over ``repeats`` episodes of the policy (actions sampled
    from ``apply(params, grid, scalars, avail)``'s logits; ``horizon`` static steps, an episode
    that is done stays as it is); a success is every agent in play arrived."""
    n = jax.tree_util.tree_leaves(lakes)[0].shape[0]
    m = n * int(repeats)
    tiled = jax.tree_util.tree_map(lambda x: jnp.repeat(x, int(repeats), axis=0), lakes)
    max_agents = tiled.max_agents

    def one(states, k):
        k_act, k_env = jax.random.split(k)
        obs = lake_obs(tiled, states, actors, radius)
        logits, _ = apply(params, obs.grid, obs.scalars, obs.avail)
        actions = jnp.zeros((m, max_agents), jnp.int32).at[:, :actors].set(sample(k_act, logits))
        states, _ = jax.vmap(lake_env_core.step)(jax.random.split(k_env, m), tiled, states, actions)
        return states, None

    states, _ = jax.lax.scan(one, lake_env_core.reset(tiled), jax.random.split(key, int(horizon)))
    status = states.status
    won = jnp.all((status == ARRIVED) | (status == ABSENT), axis=-1).astype(jnp.float32)
    return jnp.mean(won.reshape(n, int(repeats)), axis=1)


def learnability(success: jax.Array) -> jax.Array:
    """SFL's score of a level from its success rate ``p``: ``p (1 - p)`` (the variance of a
    success; 0 for a level always or never solved, largest at ``p = 1/2``)."""
    return success * (1.0 - success)


# ============================================================================ the trainer's hook
class UEDState(NamedTuple):
    """The loop state of a UED method: the buffer (SFL: the learnable levels, scored by
    learnability) and the last update's kind."""

    buffer: LevelBuffer
    mode: jax.Array


class Plan(NamedTuple):
    """One update's levels: its kind, the pool ``[P]`` and their buffer slots (replay; else -1)."""

    mode: jax.Array
    pool: Lake
    idx: jax.Array


class UEDMetrics(NamedTuple):
    """Per update (per scan step of the trainer): its kind (:data:`MODES` index; with the
    ``grad_steps`` budget the kind of its last, policy-updating play), the mean score of its
    scored levels (SFL: the kept levels' mean learnability), the buffer's filled share and mean
    score, ``plays`` (rollouts of ``num_envs x num_steps`` played: more than 1 when updates
    without a policy update came first), ``learned`` (1: the policy was updated) and
    ``scored_steps`` (lake steps of SFL's scoring rollouts, simulated steps of every episode)."""

    mode: jax.Array
    score: jax.Array
    fill: jax.Array
    buffer_score: jax.Array
    plays: Any = None
    learned: Any = None
    scored_steps: Any = None


class Levels(NamedTuple):
    """The trainer's hook (:func:`jaxlake.students.ippo.build`): ``init(key) -> UEDState``,
    ``start(key, UEDState) -> (UEDState, Plan)`` (the update's levels), ``learns(plan) -> []
    bool`` (the policy is updated), ``finish(UEDState, plan, traj, advantages) -> (UEDState,
    UEDMetrics)`` (the scores go to the buffer) and, for SFL, ``refresh(key, UEDState, params)
    -> UEDState`` run before the updates ``0, period, 2 period, ...`` of every chunk, each costing
    ``refresh_steps`` lake steps (``refresh`` ``None`` for the others)."""

    config: UEDConfig
    init: Any
    start: Any
    learns: Any
    finish: Any
    refresh: Any = None
    period: int = 0
    refresh_steps: int = 0


def _mutant(config: UEDConfig, min_dist: Any, max_dist: Any):
    """``child(key, lake)``: 1 .. ``num_edits`` in-support edits, redrawn while held out."""

    def child(key: jax.Array, lake: Lake) -> Lake:
        edits = jax.random.randint(jax.random.fold_in(key, _EDITS_STREAM), (), 1, config.num_edits + 1)

        def again(c):
            i, _ = c
            return i + 1, mutate(jax.random.fold_in(key, i), lake, edits, min_dist=min_dist, max_dist=max_dist,
                                 kinds=IN_SUPPORT_KINDS, keep_conflicts=True)

        first = again((jnp.int32(0), lake))
        _, out = jax.lax.while_loop(lambda c: is_held_out(c[1]) & (c[0] < MUTATION_TRIES), again, first)
        bad = is_held_out(out)
        return jax.tree_util.tree_map(lambda a, b: jnp.where(bad, b, a), out, lake)

    return child


def _metrics(mode: jax.Array, score: jax.Array, buf: LevelBuffer, learned: jax.Array) -> UEDMetrics:
    fill = jnp.mean(buf.filled.astype(jnp.float32))
    bscore = jnp.sum(jnp.where(buf.filled, buf.scores, 0.0)) / jnp.maximum(jnp.sum(buf.filled), 1)
    one = jnp.ones((), jnp.float32)
    return UEDMetrics(mode=mode.astype(jnp.float32), score=score, fill=fill, buffer_score=bscore, plays=one,
                      learned=learned.astype(jnp.float32), scored_steps=jnp.zeros((), jnp.float32))


def make_levels(config: UEDConfig, env: Any, pool_size: int, *, min_dist: Any = 1,
                max_dist: Optional[Any] = None, success: Optional[Any] = None, scored_steps: int = 0) -> Levels:
    """The hook of ``config`` (``plr``, ``accel`` or ``sfl``) for ``env`` (a
    :class:`~jaxlake.students.envs.StudentEnv` with ``draw`` and ``load``): pools of
    ``pool_size`` levels; ``min_dist`` / ``max_dist`` are the bounds mutations keep
    (:func:`jaxlake.levels.mutate`). SFL needs ``success(params, lakes [M], key) -> [M]`` (the
    policy's success rates, e.g. :func:`success_rates`) and the lake steps one scoring costs."""
    if config.method not in ("plr", "accel", "sfl"):
        raise ValueError(f"make_levels is for plr, accel and sfl, not ippo.ued.method={config.method}")
    if env.draw is None or env.load is None:
        raise ValueError("ippo.ued.method needs an environment of levels (StudentEnv.draw and .load)")
    if config.method == "sfl":
        return _sfl(config, env, pool_size, success, scored_steps)
    P = int(pool_size)
    need = max(1, math.ceil(config.min_fill * config.buffer_size))
    child = _mutant(config, min_dist, max_dist)

    def init(key: jax.Array) -> UEDState:
        shapes = jax.eval_shape(lambda k: env.draw(k, 1), key)
        template = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape[1:], s.dtype), shapes)
        return UEDState(empty_buffer(template, config.buffer_size), jnp.int32(NEW))

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
            return env.draw(k_new, P), none

        def replay(_):
            idx = sample_replay(k_replay, buf, P, config.temperature, config.staleness_coef)
            return jax.tree_util.tree_map(lambda x: x[idx], buf.lakes), idx

        def mutated(_):
            parents = jax.tree_util.tree_map(lambda x: x[top_slots(buf, P)], buf.lakes)
            return jax.vmap(child)(jax.random.split(k_mutate, P), parents), none

        branches = [new, replay] + ([mutated] if config.method == "accel" else [])
        pool, idx = jax.lax.switch(mode, branches, None)
        return UEDState(buf, mode), Plan(mode, pool, idx)

    def learns(plan: Plan) -> jax.Array:
        return (plan.mode == REPLAY) | (not config.robust)

    def finish(state: UEDState, plan: Plan, traj: Any, advantages: jax.Array) -> tuple[UEDState, UEDMetrics]:
        buf = state.buffer
        replayed = plan.mode == REPLAY
        slot = jnp.clip(plan.idx, 0, buf.capacity - 1)
        prior = jnp.where(replayed, buf.max_returns[slot], -jnp.inf)
        scores, best, played = level_scores(config.score, traj, advantages, prior)
        buf = jax.lax.cond(replayed, lambda b: update_played(b, plan.idx, scores, best, played),
                           lambda b: insert(b, plan.pool, scores, best, played, config.temperature,
                                            config.staleness_coef), buf)
        n = jnp.maximum(jnp.sum(played), 1)
        score = jnp.sum(jnp.where(played, scores, 0.0)) / n
        return state._replace(buffer=buf), _metrics(plan.mode, score, buf, learns(plan))

    return Levels(config, init, start, learns, finish)


def _sfl(config: UEDConfig, env: Any, pool_size: int, success: Optional[Any], scored_steps: int) -> Levels:
    """SFL's hook (:func:`make_levels`)."""
    if success is None:
        raise ValueError("ippo.ued.method=sfl needs the policy's success rates on levels (make_levels(success=...); "
                         "jaxlake.students.ippo.lake_student builds it)")
    P, M, K = int(pool_size), config.sfl_levels, config.sfl_buffer
    from_buffer = int(round(config.sfl_ratio * P))

    def init(key: jax.Array) -> UEDState:
        shapes = jax.eval_shape(lambda k: env.draw(k, 1), key)
        template = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape[1:], s.dtype), shapes)
        return UEDState(empty_buffer(template, K), jnp.int32(NEW))

    def refresh(key: jax.Array, state: UEDState, params: Any) -> UEDState:
        k_draw, k_play = jax.random.split(key)
        candidates = env.draw(k_draw, M)
        score = learnability(success(params, candidates, k_play))
        top, idx = jax.lax.top_k(score, K)
        lakes = jax.tree_util.tree_map(lambda x: x[idx], candidates)
        buf = state.buffer
        return state._replace(buffer=buf.replace(lakes=lakes, scores=top, hashes=jax.vmap(lake_hash)(lakes),
                                                 filled=jnp.ones((K,), bool), last_seen=jnp.full((K,), buf.clock)))

    def start(key: jax.Array, state: UEDState) -> tuple[UEDState, Plan]:
        k_pick, k_new, k_perm = jax.random.split(key, 3)
        buf = state.buffer.replace(clock=state.buffer.clock + 1)
        idx = jax.random.randint(k_pick, (from_buffer,), 0, K)
        parts = [jax.tree_util.tree_map(lambda x: x[idx], buf.lakes)]
        if P > from_buffer:
            parts.append(env.draw(k_new, P - from_buffer))
        pool = jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *parts)
        order = jax.random.permutation(k_perm, P)
        pool = jax.tree_util.tree_map(lambda x: x[order], pool)
        mode = jnp.int32(REPLAY)
        return UEDState(buf, mode), Plan(mode, pool, jnp.full((P,), -1, jnp.int32))

    def learns(plan: Plan) -> jax.Array:
        return jnp.ones((), bool)

    def finish(state: UEDState, plan: Plan, traj: Any, advantages: jax.Array) -> tuple[UEDState, UEDMetrics]:
        buf = state.buffer
        return state, _metrics(plan.mode, jnp.mean(buf.scores), buf, jnp.ones((), bool))

    return Levels(config, init, start, learns, finish, refresh, config.sfl_every, int(scored_steps))
