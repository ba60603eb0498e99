"""Auto-reset from a lake pool (jaxlake.autoreset): restarts exactly the finished lakes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlake import autoreset, env
from jaxlake.text import parse_lake
from jaxlake.types import ACTIVE, ARRIVED, DOWN, LEFT, RIGHT, STAY, UP, Lake, LakeStats

# ----------------------------------------------------------------------------- helpers
H, W, A = 4, 4, 3
P, B, T = 5, 6, 12


def random_pool(seed: int, n: int = P) -> Lake:
    """``n`` random lakes (4x4 canvas, 3 slots) built with NumPy: regions of 3..4 rows/cols,
    ~25 % holes, 1..3 agents on distinct frozen cells, max_steps 2..4, slip 0.3.
    Reachability is not needed by the step, so it is not enforced."""
    rng = np.random.default_rng(seed)
    fields = {k: [] for k in ("holes", "region", "starts", "goals", "num_agents", "slip_prob", "max_steps", "on_goal")}
    for _ in range(n):
        h, w = rng.integers(3, H + 1), rng.integers(3, W + 1)
        region = np.zeros((H, W), bool)
        region[:h, :w] = True
        holes = region & (rng.random((H, W)) < 0.25)
        k = int(rng.integers(1, A + 1))
        free = np.flatnonzero(region & ~holes)
        if free.size < 2 * k:
            holes[:] = False
            free = np.flatnonzero(region)
        cells = rng.choice(free, size=2 * k, replace=False)
        starts = np.zeros((A, 2), np.int32)
        goals = np.zeros((A, 2), np.int32)
        starts[:k] = np.stack([cells[:k] // W, cells[:k] % W], -1)
        goals[:k] = np.stack([cells[k:] // W, cells[k:] % W], -1)
        for name, value in (("holes", holes), ("region", region), ("starts", starts), ("goals", goals),
                            ("num_agents", k), ("slip_prob", 0.3), ("max_steps", int(rng.integers(2, 5))),
                            ("on_goal", int(rng.integers(0, 2)))):
            fields[name].append(value)
    stats = LakeStats(hole_density=jnp.zeros(n), conflict_density=jnp.zeros(n),
                      path_len=jnp.zeros((n, A), jnp.int32), dist_ok=jnp.ones(n, bool),
                      attempts=jnp.ones(n, jnp.int32))
    return Lake(holes=jnp.asarray(np.stack(fields["holes"])), region=jnp.asarray(np.stack(fields["region"])),
                starts=jnp.asarray(np.stack(fields["starts"])), goals=jnp.asarray(np.stack(fields["goals"])),
                num_agents=jnp.asarray(fields["num_agents"], jnp.int32),
                slip_prob=jnp.asarray(fields["slip_prob"], jnp.float32),
                max_steps=jnp.asarray(fields["max_steps"], jnp.int32),
                on_goal=jnp.asarray(fields["on_goal"], jnp.int32), stats=stats)


def take(tree, i):
    return jax.tree_util.tree_map(lambda x: x[i], tree)


def assert_tree_equal(a, b, what=""):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=f"{what}{jax.tree_util.keystr(path)}")


# Compiled once at module scope (fixed shapes).
step_batch = jax.jit(autoreset.step_batch)
observe = jax.jit(autoreset.observe)
plain_step = jax.jit(env.step)


@jax.jit
def run(pool, ar, actions, keys):
    """``T`` auto-reset steps; returns every intermediate observed state and info."""

    def body(ar, xs):
        a, k = xs
        ar, info = autoreset.step_batch(k, pool, ar, a)
        return ar, (autoreset.observe(pool, ar), ar.pool_idx, info)

    return jax.lax.scan(body, ar, (actions, keys))


# ----------------------------------------------------------------------------- tests
def test_init_spreads_instances_over_the_pool():
    pool = random_pool(0, n=8)
    ar = autoreset.init(pool, 4)
    np.testing.assert_array_equal(ar.pool_idx, [0, 2, 4, 6])  # (i * 8) // 4
    np.testing.assert_array_equal(autoreset.init(random_pool(1, n=3), 5).pool_idx, [0, 0, 1, 1, 2])  # (i * 3) // 5
    assert_tree_equal(ar.state, env.reset(take(pool, jnp.array([0, 2, 4, 6]))))
    assert not ar.pending.any() and not ar.episodes.any()
    with pytest.raises(ValueError, match="batch_size"):
        autoreset.init(pool, 0)


def test_hand_computed_restart_and_wraparound():
    kw = dict(max_height=3, max_width=3, max_agents=1, max_steps=5)
    pool = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *[
        parse_lake("A a .\n. . .\n. . .", **kw),   # lake 0: one step RIGHT arrives
        parse_lake(". . .\nA . .\na . .", **kw),   # lake 1: one step DOWN arrives
        parse_lake(". ~ .\n. A a\n. . .", **kw),   # lake 2: UP falls into the hole
    ])
    ar = autoreset.init(pool, 2)  # instances on lakes (0*3)//2 = 0 and (1*3)//2 = 1
    np.testing.assert_array_equal(ar.pool_idx, [0, 1])
    key = jax.random.split(jax.random.key(0), 2)

    # Step 1: instance 0 arrives (episode over), instance 1 moves UP onto (0, 0).
    ar, info = step_batch(key, pool, ar, jnp.array([[RIGHT], [UP]]))
    np.testing.assert_array_equal(info.done, [True, False])
    np.testing.assert_array_equal(info.reward[:, 0], [1.0, 0.0])
    np.testing.assert_array_equal(ar.pending, [True, False])
    np.testing.assert_array_equal(ar.pool_idx, [1, 1])
    np.testing.assert_array_equal(ar.episodes, [1, 0])
    np.testing.assert_array_equal(ar.state.status[:, 0], [ARRIVED, ACTIVE])  # terminal state kept
    np.testing.assert_array_equal(ar.state.pos[:, 0], [[0, 1], [0, 0]])
    np.testing.assert_array_equal(ar.state.t, [1, 1])
    seen = observe(pool, ar)  # instance 0 restarts on lake 1; instance 1 untouched
    np.testing.assert_array_equal(seen.pos[:, 0], [[1, 0], [0, 0]])
    np.testing.assert_array_equal(seen.status[:, 0], [ACTIVE, ACTIVE])
    np.testing.assert_array_equal(seen.t, [0, 1])

    # Step 2: instance 0 plays lake 1 from its start: DOWN arrives -> lake 2 next.
    ar, info = step_batch(key, pool, ar, jnp.array([[DOWN], [STAY]]))
    np.testing.assert_array_equal(info.done, [True, False])
    np.testing.assert_array_equal(ar.pool_idx, [2, 1])
    np.testing.assert_array_equal(ar.episodes, [2, 0])
    np.testing.assert_array_equal(ar.state.t, [1, 2])

    # Step 3: instance 0 on lake 2 falls (UP into the hole) -> wraps around to lake 0.
    ar, info = step_batch(key, pool, ar, jnp.array([[UP], [LEFT]]))
    np.testing.assert_array_equal(info.reward[:, 0], [-1.0, 0.0])
    np.testing.assert_array_equal(ar.pool_idx, [0, 1])
    np.testing.assert_array_equal(ar.episodes, [3, 0])
    np.testing.assert_array_equal(observe(pool, ar).pos[:, 0], [[0, 0], [0, 0]])


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_matches_an_eager_reset_loop_per_instance(seed):
    """Every instance plays exactly what a plain loop ``step; if done: next lake, reset`` plays."""
    pool = random_pool(seed)
    rng = np.random.default_rng(seed)
    actions = jnp.asarray(rng.integers(0, 5, size=(T, B, A)), jnp.int32)
    keys = jax.random.split(jax.random.key(seed), (T, B))
    ar0 = autoreset.init(pool, B)
    final, (seen, idx_seq, infos) = run(pool, ar0, actions, keys)

    for i in range(B):
        idx = int(ar0.pool_idx[i])
        state = env.reset(take(pool, idx))
        episodes = 0
        for t in range(T):
            state, info = plain_step(keys[t, i], take(pool, idx), state, actions[t, i])
            assert_tree_equal(take(infos, (t, i)), info, f"instance {i} step {t} info")
            if bool(state.done):
                idx, episodes = (idx + 1) % P, episodes + 1
                state = env.reset(take(pool, idx))
            assert int(idx_seq[t, i]) == idx
            assert_tree_equal(take(seen, (t, i)), state, f"instance {i} step {t} state")
        assert int(final.episodes[i]) == episodes


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_restarts_exactly_the_finished_lakes(seed):
    """One step from a mid-rollout state: done instances restart, the others are untouched."""
    pool = random_pool(seed)
    rng = np.random.default_rng(seed + 1)
    actions = jnp.asarray(rng.integers(0, 5, size=(T, B, A)), jnp.int32)
    keys = jax.random.split(jax.random.key(seed), (T, B))
    ar, _ = run(pool, autoreset.init(pool, B), actions, keys)  # some pending, some not
    a, k = actions[0], keys[0]
    start = observe(pool, ar)
    lakes = autoreset.current_lakes(pool, ar)
    ref_state, ref_info = jax.vmap(env.step)(k, lakes, start, a)
    new, info = step_batch(k, pool, ar, a)
    done = np.asarray(ref_state.done)
    assert_tree_equal(info, ref_info, "info")
    assert_tree_equal(new.state, ref_state, "state")
    np.testing.assert_array_equal(new.pending, done)
    np.testing.assert_array_equal(new.pool_idx, np.where(done, (np.asarray(ar.pool_idx) + 1) % P, ar.pool_idx))
    np.testing.assert_array_equal(new.episodes, np.asarray(ar.episodes) + done)
    after = observe(pool, new)
    fresh = env.reset(take(pool, new.pool_idx))
    for i in range(B):
        expect = take(fresh, i) if done[i] else take(ref_state, i)
        assert_tree_equal(take(after, i), expect, f"instance {i} (done={done[i]})")


def test_uniforms_variant_equals_keyed_step():
    pool = random_pool(3)
    ar = autoreset.init(pool, B)
    a = jnp.asarray(np.random.default_rng(0).integers(0, 5, size=(B, A)), jnp.int32)
    keys = jax.random.split(jax.random.key(1), B)
    u = jax.vmap(lambda k: jax.random.uniform(k, (A,)))(keys)
    assert_tree_equal(autoreset.step_batch_from_uniforms(pool, ar, a, u), step_batch(keys, pool, ar, a))
