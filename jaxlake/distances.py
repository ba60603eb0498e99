"""BFS distances through frozen cells, and the per-lake statistics built on them (docs/rules.md#densities).

Everything here is a pure function of static shapes: ``jax.jit`` and ``jax.vmap`` work on all
of it.

**Engine.** Breadth-first search runs on bit strings: a ``H x W`` cell mask is packed
row-major into ``nw = ceil(H*W/32)`` uint32 words (cell ``r*W + c`` is bit ``(r*W+c) % 32`` of
word ``(r*W+c) // 32``), so one word operation advances 32 cells. Packed arrays keep the word
axis second to last and a *batch axis last* (``[..., nw, B]``): XLA vectorises along the
minor axis, so many lakes advance together in SIMD lanes (the generator runs whole batches
this way; single-lake functions use ``B = 1``). A ``lax.while_loop`` grows every frontier by
one ring per iteration (4-neighbourhood) until all are empty; distances are accumulated
bit-sliced (one bit plane per binary digit), which keeps the loop body word-parallel.

Unreachable cells (and every cell when the source itself is not free) report
:data:`UNREACHABLE`, larger than any distance on a 64x64 canvas.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxlake.types import Lake, LakeStats

#: Distance reported for cells that cannot be reached (> 64*64, and 2*UNREACHABLE < 2**15).
UNREACHABLE = 10_000

WORD_BITS = 32


def num_words(num_cells: int) -> int:
    """uint32 words needed to hold ``num_cells`` bits."""
    return -(-num_cells // WORD_BITS)


def num_planes(num_cells: int) -> int:
    """Bit planes needed for any distance on ``num_cells`` cells (at most ``num_cells - 1``)."""
    return max(1, (num_cells - 1).bit_length())


# ============================================================================ packing
def pack(cells: jax.Array) -> jax.Array:
    """Pack bools ``[..., N, B]`` (cell axis second to last) into words ``[..., nw, B]`` uint32."""
    *lead, n, b = cells.shape
    nw = num_words(n)
    x = cells.astype(jnp.uint32)
    x = jnp.pad(x, [(0, 0)] * len(lead) + [(0, nw * WORD_BITS - n), (0, 0)])
    x = x.reshape(*lead, nw, WORD_BITS, b)
    shifts = jnp.arange(WORD_BITS, dtype=jnp.uint32)[:, None]
    return jnp.sum(x << shifts, axis=-2, dtype=jnp.uint32)


def unpack(words: jax.Array, num_cells: int) -> jax.Array:
    """Inverse of :func:`pack`: ``[..., nw, B]`` uint32 -> ``[..., num_cells, B]`` bool."""
    *lead, nw, b = words.shape
    shifts = jnp.arange(WORD_BITS, dtype=jnp.uint32)[:, None]
    bits = (words[..., :, None, :] >> shifts) & jnp.uint32(1)
    return bits.reshape(*lead, nw * WORD_BITS, b)[..., :num_cells, :].astype(bool)


def one_cell_words(cells: jax.Array, num_cells: int) -> jax.Array:
    """Packed singletons: flat cell indices ``[..., B]`` -> ``[..., nw, B]`` uint32."""
    nw = num_words(num_cells)
    cells = cells.astype(jnp.int32)
    word = jnp.arange(nw, dtype=jnp.int32)[:, None]
    bit = jnp.left_shift(jnp.uint32(1), (cells % WORD_BITS).astype(jnp.uint32))
    return jnp.where(word == (cells // WORD_BITS)[..., None, :], bit[..., None, :], jnp.uint32(0))


def _shift(x: jax.Array, s: int) -> jax.Array:
    """Shift bit strings ``[..., nw, B]`` by ``s`` bits toward higher (``s > 0``) or lower indices."""
    nw = x.shape[-2]
    q, r = divmod(abs(s), WORD_BITS)
    if q >= nw:
        return jnp.zeros_like(x)
    pad = jnp.zeros(x.shape[:-2] + (max(q, 1),) + x.shape[-1:], x.dtype)
    if s > 0:
        y = jnp.concatenate([pad[..., :q, :], x[..., : nw - q, :]], axis=-2) if q else x
        if r:
            carry = jnp.concatenate([pad[..., :1, :], y[..., :-1, :]], axis=-2)
            y = (y << r) | (carry >> (WORD_BITS - r))
    else:
        y = jnp.concatenate([x[..., q:, :], pad[..., :q, :]], axis=-2) if q else x
        if r:
            carry = jnp.concatenate([y[..., 1:, :], pad[..., :1, :]], axis=-2)
            y = (y >> r) | (carry << (WORD_BITS - r))
    return y


@functools.lru_cache(maxsize=None)
def _column_masks(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Packed ``[nw, 1]`` masks of the cells not in the first / not in the last column."""
    cols = np.tile(np.arange(w), h)
    nw = num_words(h * w)

    def pack_np(mask: np.ndarray) -> np.ndarray:
        bits = np.zeros(nw * WORD_BITS, np.uint64)
        bits[: h * w] = mask
        words = (bits.reshape(nw, WORD_BITS) << np.arange(WORD_BITS, dtype=np.uint64)).sum(-1)
        return words.astype(np.uint32)[:, None]

    return pack_np(cols != 0), pack_np(cols != w - 1)


def neighbours(x: jax.Array, h: int, w: int) -> jax.Array:
    """Packed cells 4-adjacent to a cell of ``x`` (``[..., nw, B]``; bits past ``h*w`` are garbage)."""
    not_first, not_last = _column_masks(h, w)
    right = _shift(x, 1) & jnp.asarray(not_first)  # (r, c) -> (r, c + 1)
    left = _shift(x, -1) & jnp.asarray(not_last)  # (r, c) -> (r, c - 1)
    return left | right | _shift(x, w) | _shift(x, -w)


# ============================================================================ BFS
def bfs_packed(free: jax.Array, seeds: jax.Array, h: int, w: int) -> tuple[jax.Array, jax.Array]:
    """BFS of ``K`` packed seed sets per lake, batch last.

    Args:
      free: ``[nw, B]`` packed cells that may be entered (garbage bits past ``h*w`` must be 0).
      seeds: ``[K, nw, B]`` packed sources (distance 0); seeds on cells not free are ignored.
      h, w: static canvas shape.

    Returns:
      ``(visited, planes)``: ``visited [K, nw, B]`` the cells reached, and ``planes
      [P, K, nw, B]`` with bit ``p`` of each reached cell's distance in plane ``p``
      (``P = num_planes(h*w)``).
    """
    n = h * w
    chex.assert_shape(free, (num_words(n), None))
    chex.assert_rank(seeds, 3)
    count = num_planes(n)
    frontier = seeds & free[None]
    digits = jnp.arange(count, dtype=jnp.uint32)[:, None, None, None]

    def cond(carry):
        return carry[4]

    def body(carry):
        k, frontier, visited, planes, _ = carry
        new = neighbours(frontier, h, w) & free[None] & ~visited
        k = k + jnp.uint32(1)
        select = jnp.uint32(0) - ((k >> digits) & jnp.uint32(1))
        planes = planes | (new[None] & select)
        return k, new, visited | new, planes, jnp.any(new != 0)

    planes = jnp.zeros((count,) + frontier.shape, jnp.uint32)
    init = (jnp.zeros((), jnp.uint32), frontier, frontier, planes, jnp.any(frontier != 0))
    _, _, visited, planes, _ = jax.lax.while_loop(cond, body, init)
    return visited, planes


def decode(visited: jax.Array, planes: jax.Array, num_cells: int) -> jax.Array:
    """Distances ``[K, N, B]`` int32 from :func:`bfs_packed` output (``UNREACHABLE`` if unvisited)."""
    weights = jnp.left_shift(1, jnp.arange(planes.shape[0], dtype=jnp.int32))[:, None, None, None]
    dist = jnp.sum(unpack(planes, num_cells).astype(jnp.int32) * weights, axis=0)
    return jnp.where(unpack(visited, num_cells), dist, UNREACHABLE)


def bfs_distances(free: jax.Array, seeds: jax.Array) -> jax.Array:
    """Distances from the seed cells of each of ``K`` searches, through ``free`` cells.

    Args:
      free: ``[H, W]`` bool, cells that may be entered (and left).
      seeds: ``[K, H, W]`` bool, the source cells of each search (distance 0). Seeds that are
        not free are ignored.

    Returns:
      ``[K, H, W]`` int32 distances; :data:`UNREACHABLE` where no free path exists.
    """
    chex.assert_rank(free, 2)
    chex.assert_rank(seeds, 3)
    h, w = free.shape
    n = h * w
    k = seeds.shape[0]
    free_words = pack(free.astype(bool).reshape(n, 1))
    seed_words = pack(seeds.astype(bool).reshape(k, n, 1))
    visited, planes = bfs_packed(free_words, seed_words, h, w)
    return decode(visited, planes, n).reshape(k, h, w)


def distance_field(free: jax.Array, source: jax.Array) -> jax.Array:
    """BFS distance from ``source`` to every cell, moving through ``free`` cells.

    Args:
      free: ``[H, W]`` bool.
      source: ``[2]`` int32 ``(row, col)``.

    Returns:
      ``[H, W]`` int32; :data:`UNREACHABLE` for cells with no free path from ``source``
      (everywhere if ``source`` is not a free cell or lies off the canvas).
    """
    chex.assert_shape(source, (2,))
    return distance_fields(free, source[None])[0]


def distance_fields(free: jax.Array, sources: jax.Array) -> jax.Array:
    """:func:`distance_field` for each of ``K`` sources: ``[K, 2]`` -> ``[K, H, W]`` int32."""
    chex.assert_rank(free, 2)
    chex.assert_shape(sources, (None, 2))
    h, w = free.shape
    rows = jnp.arange(h)[None, :, None]
    cols = jnp.arange(w)[None, None, :]
    seeds = (rows == sources[:, 0, None, None]) & (cols == sources[:, 1, None, None])
    return bfs_distances(free, seeds)


# ============================================================================ statistics
def shortest_path_cells(dist_start: jax.Array, dist_goal: jax.Array, length: jax.Array) -> jax.Array:
    """``SP = {c : Ds(c) + Dg(c) = length}``; empty when ``length`` is unreachable.

    ``length`` broadcasts against the fields (give it trailing singleton axes).
    """
    total = dist_start.astype(jnp.int32) + dist_goal.astype(jnp.int32)
    return (total == length) & (length < UNREACHABLE)


def pair_conflicts(sp: jax.Array, present: jax.Array) -> jax.Array:
    """``[A, A]`` bool: agents ``i != j``, both present, whose cell sets ``sp [A, ...]`` meet."""
    a = sp.shape[0]
    flat = sp.reshape(a, -1)
    meet = jnp.any(flat[:, None, :] & flat[None, :, :], axis=-1)
    return meet & present[:, None] & present[None, :] & ~jnp.eye(a, dtype=bool)


def conflict_density_from_pairs(conflicts: jax.Array, num_agents: jax.Array) -> jax.Array:
    """Share of conflicting agent pairs, from the symmetric ``[A, A]`` pair matrix (0 below 2 agents)."""
    n = jnp.asarray(num_agents, jnp.int32)
    pairs = n * (n - 1) // 2
    count = jnp.sum(jnp.triu(conflicts, k=1))
    return jnp.where(pairs > 0, count / jnp.maximum(pairs, 1), 0.0).astype(jnp.float32)


def lake_stats(lake: Lake, min_dist: Any = 1, max_dist: Optional[Any] = None) -> LakeStats:
    """Recompute a lake's :class:`LakeStats` from its cells (definitions: docs/rules.md#densities).

    Args:
      lake: one (unbatched) lake; ``vmap`` for batches.
      min_dist, max_dist: distance bounds for ``dist_ok`` (``max_dist=None``: no upper bound).

    Returns:
      ``LakeStats`` with the hole density (holes / region cells), the conflict density (share
      of present agent pairs whose shortest-path cell sets intersect; 0 below two agents),
      ``path_len`` (BFS start-goal distance through frozen cells; -1 for absent slots,
      :data:`UNREACHABLE` when a present agent cannot reach its goal), ``dist_ok`` (every
      present agent's goal is reachable within ``[min_dist, max_dist]``) and ``attempts = 1``.
    """
    chex.assert_rank(lake.holes, 2)
    chex.assert_rank(lake.starts, 2)
    free = lake.region & ~lake.holes
    present = lake.agent_mask
    a = lake.starts.shape[0]
    fields = distance_fields(free, jnp.concatenate([lake.starts, lake.goals], axis=0))
    ds, dg = fields[:a], fields[a:]
    length = ds[jnp.arange(a), lake.goals[:, 0], lake.goals[:, 1]]
    sp = shortest_path_cells(ds, dg, length[:, None, None])
    density = conflict_density_from_pairs(pair_conflicts(sp, present), lake.num_agents)
    region_cells = jnp.sum(lake.region)
    hole_density = (jnp.sum(lake.holes & lake.region) / jnp.maximum(region_cells, 1)).astype(jnp.float32)
    upper = UNREACHABLE - 1 if max_dist is None else max_dist
    in_bounds = (length >= min_dist) & (length <= upper) & (length < UNREACHABLE)
    return LakeStats(
        hole_density=hole_density,
        conflict_density=density,
        path_len=jnp.where(present, length, -1).astype(jnp.int32),
        dist_ok=jnp.all(in_bounds | ~present),
        attempts=jnp.ones((), jnp.int32),
    )
