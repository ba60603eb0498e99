"""The plan baselines of jaxlake/baselines.py: the straight walk (floor), each agent's shortest
path alone, and the reference planner (ceiling), played through the text path a policy uses."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlake import baselines
from jaxlake.config import LakeConfig
from jaxlake.generator import generate_many, stack_configs
from jaxlake.suite import build_suite, load_eval_conf, unbatch
from jaxlake.text import format_plan, parse_lake
from jaxlake.types import DOWN, LEFT, RIGHT, STAY, UP

KEY = jax.random.PRNGKey(0)


def _batch(*lakes):
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *lakes)


def test_straight_walks_rows_then_columns_into_the_hole_alone_goes_around():
    lake = parse_lake("A . .\n~ ~ .\na . .", max_steps=6)
    assert baselines.straight_plan(lake)[0].tolist() == [DOWN, DOWN, STAY, STAY, STAY, STAY]
    # around the holes: right twice, down twice, left twice (the first shortest move in action order)
    assert baselines.alone_plan(lake)[0].tolist() == [RIGHT, RIGHT, DOWN, DOWN, LEFT, LEFT]
    lakes = _batch(lake)
    straight = baselines.score_plans(lakes, baselines.batch_plans(baselines.straight_plan, lakes), KEY)
    alone = baselines.score_plans(lakes, baselines.batch_plans(baselines.alone_plan, lakes), KEY)
    assert (straight["score"], straight["fall_rate"]) == (0.0, 1.0)
    assert (alone["score"], alone["fall_rate"]) == (1.0, 0.0)


def test_alone_ignores_the_others_and_loses_to_their_conflict_the_planner_does_not():
    # A walks right and B walks down, both through the centre at the same steps: each time a
    # vertex conflict cancels both moves; the planner makes one of them wait
    lake = parse_lake(". B .\nA . a\n. b .", max_steps=4)
    lakes = _batch(lake)
    scores = {name: baselines.score_plans(lakes, plans, KEY) for name, plans in baselines.baseline_plans(lakes).items()}
    assert list(scores) == list(baselines.NAMES)
    for blind in ("straight", "alone"):
        assert (scores[blind]["score"], scores[blind]["conflict_rate"]) == (0.0, 1.0), blind
    assert (scores["reference"]["score"], scores["reference"]["conflict_rate"]) == (1.0, 0.0)


def test_an_unreachable_goal_stays():
    lake = parse_lake("A ~ a", max_steps=4)
    assert baselines.alone_plan(lake)[0].tolist() == [STAY] * 4
    assert baselines.straight_plan(lake)[0].tolist() == [RIGHT, RIGHT, STAY, STAY]


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), agents=st.integers(1, 3), holes=st.sampled_from([0.0, 0.2, 0.3]))
def test_alone_plans_are_shortest_and_hole_free_and_straight_is_manhattan(seed, agents, holes):
    """On generated lakes every agent's alone plan is exactly as long as its BFS distance
    (``stats.path_len``) and the text round trip keeps it; the straight plan is as long as
    the Manhattan distance (cut at the horizon)."""
    cfg = LakeConfig(height=5, width=5, num_agents=agents, hole_density=holes, max_steps=16,
                     max_height=5, max_width=5, max_agents=3)
    lakes = generate_many(jax.random.split(jax.random.PRNGKey(seed), 4), stack_configs([cfg] * 4))
    for lake in unbatch(lakes):
        n = int(lake.num_agents)
        alone, straight = baselines.alone_plan(lake), baselines.straight_plan(lake)
        moves = np.sum(alone[:n] != STAY, axis=1)
        np.testing.assert_array_equal(moves, np.asarray(lake.stats.path_len)[:n])
        manhattan = np.abs(np.asarray(lake.starts)[:n] - np.asarray(lake.goals)[:n]).sum(-1)
        np.testing.assert_array_equal(np.sum(straight[:n] != STAY, axis=1), np.minimum(manhattan, 16))
        assert format_plan(alone, n).count("\n") == n - 1
    lakes_scores = baselines.score_plans(lakes, baselines.batch_plans(baselines.alone_plan, lakes), KEY)
    if agents == 1:  # alone on the lake: nothing to conflict with, every agent arrives
        assert lakes_scores["score"] == 1.0


def test_suite_baselines_rows_on_the_tiny_suite():
    suite = build_suite(load_eval_conf("tiny"))
    scores = baselines.suite_baselines(suite)
    assert list(scores) == list(baselines.NAMES)
    assert all(0.0 <= v <= 1.0 for v in scores.values())
    assert scores["straight"] <= scores["alone"] <= scores["reference"]
    rows = baselines.table_rows(scores, columns=3)
    assert len(rows) == 3 and rows[-1] == "| *reference planner* | – | " + " | ".join([f"{scores['reference']:.3f}"] * 3) + " |"


@pytest.mark.slow
def test_the_small_suite_straight_walk_scores_the_issue_floor():
    """The number the tiny planner is measured against (README): the straight walk on the
    `small` suite scores 70 of 96 lakes, the reference planner all 96."""
    scores = baselines.suite_baselines(build_suite(load_eval_conf("small")))
    assert round(scores["straight"] * 96) == 70 and scores["reference"] == 1.0
    assert scores["alone"] > scores["straight"]


def test_an_eval_json_description_rebuilds_the_same_lakes_and_scores():
    from jaxlake.suite import described_lakes

    suite = build_suite(load_eval_conf("tiny"), solve=False)
    lakes = described_lakes(suite.describe())
    for a, b in zip(jax.tree_util.tree_leaves(lakes), jax.tree_util.tree_leaves(suite.lakes)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert baselines.described_baselines(suite.describe()) == baselines.suite_baselines(suite)


def test_the_command_prints_one_row_per_baseline_and_names_a_bad_suite(capsys):
    assert baselines.main(["tiny"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 + len(baselines.NAMES)
    assert [line.split(" | ")[2] for line in lines[2:]] == [baselines.LABELS[n] for n in baselines.NAMES]
    with pytest.raises(SystemExit) as err:
        baselines.main(["no_such_suite"])
    assert err.value.code == 1
    assert capsys.readouterr().err.startswith("error: suite 'no_such_suite': eval config")
