"""jaxlake.analysis: grouped generation, achieved-vs-target curves, path lengths, planner stats."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlake import analysis
from jaxlake.config import ConfigError, LakeConfig
from jaxlake.generator import generate
from jaxlake.text import parse_lake

# One capacity and one batch size (3 groups x 8 lakes) for every generated batch: one compile.
BASE = LakeConfig(height=5, width=5, num_agents=3, hole_density=0.2, conflict_density=0.5, max_steps=12,
                  max_height=5, max_width=5, max_agents=3)
HOLES = (0.0, 0.2, 0.4)
N = 8


@pytest.fixture(scope="module")
def hole_sweep():
    return analysis.generate_sweep(jax.random.key(0), BASE, "hole_density", HOLES, N)


def test_groups_are_blocks_and_each_lake_equals_the_one_generated_alone(hole_sweep):
    assert hole_sweep.num_groups == 3 and hole_sweep.n == N
    assert hole_sweep.field == "hole_density" and hole_sweep.values == HOLES
    assert np.asarray(hole_sweep.lakes.num_agents).shape == (3 * N,)
    keys = jax.random.split(jax.random.key(0), 3 * N)
    for i in (0, N + 3, 3 * N - 1):  # one lake per group
        alone = generate(keys[i], BASE.replace(hole_density=HOLES[i // N]))
        one = jax.tree.map(lambda x: x[i], hole_sweep.lakes)
        for a, b in zip(jax.tree.leaves(alone), jax.tree.leaves(one)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    g1 = hole_sweep.group(1)
    np.testing.assert_array_equal(np.asarray(g1.holes), np.asarray(hole_sweep.lakes.holes)[N:2 * N])
    with pytest.raises(IndexError, match="group k=3"):
        hole_sweep.group(3)


def test_achieved_densities_are_the_lakes_own_hole_shares(hole_sweep):
    curve = analysis.achieved_vs_target(hole_sweep)
    np.testing.assert_allclose(curve.targets, HOLES)
    holes = np.asarray(hole_sweep.lakes.holes).sum(axis=(1, 2))
    cells = np.asarray(hole_sweep.lakes.region).sum(axis=(1, 2))
    np.testing.assert_allclose(curve.achieved.ravel(), holes / cells, rtol=1e-6)
    np.testing.assert_allclose(curve.mean, (holes / cells).reshape(3, N).mean(axis=1), rtol=1e-6)
    assert curve.achieved[0].max() == 0.0  # target 0: no hole anywhere
    own_means = (holes / cells).reshape(3, N).mean(axis=1)  # from the lakes, not from the curve
    assert curve.max_abs_error == pytest.approx(np.max(np.abs(own_means - np.asarray(HOLES))), abs=1e-6)
    with pytest.raises(ValueError, match="no achieved value"):
        analysis.achieved_vs_target(hole_sweep, "slip_prob")


def test_path_lengths_are_the_in_play_bfs_distances(hole_sweep):
    lengths = analysis.agent_path_lengths(hole_sweep.lakes)
    assert lengths.shape == (3 * N * 3,) and lengths.min() >= 1  # 3 agents per lake, all in play
    lake = parse_lake("A . . a\n. ~ ~ .\nB . b .", max_agents=4)
    assert analysis.agent_path_lengths(lake).tolist() == [3, 2]  # absent slots left out


def test_group_mean_ci_by_hand():
    groups = analysis.generate_groups(jax.random.key(1), [BASE, BASE.replace(num_agents=2), BASE], N)
    values = np.zeros(3 * N)
    values[:N] = 1.0
    values[N:2 * N] = np.arange(N)
    mean, half, count = analysis.group_mean_ci(groups, values)
    sd = np.std(np.arange(N), ddof=1)
    t7 = 2.364624  # 97.5 % quantile of Student's t with 7 degrees of freedom
    np.testing.assert_allclose(mean, [1.0, 3.5, 0.0])
    np.testing.assert_allclose(half, [0.0, t7 * sd / math.sqrt(N), 0.0], rtol=1e-6)
    assert count.tolist() == [N, N, N]
    mask = np.zeros(3 * N, bool)
    mask[N:N + 2] = True  # group 1: values 0 and 1 only; group 0 and 2: nothing
    mean, half, count = analysis.group_mean_ci(groups, values, mask)
    assert count.tolist() == [0, 2, 0] and mean[1] == 0.5 and np.isnan(mean[0]) and np.isnan(half[2])
    assert np.asarray(groups.group(1).num_agents).tolist() == [2] * N
    with pytest.raises(ValueError, match="leading axis"):
        analysis.group_mean_ci(groups, values[:-1])


def test_planner_stats_delay_of_a_crossing_by_hand():
    # A: (1,0)->(1,2) and B: (0,1)->(2,1) both need the centre at t=1: one of them waits once.
    one = parse_lake("~ B ~\nA . a\n~ b ~", max_steps=8)
    lakes = jax.tree.map(lambda x: np.stack([x, x]), one)
    stats = analysis.planner_stats(lakes)
    assert stats.found.tolist() == [True, True] and stats.solved_share == 1.0
    assert stats.sum_of_costs.tolist() == [5, 5] and stats.makespan.tolist() == [3, 3]
    assert sorted(stats.delay[0].tolist()) == [0, 1]
    assert sorted(stats.delays().tolist()) == [0, 0, 1, 1]
    assert stats.actions.shape == (2, 2, 8)


def test_planner_stats_marks_unsolved_lakes():
    # the horizon is too short for A's 3 steps: nothing found, no delays
    lakes = jax.tree.map(lambda x: np.asarray(x)[None], parse_lake("A . . a", max_steps=2))
    stats = analysis.planner_stats(lakes)
    assert stats.found.tolist() == [False] and stats.solved_share == 0.0
    assert stats.delay.tolist() == [[-1]] and stats.delays().size == 0


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_planner_delays_are_never_negative_and_add_up(seed):
    groups = analysis.generate_sweep(jax.random.key(seed), BASE, "conflict_density", (0.0, 0.5, 1.0), N)
    stats = analysis.planner_stats(groups.lakes)
    bfs = np.asarray(groups.lakes.stats.path_len)
    for b in np.nonzero(stats.found)[0]:
        n = int(np.asarray(groups.lakes.num_agents)[b])
        assert (stats.delay[b, :n] >= 0).all()
        assert stats.sum_of_costs[b] == int(bfs[b, :n].sum() + stats.delay[b, :n].sum())


def test_bad_sweeps_name_the_field():
    with pytest.raises(ConfigError, match="field='max_width' cannot be swept"):
        analysis.generate_sweep(jax.random.key(0), BASE, "max_width", [4], 2)
    with pytest.raises(ConfigError, match=r"hole_density=1.5 not in \[0.0, 0.9\]"):
        analysis.generate_sweep(jax.random.key(0), BASE, "hole_density", [0.1, 1.5], 2)
    with pytest.raises(ConfigError, match="n=0"):
        analysis.generate_groups(jax.random.key(0), [BASE], 0)
    with pytest.raises(ConfigError, match="max_agents"):
        analysis.generate_groups(jax.random.key(0), [BASE, BASE.replace(max_agents=4)], 2)
