"""The lake generator (docs/rules.md#generator): ``generate(key, config) -> Lake``, batches and mixtures.

Algorithm of one *attempt* (static shapes only, no Python loop over lakes):

1. **Holes and endpoint pool.** One pass of selection sampling over the canvas cells (a
   ``lax.scan``, exact integer arithmetic, one random word per cell) picks a uniform set of
   ``n`` hole cells in the region, ``n = floor(hole_density * cells + u)`` with ``u`` uniform
   (stochastic rounding: the batch mean of ``n`` is ``hole_density * cells``), capped so that
   ``2 * num_agents`` cells stay frozen; and, among the frozen cells, a uniform *pool* of
   ``pool_size`` cells that may become starts or goals (all frozen cells when fewer).
2. **Distances.** One bit-packed BFS from every pool cell (:func:`distances.bfs_packed`)
   gives, bit-sliced, the distance field of every pool cell, hence every pool-pair distance.
3. **Assignment.** Each lake first fixes how many of its agent pairs should conflict:
   ``aim = floor(conflict_density * pairs + u)`` (stochastic rounding, so the batch mean of
   ``aim / pairs`` is the target). Agents are then placed one after the other (``lax.scan``).
   For agent ``i`` the candidates are the unused pool pairs whose distance lies in
   ``[min_dist, max_dist]`` (or, when there is none, every reachable unused pair; the lake is
   then flagged ``dist_ok=False``). ``num_proposals`` pairs are drawn (a uniform start among
   those with a candidate goal, then a uniform goal); each is scored by how many earlier
   agents its shortest-path cell set (docs/rules.md#densities) meets, and the proposal that keeps the
   running count closest to the schedule ``round(aim * pairs(i+1) / pairs)`` wins. When
   ``aim < pairs / 2``, ties go to the narrowest shortest-path set (fewest cells beyond a
   single path), which leaves later agents room to stay apart; low conflict targets
   therefore lean somewhat toward straighter, shorter paths within the distance bounds.

An attempt is *valid* when every agent found a reachable pair and *ok* when moreover every
distance lies in the bounds. Attempts ``0 .. max_attempts-2`` (fresh randomness each) run
until one is ok, the first valid one being kept otherwise; if none was valid, attempt
``max_attempts-1`` uses a hole-free region, where a valid assignment always exists
(validation guarantees ``2 * num_agents <= height * width``). The loop is therefore bounded,
never yields an unreachable goal, and ``stats.attempts`` reports the attempts run. All
statistics are exact for the returned lake (they equal :func:`distances.lake_stats`).

**Batching.** The implementation is written for a batch of lakes with the batch axis *last*
(XLA vectorises along the minor axis, so lakes advance in SIMD lanes). :func:`generate` is a
``jax.custom_batching.custom_vmap``: called alone it runs a batch of one; under ``jax.vmap``
it runs the whole batch in that layout directly. Loops run as long as the slowest lake of the
batch needs, and every lake's result is exactly the one it gets alone.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Optional, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.custom_batching import custom_vmap

from jaxlake.config import (
    DYNAMIC_FIELDS,
    ConfigError,
    LakeConfig,
    config_arrays,
    repeat_config,
    stack_configs,
    with_capacity,
)
from jaxlake.distances import UNREACHABLE, WORD_BITS, bfs_packed, num_words, one_cell_words, pack
from jaxlake.mixture import Mixture, check_weights
from jaxlake.types import Lake, LakeStats

#: Default number of attempts (the last one hole-free, run only if nothing valid was found).
DEFAULT_MAX_ATTEMPTS = 6
#: Default number of candidate pairs scored per agent.
DEFAULT_NUM_PROPOSALS = 12
_FIXED_ONE = 1 << 16  # fixed-point scale of densities in the integer stochastic rounding


def default_pool_size(max_height: int, max_width: int, max_agents: int) -> int:
    """Static pool size: ``max(16, 4 * max_agents)`` cells, at most the canvas."""
    return int(min(max_height * max_width, max(16, 4 * max_agents)))


@dataclasses.dataclass(frozen=True)
class _Static:
    """Static shape and option of one compiled generator."""

    h: int
    w: int
    a: int
    pool: int
    proposals: int
    attempts: int
    chunk: int  # lakes per chunk under vmap; 0: the whole batch at once


@struct.dataclass
class KernelConfig:
    """The dynamic settings the generator kernel reads, one ``[B]`` array per lake of the batch.

    A pytree (``flax.struct``) of :data:`jaxlake.config.DYNAMIC_FIELDS`, in that order; the
    static ones (canvas, agent slots, pool size, proposals, attempts, chunk) are the kernel's
    static arguments (:class:`_Static`), fixed per compilation.

    Attributes:
      height / width: ``[B]`` int32, the region's size.
      num_agents: ``[B]`` int32, agents placed.
      hole_density / conflict_density: ``[B]`` float32 targets.
      slip_prob: ``[B]`` float32, copied to the lake.
      max_steps: ``[B]`` int32, copied to the lake.
      min_dist / max_dist: ``[B]`` int32, the start-goal distance bounds.
      on_goal: ``[B]`` int32 code (``types.ON_GOAL_VANISH`` / ``ON_GOAL_STAY``), copied to the lake.
    """

    height: jax.Array
    width: jax.Array
    num_agents: jax.Array
    hole_density: jax.Array
    conflict_density: jax.Array
    slip_prob: jax.Array
    max_steps: jax.Array
    min_dist: jax.Array
    max_dist: jax.Array
    on_goal: jax.Array

    @classmethod
    def from_leaves(cls, leaves: Sequence[jax.Array]) -> "KernelConfig":
        """From a :class:`LakeConfig`'s leaves (:data:`DYNAMIC_FIELDS` order)."""
        return cls(**dict(zip(DYNAMIC_FIELDS, leaves, strict=True)))


@chex.dataclass
class _Attempt:
    """One attempt's result for a batch, batch axis last."""

    holes: jax.Array  # [N, B] bool
    starts: jax.Array  # [A, 2, B] int32
    goals: jax.Array  # [A, 2, B] int32
    path_len: jax.Array  # [A, B] int32
    n_holes: jax.Array  # [B] int32
    conflicts: jax.Array  # [B] int32
    valid: jax.Array  # [B] bool
    dist_ok: jax.Array  # [B] bool


# ============================================================================ one attempt
def _random_words(st: _Static, keys: jax.Array, attempt: jax.Array, count: int) -> jax.Array:
    """``[count, B]`` uint32 random words of each lake's attempt ``attempt``."""

    def one(key_data: jax.Array) -> jax.Array:
        key = jax.random.wrap_key_data(key_data, impl="threefry2x32")
        return jax.random.bits(jax.random.fold_in(key, attempt), (count,), jnp.uint32)

    return jax.vmap(one)(keys).T


def _fixed(x: jax.Array) -> jax.Array:
    """A float in [0, 1] as an int32 multiple of ``2**-16`` (exact scaling, then rounding)."""
    return jnp.round(x.astype(jnp.float32) * jnp.float32(_FIXED_ONE)).astype(jnp.int32)


def _sum_equals(x: jax.Array, y: jax.Array, length: jax.Array) -> jax.Array:
    """Packed cells where ``x + y == length``, for bit-sliced ``x, y [P, ..., nw, B]``.

    ``length`` is ``[...,  B]`` (broadcast over words) and below ``2**P``.
    """
    carry = jnp.zeros_like(x[0])
    equal = ~jnp.zeros_like(x[0])
    for bit in range(x.shape[0]):
        xb, yb = x[bit], y[bit]
        half = xb ^ yb
        total = half ^ carry
        carry = (xb & yb) | (carry & half)
        want = jnp.uint32(0) - ((length >> bit) & 1).astype(jnp.uint32)
        equal = equal & ~(total ^ want[..., None, :])
    return equal & ~carry


def _take(x: jax.Array, index: jax.Array, axis: int) -> jax.Array:
    """``take_along_axis`` with ``index`` broadcast to ``x``'s shape off ``axis`` (batch last)."""
    shape = list(x.shape)
    shape[axis] = index.shape[axis]
    return jnp.take_along_axis(x, jnp.broadcast_to(index, shape), axis=axis, mode="clip")


def _cumsum(x: jax.Array, axis: int) -> jax.Array:
    """Inclusive prefix sum (log-depth; ``jnp.cumsum`` lowers quadratically on CPU)."""
    return jax.lax.associative_scan(jnp.add, x, axis=axis)


def _draw(count: jax.Array, words: jax.Array) -> jax.Array:
    """Uniform index in ``[0, count)`` from random ``words`` (``count = 0`` gives 0)."""
    return (words % jnp.maximum(count, 1).astype(jnp.uint32)).astype(jnp.int32)


def _nth_true(cum: jax.Array, n: jax.Array, axis: int) -> jax.Array:
    """Index of the ``n``-th True (from 0) given the inclusive prefix count ``cum``."""
    return jnp.sum(cum <= jnp.expand_dims(n, axis), axis=axis, dtype=jnp.int32)


def _attempt(st: _Static, keys: jax.Array, cfg: KernelConfig, attempt: jax.Array, hole_free: jax.Array) -> _Attempt:
    """One attempt for every lake of the batch (see the module docstring); batch axis last."""
    h, w, a, k_pool, p = st.h, st.w, st.a, st.pool, st.proposals
    n = h * w
    nw = num_words(n)
    b = keys.shape[0]
    height, width, num_agents = cfg.height, cfg.width, cfg.num_agents
    cells = height * width

    words = _random_words(st, keys, attempt, n + 1 + a * 2 * p)
    cell_words, round_word, agent_words = words[:n], words[n], words[n + 1 :].reshape(a, 2 * p, b)

    # ---- holes and pool: selection sampling over the cells in row-major order
    flat = jnp.arange(n, dtype=jnp.int32)
    region = ((flat // w)[:, None] < height) & ((flat % w)[:, None] < width)  # [N, B]
    n_holes = (_fixed(cfg.hole_density) * cells + (round_word >> 16).astype(jnp.int32)) >> 16
    n_holes = jnp.where(hole_free, 0, jnp.clip(n_holes, 0, cells - 2 * num_agents))
    slots = jnp.arange(k_pool, dtype=jnp.int32)[:, None]

    def select(carry, x):
        holes_left, region_left, pool_left, pool_cell = carry
        cell, word, inside = x
        j = _draw(region_left, word)
        is_hole = inside & (j < holes_left)
        is_pool = inside & ~is_hole & (j - holes_left < pool_left)
        pool_cell = jnp.where(is_pool & (slots == k_pool - pool_left), cell, pool_cell)
        carry = (holes_left - is_hole, region_left - inside, pool_left - is_pool, pool_cell)
        return carry, is_hole

    init = (n_holes, cells, jnp.full((b,), k_pool, jnp.int32), jnp.full((k_pool, b), -1, jnp.int32))
    (_, _, _, pool_cell), holes = jax.lax.scan(select, init, (flat, cell_words, region))
    filled = pool_cell >= 0  # [K, B]
    seeds = jnp.where(filled[:, None], one_cell_words(jnp.maximum(pool_cell, 0), n), jnp.uint32(0))
    free = pack(region & ~holes)  # [nw, B]

    # ---- distances from every pool cell; pool-pair distance and reachability [K, K, B]
    visited, planes = bfs_packed(free, seeds, h, w)
    word_of = (jnp.maximum(pool_cell, 0) // WORD_BITS)[None]  # [1, K(t), B]
    bit_of = (jnp.maximum(pool_cell, 0) % WORD_BITS).astype(jnp.uint32)[None]

    def at_pool(x):  # [..., K(s), nw, B] -> bit of each pool cell t: [..., K(s), K(t), B]
        return (_take(x, word_of, axis=-2) >> bit_of) & jnp.uint32(1)

    digit = jnp.left_shift(1, jnp.arange(planes.shape[0], dtype=jnp.int32))[:, None, None, None]
    pair = jnp.sum(at_pool(planes).astype(jnp.int32) * digit, axis=0)  # [K, K, B]
    distinct = ~jnp.eye(k_pool, dtype=bool)[:, :, None]
    reach = (at_pool(visited) != 0) & filled[None] & distinct
    in_bounds = reach & (pair >= cfg.min_dist) & (pair <= cfg.max_dist)
    # conflicting pairs this lake aims at: stochastic rounding of conflict_density * pairs
    pairs = num_agents * (num_agents - 1) // 2
    aim = (_fixed(cfg.conflict_density) * pairs + (round_word & jnp.uint32(0xFFFF)).astype(jnp.int32)) >> 16
    narrow = 2 * aim < pairs  # break ties toward narrow shortest-path sets

    def place(carry, x):
        used, sp_all, conflicts, valid, dist_ok = carry
        i, bits = x
        present = i < num_agents
        avail = ~used[:, None] & ~used[None, :]
        good = in_bounds & avail
        use_good = jnp.any(good, axis=(0, 1))
        cand = jnp.where(use_good, good, reach & avail)  # [K(s), K(g), B]
        row_count = jnp.sum(cand, axis=1, dtype=jnp.int32)  # [K, B]
        has_row = row_count > 0
        starts_cum = _cumsum(has_row.astype(jnp.int32), axis=0)
        found = starts_cum[-1] > 0
        # proposals: a uniform start among those with a candidate goal, then a uniform goal
        s = _nth_true(starts_cum[None], _draw(starts_cum[-1], bits[:p]), axis=1)  # [P, B]
        s = jnp.minimum(s, k_pool - 1)
        row = _take(cand, s[:, None], axis=0)  # [P, K, B]
        g = _nth_true(_cumsum(row.astype(jnp.int32), axis=1), _draw(_take(row_count, s, 0), bits[p : 2 * p]), 1)
        g = jnp.minimum(g, k_pool - 1)
        length = jnp.squeeze(_take(_take(pair, s[:, None], 0), g[:, None], 1), 1)  # [P, B]
        ps = _take(planes, s[None, :, None], axis=1)  # [bits, P, nw, B]
        pg = _take(planes, g[None, :, None], axis=1)
        sp = _sum_equals(ps, pg, length)
        sp = sp & _take(visited, s[:, None], 0) & _take(visited, g[:, None], 0)  # [P, nw, B]
        meets = jnp.sum(jnp.any((sp[:, None] & sp_all[None]) != 0, axis=-2), axis=1, dtype=jnp.int32)
        # steer the running count along the schedule aim * pairs(i+1) / pairs (rounded)
        done_pairs = i * (i + 1) // 2
        wanted = (2 * aim * done_pairs + pairs) // jnp.maximum(2 * pairs, 1) - conflicts
        # ties: with a low aim prefer narrow shortest-path sets (fewest cells beyond one
        # path): they leave later agents room to stay apart without shortening paths much
        size = jnp.sum(jax.lax.population_count(sp), axis=1, dtype=jnp.int32)  # [P, B]
        tie = jnp.where(narrow, size - length, 0)
        score = jnp.abs(meets - wanted[None]) * (n + 1) + tie
        best = jnp.argmin(score, axis=0).astype(jnp.int32)[None]  # [1, B]
        take = present & found
        s_b, g_b = _take(s, best, 0)[0], _take(g, best, 0)[0]
        used = used | (take & ((slots == s_b) | (slots == g_b)))
        sp_best = jnp.where(take, _take(sp, best[:, None], 0)[0], jnp.uint32(0))
        sp_all = jax.lax.dynamic_update_index_in_dim(sp_all, sp_best, i, 0)
        conflicts = conflicts + jnp.where(take, _take(meets, best, 0)[0], 0)
        valid = valid & (found | ~present)
        dist_ok = dist_ok & (use_good | ~present)
        s_cell = _take(pool_cell, s_b[None], 0)[0]
        g_cell = _take(pool_cell, g_b[None], 0)[0]
        start = jnp.where(take, jnp.stack([s_cell // w, s_cell % w]), 0)
        goal = jnp.where(take, jnp.stack([g_cell // w, g_cell % w]), 0)
        path_len = jnp.where(present, jnp.where(found, _take(length, best, 0)[0], UNREACHABLE), -1)
        return (used, sp_all, conflicts, valid, dist_ok), (start, goal, path_len)

    init = (
        jnp.zeros((k_pool, b), bool),
        jnp.zeros((a, nw, b), jnp.uint32),
        jnp.zeros((b,), jnp.int32),
        jnp.ones((b,), bool),
        jnp.ones((b,), bool),
    )
    xs = (jnp.arange(a, dtype=jnp.int32), agent_words)
    (_, _, conflicts, valid, dist_ok), (starts, goals, path_len) = jax.lax.scan(place, init, xs)
    return _Attempt(
        holes=holes,
        starts=starts.astype(jnp.int32),
        goals=goals.astype(jnp.int32),
        path_len=path_len.astype(jnp.int32),
        n_holes=n_holes.astype(jnp.int32),
        conflicts=conflicts,
        valid=valid,
        dist_ok=valid & dist_ok,
    )


# ============================================================================ batch with retries
def _generate_many(st: _Static, keys: jax.Array, cfg: KernelConfig) -> Lake:
    """Generate ``B`` lakes: ``keys [B, ...]`` key data, ``cfg`` each field ``[B]``."""
    b = keys.shape[0]
    h, w, a = st.h, st.w, st.a
    last = st.attempts - 1

    def run(k: jax.Array) -> _Attempt:
        return _attempt(st, keys, cfg, k, jnp.broadcast_to(k == last, (b,)))

    def needs(k: jax.Array, best: _Attempt) -> jax.Array:
        return jnp.where(k < last, ~best.dist_ok, (k == last) & ~best.valid)

    def cond(carry):
        k, best, _ = carry
        return jnp.any(needs(k, best))

    def body(carry):
        k, best, used = carry
        active = needs(k, best)
        new = run(k)
        better = active & ((new.valid & ~best.valid) | (new.dist_ok & ~best.dist_ok))
        best = jax.tree_util.tree_map(lambda x, y: jnp.where(better, x, y), new, best)
        return k + 1, best, jnp.where(active, k + 1, used)

    none = _Attempt(
        holes=jnp.zeros((h * w, b), bool),
        starts=jnp.zeros((a, 2, b), jnp.int32),
        goals=jnp.zeros((a, 2, b), jnp.int32),
        path_len=jnp.zeros((a, b), jnp.int32),
        n_holes=jnp.zeros((b,), jnp.int32),
        conflicts=jnp.zeros((b,), jnp.int32),
        valid=jnp.zeros((b,), bool),
        dist_ok=jnp.zeros((b,), bool),
    )
    zero = jnp.zeros((), jnp.int32)
    _, best, used = jax.lax.while_loop(cond, body, (zero, none, jnp.zeros((b,), jnp.int32)))

    height, width, num_agents = cfg.height, cfg.width, cfg.num_agents
    cells = height * width
    pairs = num_agents * (num_agents - 1) // 2
    region = (jnp.arange(h)[None, :, None] < height[:, None, None]) & (jnp.arange(w)[None, None, :] < width[:, None, None])
    stats = LakeStats(
        hole_density=(best.n_holes / cells).astype(jnp.float32),
        conflict_density=jnp.where(pairs > 0, best.conflicts / jnp.maximum(pairs, 1), 0.0).astype(jnp.float32),
        path_len=best.path_len.T,
        dist_ok=best.dist_ok,
        attempts=used,
    )
    return Lake(
        holes=best.holes.T.reshape(b, h, w),
        region=region,
        starts=jnp.transpose(best.starts, (2, 0, 1)),
        goals=jnp.transpose(best.goals, (2, 0, 1)),
        num_agents=num_agents.astype(jnp.int32),
        slip_prob=cfg.slip_prob.astype(jnp.float32),
        max_steps=cfg.max_steps.astype(jnp.int32),
        on_goal=cfg.on_goal.astype(jnp.int32),
        stats=stats,
    )


#: Default lakes per chunk under ``vmap``, per backend: chunks keep the CPU working set in
#: cache (fewer for big canvases, see :func:`default_chunk_size`); accelerators take the
#: whole batch at once.
DEFAULT_CHUNK = {"cpu": 1024}
_CHUNK_BYTES = 1 << 24  # CPU: aim at ~16 MiB of distance bit planes per chunk


def default_chunk_size(max_height: int, max_width: int, max_agents: int, backend: Optional[str] = None) -> int:
    """Lakes per ``lax.map`` step under ``vmap`` (0: whole batch) for a canvas on ``backend``."""
    chunk = DEFAULT_CHUNK.get(backend or jax.default_backend(), 0)
    if chunk <= 0:
        return 0
    n = max_height * max_width
    plane_bytes = max(1, (n - 1).bit_length()) * default_pool_size(max_height, max_width, max_agents) * num_words(n) * 4
    return int(max(64, min(chunk, _CHUNK_BYTES // plane_bytes)))


def _generate_chunked(st: _Static, keys: jax.Array, cfg: KernelConfig, size: int) -> Lake:
    """:func:`_generate_many` over chunks of ``st.chunk`` lakes (``lax.map``)."""
    chunk = st.chunk
    if chunk <= 0 or size <= chunk:
        return _generate_many(st, keys, cfg)
    chunks = -(-size // chunk)
    pad = chunks * chunk - size

    def split(x):
        x = jnp.concatenate([x, jnp.broadcast_to(x[:1], (pad,) + x.shape[1:])]) if pad else x
        return x.reshape((chunks, chunk) + x.shape[1:])

    out = jax.lax.map(lambda args: _generate_many(st, args[0], args[1]),
                      (split(keys), jax.tree_util.tree_map(split, cfg)))
    return jax.tree_util.tree_map(lambda x: x.reshape((chunks * chunk,) + x.shape[2:])[:size], out)


@functools.lru_cache(maxsize=None)
def _generator(st: _Static):
    """The ``custom_vmap`` generator for one static setting ``st`` (the static arguments);
    its array arguments are the key data and the config's leaves, which the kernel reads as a
    :class:`KernelConfig`."""

    @custom_vmap
    def gen(key_data, *leaves):
        lake = _generate_many(st, key_data[None], KernelConfig.from_leaves([x[None] for x in leaves]))
        return jax.tree_util.tree_map(lambda x: x[0], lake)

    @gen.def_vmap
    def _batched(axis_size, in_batched, key_data, *leaves):
        args = [
            x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)
            for x, batched in zip((key_data,) + leaves, in_batched)
        ]
        lake = _generate_chunked(st, args[0], KernelConfig.from_leaves(args[1:]), axis_size)
        return lake, jax.tree_util.tree_map(lambda _: True, lake)

    return jax.jit(gen)


def _static_for(
    config: LakeConfig,
    key: Any,
    max_attempts: int,
    pool_size: Optional[int],
    num_proposals: int,
    chunk_size: Optional[int],
) -> tuple[_Static, jax.Array]:
    """Check the static options; return them with the key as threefry key data ``uint32[2]``."""
    if not isinstance(config, LakeConfig):
        raise ConfigError(f"config must be a LakeConfig, got {type(config).__name__}")
    h, w, a = config.max_height, config.max_width, config.max_agents
    k_pool = default_pool_size(h, w, a) if pool_size is None else int(pool_size)
    lowest = min(2 * a, h * w)
    if not lowest <= k_pool <= h * w:
        raise ConfigError(f"pool_size={k_pool} not in [{lowest}, {h * w}] (2 * max_agents .. canvas cells)")
    if int(max_attempts) < 2:
        raise ConfigError(f"max_attempts={max_attempts} not in [2, inf)")
    if int(num_proposals) < 1:
        raise ConfigError(f"num_proposals={num_proposals} not in [1, inf)")
    chunk = default_chunk_size(h, w, a) if chunk_size is None else int(chunk_size)
    if chunk < 0:
        raise ConfigError(f"chunk_size={chunk_size} not in [0, inf) (0: no chunking)")
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(jnp.asarray(key, jnp.uint32))  # raw key: the default impl
    data = jax.random.key_data(key)
    if str(jax.random.key_impl(key)) != "threefry2x32":
        # other implementations (rbg, ...) are not vmap-invariant: fold their key words into a
        # threefry key, so a lake never depends on the batch it was generated in
        words = data.reshape(data.shape[:-1] + (-1, 2))
        data = functools.reduce(jnp.bitwise_xor, [words[..., i, :] for i in range(words.shape[-2])])
    return _Static(h, w, a, k_pool, int(num_proposals), int(max_attempts), chunk), data


# ============================================================================ public API
def generate(
    key: jax.Array,
    config: LakeConfig,
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    pool_size: Optional[int] = None,
    num_proposals: int = DEFAULT_NUM_PROPOSALS,
    chunk_size: Optional[int] = None,
) -> Lake:
    """Generate one lake (docs/rules.md#generator-guarantees); pure and deterministic in ``key``.

    ``jax.jit(generate)`` and ``jax.vmap(generate)(keys, stacked_config)`` work; a stacked
    config (:func:`config.stack_configs`, :func:`config.repeat_config`) mixes settings in one
    compiled batch, each lake equal to the one generated alone from its key and config.

    Args:
      key: a JAX PRNG key (typed or raw ``uint32``; keys of implementations other than
        threefry are folded into a threefry key, so every lake is vmap-invariant).
      config: a validated :class:`LakeConfig` (dynamic fields may be traced).
      max_attempts: static, at least 2; the last attempt is the hole-free fallback.
      pool_size: static number of cells that may become starts/goals per attempt (default
        :func:`default_pool_size`); between ``2 * max_agents`` and the canvas size.
      num_proposals: static number of candidate pairs scored per agent.
      chunk_size: under ``vmap``, lakes generated together per ``lax.map`` step (``None``:
        :func:`default_chunk_size`; 0: the whole batch). Results do not depend on it.

    Returns:
      A :class:`Lake` on the ``max_height x max_width`` canvas with ``max_agents`` slots
      (absent slots: start/goal ``(0, 0)``, ``path_len = -1``) and its achieved
      :class:`LakeStats`.
    """
    st, key_data = _static_for(config, key, max_attempts, pool_size, num_proposals, chunk_size)
    leaves = jax.tree_util.tree_leaves(config_arrays(config))
    chex.assert_rank(leaves, 0)
    return _generator(st)(key_data, *leaves)


_OPTIONS = ("max_attempts", "pool_size", "num_proposals", "chunk_size")


@functools.lru_cache(maxsize=None)
def _batch_fn(options: tuple[tuple[str, Any], ...]):
    return jax.jit(jax.vmap(functools.partial(generate, **dict(options))))


def generate_many(keys: jax.Array, configs: LakeConfig, **options: Any) -> Lake:
    """``jit(vmap(generate))(keys [n], configs)`` for a stacked config, compiled once per shape.

    ``options`` are :func:`generate`'s keyword options (``max_attempts``, ``pool_size``,
    ``num_proposals``, ``chunk_size``).
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"unknown generator option(s) {unknown}; known: {list(_OPTIONS)}")
    return _batch_fn(tuple(sorted(options.items())))(keys, configs)


def generate_batch(key: jax.Array, config: LakeConfig, n: int, **options: Any) -> Lake:
    """``n`` lakes of one config (leaves with a leading ``[n]``); lake ``i`` uses ``split(key, n)[i]``."""
    if int(n) < 1:
        raise ConfigError(f"n={n} not in [1, inf)")
    config.validate()
    return generate_many(jax.random.split(key, int(n)), repeat_config(config, int(n)), **options)


# ============================================================================ mixtures
def mixture_counts(weights: Sequence[float], n: int) -> list[int]:
    """Split ``n`` lakes by ``weights`` with largest-remainder rounding (ties: lower index first).

    Weights are checked by :func:`jaxlake.mixture.check_weights` (a :class:`MixtureError`,
    which is a :class:`ConfigError`, for an empty list, a negative or non-finite weight, or an
    all-zero one); a zero weight gets zero lakes.
    """
    weights = check_weights(weights)
    total = sum(weights)
    if int(n) < 0:
        raise ConfigError(f"n={n} not in [0, inf)")
    quotas = [x * n / total for x in weights]
    counts = [int(math.floor(q)) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


#: How :func:`generate_mixture` splits a batch over the components: ``"quota"`` (the same
#: largest-remainder counts for every key: evaluations, whose cells must be fixed) or
#: ``"random"`` (systematic sampling over a random order of the components, drawn from the
#: key: training, so that every component is drawn, at its weight on average, even when
#: there are more components than lakes per batch).
SPLITS = ("quota", "random")


def random_components(weights: Sequence[float], n: int, key: jax.Array) -> np.ndarray:
    """``[n]`` component ids drawn from ``key`` by systematic sampling over a random order of
    the components: each component gets ``floor(n w)`` or ``ceil(n w)`` lakes, ``n w`` on
    average over keys, and which components share a batch changes with the key (the lakes come
    in blocks, in that random order)."""
    weights = np.asarray(check_weights(weights), np.float64)
    m = len(weights)
    k_order, k_offset = jax.random.split(jax.random.fold_in(key, 0x5917))
    order = np.asarray(jax.random.permutation(k_order, m))
    cum = np.cumsum(weights[order])
    cum /= cum[-1]
    points = (np.arange(int(n)) + float(jax.random.uniform(k_offset))) / int(n)
    return order[np.minimum(np.searchsorted(cum, points, side="right"), m - 1)].astype(np.int32)


def mixture_components(
    mixture: Mixture | Sequence[tuple[float, LakeConfig]], n: int, *, key: Optional[jax.Array] = None,
    shuffle: bool = False, split: str = "quota",
) -> np.ndarray:
    """``[n]`` int: which component of ``Mixture.of(mixture)`` each lake of
    :func:`generate_mixture` came from (components of weight 0 are dropped by the type).

    ``split="quota"`` (:data:`SPLITS`): the counts of :func:`mixture_counts`, lakes in
    component blocks (component 0 first); ``"random"``: :func:`random_components` of ``key``.
    With ``shuffle`` (or ``split="random"``) pass the same ``key`` as to
    :func:`generate_mixture`.
    """
    if split not in SPLITS:
        raise ConfigError(f"split={split!r} not in {list(SPLITS)}")
    if (shuffle or split == "random") and key is None:
        raise ConfigError(f"mixture_components(shuffle={shuffle}, split={split!r}) needs the key given to "
                          "generate_mixture")
    weights = Mixture.of(mixture).weights
    if split == "random":
        ids = random_components(weights, n, key)
    else:
        counts = mixture_counts(weights, n)
        ids = np.repeat(np.arange(len(counts)), counts)
    if shuffle:
        _, k_perm = jax.random.split(key)
        ids = ids[np.asarray(jax.random.permutation(k_perm, n))]
    return ids.astype(np.int32)


def lift_configs(configs: Sequence[LakeConfig]) -> list[LakeConfig]:
    """The configs on one common static capacity: the largest ``max_height``, ``max_width``
    and ``max_agents`` among them (so no config's canvas shrinks)."""
    cap = (max(c.max_height for c in configs), max(c.max_width for c in configs), max(c.max_agents for c in configs))
    return [c if c.capacity == cap else with_capacity(c, *cap) for c in configs]


def generate_mixture(
    key: jax.Array, mixture: Mixture | Sequence[tuple[float, LakeConfig]], n: int, *, shuffle: bool = False,
    split: str = "quota", **options: Any,
) -> Lake:
    """``n`` lakes from a weighted mixture ``[(weight, config), ...]`` in one compiled call.

    Component counts follow :func:`mixture_counts` (``split="quota"``: largest remainder, the
    same for every key) or :func:`random_components` (``split="random"``: drawn from ``key``,
    unbiased). Configs of different capacities are lifted to a common one
    (:func:`lift_configs`). Lakes come in component blocks unless ``shuffle``;
    :func:`mixture_components` (same ``key``, ``n``, ``shuffle``, ``split``) says which
    component each lake came from. Lake ``i`` is ``generate(split(split(key)[0], n)[i],
    config_of_lake_i)``.
    """
    mixture = Mixture.of(mixture)  # the one mixture validator (jaxlake.mixture)
    if int(n) < 1:
        raise ConfigError(f"n={n} not in [1, inf)")
    n = int(n)
    ids = mixture_components(mixture, n, key=key, shuffle=shuffle, split=split)
    k_lakes, _ = jax.random.split(key)
    return generate_per_lake(jax.random.split(k_lakes, n), lift_configs(mixture.configs), ids, **options)


def generate_per_lake(keys: jax.Array, configs: Sequence[LakeConfig], ids: Any, **options: Any) -> Lake:
    """Lake ``i`` = ``generate(keys[i], configs[ids[i]])``, all in one compiled call.

    Args:
      keys: ``[N]`` PRNG keys.
      configs: configs of one static capacity (see :func:`lift_configs`).
      ids: ``[N]`` ints, each lake's config index.
      options: generator options (:func:`generate_many`).
    """
    # only the configs the batch uses are stacked (a mixture may have thousands of components)
    used, index = np.unique(np.asarray(ids).reshape(-1), return_inverse=True)
    configs = list(configs)
    stacked = stack_configs([configs[i] for i in used])
    per_lake = jax.tree_util.tree_map(lambda x: x[jnp.asarray(index.astype(np.int32))], stacked)
    return generate_many(keys, per_lake, **options)
