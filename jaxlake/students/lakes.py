"""Where the student's lakes come from: fresh training lakes from any mixture, and held-out
lakes that training never sees.

**The held-out split.** Every lake has a 32-bit hash of what defines it (:func:`lake_hash`:
its region, holes, the starts and goals of the agents in play, the agent count, slip, horizon
and goal rule); a lake is *held out* when the hash's top four bits are 0
(:func:`is_held_out`, one lake in :data:`HELD_OUT_BUCKETS`). Training only plays lakes that are
not held out (:func:`train_sampler`, :func:`fresh_pool` regenerate the others) and the
evaluation only plays lakes that are (:func:`heldout_lakes`), so the two sets are disjoint by
construction, lake by lake, while both follow the mixture's distribution (the hash ignores
what the generator aims for). The evaluation's lakes come from their own fixed seed
(``ippo.eval_seed``): every run, seed and update is scored on the same lakes.

**Training lakes.** A mixture's components are lifted to one capacity and stacked, so one
traced draw picks a component by weight and generates from it (:func:`mixture_draw`):
:func:`train_sampler` is a generating sampler for :func:`jaxlake.levels.step_batch` (a new
lake at every episode end); :func:`fresh_pool` makes a pool of fresh lakes at once (the
trainer's default: a new pool every update, drawn from as episodes end).
"""

from __future__ import annotations

import json
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlake.config import LakeConfig, stack_configs
from jaxlake.generator import generate, generate_batch, lift_configs, mixture_counts
from jaxlake.mixture import Mixture
from jaxlake.types import Lake

__all__ = ["HELD_OUT_BUCKETS", "fresh_pool", "heldout_lakes", "is_held_out", "lake_hash", "mixture_draw",
           "train_sampler"]

#: One lake in this many is held out (the hash's top ``log2`` bits are 0).
HELD_OUT_BUCKETS = 16
_SHIFT = 32 - int(np.log2(HELD_OUT_BUCKETS))
_EVAL_STREAM = 0xE7A1


def _multipliers(n: int) -> jax.Array:
    """``[n]`` fixed odd uint32 multipliers (the same in every process)."""
    rs = np.random.RandomState(0x1A4E)
    return jnp.asarray(rs.randint(0, 2 ** 31, size=n, dtype=np.int64) * 2 + 1, dtype=jnp.uint32)


def lake_hash(lake: Lake) -> jax.Array:
    """``[]`` uint32 hash of an unbatched lake's definition (``vmap`` for a batch).

    Two lakes that play the same (same region, holes, in-play starts and goals, agent count,
    slip, horizon and goal rule) hash the same; the generator's ``stats`` are ignored.
    """
    agents = lake.agent_mask[:, None]
    parts = [
        lake.region.reshape(-1).astype(jnp.uint32),
        (lake.holes & lake.region).reshape(-1).astype(jnp.uint32),
        jnp.where(agents, lake.starts + 1, 0).reshape(-1).astype(jnp.uint32),
        jnp.where(agents, lake.goals + 1, 0).reshape(-1).astype(jnp.uint32),
        jnp.stack([jnp.asarray(lake.num_agents, jnp.uint32), jnp.asarray(lake.max_steps, jnp.uint32),
                   jnp.asarray(lake.on_goal, jnp.uint32),
                   jax.lax.bitcast_convert_type(jnp.asarray(lake.slip_prob, jnp.float32), jnp.uint32)]),
    ]
    v = jnp.concatenate(parts)
    h = jnp.sum(v * _multipliers(v.shape[0]), dtype=jnp.uint32)
    h = h ^ (h >> 16)  # murmur3's finaliser: every input bit reaches the top bits
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def is_held_out(lake: Lake) -> jax.Array:
    """``[]`` bool: the lake belongs to the held-out set (one in :data:`HELD_OUT_BUCKETS`)."""
    return (lake_hash(lake) >> _SHIFT) == 0


def mixture_draw(mixture: Mixture | Sequence | LakeConfig) -> Callable[[jax.Array], Lake]:
    """``key -> Lake``: a component drawn by weight, then a lake generated from it (jittable,
    vmappable; every component on the mixture's common capacity)."""
    mixture = Mixture.of(mixture)
    stacked = stack_configs(lift_configs(mixture.configs))
    logw = jnp.log(jnp.asarray(mixture.weights, jnp.float32))

    def draw(key: jax.Array) -> Lake:
        k_comp, k_lake = jax.random.split(key)
        c = jax.random.categorical(k_comp, logw)
        return generate(k_lake, jax.tree_util.tree_map(lambda x: x[c], stacked))

    return draw


def train_sampler(mixture: Mixture | Sequence | LakeConfig) -> Callable[[jax.Array], Lake]:
    """``key -> Lake``: a fresh lake of the mixture that is not held out (redrawn with
    ``fold_in(key, i)`` until it is not; one lake in 16 needs a second draw)."""
    draw = mixture_draw(mixture)

    def sampler(key: jax.Array) -> Lake:
        def redraw(carry):
            i, _ = carry
            return i + 1, draw(jax.random.fold_in(key, i))

        first = draw(jax.random.fold_in(key, 0))
        return jax.lax.while_loop(lambda c: is_held_out(c[1]), redraw, (jnp.int32(1), first))[1]

    return sampler


def fresh_pool(key: jax.Array, mixture: Mixture | Sequence | LakeConfig, n: int) -> Lake:
    """``n`` fresh lakes of the mixture, none held out (leaves ``[n, ...]``; jittable).

    Rounds of ``n + n // 8 + 16`` generated lakes (round ``i`` from ``fold_in(key, i)``) fill
    the slots still empty with their lakes that are not held out, in order; the first round
    almost always fills all ``n`` (one lake in 16 is held out), so one round is the cost. The
    generator appears once in the compiled program.
    """
    n = int(n)
    draw = mixture_draw(mixture)
    extra = n + n // 8 + 16
    shapes = jax.eval_shape(jax.vmap(draw), jax.random.split(key, n))
    empty = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def fill(carry):
        i, pool, missing = carry
        cand = jax.vmap(draw)(jax.random.split(jax.random.fold_in(key, i), extra))
        good = ~jax.vmap(is_held_out)(cand)
        order = jnp.argsort(~good, stable=True)  # the good candidates first, in order
        rank = jnp.cumsum(missing) - 1  # slot's rank among the empty slots
        take = order[jnp.clip(rank, 0, extra - 1)]
        fills = missing & (rank < jnp.sum(good))
        pick = lambda a, b: jnp.where(fills.reshape(fills.shape + (1,) * (b.ndim - 1)), a[take], b)  # noqa: E731
        return i + 1, jax.tree_util.tree_map(pick, cand, pool), missing & ~fills

    start = (jnp.int32(0), empty, jnp.ones((n,), bool))
    return jax.lax.while_loop(lambda c: jnp.any(c[2]), fill, start)[1]


_EVAL_CACHE: dict[str, tuple[Lake, np.ndarray]] = {}


def heldout_lakes(mixture: Mixture | Sequence | LakeConfig, n: int, seed: int) -> tuple[Lake, np.ndarray]:
    """``(lakes [n], component [n])``: the held-out evaluation lakes of a mixture.

    Component ``c`` gets :func:`~jaxlake.generator.mixture_counts`' share of ``n``; its lakes
    are the first held-out ones among lakes generated from
    ``split(fold_in(fold_in(PRNGKey(seed), EVAL_STREAM), c))`` batches. Deterministic in
    ``(mixture, n, seed)`` and cached in the process.
    """
    mixture = Mixture.of(mixture)
    tag = json.dumps([[w, c.to_dict()] for w, c in mixture] + [int(n), int(seed)], sort_keys=True)
    if tag in _EVAL_CACHE:
        return _EVAL_CACHE[tag]
    configs = lift_configs(mixture.configs)
    root = jax.random.fold_in(jax.random.PRNGKey(int(seed)), _EVAL_STREAM)
    parts, comps = [], []
    for c, (count, config) in enumerate(zip(mixture_counts(mixture.weights, int(n)), configs)):
        if count == 0:
            continue
        got: list[Lake] = []
        have, batch = 0, 0
        size = max(256, 24 * count)
        while have < count:
            lakes = generate_batch(jax.random.fold_in(jax.random.fold_in(root, c), batch), config, size)
            keep = np.flatnonzero(np.asarray(jax.vmap(is_held_out)(lakes)))[: count - have]
            got.append(jax.tree_util.tree_map(lambda x: x[keep], lakes))
            have += len(keep)
            batch += 1
        parts += got
        comps.append(np.full(count, c, np.int32))
    lakes = jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *parts)
    out = (lakes, np.concatenate(comps))
    _EVAL_CACHE[tag] = out
    return out

