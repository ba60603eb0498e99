"""BFS distances through frozen cells, and the per-lake statistics built on them (DESIGN §4).

Everything here is a pure function of static shapes: ``jax.jit`` and ``jax.vmap`` work on all
of it. Breadth-first search is a ``lax.while_loop`` that grows a frontier one ring per
iteration (4-neighbourhood) until the frontier is empty, so the number of iterations is the
largest finite distance plus one (under ``vmap``: the largest in the batch).

Unreachable cells (and every cell when the source itself is not free) hold
:data:`UNREACHABLE`, a constant larger than any distance on a 64x64 canvas and small enough
that the sum of two of them still fits in int16.
"""

from __future__ import annotations

from typing import Any, Optional

import chex
import jax
import jax.numpy as jnp

from jaxlake.types import Lake, LakeStats

#: Distance reported for cells that cannot be reached (> 64*64, and 2*UNREACHABLE < 2**15).
UNREACHABLE = 10_000


def _dilate(mask: jax.Array) -> jax.Array:
    """``mask`` OR its four axis-neighbours, over the last two axes (no wrap-around)."""
    false_row = jnp.zeros_like(mask[..., :1, :])
    false_col = jnp.zeros_like(mask[..., :, :1])
    up = jnp.concatenate([mask[..., 1:, :], false_row], axis=-2)
    down = jnp.concatenate([false_row, mask[..., :-1, :]], axis=-2)
    left = jnp.concatenate([mask[..., :, 1:], false_col], axis=-1)
    right = jnp.concatenate([false_col, mask[..., :, :-1]], axis=-1)
    return mask | up | down | left | right


def bfs_distances(free: jax.Array, seeds: jax.Array, dtype: Any = jnp.int32) -> jax.Array:
    """Distances from the seed cells of each of ``K`` searches, through ``free`` cells.

    Args:
      free: ``[H, W]`` bool, cells that may be entered (and left).
      seeds: ``[K, H, W]`` bool, the source cells of each search (distance 0). Seeds that are
        not free are ignored.
      dtype: integer dtype of the result (int16 halves the memory traffic of big batches).

    Returns:
      ``[K, H, W]`` distances; :data:`UNREACHABLE` where no free path exists.
    """
    chex.assert_rank(free, 2)
    chex.assert_rank(seeds, 3)
    free = free.astype(bool)
    frontier = seeds.astype(bool) & free
    dist = jnp.where(frontier, 0, UNREACHABLE).astype(dtype)

    def cond(carry):
        _, frontier, _, _ = carry
        return jnp.any(frontier)

    def body(carry):
        k, frontier, visited, dist = carry
        new = _dilate(frontier) & free & ~visited
        dist = jnp.where(new, (k + 1).astype(dtype), dist)
        return k + 1, new, visited | new, dist

    _, _, _, dist = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), frontier, frontier, dist))
    return dist


def distance_field(free: jax.Array, source: jax.Array) -> jax.Array:
    """BFS distance from ``source`` to every cell, moving through ``free`` cells.

    Args:
      free: ``[H, W]`` bool.
      source: ``[2]`` int32 ``(row, col)``.

    Returns:
      ``[H, W]`` int32; :data:`UNREACHABLE` for cells with no free path from ``source``
      (everywhere if ``source`` is not a free cell or lies off the canvas).
    """
    chex.assert_rank(free, 2)
    chex.assert_shape(source, (2,))
    h, w = free.shape
    rows = jnp.arange(h)[:, None]
    cols = jnp.arange(w)[None, :]
    seed = (rows == source[0]) & (cols == source[1])
    return bfs_distances(free, seed[None], jnp.int32)[0]


def distance_fields(free: jax.Array, sources: jax.Array) -> jax.Array:
    """:func:`distance_field` for each of ``K`` sources: ``[K, 2]`` -> ``[K, H, W]`` int32."""
    chex.assert_rank(sources, 2)
    h, w = free.shape
    rows = jnp.arange(h)[None, :, None]
    cols = jnp.arange(w)[None, None, :]
    seeds = (rows == sources[:, 0, None, None]) & (cols == sources[:, 1, None, None])
    return bfs_distances(free, seeds, jnp.int32)


def shortest_path_cells(dist_start: jax.Array, dist_goal: jax.Array, length: jax.Array) -> jax.Array:
    """``SP = {c : Ds(c) + Dg(c) = length}``, empty when ``length`` is unreachable.

    Works on any matching shapes (``length`` broadcasts against the fields' leading axes when
    given with trailing singleton axes).
    """
    reachable = length < UNREACHABLE
    total = dist_start.astype(jnp.int32) + dist_goal.astype(jnp.int32)
    return (total == length) & reachable


def pair_conflicts(sp: jax.Array, present: jax.Array) -> jax.Array:
    """``[A, A]`` bool: agents i != j both present whose shortest-path cell sets intersect.

    Args:
      sp: ``[A, ...]`` bool shortest-path cell sets.
      present: ``[A]`` bool agents in play.
    """
    a = sp.shape[0]
    flat = sp.reshape(a, -1)
    meet = jnp.any(flat[:, None, :] & flat[None, :, :], axis=-1)
    pair = present[:, None] & present[None, :] & ~jnp.eye(a, dtype=bool)
    return meet & pair


def conflict_density_from_pairs(conflicts: jax.Array, num_agents: jax.Array) -> jax.Array:
    """Share of conflicting agent pairs given the symmetric ``[A, A]`` pair matrix."""
    n = jnp.asarray(num_agents, jnp.int32)
    pairs = n * (n - 1) // 2
    count = jnp.sum(jnp.triu(conflicts, k=1))
    return jnp.where(pairs > 0, count / jnp.maximum(pairs, 1), 0.0).astype(jnp.float32)


def lake_stats(lake: Lake, min_dist: Any = 1, max_dist: Optional[Any] = None) -> LakeStats:
    """Recompute a lake's :class:`LakeStats` from its cells (DESIGN §4 definitions).

    Args:
      lake: one (unbatched) lake; ``vmap`` for batches.
      min_dist, max_dist: distance bounds for ``dist_ok`` (``max_dist=None``: no upper bound).

    Returns:
      ``LakeStats`` with the achieved hole density (holes / region cells), conflict density
      (share of present agent pairs whose shortest-path cell sets intersect; 0 below two
      agents), ``path_len`` (BFS start-goal distance; -1 for absent slots, ``UNREACHABLE``
      when a present agent cannot reach its goal), ``dist_ok`` (every present agent's goal is
      reachable within ``[min_dist, max_dist]``) and ``attempts = 1``.
    """
    chex.assert_rank(lake.holes, 2)
    chex.assert_rank(lake.starts, 2)
    free = lake.region & ~lake.holes
    present = lake.agent_mask
    ds = distance_fields(free, lake.starts)
    dg = distance_fields(free, lake.goals)
    a = lake.starts.shape[0]
    length = ds[jnp.arange(a), lake.goals[:, 0], lake.goals[:, 1]]
    sp = shortest_path_cells(ds, dg, length[:, None, None])
    conflicts = pair_conflicts(sp, present)
    density = conflict_density_from_pairs(conflicts, lake.num_agents)
    region_cells = jnp.sum(lake.region)
    hole_density = (jnp.sum(lake.holes & lake.region) / jnp.maximum(region_cells, 1)).astype(jnp.float32)
    upper = UNREACHABLE - 1 if max_dist is None else max_dist
    in_bounds = (length >= min_dist) & (length <= upper) & (length < UNREACHABLE)
    dist_ok = jnp.all(in_bounds | ~present)
    path_len = jnp.where(present, length, -1).astype(jnp.int32)
    return LakeStats(
        hole_density=hole_density,
        conflict_density=density,
        path_len=path_len,
        dist_ok=dist_ok,
        attempts=jnp.ones((), jnp.int32),
    )
