"""Levels for UED (jaxlake/levels.py): ``mutate`` keeps every generator guarantee and reports
exact stats; the terminated / truncated split; the sampler-driven auto-reset.

* ``mutate``: hypothesis draws configs (5x5 canvas, 3 slots, any distance bounds), generated
  lakes and edit counts; every child passes the generator's own independent checker
  (``tests/jaxlake/test_generator.py::check_lake``: region, holes in it, frozen distinct
  endpoints, reachability, BFS path lengths, both densities, ``dist_ok``), keeps what it must
  keep, and its stats equal ``distances.lake_stats`` recomputed; vmap equals one at a time.
* split: a hand-drawn lake where one agent arrives, one falls and one times out, and random
  rollouts where the split is exactly "left ACTIVE in this step".
* reset: a weighted pool sampler and a generating function, against an eager
  ``step; if done: draw, reset`` loop built on ``env.step``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxlake import env, levels
from jaxlake.config import LakeConfig, repeat_config
from jaxlake.distances import lake_stats
from jaxlake.generator import generate, generate_many
from jaxlake.text import parse_lake
from jaxlake.types import ABSENT, ACTIVE, ARRIVED, FELL, RIGHT, STAY, TIMED_OUT
from tests.jaxlake.support import lake_configs
from tests.jaxlake.test_autoreset import assert_tree_equal, random_pool, take
from tests.jaxlake.test_generator import check_lake, to_numpy

H, W, A = 5, 5, 3
N = 8  # lakes per hypothesis example
CANVAS = dict(max_height=H, max_width=W, max_agents=A)
PROPERTY = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MUTATE = jax.jit(jax.vmap(lambda k, lake, n, lo, hi: levels.mutate(k, lake, n, min_dist=lo, max_dist=hi),
                          in_axes=(0, 0, 0, None, None)))
STATS = jax.jit(jax.vmap(lake_stats, in_axes=(0, None, None)))


def generate_lakes(seed: int, config: LakeConfig, n: int = N):
    return generate_many(jax.random.split(jax.random.key(seed), n), repeat_config(config, n))


def configs():
    return lake_configs(CANVAS, holes=[0.0, 0.15, 0.3, 0.5], conflicts=[0.0, 0.5, 1.0], dists=True, max_steps=9)


def bounds(config: LakeConfig):
    # max_dist=None: no upper bound, passed as the canvas size, which no distance reaches
    return jnp.int32(config.min_dist), jnp.int32(config.effective_max_dist)


# ============================================================================ mutate
@PROPERTY
@given(config=configs(), seed=st.integers(0, 2**31 - 1), edits=st.lists(st.integers(0, 16), min_size=N, max_size=N))
def test_mutate_keeps_every_generator_guarantee(config, seed, edits):
    parents = generate_lakes(seed, config)
    lo, hi = bounds(config)
    keys = jax.random.split(jax.random.key(seed + 1), N)
    children = MUTATE(keys, parents, jnp.asarray(edits, jnp.int32), lo, hi)
    recomputed = to_numpy(STATS(children, lo, hi))
    parents, children = to_numpy(parents), to_numpy(children)
    for i in range(N):
        child, parent = take(children, i), take(parents, i)
        check_lake(child, config)  # the generator's independent checker, with the config's bounds
        for name in ("region", "num_agents", "slip_prob", "max_steps", "on_goal"):
            np.testing.assert_array_equal(getattr(child, name), getattr(parent, name), err_msg=name)
        assert not child.stats.dist_ok < parent.stats.dist_ok, "an in-bounds lake left its bounds"
        # stats exactly as lake_stats recomputes them (attempts: the parent's)
        for name in ("hole_density", "conflict_density", "path_len", "dist_ok"):
            np.testing.assert_array_equal(getattr(child.stats, name), getattr(take(recomputed, i), name), err_msg=name)
        assert child.stats.attempts == parent.stats.attempts
        if edits[i] == 0:
            assert_tree_equal(child, parent, "no edits")


def test_mutate_edits_every_kind_and_vmap_equals_one_at_a_time():
    config = LakeConfig(height=5, width=5, num_agents=3, hole_density=0.2, max_steps=9, **CANVAS)
    n = 48
    parents = generate_lakes(3, config, n)
    keys = jax.random.split(jax.random.key(4), n)
    lo, hi = bounds(config)
    children = MUTATE(keys, parents, jnp.full((n,), 6, jnp.int32), lo, hi)
    p, c = to_numpy(parents), to_numpy(children)
    changed = lambda name: np.any(getattr(p, name) != getattr(c, name), axis=(1, 2))  # noqa: E731
    holes, starts, goals = changed("holes"), changed("starts"), changed("goals")
    shares = (holes.mean(), starts.mean(), goals.mean())
    assert shares[0] > 0.5 and shares[1] > 0.3 and shares[2] > 0.3, shares
    assert (np.abs(c.stats.hole_density - p.stats.hole_density) > 0).any()
    one = jax.jit(levels.mutate, static_argnums=2)  # a static edit count, unbatched
    for i in range(3):
        assert_tree_equal(one(keys[i], take(parents, i), 6, min_dist=lo, max_dist=hi), take(children, i), f"lake {i}")


def test_in_support_edits_keep_the_hole_count_and_the_conflicts():
    """ACCEL's editor (IN_SUPPORT_KINDS, keep_conflicts): every child passes the generator's
    checker with the parent's hole count and conflicting pairs (a lake the same config could
    generate); the no-op leaves some children as they were, the moves change others; a bad
    kind is refused."""
    config = LakeConfig(height=5, width=5, num_agents=3, hole_density=0.2, conflict_density=0.5, max_steps=9, **CANVAS)
    n = 48
    parents = generate_lakes(11, config, n)
    lo, hi = bounds(config)
    edit = jax.jit(jax.vmap(lambda k, lake: levels.mutate(k, lake, 1, min_dist=lo, max_dist=hi,
                                                           kinds=levels.IN_SUPPORT_KINDS, keep_conflicts=True)))
    p, c = to_numpy(parents), to_numpy(edit(jax.random.split(jax.random.key(12), n), parents))
    same = 0
    for i in range(n):
        child, parent = take(c, i), take(p, i)
        check_lake(child, config)
        assert child.holes.sum() == parent.holes.sum()
        assert child.stats.conflict_density == parent.stats.conflict_density
        same += int(np.array_equal(child.holes, parent.holes) and np.array_equal(child.starts, parent.starts)
                    and np.array_equal(child.goals, parent.goals))
    assert 0 < same < n
    assert (np.any(p.holes != c.holes, axis=(1, 2))).any()  # some holes moved
    noop = jax.jit(lambda k, lake: levels.mutate(k, lake, 3, kinds=(levels.NO_OP,)))(jax.random.key(0), take(parents, 0))
    assert_tree_equal(noop.replace(stats=take(parents, 0).stats), take(parents, 0), "no-op")
    with pytest.raises(ValueError, match="kinds"):
        levels.mutate(jax.random.key(0), take(parents, 0), 1, kinds=(7,))


def test_mutate_never_disconnects_a_corridor():
    # a one-cell-wide corridor: a hole between an agent and its goal would cut its only path,
    # so such edits are skipped and the goal always stays reachable
    lake = parse_lake("A . . . a", max_steps=9, **CANVAS)
    lakes = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (N,) + x.shape), lake)
    lo, hi = jnp.int32(1), jnp.int32(H * W)
    children = [to_numpy(MUTATE(jax.random.split(jax.random.key(r), N), lakes, jnp.full((N,), 8, jnp.int32), lo, hi))
                for r in range(4)]
    for i in range(4 * N):
        child = take(children[i // N], i % N)
        assert 1 <= child.stats.path_len[0] < 10_000
        cols = sorted([int(child.starts[0, 1]), int(child.goals[0, 1])])
        assert not child.holes[0, cols[0]:cols[1] + 1].any()
        assert not child.holes[1:].any() and not (child.holes & ~child.region).any()
    assert any(take(c, i).holes.any() for c in children for i in range(N))  # some flips were kept


# ============================================================================ episode ends
def test_split_on_a_hand_drawn_lake():
    # A arrives and B falls on step 1; C is still walking when the horizon (2) runs out
    lake = parse_lake("A a . .\nB ~ b .\nC . . c", max_steps=2, max_agents=4)
    plan = jnp.asarray([[RIGHT, STAY, STAY], [RIGHT, STAY, STAY], [RIGHT, RIGHT, RIGHT], [STAY] * 3], jnp.int32)
    out = env.rollout(jax.random.key(0), lake, plan)
    term, trunc = levels.step_split(out.trajectory.info)  # [T, A]
    np.testing.assert_array_equal(term, [[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(trunc, [[0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])  # step 3: done, nothing
    term, trunc = levels.status_split(out.final_state)
    np.testing.assert_array_equal(out.final_state.status, [ARRIVED, FELL, TIMED_OUT, ABSENT])
    np.testing.assert_array_equal(term, [1, 1, 0, 0])
    np.testing.assert_array_equal(trunc, [0, 0, 1, 0])


def test_split_is_exactly_leaving_active():
    config = LakeConfig(height=4, width=5, num_agents=3, hole_density=0.3, max_steps=6, **CANVAS)
    lakes = generate_lakes(5, config, 32)
    T = 8
    plans = jax.random.randint(jax.random.key(6), (32, A, T), 0, 5, dtype=jnp.int32)
    keys = jax.random.split(jax.random.key(7), 32)
    out = jax.jit(jax.vmap(env.rollout))(keys, lakes, plans)
    term, trunc = map(np.asarray, levels.step_split(out.trajectory.info))  # [B, T, A]
    status = np.asarray(out.trajectory.status)
    before = np.concatenate([np.asarray(env.reset(lakes).status)[:, None], status[:, :-1]], axis=1)
    left = (before == ACTIVE) & (status != ACTIVE)
    np.testing.assert_array_equal(term | trunc, left)
    assert not (term & trunc).any()
    np.testing.assert_array_equal(term, left & np.isin(status, [ARRIVED, FELL]))
    np.testing.assert_array_equal(trunc, left & (status == TIMED_OUT))
    fterm, ftrunc = map(np.asarray, levels.status_split(out.final_state))
    np.testing.assert_array_equal(fterm, term.any(axis=1))
    np.testing.assert_array_equal(ftrunc, trunc.any(axis=1))
    assert term.any() and trunc.any()


# ============================================================================ sampler-driven reset
P, B, T = 5, 6, 12
PA = 3  # agent slots of test_autoreset.random_pool


def test_pool_sampler_draws_by_weight():
    pool = random_pool(0, n=4)
    sampler = levels.PoolSampler(pool=pool, weights=jnp.asarray([0.0, 1.0, 0.0, 3.0]))
    _, idx = jax.vmap(sampler.sample)(jax.random.split(jax.random.key(0), 4000))
    counts = np.bincount(np.asarray(idx), minlength=4)
    assert counts[0] == counts[2] == 0
    assert abs(counts[3] / 4000 - 0.75) < 0.03
    lake, i = sampler.sample(jax.random.key(1))
    assert_tree_equal(lake, take(pool, int(i)))
    assert levels.PoolSampler.uniform(pool).weights.shape == (4,)


@jax.jit
def run_levels(sampler, rs, actions, keys):
    def body(rs, xs):
        a, k = xs
        rs, info = jax.vmap(lambda kk, r, x: levels.step(kk, sampler, r, x))(k, rs, a)
        return rs, (levels.observe(rs), rs.level, rs.ar.episodes, info)

    return jax.lax.scan(body, rs, (actions, keys))


STEP = jax.jit(env.step)
RESET = jax.jit(env.reset)
SAMPLE = jax.jit(lambda sampler, key: sampler.sample(key))


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_weighted_reset_matches_an_eager_loop(seed):
    """Each instance plays what ``step; if done: lake = draw(fold_in(key)); reset`` plays."""
    pool = random_pool(seed)
    rng = np.random.default_rng(seed)
    weights = jnp.asarray(rng.random(P) * (rng.random(P) < 0.7) + np.eye(P)[0], jnp.float32)
    sampler = levels.PoolSampler(pool=pool, weights=weights)
    actions = jnp.asarray(rng.integers(0, 5, size=(T, B, PA)), jnp.int32)
    keys = jax.random.split(jax.random.key(seed), (T, B))
    k0 = jax.random.key(seed + 1)
    rs0 = levels.init(k0, sampler, B)
    final, (seen, level, episodes, infos) = run_levels(sampler, rs0, actions, keys)
    assert (np.asarray(weights)[np.asarray(level)] > 0).all()
    init_keys = jax.random.split(k0, B)
    for i in range(B):
        lake, idx = SAMPLE(sampler, init_keys[i])
        assert int(rs0.level[i]) == int(idx)
        state, count = RESET(lake), 0
        for t in range(T):
            state, info = STEP(keys[t, i], lake, state, actions[t, i])
            assert_tree_equal(take(infos, (t, i)), info, f"instance {i} step {t} info")
            if bool(state.done):
                lake, idx = SAMPLE(sampler, jax.random.fold_in(keys[t, i], levels.LEVEL_STREAM))
                state, count = RESET(lake), count + 1
            assert int(level[t, i]) == int(idx) and int(episodes[t, i]) == count
            assert_tree_equal(take(seen, (t, i)), state, f"instance {i} step {t} state")
        assert_tree_equal(take(final.lake, i), lake, f"instance {i} lake")


def test_new_weights_need_no_recompile_and_one_hot_weights_pin_the_level():
    pool = random_pool(2)
    rng = np.random.default_rng(0)
    actions = jnp.asarray(rng.integers(0, 5, size=(T, B, PA)), jnp.int32)
    keys = jax.random.split(jax.random.key(0), (T, B))
    rs0 = levels.init(jax.random.key(1), levels.PoolSampler.uniform(pool), B)
    before = run_levels._cache_size()
    for level in (1, 3):
        sampler = levels.PoolSampler(pool=pool, weights=jnp.asarray(np.eye(P)[level], jnp.float32))
        final, (seen, lv, episodes, _) = run_levels(sampler, rs0, actions, keys)
        ended = np.asarray(episodes) > 0
        assert ended.any()
        assert (np.asarray(lv)[ended] == level).all()
    assert run_levels._cache_size() - before <= 1  # one compile serves every weights vector


def test_generating_sampler_batch_equals_vmapped_step():
    config = LakeConfig(height=3, width=3, num_agents=2, hole_density=0.1, max_steps=2,
                        max_height=3, max_width=3, max_agents=2)

    def sampler(key):
        return generate(key, config)

    b, steps = 4, 5
    rs = levels.init(jax.random.key(0), sampler, b)
    np.testing.assert_array_equal(rs.level, -1)
    actions = jax.random.randint(jax.random.key(1), (steps, b, 2), 0, 5, dtype=jnp.int32)
    keys = jax.random.split(jax.random.key(2), (steps, b))
    batched = jax.jit(lambda k, r, a: levels.step_batch(k, sampler, r, a))
    mapped = jax.jit(jax.vmap(lambda k, r, a: levels.step(k, sampler, r, a)))
    ra, rb = rs, rs
    for t in range(steps):
        prev = ra
        ra, ia = batched(keys[t], ra, actions[t])
        rb, ib = mapped(keys[t], rb, actions[t])
        assert_tree_equal(ra, rb, f"step {t} state")
        assert_tree_equal(ia, ib, f"step {t} info")
        for i in np.flatnonzero(np.asarray(ra.ar.pending)):  # the next lake is the sampler's draw
            assert_tree_equal(take(ra.lake, i), sampler(jax.random.fold_in(keys[t, i], levels.LEVEL_STREAM)))
        for i in np.flatnonzero(~np.asarray(ra.ar.pending)):
            assert_tree_equal(take(ra.lake, i), take(prev.lake, i))
    assert int(ra.ar.episodes.sum()) >= b  # horizon 2: every instance finished episodes
    np.testing.assert_array_equal(ra.level, -1)


def test_bad_samplers_are_rejected():
    with pytest.raises(TypeError, match="PoolSampler or a function"):
        levels.init(jax.random.key(0), "pool", 2)
    with pytest.raises(TypeError, match="not a Lake"):
        levels.init(jax.random.key(0), lambda k: 3, 2)
    with pytest.raises(ValueError, match="batch_size"):
        levels.init(jax.random.key(0), levels.PoolSampler.uniform(random_pool(0)), 0)
