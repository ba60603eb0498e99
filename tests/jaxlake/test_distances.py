"""BFS distances and lake statistics against an independent plain-Python BFS."""

from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlake.distances import (
    UNREACHABLE,
    bfs_distances,
    distance_field,
    distance_fields,
    lake_stats,
    pack,
    unpack,
)
from jaxlake.types import Lake, LakeStats

_field = jax.jit(distance_field)
_fields = jax.jit(distance_fields)
_stats = jax.jit(lake_stats)


def reference_bfs(free: np.ndarray, source: tuple[int, int]) -> np.ndarray:
    """Plain BFS: distances through free cells, UNREACHABLE elsewhere."""
    h, w = free.shape
    dist = np.full((h, w), UNREACHABLE, dtype=np.int64)
    if not free[source]:
        return dist
    dist[source] = 0
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            rr, cc = r + dr, c + dc
            if 0 <= rr < h and 0 <= cc < w and free[rr, cc] and dist[rr, cc] == UNREACHABLE:
                dist[rr, cc] = dist[r, c] + 1
                queue.append((rr, cc))
    return dist


@pytest.mark.parametrize("shape", [(1, 2), (3, 5), (7, 9), (8, 8), (3, 40), (13, 11)])
def test_distance_field_matches_reference_bfs(shape):
    rng = np.random.default_rng(sum(shape))
    for trial in range(6):
        free = rng.random(shape) > rng.uniform(0.0, 0.5)
        source = (int(rng.integers(shape[0])), int(rng.integers(shape[1])))
        got = np.asarray(_field(jnp.asarray(free), jnp.asarray(source, jnp.int32)))
        np.testing.assert_array_equal(got, reference_bfs(free, source), err_msg=f"{shape} trial {trial}")


def test_long_serpentine_path_needs_many_bit_planes():
    # 16x16 serpentine: walls on odd rows except one gap alternating sides -> distances > 127
    free = np.ones((16, 16), bool)
    for r in range(1, 16, 2):
        free[r, :] = False
        free[r, 15 if (r // 2) % 2 == 0 else 0] = True
    got = np.asarray(_field(jnp.asarray(free), jnp.asarray((0, 0), jnp.int32)))
    want = reference_bfs(free, (0, 0))
    np.testing.assert_array_equal(got, want)
    assert want[free].max() > 127


def test_unfree_source_reaches_nothing():
    free = np.ones((4, 4), bool)
    free[1, 2] = False
    got = np.asarray(_field(jnp.asarray(free), jnp.asarray((1, 2), jnp.int32)))
    assert (got == UNREACHABLE).all()


def test_hand_computed_distances():
    free = np.array([[1, 1, 1], [0, 0, 1], [1, 1, 1]], bool)
    got = np.asarray(_field(jnp.asarray(free), jnp.asarray((0, 0), jnp.int32)))
    U = UNREACHABLE
    np.testing.assert_array_equal(got, [[0, 1, 2], [U, U, 3], [6, 5, 4]])


def test_multi_seed_bfs_is_min_over_sources():
    rng = np.random.default_rng(3)
    free = rng.random((6, 7)) > 0.25
    seeds = np.zeros((2, 6, 7), bool)
    seeds[0, 0, 0] = seeds[0, 5, 6] = True
    seeds[1, 2, 3] = True
    got = np.asarray(jax.jit(bfs_distances)(jnp.asarray(free), jnp.asarray(seeds)))
    np.testing.assert_array_equal(got[0], np.minimum(reference_bfs(free, (0, 0)), reference_bfs(free, (5, 6))))
    np.testing.assert_array_equal(got[1], reference_bfs(free, (2, 3)))


def test_pack_unpack_round_trip():
    rng = np.random.default_rng(0)
    cells = rng.random((3, 70, 5)) > 0.5
    np.testing.assert_array_equal(np.asarray(unpack(pack(jnp.asarray(cells)), 70)), cells)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0.0, 0.7), st.integers(0, 7), st.integers(0, 7))
def test_distance_fields_property(seed, density, r, c):
    free = np.random.default_rng(seed).random((8, 8)) >= density
    sources = jnp.asarray([[r, c], [7 - r, 7 - c]], jnp.int32)
    got = np.asarray(_fields(jnp.asarray(free), sources))
    np.testing.assert_array_equal(got[0], reference_bfs(free, (r, c)))
    np.testing.assert_array_equal(got[1], reference_bfs(free, (7 - r, 7 - c)))


def test_distance_field_vmaps():
    rng = np.random.default_rng(5)
    free = rng.random((4, 5, 5)) > 0.3
    sources = jnp.asarray([[0, 0], [1, 1], [4, 4], [2, 3]], jnp.int32)
    got = np.asarray(jax.vmap(distance_field)(jnp.asarray(free), sources))
    for i in range(4):
        np.testing.assert_array_equal(got[i], reference_bfs(free[i], tuple(np.asarray(sources[i]))))


# ============================================================================ lake_stats
def make_lake(holes, region_hw, starts, goals, num_agents, canvas=(4, 4), max_agents=4):
    h, w = canvas
    hole = np.zeros(canvas, bool)
    for cell in holes:
        hole[cell] = True
    region = np.zeros(canvas, bool)
    region[: region_hw[0], : region_hw[1]] = True
    s = np.zeros((max_agents, 2), np.int32)
    g = np.zeros((max_agents, 2), np.int32)
    s[: len(starts)] = starts
    g[: len(goals)] = goals
    placeholder = LakeStats(
        hole_density=jnp.float32(0), conflict_density=jnp.float32(0),
        path_len=jnp.zeros((max_agents,), jnp.int32), dist_ok=jnp.bool_(False), attempts=jnp.int32(0),
    )
    return Lake(
        holes=jnp.asarray(hole), region=jnp.asarray(region), starts=jnp.asarray(s), goals=jnp.asarray(g),
        num_agents=jnp.int32(num_agents), slip_prob=jnp.float32(0), max_steps=jnp.int32(10),
        on_goal=jnp.int32(0), stats=placeholder,
    )


def test_lake_stats_hand_computed_conflict():
    # 3x3 region, holes at (1,0),(1,1): agent 0 walks the U from (0,0) to (2,0) (length 6),
    # agent 1 goes (2,2)->(0,2) (length 2) along the right column, which agent 0 also uses.
    lake = make_lake([(1, 0), (1, 1)], (3, 3), [(0, 0), (2, 2)], [(2, 0), (0, 2)], 2)
    stats = _stats(lake, 1, None)
    assert float(stats.hole_density) == pytest.approx(2 / 9)
    assert float(stats.conflict_density) == 1.0
    np.testing.assert_array_equal(np.asarray(stats.path_len), [6, 2, -1, -1])
    assert bool(stats.dist_ok)
    assert int(stats.attempts) == 1
    # bounds: max_dist 5 excludes agent 0's path of 6, min_dist 3 excludes agent 1's 2
    assert not bool(_stats(lake, 1, 5).dist_ok)
    assert not bool(_stats(lake, 3, None).dist_ok)
    assert bool(_stats(lake, 2, 6).dist_ok)


def test_lake_stats_disjoint_paths_and_three_agents():
    # 4x4 hole-free: agents along rows 0, 1 and 3 -> shortest paths are the rows, disjoint
    lake = make_lake([], (4, 4), [(0, 0), (1, 0), (3, 0)], [(0, 3), (1, 3), (3, 3)], 3)
    stats = _stats(lake, 1, None)
    assert float(stats.conflict_density) == 0.0
    # make agent 2 go diagonally (3,0)->(0,3): its shortest paths fill the square -> meets both
    lake = make_lake([], (4, 4), [(0, 0), (1, 0), (3, 0)], [(0, 3), (1, 3), (2, 1)], 3)
    stats = _stats(lake, 1, None)
    # agent 2: (3,0)->(2,1), SP = {(3,0),(2,0),(3,1),(2,1)}: meets neither row 0 nor row 1
    assert float(stats.conflict_density) == 0.0
    lake = make_lake([], (4, 4), [(0, 0), (1, 0), (3, 0)], [(0, 3), (1, 3), (1, 1)], 3)
    # agent 2: (3,0)->(1,1) covers rows 1..3, cols 0..1: meets agent 1's row only -> 1 of 3 pairs
    assert float(_stats(lake, 1, None).conflict_density) == pytest.approx(1 / 3)


def test_lake_stats_unreachable_goal_and_single_agent():
    lake = make_lake([(1, 0), (1, 1), (1, 2), (1, 3)], (4, 4), [(0, 0)], [(3, 3)], 1)
    stats = _stats(lake, 1, None)
    assert int(stats.path_len[0]) == UNREACHABLE
    assert not bool(stats.dist_ok)
    assert float(stats.conflict_density) == 0.0
    np.testing.assert_array_equal(np.asarray(stats.path_len[1:]), [-1, -1, -1])
