"""Hand-written scenarios for every rule of ``jaxlake.env.step`` (docs/rules.md#one-step).

Lakes are drawn by hand (no generator): ``.`` frozen, ``~`` hole, ``A``.. agent starts,
``a``.. their goals. Every lake lives on the same 5x5 canvas with 4 agent slots, so the
jitted ``step`` compiles once for the whole file. Every scenario asserts exact positions,
statuses and event flags.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlake.env import reset, step
from jaxlake.types import (
    ABSENT,
    ACTION_LETTERS,
    ACTIVE,
    ARRIVED,
    FELL,
    ON_GOAL_CODES,
    TIMED_OUT,
    Lake,
    LakeStats,
    State,
)

CANVAS = (5, 5)
MAX_AGENTS = 4


# ------------------------------------------------------------------------- test helpers
def lake_from_rows(
    rows: Sequence[str],
    *,
    slip_prob: float = 0.0,
    max_steps: int = 32,
    on_goal: str = "vanish",
    canvas: tuple[int, int] = CANVAS,
    max_agents: int = MAX_AGENTS,
) -> Lake:
    """A ``Lake`` from rows like ``["A . a", ". ~ .", "b . B"]`` (dummy ``LakeStats``)."""
    grid = [row.split() for row in rows]
    height, width = len(grid), len(grid[0])
    assert all(len(r) == width for r in grid), "ragged rows"
    assert height <= canvas[0] and width <= canvas[1]
    holes = np.zeros(canvas, bool)
    region = np.zeros(canvas, bool)
    region[:height, :width] = True
    starts = np.zeros((max_agents, 2), np.int32)
    goals = np.zeros((max_agents, 2), np.int32)
    seen_start, seen_goal = set(), set()
    for r, row in enumerate(grid):
        for c, ch in enumerate(row):
            if ch == "~":
                holes[r, c] = True
            elif ch.isupper():
                starts[ord(ch) - ord("A")] = (r, c)
                seen_start.add(ord(ch) - ord("A"))
            elif ch.islower():
                goals[ord(ch) - ord("a")] = (r, c)
                seen_goal.add(ord(ch) - ord("a"))
            else:
                assert ch == ".", f"unknown symbol {ch!r}"
    n = len(seen_start)
    assert seen_start == set(range(n)) == seen_goal, "agents must be A.. with goals a.."
    stats = LakeStats(
        hole_density=jnp.float32(holes.sum() / (height * width)),
        conflict_density=jnp.float32(0.0),
        path_len=jnp.full((max_agents,), -1, jnp.int32),
        dist_ok=jnp.bool_(True),
        attempts=jnp.int32(1),
    )
    return Lake(
        holes=jnp.asarray(holes),
        region=jnp.asarray(region),
        starts=jnp.asarray(starts),
        goals=jnp.asarray(goals),
        num_agents=jnp.int32(n),
        slip_prob=jnp.float32(slip_prob),
        max_steps=jnp.int32(max_steps),
        on_goal=jnp.int32(ON_GOAL_CODES[on_goal]),
        stats=stats,
    )


def acts(letters: str, max_agents: int = MAX_AGENTS) -> jax.Array:
    """``"R L S"`` -> ``[A]`` int32 actions (missing agents STAY)."""
    ids = [ACTION_LETTERS.index(ch) for ch in letters.split()]
    return jnp.asarray(ids + [0] * (max_agents - len(ids)), jnp.int32)


STEP = jax.jit(step)
KEY = jax.random.key(0)


def run(lake: Lake, *moves: str, state: State | None = None):
    """Apply each joint move in turn; return the final state and the list of infos."""
    state = reset(lake) if state is None else state
    infos = []
    for k, m in enumerate(moves):
        state, info = STEP(jax.random.fold_in(KEY, k), lake, state, acts(m))
        infos.append(info)
    return state, infos


def assert_pos(state: State, expected: Sequence[tuple[int, int]]) -> None:
    np.testing.assert_array_equal(np.asarray(state.pos)[: len(expected)], np.asarray(expected))


def assert_status(state: State, expected: Sequence[int]) -> None:
    np.testing.assert_array_equal(np.asarray(state.status)[: len(expected)], np.asarray(expected))


def flags(info, name: str, n: int) -> list[bool]:
    return [bool(x) for x in np.asarray(getattr(info, name))[:n]]


def assert_flags(info, n: int, **expected: Sequence[bool]) -> None:
    """Named flags must equal the given lists; every other conflict flag must be all False."""
    for name in ("vertex_conflict", "swap_conflict", "blocked", "wall", "slipped", "fell", "arrived", "timed_out"):
        want = list(expected.get(name, [False] * n))
        assert flags(info, name, n) == want, f"{name}: {flags(info, name, n)} != {want}"


# ------------------------------------------------------------------------------ reset
def test_reset_places_agents_and_marks_unused_slots_absent():
    lake = lake_from_rows(["A . a", ". ~ .", "b . B"])
    state = reset(lake)
    assert_pos(state, [(0, 0), (2, 2)])
    np.testing.assert_array_equal(np.asarray(state.status), [ACTIVE, ACTIVE, ABSENT, ABSENT])
    assert int(state.t) == 0


def test_reset_works_on_a_batch_of_lakes():
    lakes = jax.tree.map(lambda *xs: jnp.stack(xs), lake_from_rows(["A a ."]), lake_from_rows(["A B b a"]))
    state = reset(lakes)
    assert state.t.shape == (2,)
    np.testing.assert_array_equal(np.asarray(state.status[:, :2]), [[ACTIVE, ABSENT], [ACTIVE, ACTIVE]])


# ----------------------------------------------------------------------- conflict rules
def test_follow_the_leader_chain_of_three_moves_right():
    lake = lake_from_rows(
        [
            "A B C . .",
            ". . . . .",
            "a b c . .",
        ]
    )
    state, (info,) = run(lake, "R R R")
    assert_pos(state, [(0, 1), (0, 2), (0, 3)])
    assert_status(state, [ACTIVE] * 3)
    assert_flags(info, 3)
    assert flags(info, "moved", 3) == [True, True, True]


def test_rotation_of_four_in_a_2x2_block_is_allowed():
    lake = lake_from_rows(
        [
            "A B . . .",
            "D C . . .",
            ". . . . .",
            "a b c d .",
        ]
    )
    # A right, B down, C left, D up: a clockwise rotation, every agent moves.
    state, (info,) = run(lake, "R D L U")
    assert_pos(state, [(0, 1), (1, 1), (1, 0), (0, 0)])
    assert_flags(info, 4)
    assert flags(info, "moved", 4) == [True] * 4


def test_swap_cancels_both_movers():
    lake = lake_from_rows(
        [
            "A B .",
            ". . .",
            "b a .",
        ]
    )
    state, (info,) = run(lake, "R L")
    assert_pos(state, [(0, 0), (0, 1)])
    assert_flags(info, 2, swap_conflict=[True, True])
    assert flags(info, "moved", 2) == [False, False]


def test_three_way_vertex_conflict_cancels_all_three():
    lake = lake_from_rows(
        [
            ". A . .",
            "B . C .",
            ". . . D",
            "a b c d",
        ]
    )
    # A down, B right, C left: all target (1, 1). D moves independently.
    state, (info,) = run(lake, "D R L L")
    assert_pos(state, [(0, 1), (1, 0), (1, 2), (2, 2)])
    assert_flags(info, 4, vertex_conflict=[True, True, True, False])
    assert flags(info, "moved", 4) == [False, False, False, True]


@pytest.mark.parametrize(
    "rows, moves, order",
    [
        # Letters: row 2 is  X Y P .  and Q stands above the empty cell; P and Q collide.
        (["a b c d", ". . . B", "D C A .", ". . . ."], "R D R R", "ABCD"),
        # The same geometry with the agents numbered the other way round.
        (["d c b a", ". . . C", "A B D .", ". . . ."], "R R D R", "DCBA"),
        (["b a d c", ". . . A", "C D B .", ". . . ."], "D R R R", "BADC"),
    ],
)
def test_chain_blocked_behind_a_cancelled_agent(rows, moves, order):
    """Two movers collide; the agent following one of them is blocked, and the one behind it too.

    Geometry (same in every parametrisation): ``X Y P .`` on row 2 with ``Q`` at (1, 3).
    ``P`` moves right into (2, 3) and ``Q`` moves down into (2, 3): vertex conflict.
    ``Y`` follows ``P`` (blocked: P stays), ``X`` follows ``Y`` (blocked in the next round).
    ``order`` names the agents playing P, Q, Y, X.
    """
    lake = lake_from_rows(rows)
    state, (info,) = run(lake, moves)
    p, q, y, x = (ord(ch) - ord("A") for ch in order)
    pos = np.asarray(state.pos)
    assert tuple(pos[p]) == (2, 2) and tuple(pos[q]) == (1, 3)
    assert tuple(pos[y]) == (2, 1) and tuple(pos[x]) == (2, 0)
    vertex, blocked = np.asarray(info.vertex_conflict), np.asarray(info.blocked)
    assert vertex[p] and vertex[q] and not vertex[y] and not vertex[x]
    assert blocked[y] and blocked[x] and not blocked[p] and not blocked[q]
    assert not np.asarray(info.swap_conflict).any()
    assert not np.asarray(info.moved).any()


def test_long_blocking_chain_needs_every_round():
    """A chain of four behind a staying agent: each blocking round cancels one more mover."""
    lake = lake_from_rows(["A B C D", ". . . .", "a b c d"])
    state, (info,) = run(lake, "R R R S")
    assert_pos(state, [(0, 0), (0, 1), (0, 2), (0, 3)])
    assert_flags(info, 4, blocked=[True, True, True, False])


def test_follower_of_a_vertex_loser_is_blocked():
    lake = lake_from_rows(
        [
            "A B . C",
            ". . . .",
            "a . b c",
        ]
    )
    # A -> (0,1) follows B; B -> (0,2) collides with C -> (0,2): A blocked, B and C vertex.
    state, (info,) = run(lake, "R R L")
    assert_pos(state, [(0, 0), (0, 1), (0, 3)])
    assert_flags(info, 3, vertex_conflict=[False, True, True], blocked=[True, False, False])


def test_swap_and_vertex_on_the_same_agent():
    lake = lake_from_rows(
        [
            "A B .",
            ". C .",
            "a b c",
        ]
    )
    # A and B swap; C moves up into (0, 1) = A's target as well.
    state, (info,) = run(lake, "R L U")
    assert_pos(state, [(0, 0), (0, 1), (1, 1)])
    assert flags(info, "swap_conflict", 3) == [True, True, False]
    assert flags(info, "vertex_conflict", 3) == [True, False, True]
    assert flags(info, "blocked", 3) == [False, False, False]


# ------------------------------------------------------------------------------ walls
def test_walls_of_the_region_and_of_the_canvas_keep_agents_in_place():
    # Region 3 wide inside the 5-wide canvas: moving right from column 2 hits the region
    # wall; moving up from row 0 hits the canvas wall.
    lake = lake_from_rows(
        [
            "A . B",
            ". . .",
            "a b .",
        ]
    )
    state, (info,) = run(lake, "U R")
    assert_pos(state, [(0, 0), (0, 2)])
    assert_flags(info, 2, wall=[True, True])
    assert flags(info, "moved", 2) == [False, False]
    # The region's bottom edge as well as the canvas's right/bottom edges.
    full = lake_from_rows(
        [
            "a . . . .",
            ". . . . .",
            ". . . . .",
            ". . . . b",
            "B . . . A",
        ]
    )
    state, (info,) = run(full, "R L")
    assert_pos(state, [(4, 4), (4, 0)])
    assert_flags(info, 2, wall=[True, True])
    state, (info,) = run(full, "D D")
    assert_pos(state, [(4, 4), (4, 0)])
    assert_flags(info, 2, wall=[True, True])


def test_an_agent_bumping_a_wall_blocks_a_follower():
    lake = lake_from_rows(
        [
            "B A",
            ". .",
            "a b",
        ]
    )
    state, (info,) = run(lake, "R R")
    assert_pos(state, [(0, 1), (0, 0)])
    assert_flags(info, 2, wall=[True, False], blocked=[False, True])


# ----------------------------------------------------------------------- goal rules
@pytest.mark.parametrize("on_goal", ["stay", "vanish"])
def test_stay_blocks_the_goal_cell_while_vanish_frees_it(on_goal):
    lake = lake_from_rows(
        [
            "A a B",
            ". . .",
            "b . .",
        ],
        on_goal=on_goal,
    )
    state, (info,) = run(lake, "R S")
    assert_pos(state, [(0, 1), (0, 2)])
    assert_status(state, [ARRIVED, ACTIVE])
    assert_flags(info, 2, arrived=[True, False])
    assert np.asarray(info.reward)[:2].tolist() == [1.0, 0.0]
    # B now walks onto A's goal cell; A's (ignored) action tries to move it away.
    state, (info,) = run(lake, "D L", state=state)
    if on_goal == "stay":
        assert_pos(state, [(0, 1), (0, 2)])
        assert_flags(info, 2, blocked=[False, True])
    else:
        assert_pos(state, [(0, 1), (0, 1)])
        assert_flags(info, 2)
        assert flags(info, "moved", 2) == [False, True]
    assert_status(state, [ARRIVED, ACTIVE])


def test_following_an_agent_that_arrives_is_allowed_under_stay():
    lake = lake_from_rows(["B A a", ". . .", "b . ."], on_goal="stay")
    state, (info,) = run(lake, "R R")
    assert_pos(state, [(0, 2), (0, 1)])
    assert_status(state, [ARRIVED, ACTIVE])
    assert_flags(info, 2, arrived=[True, False])


# ------------------------------------------------------------------------------ holes
def test_falling_into_a_hole_and_the_hole_not_blocking_others():
    lake = lake_from_rows(
        [
            "A ~ B",
            ". . .",
            "a b .",
        ]
    )
    state, (info,) = run(lake, "R S")
    assert_pos(state, [(0, 1), (0, 2)])  # the fallen agent keeps the hole as its last cell
    assert_status(state, [FELL, ACTIVE])
    assert_flags(info, 2, fell=[True, False])
    assert np.asarray(info.reward)[:2].tolist() == [-1.0, 0.0]
    # The fallen agent has left the board: B is not blocked by it and falls too.
    state, (info,) = run(lake, "R L", state=state)
    assert_status(state, [FELL, FELL])
    assert_pos(state, [(0, 1), (0, 1)])
    assert_flags(info, 2, fell=[False, True])
    assert bool(info.done)


def test_following_an_agent_that_falls_and_configurable_rewards():
    lake = lake_from_rows(["B A ~", ". b .", "a . ."])
    state = reset(lake)
    state, info = STEP(KEY, lake, state, acts("R R"), arrive_reward=5.0, fall_reward=-3.0)
    assert_pos(state, [(0, 2), (0, 1)])
    assert_status(state, [FELL, ACTIVE])
    assert np.asarray(info.reward)[:2].tolist() == [-3.0, 0.0]
    state, info = STEP(KEY, lake, state, acts("S D"), arrive_reward=5.0, fall_reward=-3.0)
    assert_status(state, [FELL, ARRIVED])
    assert np.asarray(info.reward)[:2].tolist() == [0.0, 5.0]


def test_vertex_conflict_on_a_hole_saves_both():
    lake = lake_from_rows(["A ~ B", ". . .", "a . b"])
    state, (info,) = run(lake, "R L")
    assert_status(state, [ACTIVE, ACTIVE])
    assert_flags(info, 2, vertex_conflict=[True, True])


# ------------------------------------------------------------------------ time, done
def test_timeout_at_max_steps_and_arrival_on_the_last_step_wins():
    lake = lake_from_rows(["A . a", ". . .", "B b ."], max_steps=2)
    state, (i1, i2) = run(lake, "R S", "R S")
    assert_status(state, [ARRIVED, TIMED_OUT])
    assert int(state.t) == 2
    assert_flags(i1, 2)
    assert_flags(i2, 2, arrived=[True, False], timed_out=[False, True])
    assert bool(i2.done) and not bool(i1.done)
    assert np.asarray(i2.reward)[:2].tolist() == [1.0, 0.0]


def test_stepping_a_done_episode_changes_nothing_and_pays_nothing():
    lake = lake_from_rows(["A . a", ". . .", "B b ."], max_steps=1)
    done_state, (info,) = run(lake, "S S")
    assert_status(done_state, [TIMED_OUT, TIMED_OUT])
    assert bool(info.done)
    state, infos = run(lake, "R R", "D U", state=done_state)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(done_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for info in infos:
        assert bool(info.done)
        assert not np.asarray(info.reward).any()
        for name in ("arrived", "fell", "timed_out", "slipped", "wall", "vertex_conflict", "swap_conflict", "blocked", "moved"):
            assert not np.asarray(getattr(info, name)).any(), name


def test_actions_of_inactive_agents_and_out_of_range_actions_are_stay():
    lake = lake_from_rows(["A . a", ". . .", "B b ."], on_goal="stay")
    state = reset(lake)
    state, info = STEP(KEY, lake, state, jnp.asarray([-1, 5, 2, 1], jnp.int32))
    assert_pos(state, [(0, 0), (2, 0)])
    assert not np.asarray(info.moved).any() and not np.asarray(info.wall).any()
    # Absent slots 2 and 3 got moves too: their status and pos stay as they were.
    np.testing.assert_array_equal(np.asarray(state.status), [ACTIVE, ACTIVE, ABSENT, ABSENT])
    np.testing.assert_array_equal(np.asarray(state.pos), np.asarray(reset(lake).pos))
    assert int(state.t) == 1
    with pytest.raises(TypeError, match="actions must be integers"):  # docs/rules.md#conventions
        step(KEY, lake, reset(lake), jnp.asarray([1.0, 2.0, 0.0, 0.0]))


# ------------------------------------------------------------------------------ slip
def test_slip_prob_one_always_goes_perpendicular_and_stay_never_slips():
    lake = lake_from_rows([". . . . .", ". . . . .", ". . A . .", ". B . . .", "a . . . b"], slip_prob=1.0)
    keys = jax.random.split(jax.random.key(7), 256)
    state = reset(lake)
    batched = jax.jit(jax.vmap(step, in_axes=(0, None, None, None)))
    for action, perpendicular in (("U", {(2, 1), (2, 3)}), ("L", {(1, 2), (3, 2)})):
        nxt, info = batched(keys, lake, state, acts(action + " S"))
        cells = {tuple(p) for p in np.asarray(nxt.pos[:, 0])}
        assert cells == perpendicular  # both perpendicular cells occur, nothing else
        assert np.asarray(info.slipped[:, 0]).all()
        assert not np.asarray(info.slipped[:, 1]).any()  # STAY never slips
        assert (np.asarray(nxt.pos[:, 1]) == [3, 1]).all()
