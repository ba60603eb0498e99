"""Reward terms on hand-made completions (llm/game/rewards.py)."""

import jax
import numpy as np
import pytest

from jaxlake.text import parse_lake
from llm.game import rewards
from llm.game.rewards import RewardConfig
from jaxlake.conf import CONF_DIR

# A at (0,0) -> a at (2,2); B at (2,0) -> b at (0,2); a hole in the middle.
GRID = "A . b\n. ~ .\nB . a"

CASES = {
    # both agents take a shortest path (4 steps each), no conflict: soc 8 = the planner's
    "good": "A: R R D D\nB: U U R R",
    # same plan plus stray text: malformed, still runs
    "malformed": "A: R R D D\nB: U U R R\nhello",
    # only agent A: B stays and times out
    "partial": "A: R R D D",
    # A walks into the hole, B missing
    "fall": "A: D R",
    # A down and B up target the same cell (1,0): both cancelled (vertex conflict)
    "conflict": "A: D\nB: U",
    # B waits one step: soc 9
    "slow": "A: R R D D\nB: S U U R R",
    # unknown agent letter
    "unknown_agent": "A: R R D D\nC: U",
}


@pytest.fixture(scope="module")
def batch():
    lake = parse_lake(GRID, max_steps=8, max_height=4, max_width=4, max_agents=3)
    names = list(CASES)
    lakes = jax.tree_util.tree_map(lambda x: np.stack([np.asarray(x)] * len(names)), lake)
    return names, lakes


@pytest.fixture(scope="module")
def result(batch):
    names, lakes = batch
    texts = [CASES[n] for n in names]
    return rewards.compute_rewards(lakes, texts, jax.random.PRNGKey(0), RewardConfig())


def row(batch, result, name):
    i = batch[0].index(name)
    terms = {t: float(v[i]) for t, v in result.terms.items()}
    return terms, float(result.reward[i]), i


def test_reference_cost(batch):
    _, lakes = batch
    np.testing.assert_array_equal(rewards.reference_costs(lakes), 8)


def test_well_formed_success(batch, result):
    terms, reward, i = row(batch, result, "good")
    assert terms == {"arrived": 1.0, "all_arrived": 1.0, "fell": 0.0, "conflict": 0.0, "malformed": 0.0, "efficiency": 1.0}
    assert reward == pytest.approx(1 + 1 + 0.5)
    assert bool(result.success[i]) and int(result.sum_of_costs[i]) == 8


def test_malformed_still_runs(batch, result):
    terms, reward, i = row(batch, result, "malformed")
    assert terms["malformed"] == 1.0 and terms["all_arrived"] == 1.0
    assert reward == pytest.approx(2.5 - 0.5)
    terms, reward, _ = row(batch, result, "unknown_agent")
    assert terms["malformed"] == 1.0 and terms["arrived"] == 0.5
    assert reward == pytest.approx(0.5 - 0.5)


def test_partial_plan(batch, result):
    terms, reward, i = row(batch, result, "partial")
    assert terms["arrived"] == 0.5 and terms["all_arrived"] == 0.0 and terms["efficiency"] == 0.0
    assert terms["malformed"] == 0.0
    assert float(result.timed_out[i]) == 0.5
    assert reward == pytest.approx(0.5)


def test_fall(batch, result):
    terms, reward, i = row(batch, result, "fall")
    assert terms["fell"] == 0.5 and terms["arrived"] == 0.0
    assert float(result.timed_out[i]) == 0.5
    assert reward == pytest.approx(-0.5)


def test_conflict(batch, result):
    terms, reward, i = row(batch, result, "conflict")
    assert terms["conflict"] == 1.0  # two cancelled moves over two agents
    assert int(result.conflicts[i]) == 2
    assert reward == pytest.approx(-0.1)


def test_efficiency_against_planner(batch, result):
    terms, reward, i = row(batch, result, "slow")
    assert int(result.sum_of_costs[i]) == 9
    assert terms["efficiency"] == pytest.approx(8 / 9)
    assert reward == pytest.approx(2 + 0.5 * 8 / 9)


def test_weights_and_metrics(batch, result):
    names, lakes = batch
    cfg = RewardConfig(arrived=0.0, all_arrived=2.0, fell=0.0, conflict=0.0, malformed=0.0, efficiency=0.0)
    again = rewards.compute_rewards(lakes, [CASES[n] for n in names], jax.random.PRNGKey(1), cfg,
                                    ref_soc=rewards.reference_costs(lakes))
    np.testing.assert_allclose(again.reward, 2.0 * result.terms["all_arrived"])
    m = rewards.reward_metrics(result)
    assert m["success"] == pytest.approx(3 / 7)
    assert m["malformed_rate"] == pytest.approx(2 / 7)
    for t in rewards.TERMS:
        assert f"term/{t}" in m


def test_reward_config_validation():
    assert RewardConfig.from_dict({"fell": -2}).fell == -2.0
    with pytest.raises(ValueError, match=r"unknown reward field\(s\)"):
        RewardConfig.from_dict({"speed": 1.0})
    with pytest.raises(ValueError, match="reward.fell"):
        RewardConfig.from_dict({"fell": "a lot"})


def test_repeat_lakes(batch):
    _, lakes = batch
    rep = rewards.repeat_lakes(jax.tree_util.tree_map(lambda x: x[:2], lakes), 3)
    assert rep.starts.shape[0] == 6


def test_conf_yaml_matches_dataclass_defaults():

    from omegaconf import OmegaConf

    path = CONF_DIR / "reward" / "default.yaml"
    cfg = RewardConfig.from_dict(OmegaConf.to_container(OmegaConf.load(path)))
    assert cfg == RewardConfig()
