"""Levels for unsupervised environment design (UED): mutate a lake, split episode ends into
terminated and truncated, and auto-reset onto lakes drawn by a caller's sampler.

All functions are pure and work on one unbatched lake (``jax.vmap`` makes batches) unless
their name says ``batch``; shapes as in :mod:`jaxlake.types` (``H = max_height``,
``W = max_width``, ``A = max_agents``).

**Mutation** (:func:`mutate`, ACCEL's editor for this game). Each of ``num_edits`` edits
draws one kind uniformly from ``kinds`` (by default the first three):

* :data:`FLIP_HOLE`: a uniform region cell that is no agent's start or goal turns from frozen
  to hole or back;
* :data:`MOVE_START` / :data:`MOVE_GOAL`: a uniform agent in play moves its start (goal) to a
  uniform frozen region cell that is no start or goal;
* :data:`MOVE_HOLE`: a uniform hole moves to a uniform frozen region cell that is no start or
  goal (the hole count, hence the hole density, is kept);
* :data:`NO_OP`: nothing (a child may equal its parent, as in minimax's and JaxUED's editors).

:data:`IN_SUPPORT_KINDS` (no-op, move a hole, move a start, move a goal) with
``keep_conflicts=True`` is the editor that stays inside the generator's support: the hole count
and the number of conflicting agent pairs are the parent's, so a child is a lake the same
config could have generated (ACCEL's default, :mod:`jaxlake.students.ued`).

An edit is *kept* only if the edited lake keeps every generator guarantee
(docs/rules.md#generator-guarantees): the region is untouched and holes stay inside it
(flips are drawn in the region); starts and goals stay frozen, in the region and pairwise
distinct (flips skip them, moves only go to free frozen cells); every agent's goal stays
reachable; and a lake whose distances were all within ``[min_dist, max_dist]`` stays so (a
lake that was already flagged, ``dist_ok = False``, may stay flagged, as the generator's
fallback does). With ``keep_conflicts`` an edit is kept only if moreover the number of
agent pairs whose shortest-path cell sets meet (``stats.conflict_density``) is unchanged.
Otherwise the edit is skipped (it still counts as one of the ``num_edits``), so ``mutate`` never
returns a lake the generator could not have returned.
The hole count needs no cap: starts and goals are never holes, so ``2 * num_agents`` cells
stay frozen, as the generator's cap requires.

``stats`` are recomputed exactly as the generator reports them, with
:func:`jaxlake.distances.lake_stats` (the generator's stats equal it, tested in
``tests/jaxlake/test_generator.py``): ``hole_density``, ``conflict_density``, ``path_len``
and ``dist_ok`` (against the ``min_dist`` / ``max_dist`` given to :func:`mutate`, which a
lake does not carry: pass the ones of the config that made it). ``attempts`` keeps the
parent's value (how many generator attempts made the lake it descends from).

**Episode ends** (:func:`step_split`, :func:`status_split`): per agent, *terminated* means
the agent arrived or fell (a true end of its episode), *truncated* means the horizon ran out
while it was ACTIVE (docs/rules.md#time-outs), as gymnasium and JaxMARL split ``done``.

**Sampler-driven auto-reset** (:func:`init`, :func:`step`, :func:`step_batch`,
:func:`observe`), built on :func:`jaxlake.autoreset.step_lake_from_uniforms` and with its
conventions (docs/rules.md#conventions, auto-reset): after the step that ends an episode an
instance holds the terminal state and ``pending``; its next step starts from the reset of the
next lake, so no step is wasted. The next lake comes from a *sampler*:

* a :class:`PoolSampler` (a pool of lakes, leading axis ``[P]``, and a ``[P]`` weights vector,
  e.g. a level buffer's replay distribution): the next lake is pool lake
  ``categorical(log weights)`` and :attr:`ResetState.level` records its index, so a buffer can
  score the level that was played; the sampler is a pytree, so new weights can be passed to
  every (jitted) step;
* or any function ``key -> Lake`` (e.g. ``lambda k: generate(k, config)``, or a function that
  draws from a buffer and :func:`mutate`-s); ``level`` is then ``-1``.

Keys: a step's slip noise is exactly :func:`jaxlake.env.step`'s for the same key (so a
trajectory equals plain ``env.step`` calls on the same lakes, keys and actions); the next lake
is drawn from ``jax.random.fold_in(key, LEVEL_STREAM)``. Under ``vmap`` a sampler runs on
every step (a ``select`` keeps its draw only where an episode ended): cheap for a
:class:`PoolSampler` (one categorical draw and one gather), but a function that generates
lakes costs a generation per step; :func:`step_batch` therefore draws for the whole batch
under a ``lax.cond`` that runs only on steps where some episode ended.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import chex
import jax
import jax.numpy as jnp
from flax import struct

from jaxlake import autoreset, env
from jaxlake.distances import UNREACHABLE, lake_stats
from jaxlake.types import ARRIVED, FELL, TIMED_OUT, Lake, State, StepInfo

__all__ = [
    "DEFAULT_KINDS",
    "EDIT_KINDS",
    "FLIP_HOLE",
    "IN_SUPPORT_KINDS",
    "LEVEL_STREAM",
    "MOVE_GOAL",
    "MOVE_HOLE",
    "MOVE_START",
    "NO_OP",
    "PoolSampler",
    "ResetState",
    "Sampler",
    "current_lakes",
    "init",
    "mutate",
    "observe",
    "status_split",
    "step",
    "step_batch",
    "step_from_uniforms",
    "step_split",
]

#: Edit kinds of :func:`mutate` (indices into :data:`EDIT_KINDS`).
FLIP_HOLE, MOVE_START, MOVE_GOAL, MOVE_HOLE, NO_OP = 0, 1, 2, 3, 4
EDIT_KINDS = ("flip_hole", "move_start", "move_goal", "move_hole", "no_op")
#: :func:`mutate`'s default kinds (its original editor; JaxUED's adapter uses it).
DEFAULT_KINDS = (FLIP_HOLE, MOVE_START, MOVE_GOAL)
#: The kinds that keep the hole count: with ``keep_conflicts``, children stay in the generator's support.
IN_SUPPORT_KINDS = (NO_OP, MOVE_HOLE, MOVE_START, MOVE_GOAL)
#: ``fold_in`` constant of the key the next lake is drawn from (the slip noise uses the key itself).
LEVEL_STREAM = 0x1E5E1


# ============================================================================ mutation
def _check_lake(lake: Lake) -> None:
    A = lake.max_agents
    H, W = lake.canvas_shape
    chex.assert_shape([lake.holes, lake.region], (H, W))
    chex.assert_shape([lake.starts, lake.goals], (A, 2))
    chex.assert_rank([lake.num_agents, lake.slip_prob, lake.max_steps, lake.on_goal], 0)


def _pick_cell(key: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A uniform True cell of ``[H, W]`` ``mask``: ``([2] int32 cell, [] bool any)``."""
    H, W = mask.shape
    flat = mask.reshape(-1)
    logits = jnp.where(flat, 0.0, -jnp.inf)
    idx = jax.random.categorical(key, jnp.where(jnp.any(flat), logits, 0.0)).astype(jnp.int32)
    return jnp.stack([idx // W, idx % W]), jnp.any(flat)


def _endpoint_mask(lake: Lake) -> jax.Array:
    """``[H, W]`` bool: the starts and goals of the agents in play."""
    H, W = lake.canvas_shape
    cells = jnp.concatenate([lake.starts, lake.goals], axis=0)
    on = jnp.concatenate([lake.agent_mask, lake.agent_mask])
    rows = jnp.arange(H)[None, :, None] == cells[:, 0, None, None]
    cols = jnp.arange(W)[None, None, :] == cells[:, 1, None, None]
    return jnp.any(rows & cols & on[:, None, None], axis=0)


def _propose(key: jax.Array, lake: Lake, kinds: tuple = DEFAULT_KINDS) -> tuple[Lake, jax.Array]:
    """One random edit of ``lake`` (stats not updated), its kind drawn uniformly from ``kinds``,
    and whether a cell could be drawn."""
    k_kind, k_agent, k_cell = jax.random.split(key, 3)  # the original editor's stream, unchanged
    k_hole = jax.random.fold_in(k_cell, 1)
    kind = jnp.asarray(kinds, jnp.int32)[jax.random.randint(k_kind, (), 0, len(kinds))]
    taken = _endpoint_mask(lake)
    flip_cell, can_flip = _pick_cell(k_cell, lake.region & ~taken)
    move_cell, can_move = _pick_cell(k_cell, lake.region & ~lake.holes & ~taken)
    hole_cell, has_hole = _pick_cell(k_hole, lake.region & lake.holes)
    agent = jax.random.randint(k_agent, (), 0, jnp.maximum(lake.num_agents, 1))
    slot = (jnp.arange(lake.max_agents) == agent)[:, None]
    flipped = lake.holes.at[flip_cell[0], flip_cell[1]].set(~lake.holes[flip_cell[0], flip_cell[1]])
    moved = lake.holes.at[hole_cell[0], hole_cell[1]].set(False).at[move_cell[0], move_cell[1]].set(True)
    holes = jnp.where(kind == FLIP_HOLE, flipped, jnp.where(kind == MOVE_HOLE, moved, lake.holes))
    starts = jnp.where((kind == MOVE_START) & slot, move_cell[None], lake.starts)
    goals = jnp.where((kind == MOVE_GOAL) & slot, move_cell[None], lake.goals)
    found = jnp.select([kind == FLIP_HOLE, kind == MOVE_HOLE, kind == NO_OP],
                       [can_flip, has_hole & can_move, jnp.bool_(True)], can_move & (lake.num_agents > 0))
    return lake.replace(holes=holes, starts=starts.astype(jnp.int32), goals=goals.astype(jnp.int32)), found


def mutate(key: jax.Array, lake: Lake, num_edits: Union[int, jax.Array], *, min_dist: Any = 1,
           max_dist: Optional[Any] = None, kinds: tuple = DEFAULT_KINDS, keep_conflicts: bool = False) -> Lake:
    """``num_edits`` random edits of ``lake``, each kept only if every generator guarantee holds.

    See the module docstring for the edits and the guarantees. Pure, ``jit``-able and
    ``vmap``-able (over keys, lakes and ``num_edits``); JaxUED's mutator signature
    ``(rng, level, num_edits) -> level``.

    Args:
      key: a PRNG key (edit ``e`` uses ``fold_in(key, e)``).
      lake: an unbatched lake that meets the guarantees (e.g. from :func:`~jaxlake.generate`).
      num_edits: edits to try (an int or an int scalar array; 0 returns the lake with its
        stats recomputed).
      min_dist: the lower distance bound of ``stats.dist_ok``, the config's that made the lake.
      max_dist: its upper bound (``None``: none), likewise.
      kinds: the edit kinds drawn from, uniformly (static; indices of :data:`EDIT_KINDS`).
      keep_conflicts: keep an edit only if the number of conflicting agent pairs is unchanged.

    Returns:
      The mutated :class:`Lake` (same capacity, region, agents, slip, horizon and goal rule)
      with ``stats`` recomputed (``attempts`` kept).
    """
    _check_lake(lake)
    kinds = tuple(int(k) for k in kinds)
    if not kinds or any(k < 0 or k >= len(EDIT_KINDS) for k in kinds):
        raise ValueError(f"kinds={kinds!r} must be a non-empty tuple of edit kinds in [0, {len(EDIT_KINDS) - 1}]")

    def stats_of(x: Lake):
        return lake_stats(x, min_dist, max_dist)

    def edit(e, carry):
        current, stats = carry
        candidate, found = _propose(jax.random.fold_in(key, e), current, kinds)
        new_stats = stats_of(candidate)
        reachable = jnp.all((new_stats.path_len < UNREACHABLE) | ~candidate.agent_mask)
        keep = found & reachable & (new_stats.dist_ok | ~stats.dist_ok)
        if keep_conflicts:
            keep = keep & (new_stats.conflict_density == stats.conflict_density)
        return jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), (candidate, new_stats), (current, stats))

    stats0 = stats_of(lake)
    current, stats = jax.lax.fori_loop(0, num_edits, edit, (lake.replace(stats=stats0), stats0))
    return current.replace(stats=stats.replace(attempts=jnp.asarray(lake.stats.attempts, jnp.int32)))


# ============================================================================ episode ends
def step_split(info: StepInfo) -> tuple[jax.Array, jax.Array]:
    """``(terminated, truncated)``, each ``[A]`` bool (any leading batch axes): the agent's
    episode ended in this step by arriving or falling / by the horizon running out while it
    was ACTIVE. At most one is True per agent; both are False on steps of a done episode."""
    return info.arrived | info.fell, info.timed_out


def status_split(state: State) -> tuple[jax.Array, jax.Array]:
    """``(terminated, truncated)``, each ``[A]`` bool, from the statuses: the agent's episode
    has ended by arriving or falling (ARRIVED, FELL) / by the horizon (TIMED_OUT). Absent
    slots are neither."""
    status = state.status
    return (status == ARRIVED) | (status == FELL), status == TIMED_OUT


# ============================================================================ sampler-driven reset
@struct.dataclass
class PoolSampler:
    """Draws the next lake from a pool by weight (a pytree: pass new weights to any step).

    Attributes:
      pool: a :class:`Lake` with a leading ``[P]`` axis on every leaf.
      weights: ``[P]`` float, non-negative with a positive sum (normalised when drawing).
    """

    pool: Lake
    weights: jax.Array

    @classmethod
    def uniform(cls, pool: Lake) -> "PoolSampler":
        """Every pool lake with the same weight."""
        return cls(pool=pool, weights=jnp.ones((autoreset.pool_size(pool),), jnp.float32))

    def sample(self, key: jax.Array) -> tuple[Lake, jax.Array]:
        """``(lake, index)``: pool lake ``index ~ weights``."""
        chex.assert_shape(self.weights, (autoreset.pool_size(self.pool),))
        w = jnp.asarray(self.weights, jnp.float32)
        idx = jax.random.categorical(key, jnp.where(w > 0, jnp.log(jnp.maximum(w, 1e-30)), -jnp.inf))
        idx = idx.astype(jnp.int32)
        return jax.tree_util.tree_map(lambda x: jnp.take(x, idx, axis=0, mode="clip"), self.pool), idx


#: What drives the reset: a :class:`PoolSampler`, or a function ``key -> Lake``.
Sampler = Union[PoolSampler, Callable[[jax.Array], Lake]]


def _draw(sampler: Sampler, key: jax.Array) -> tuple[Lake, jax.Array]:
    """``(lake, level index)``; the index is -1 for a function sampler."""
    if isinstance(sampler, PoolSampler):
        return sampler.sample(key)
    if not callable(sampler):
        raise TypeError(f"sampler must be a PoolSampler or a function key -> Lake, got {type(sampler).__name__}")
    lake = sampler(key)
    if not isinstance(lake, Lake):
        raise TypeError(f"the sampler returned {type(lake).__name__}, not a Lake")
    return lake, jnp.full((), -1, jnp.int32)


@struct.dataclass
class ResetState:
    """One instance of the sampler-driven auto-reset (add a leading ``[B]`` axis for a batch).

    Attributes:
      ar: the :class:`jaxlake.autoreset.AutoResetState` (``state``: after the last step, the
        terminal one when ``pending``; ``pool_idx``: the level index of ``lake``, -1 for a
        function sampler; ``episodes``; ``pending``: the next step restarts on ``lake``).
      lake: the lake the next step plays (already the next level when ``ar.pending``).
    """

    ar: autoreset.AutoResetState
    lake: Lake

    @property
    def level(self) -> jax.Array:
        """``[]`` int32 pool index of :attr:`lake` (-1 for a function sampler)."""
        return self.ar.pool_idx

    @property
    def state(self) -> State:
        return self.ar.state


def init(key: jax.Array, sampler: Sampler, batch_size: int) -> ResetState:
    """Batched start: instance ``i`` plays ``sampler(split(key, B)[i])``, freshly reset."""
    if int(batch_size) < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    lakes, idx = jax.vmap(lambda k: _draw(sampler, k))(jax.random.split(key, int(batch_size)))
    b = int(batch_size)
    ar = autoreset.AutoResetState(state=env.reset(lakes), pool_idx=idx, episodes=jnp.zeros((b,), jnp.int32),
                                  pending=jnp.zeros((b,), bool))
    return ResetState(ar=ar, lake=lakes)


def _where(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
    """Per-instance select of two pytrees (``pred`` is ``[]`` or ``[B]``)."""
    def pick(a, b):
        return jnp.where(jnp.reshape(pred, jnp.shape(pred) + (1,) * (jnp.ndim(b) - jnp.ndim(pred))), a, b)

    return jax.tree_util.tree_map(pick, on_true, on_false)


def observe(rs: ResetState) -> State:
    """The state the next step starts from (``env.reset(lake)`` where pending); batched or not."""
    return _where(rs.ar.pending, env.reset(rs.lake), rs.ar.state)


def current_lakes(rs: ResetState) -> Lake:
    """The lake each instance plays next."""
    return rs.lake


def _play(rs: ResetState, actions: jax.Array, u: jax.Array, **step_kwargs: Any):
    """Step one instance; the level index after a finished episode is filled in by the caller."""
    return autoreset.step_lake_from_uniforms(rs.lake, rs.ar, actions, u, rs.ar.pool_idx, **step_kwargs)


def step_from_uniforms(key: jax.Array, sampler: Sampler, rs: ResetState, actions: jax.Array, u: jax.Array,
                       **step_kwargs: Any) -> tuple[ResetState, StepInfo]:
    """:func:`step` with the slip noise ``u`` (``[A]`` uniforms) given; ``key`` draws the next
    lake only (``fold_in(key, LEVEL_STREAM)``)."""
    ar, info = _play(rs, actions, u, **step_kwargs)
    lake, idx = _draw(sampler, jax.random.fold_in(key, LEVEL_STREAM))
    done = ar.pending
    ar = ar.replace(pool_idx=jnp.where(done, idx, ar.pool_idx).astype(jnp.int32))
    return ResetState(ar=ar, lake=_where(done, lake, rs.lake)), info


def step(key: jax.Array, sampler: Sampler, rs: ResetState, actions: jax.Array,
         **step_kwargs: Any) -> tuple[ResetState, StepInfo]:
    """One auto-resetting step of one instance (``vmap`` over ``key``, ``rs``, ``actions``).

    Plays :attr:`ResetState.lake` with :func:`jaxlake.env.step` (slip noise drawn from ``key``
    exactly as ``env.step`` does) from :func:`observe`'s state. When the episode is done
    afterwards, the next lake is drawn from ``sampler`` (key ``fold_in(key, LEVEL_STREAM)``),
    ``episodes`` grows by one and ``pending`` is set; the returned :class:`StepInfo` is the
    step's own (:func:`step_split` splits its ends). ``step_kwargs`` go to ``env.step``.
    """
    return step_from_uniforms(key, sampler, rs, actions, env.slip_uniforms(key, rs.lake.max_agents), **step_kwargs)


def step_batch(keys: jax.Array, sampler: Sampler, rs: ResetState, actions: jax.Array,
               **step_kwargs: Any) -> tuple[ResetState, StepInfo]:
    """:func:`step` over a batch (``keys [B]``, ``rs [B]``, ``actions [B, A]``), equal to
    ``vmap(step)``, with the sampler run (for the whole batch) only on steps where some
    episode ended (``lax.cond``): use it with samplers that generate lakes."""
    chex.assert_rank(rs.ar.pool_idx, 1)
    u = jax.vmap(lambda k: env.slip_uniforms(k, rs.lake.max_agents))(keys)
    ar, info = jax.vmap(lambda r, a, x: _play(r, a, x, **step_kwargs))(rs, actions, u)
    done = ar.pending

    def draw(_):
        return jax.vmap(lambda k: _draw(sampler, jax.random.fold_in(k, LEVEL_STREAM)))(keys)

    def keep(_):
        return rs.lake, ar.pool_idx

    lake, idx = jax.lax.cond(jnp.any(done), draw, keep, None)
    ar = ar.replace(pool_idx=jnp.where(done, idx, ar.pool_idx).astype(jnp.int32))
    return ResetState(ar=ar, lake=_where(done, lake, rs.lake)), info
