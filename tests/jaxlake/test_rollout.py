"""``jaxlake.env.rollout``: scan equals stepping by hand, vmap over lakes and plans, outcomes."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlake.env import pad_plan, reset, rollout, step
from jaxlake.types import ACTION_LETTERS, ACTIVE, ARRIVED, FELL, STAY, TIMED_OUT
from tests.jaxlake.test_step_rules import MAX_AGENTS, lake_from_rows

A = MAX_AGENTS
T = 6
_ROLLOUT = jax.jit(rollout, static_argnames=("horizon",))
STEP = jax.jit(step)


def ROLLOUT(key, lake, plan, *, arrive_reward=1.0, fall_reward=-1.0, horizon=None, init_state=None):
    """Jitted ``rollout`` called with one argument signature, so each shape compiles once."""
    init_state = reset(lake) if init_state is None else init_state
    return _ROLLOUT(key, lake, plan, arrive_reward=arrive_reward, fall_reward=fall_reward,
                    horizon=horizon, init_state=init_state)


def plan_of(*rows: str, steps: int = T) -> jnp.ndarray:
    """``plan_of("U R D", "S L")`` -> ``[A, steps]`` int32, padded with STAY."""
    plan = np.full((A, steps), STAY, np.int32)
    for i, row in enumerate(rows):
        letters = row.split()
        plan[i, : len(letters)] = [ACTION_LETTERS.index(ch) for ch in letters]
    return jnp.asarray(plan)


def assert_trees_equal(a, b):
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, b))


LAKES = [
    lake_from_rows(["A . ~ a", ". B . .", "C ~ b .", ". . . c"], slip_prob=0.5, on_goal="stay", max_steps=5),
    lake_from_rows(["A B . .", ". . ~ .", "b . . a"], slip_prob=0.0, on_goal="vanish", max_steps=4),
    lake_from_rows(["A . . . D", ". ~ . ~ .", "C . B . .", "a b c d ."], slip_prob=1 / 3, max_steps=6),
]


def random_plan(seed: int) -> jnp.ndarray:
    return jax.random.randint(jax.random.key(seed), (A, T), 0, 5, dtype=jnp.int32)


@pytest.mark.parametrize("index", range(len(LAKES)))
def test_scan_equals_stepping_by_hand(index):
    lake, plan, key = LAKES[index], random_plan(index), jax.random.key(10 + index)
    out = ROLLOUT(key, lake, plan)
    state = reset(lake)
    for k, step_key in enumerate(jax.random.split(key, T)):
        state, info = STEP(step_key, lake, state, plan[:, k])
        assert_trees_equal(jax.tree.map(lambda x: x[k], out.trajectory.info), info)
        np.testing.assert_array_equal(out.trajectory.pos[k], state.pos)
        np.testing.assert_array_equal(out.trajectory.status[k], state.status)
        assert int(out.trajectory.t[k]) == int(state.t)
    assert_trees_equal(out.final_state, state)


def test_vmap_over_lakes_and_plans_equals_one_by_one():
    lakes = jax.tree.map(lambda *xs: jnp.stack(xs), *LAKES)
    plans = jnp.stack([random_plan(100 + i) for i in range(len(LAKES))])
    keys = jax.random.split(jax.random.key(5), len(LAKES))
    batched = jax.jit(jax.vmap(rollout))(keys, lakes, plans)
    assert batched.trajectory.pos.shape == (len(LAKES), T, A, 2)
    assert batched.outcome.success.shape == (len(LAKES),)
    for i, lake in enumerate(LAKES):
        single = ROLLOUT(keys[i], lake, plans[i])
        assert_trees_equal(jax.tree.map(lambda x: x[i], batched), single)


def test_outcome_arrive_and_fall():
    lake = lake_from_rows(["A . a", "B ~ .", "b . ."], max_steps=10)
    out = ROLLOUT(jax.random.key(0), lake, plan_of("R R", "R"))
    o = out.outcome
    assert o.arrived[:2].tolist() == [True, False]
    assert o.fell[:2].tolist() == [False, True]
    assert not o.timed_out.any() and not o.still_active.any()
    assert o.steps.tolist() == [2, 1, 0, 0]
    assert o.returns[:2].tolist() == [1.0, -1.0]
    assert int(o.num_arrived) == 1 and not bool(o.success) and bool(o.all_done)
    assert int(o.makespan) == 2  # t stops once the episode is done
    assert out.trajectory.t.tolist() == [1, 2, 2, 2, 2, 2]
    assert out.final_state.status[:2].tolist() == [ARRIVED, FELL]


def test_outcome_success_with_custom_rewards_and_event_counts():
    lake = lake_from_rows(["A B .", ". . .", "a b ."], max_steps=10)
    # Step 1: A bumps the top wall. Step 2: A and B try to swap. Then both walk to their goals.
    plan = plan_of("U R D D", "S L S D D")
    out = ROLLOUT(jax.random.key(0), lake, plan, arrive_reward=2.0, fall_reward=-5.0)
    o = out.outcome
    assert o.arrived[:2].tolist() == [True, True] and bool(o.success)
    assert o.wall_bumps[:2].tolist() == [1, 0]
    assert o.swap_conflicts[:2].tolist() == [1, 1]
    assert o.vertex_conflicts.sum() == 0 and o.blocks.sum() == 0
    assert o.steps[:2].tolist() == [4, 5]
    assert o.returns[:2].tolist() == [2.0, 2.0]
    assert int(o.num_arrived) == 2 and int(o.makespan) == 5


def test_conflict_counts_accumulate_and_unfinished_agents_stay_active():
    lake = lake_from_rows(["a b c d", ". . . B", "D C A .", ". . . ."], max_steps=20)
    out = ROLLOUT(jax.random.key(0), lake, plan_of("R R R", "D D D", "R R R", "R R R"))
    o = out.outcome
    assert o.vertex_conflicts.tolist() == [3, 3, 0, 0]
    assert o.blocks.tolist() == [0, 0, 3, 3]
    assert o.still_active.all() and not (o.arrived | o.fell | o.timed_out).any()
    assert o.steps.tolist() == [T] * 4
    assert not bool(o.all_done) and not bool(o.success)


def test_short_plan_leaves_agents_active_but_horizon_pads_to_the_end():
    lake = lake_from_rows(["A . . a", ". . . .", "b . . B"], max_steps=T + 2)
    plan = plan_of("R", "U")
    short = ROLLOUT(jax.random.key(0), lake, plan).outcome
    assert short.still_active[:2].all() and not short.timed_out.any()
    assert short.steps[:2].tolist() == [T, T] and not bool(short.all_done)
    full = ROLLOUT(jax.random.key(0), lake, plan, horizon=T + 3)
    assert full.trajectory.pos.shape == (T + 3, A, 2)
    o = full.outcome
    assert o.timed_out[:2].all() and not o.still_active.any() and bool(o.all_done)
    assert o.steps[:2].tolist() == [T + 2, T + 2] and int(o.makespan) == T + 2
    assert full.final_state.status[:2].tolist() == [TIMED_OUT, TIMED_OUT]


def test_init_state_continues_an_episode():
    lake = lake_from_rows(["A . . .", ". . ~ .", "b . . a", ". . . B"], max_steps=20)
    plan = random_plan(7)
    first = ROLLOUT(jax.random.key(2), lake, plan)
    second = ROLLOUT(jax.random.key(3), lake, plan, init_state=first.final_state)
    state = first.final_state
    for k, step_key in enumerate(jax.random.split(jax.random.key(3), T)):
        state, _ = STEP(step_key, lake, state, plan[:, k])
        np.testing.assert_array_equal(second.trajectory.pos[k], state.pos)
    assert_trees_equal(second.final_state, state)


def test_pad_plan():
    plan = jnp.asarray([[1, 2], [3, 4]], jnp.int32)
    np.testing.assert_array_equal(pad_plan(plan, 4), [[1, 2, 0, 0], [3, 4, 0, 0]])
    np.testing.assert_array_equal(pad_plan(plan, 1), [[1], [3]])
    batch = jnp.stack([plan, plan])
    assert pad_plan(batch, 3).shape == (2, 2, 3)
    with pytest.raises(ValueError, match="horizon=0"):
        pad_plan(plan, 0)


def test_bad_plan_shapes_are_rejected():
    lake = LAKES[0]
    with pytest.raises(AssertionError):
        rollout(jax.random.key(0), lake, jnp.zeros((A + 1, T), jnp.int32))
    with pytest.raises(ValueError, match="T=0"):
        rollout(jax.random.key(0), lake, jnp.zeros((A, 0), jnp.int32))


def test_statuses_in_trajectory_only_leave_active():
    lake = LAKES[2]
    out = ROLLOUT(jax.random.key(4), lake, random_plan(3))
    status = np.concatenate([np.asarray(reset(lake).status)[None], np.asarray(out.trajectory.status)])
    changed = status[1:] != status[:-1]
    assert (status[:-1][changed] == ACTIVE).all()
