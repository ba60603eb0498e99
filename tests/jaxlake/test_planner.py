"""Reference planner: its plans succeed when executed by ``jaxlake.env.rollout`` (slip 0)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxlake import generator
from jaxlake.config import LakeConfig, stack_configs
from jaxlake.distances import UNREACHABLE
from jaxlake.env import rollout
from jaxlake.planner import solvable_share, solve, solve_batch
from jaxlake.text import format_plan, parse_lake, parse_plan_batch, render_text
from jaxlake.types import STAY

# One canvas for every hand-made lake: one compile of the jitted rollout.
CAP = dict(max_height=4, max_width=6, max_agents=4, max_steps=12)
_rollout = jax.jit(rollout)
KEY = jax.random.key(0)


def lake_of(text, on_goal="vanish", **fields):
    return parse_lake(text, on_goal=on_goal, **{**CAP, **fields})


def execute(lake, sol):
    """Roll the plan out with slip 0 and check it ran exactly as planned."""
    assert sol.actions.shape == (4, 12) and sol.actions.dtype == np.int32
    out = _rollout(KEY, lake, sol.actions).outcome
    n = int(lake.num_agents)
    assert bool(out.success), format_plan(sol.actions, n)
    np.testing.assert_array_equal(np.asarray(out.steps)[:n], sol.path_len[:n])
    for name in ("vertex_conflicts", "swap_conflicts", "blocks", "wall_bumps"):
        assert not np.asarray(getattr(out, name)).any(), name
    assert sol.sum_of_costs == int(sol.path_len[:n].sum())
    assert sol.makespan == int(sol.path_len[:n].max())
    return out


def test_crossing_needs_one_wait_costs_by_hand():
    # A: (1,0)->(1,2) and B: (0,1)->(2,1) both need (1,1) at t=1: one waits one step.
    lake = lake_of("~ B ~\nA . a\n~ b ~")
    sol = solve(lake)
    assert sol.found and sol.reason == ""
    assert sorted(sol.path_len[:2].tolist()) == [2, 3]
    assert sol.sum_of_costs == 5 and sol.makespan == 3
    assert (sol.path_len[2:] == -1).all() and (sol.actions[2:] == STAY).all()
    waiter = int(np.argmax(sol.path_len))
    assert sol.actions[waiter, 0] == STAY  # the wait comes first, then two moves
    execute(lake, sol)


def test_paths_match_actions_and_start_at_starts():
    lake = lake_of("A . . ~\n. ~ . b\nB . . a")
    sol = solve(lake)
    assert sol.found
    for i, path in enumerate(sol.paths):
        np.testing.assert_array_equal(path[0], np.asarray(lake.starts)[i])
        np.testing.assert_array_equal(path[-1], np.asarray(lake.goals)[i])
        assert len(path) == sol.path_len[i] + 1
    execute(lake, sol)


def test_corridor_pass_with_a_pocket():
    # A and B must pass each other in a one-cell corridor; (1,3) is the only pocket.
    lake = lake_of("b A . . B a\n~ ~ ~ . ~ ~")
    sol = solve(lake)
    assert sol.found
    shortest = np.asarray(lake.stats.path_len)[:2]
    np.testing.assert_array_equal(shortest, [4, 4])
    assert sol.sum_of_costs > shortest.sum()  # someone detours into the pocket
    execute(lake, sol)


def test_stay_rule_decides_who_waits():
    # B (1,2) -> b (0,4) must pass through A's goal (0,2). Both want (0,2) at t=1.
    text = ". A a . b\n~ ~ B ~ ~"
    for rule in ("vanish", "stay"):
        lake = lake_of(text, on_goal=rule)
        sol = solve(lake)
        assert sol.found and sol.sum_of_costs == 5 and sol.makespan == 3
        execute(lake, sol)
    # Under "stay" an arrived A would block (0,2) forever: A must be the one who waits.
    sol = solve(lake_of(text, on_goal="stay"))
    assert sol.path_len[:2].tolist() == [2, 3]


def test_stay_blocks_where_vanish_frees_the_goal():
    # B arrives first at (0,2), which A must cross to reach (0,3).
    text = "A B b a\n~ ~ ~ ~"
    vanish = lake_of(text, on_goal="vanish")
    sol = solve(vanish)
    assert sol.found and sol.path_len[:2].tolist() == [3, 1]  # A follows B, B vanishes
    execute(vanish, sol)
    stuck = solve(lake_of(text, on_goal="stay"))
    assert not stuck.found and stuck.sum_of_costs == -1 and stuck.makespan == -1
    assert (stuck.actions == STAY).all() and (stuck.path_len == -1).all()


def test_reordering_after_a_failed_priority():
    # Longest-first ties give A priority; A's shortest path then traps B. With B first, A
    # steps into the dead end (0,0)-(0,1) and lets B pass: A 6 steps, B 2 (optimal).
    lake = lake_of("b .\nA ~\nB a")
    sol = solve(lake)
    assert sol.found and sol.orderings == 2
    assert sol.path_len[:2].tolist() == [6, 2] and sol.sum_of_costs == 8 and sol.makespan == 6
    execute(lake, sol)
    # Under "stay" B occupies the only way out of the dead end for good.
    assert not solve(lake_of("b .\nA ~\nB a", on_goal="stay")).found


@pytest.mark.parametrize(
    "text, reason",
    [
        ("b A B\n~ ~ a", "no ordering succeeded"),  # a swap in a corridor: impossible
        ("~ B b\nA ~ a", "agent 0: goal unreachable"),
        ("A . . . . a\n~ ~ ~ ~ ~ ~", "distance 5 exceeds the horizon 4"),
    ],
)
def test_unsolvable_returns_not_found_quickly(text, reason):
    sol = solve(lake_of(text, max_steps=4 if "distance" in reason else 12))
    assert not sol.found and reason in sol.reason
    assert sol.expansions < 5_000


def test_budget_exhaustion_is_not_found():
    sol = solve(lake_of("b A B\n~ ~ a"), max_expansions=3)
    assert not sol.found and "budget" in sol.reason and sol.expansions == 3


def test_horizon_shorter_than_max_steps():
    lake = lake_of("~ B ~\nA . a\n~ b ~")
    assert solve(lake, horizon=3).found
    assert solve(lake, horizon=3).actions.shape == (4, 3)
    assert not solve(lake, horizon=2).found  # one of the two must wait: makespan 3


@st.composite
def small_lakes(draw):
    h, w = draw(st.integers(2, 4)), draw(st.integers(2, 6))
    cells = h * w
    n = draw(st.integers(1, min(4, cells // 2)))
    grid = np.where(np.asarray(draw(st.lists(st.booleans(), min_size=cells, max_size=cells))), "~", ".")
    grid = grid.astype(object).reshape(h, w)
    order = draw(st.permutations(range(cells)))
    for i in range(n):
        grid[divmod(order[2 * i], w)] = chr(ord("A") + i)
        grid[divmod(order[2 * i + 1], w)] = chr(ord("a") + i)
    text = "\n".join(" ".join(row) for row in grid)
    return text, draw(st.sampled_from(["vanish", "stay"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_lakes())
def test_found_plans_execute_exactly(case):
    text, rule = case
    lake = lake_of(text, on_goal=rule)
    sol = solve(lake)
    n = int(lake.num_agents)
    bfs = np.asarray(lake.stats.path_len)[:n]
    if sol.found:
        execute(lake, sol)
        assert (sol.path_len[:n] >= bfs).all()
    else:
        assert sol.reason
        if (bfs == UNREACHABLE).any():
            assert "unreachable" in sol.reason


@pytest.mark.slow  # ~30 s on 2 CPU cores, mostly compiling the generator and the rollout
def test_generated_lakes_succeed_under_rollout():

    configs = [
        LakeConfig(height=5, width=5, num_agents=2, hole_density=0.1, max_steps=16),
        LakeConfig(height=6, width=6, num_agents=3, hole_density=0.2, max_steps=16, on_goal="stay"),
        LakeConfig(height=6, width=6, num_agents=4, hole_density=0.15, conflict_density=0.9, max_steps=16),
        LakeConfig(height=4, width=6, num_agents=3, hole_density=0.1, max_steps=12, on_goal="stay"),
    ]
    configs = [c.replace(max_height=6, max_width=6, max_agents=4) for c in configs]
    per = 75
    stacked = stack_configs([c for c in configs for _ in range(per)])
    keys = jax.random.split(jax.random.key(7), per * len(configs))
    lakes = jax.jit(jax.vmap(generator.generate))(keys, stacked)
    batch = solve_batch(lakes)
    assert batch.actions.shape == (per * len(configs), 4, 16)
    outcome = jax.jit(jax.vmap(rollout, in_axes=(None, 0, 0)))(KEY, lakes, batch.actions).outcome
    found = batch.found
    success = np.asarray(outcome.success)
    assert success[found].all()
    steps = np.asarray(outcome.steps)
    np.testing.assert_array_equal(np.where(batch.path_len >= 0, steps, -1)[found], batch.path_len[found])
    assert (batch.path_len[found] >= np.asarray(lakes.stats.path_len)[found]).all()
    share = found.mean()
    print(f"solvable share {share:.3f} over {found.size} generated lakes;",
          [f"{found[k * per:(k + 1) * per].mean():.2f}" for k in range(len(configs))])
    assert share > 0.8
    # The warm-start path: plan -> canonical text -> parse -> the same padded actions.
    for b in range(0, found.size, 37):
        n = int(lakes.num_agents[b])
        text = format_plan(batch.actions[b], n)
        back, malformed = parse_plan_batch([text], n, max_agents=4, horizon=16)
        assert not malformed[0]
        np.testing.assert_array_equal(back[0], batch.actions[b])
        # Generated lakes round-trip through the text grid as well.
        lake = jax.tree_util.tree_map(lambda x: x[b], lakes)
        again = parse_lake(render_text(lake), max_height=6, max_width=6, max_agents=4,
                           max_steps=int(lake.max_steps), on_goal=int(lake.on_goal))
        for name in ("holes", "region", "starts", "goals", "num_agents", "max_steps", "on_goal"):
            np.testing.assert_array_equal(getattr(again, name), getattr(lake, name))
        np.testing.assert_array_equal(again.stats.path_len, lake.stats.path_len)
    assert solvable_share(jax.tree_util.tree_map(lambda x: x[:8], lakes)) == pytest.approx(found[:8].mean())
