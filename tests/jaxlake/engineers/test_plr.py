"""PLR and ACCEL (jaxlake.engineers.plr / .accel): the buffer's prioritisation (equal scores
equal mass, staleness), the replay-or-new decision, scores from the policy's own rollouts on
each component (never the held-out suite), proposals in the run's space, ACCEL's edits."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from jaxlake.conf import CONF_DIR
from jaxlake.config import ConfigError, LakeConfig
from jaxlake.engineers import ACCELEngineer, EngineerContext, PLREngineer, build_engineer, check_in_space, space_from_conf
from jaxlake.engineers.plr import (
    learnability,
    level_key,
    rank_priorities,
    replay_distribution,
    staleness_priorities,
    update_buffer,
)
from jaxlake.mixture import Mixture

BASE = LakeConfig(height=5, width=5, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=16)
SPACE = {"editable": ["height", "width", "num_agents", "hole_density", "conflict_density"],
         "values": {"hole_density": [0.0, 0.1, 0.2, 0.3], "conflict_density": [0.0, 0.25, 0.5, 0.75, 1.0]}}


def training_eval(current, success, suite_score=0.5, cells=()):
    """An eval.json stand-in: per-component training-environment success ``success(config)``
    and a held-out suite result (``cells``) that PLR must not read."""
    comps = [{"weight": w, "config": c.to_dict(), "n": 8, "score": success(c)} for w, c in current]
    pooled = float(np.mean([c["score"] for c in comps]))
    suite = {"n": 10, "score": suite_score, "by_cell": list(cells)}
    return {"modes": {"greedy": suite, "sampled": suite},
            "current_env": {"modes": {m: {"n": 8 * len(comps), "score": pooled, "by_component": comps}
                                      for m in ("greedy", "sampled")}}}


def ctx(stage, current, state, eval_result, seed=0):
    return EngineerContext(stage=stage, current=current, initial=current, eval_result=eval_result, summary={},
                           history=[], state=state, seed=seed)


def run(eng, success, stages, seed=0, cells=()):
    """Feed ``eng`` ``stages`` decisions; return every proposal."""
    current, state, out = Mixture.of(BASE), {}, []
    for stage in range(1, stages + 1):
        p = eng.propose(ctx(stage, current, state, training_eval(current, success, cells=cells), seed=seed))
        out.append(p)
        current, state = p.mixture, p.state
    return out


def by_height(config):  # a learnability landscape: 4x? levels half solved, the rest always solved
    return 0.5 if config.height == 4 else 1.0


# ----------------------------------------------------------------------------- prioritisation
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 30), score=st.floats(0, 0.25), temperature=st.floats(0.05, 5.0), seen=st.integers(0, 5))
def test_equal_scores_get_uniform_mass(n, score, temperature, seen):
    np.testing.assert_allclose(rank_priorities([score] * n, temperature), np.full(n, 1.0 / n))
    # with staleness mixed in: equal scores and equal ages stay uniform
    probs = replay_distribution([score] * n, [seen] * n, now=seen + 2, temperature=temperature, staleness_coef=0.3)
    np.testing.assert_allclose(probs, np.full(n, 1.0 / n))


@settings(max_examples=60, deadline=None)
@given(scores=st.lists(st.sampled_from([0.0, 0.09, 0.16, 0.21, 0.25]), min_size=1, max_size=20),
       temperature=st.floats(0.05, 5.0))
def test_ties_share_mass_and_higher_scores_get_more(scores, temperature):
    probs = rank_priorities(scores, temperature)
    assert abs(probs.sum() - 1.0) < 1e-9
    for i, si in enumerate(scores):
        for j, sj in enumerate(scores):
            if si == sj:
                assert abs(probs[i] - probs[j]) < 1e-12  # buffer order does not matter
            elif si > sj:
                assert probs[i] > probs[j]


def test_staleness_grows_for_levels_not_trained():
    a, b, c = (BASE.replace(height=h) for h in (4, 6, 7))
    buffer = update_buffer([], [(a, 0.5, 8), (b, 0.5, 8), (c, 0.5, 8)], now=1, capacity=8)
    shares = []
    for now in range(2, 6):  # a is trained every stage, b and c are not
        buffer = update_buffer(buffer, [(a, 0.5, 8)], now=now, capacity=8)
        ages = {level_key(e["config"]): now - e["last_seen"] for e in buffer}
        assert ages[level_key(a)] == 0 and ages[level_key(b)] == ages[level_key(c)] == now - 1
        p_c = staleness_priorities([e["last_seen"] for e in buffer], now + 1)
        shares.append(p_c[1] / p_c[0])  # b's staleness share relative to a's
    assert all(x < y for x, y in zip(shares, shares[1:]))  # grows with every stage b is not trained
    assert staleness_priorities([3, 3], 3) is None  # nothing stale: the score term alone


def test_full_buffer_swaps_out_its_lowest_score():
    levels = [BASE.replace(height=h) for h in (3, 4, 5, 6)]
    buffer = update_buffer([], [(levels[0], 1.0, 8), (levels[1], 0.5, 8), (levels[2], 0.6, 8)], now=1, capacity=3)
    kept = update_buffer(buffer, [(levels[3], 0.0, 8)], now=2, capacity=3)  # score 0 < 0.24: dropped
    assert [e["config"]["height"] for e in kept] == [3, 4, 5]
    swapped = update_buffer(buffer, [(levels[3], 0.3, 8)], now=2, capacity=3)  # 0.21 > 0 of height 3
    assert [e["config"]["height"] for e in swapped] == [6, 4, 5]


# ----------------------------------------------------------------------------- the engineer
def test_replay_decision_frequency_is_p_replay():
    eng = PLREngineer(levels=1, p_replay=0.3, min_replay=1, space=SPACE)
    state = {"buffer": update_buffer([], [(BASE.replace(height=4), 0.5, 8), (BASE.replace(height=6), 0.3, 8)], 1, 32)}
    n = 300
    replays = sum(eng.propose(ctx(2, Mixture.of(BASE), state, training_eval([(1.0, BASE)], by_height), seed=s))
                  .record["replay"] for s in range(n))
    assert abs(replays / n - 0.3) < 4 * np.sqrt(0.3 * 0.7 / n)  # within 4 standard errors


def test_scores_come_from_each_components_own_training_lakes():
    eng = PLREngineer(levels=2, p_replay=0.0, space=SPACE)
    first = eng.propose(ctx(1, Mixture.of(BASE), {}, training_eval([(1.0, BASE)], by_height)))
    # the run's first environment is buffered too; two new levels join it (an edit: add)
    assert [e["config"] for e in first.state["buffer"]] == [BASE.to_dict()] and first.record["replay"] is False
    assert first.edit.kind == "add" and len(first.mixture) == 3 and first.mixture.configs[0] == BASE
    a, b = first.mixture.configs[1:]
    p = {level_key(BASE): 1.0, level_key(a): 0.25, level_key(b): 0.75}
    second = eng.propose(ctx(2, first.mixture, first.state, training_eval(first.mixture, lambda c: p[level_key(c)])))
    got = {level_key(e["config"]): (e["p"], e["score"], e["last_seen"]) for e in second.state["buffer"]}
    assert got == {level_key(BASE): (1.0, 0.0, 2), level_key(a): (0.25, 0.1875, 2),
                   level_key(b): (0.75, 0.1875, 2)}  # one score each, not pooled


BROAD = Mixture([(1.0, BASE.replace(height=h, num_agents=n)) for h in (4, 6) for n in (1, 2)])


@pytest.mark.parametrize("cls", [PLREngineer, ACCELEngineer])
def test_the_first_environment_is_buffered_so_the_first_decision_can_replay(cls):
    """From a mixture (env=broad) the first decision already replays: it re-weights the mixture by
    the replay distribution over its own components, the most learnable heaviest."""
    eng = cls(levels=2, p_replay=1.0, min_replay=2, temperature=0.3, staleness_coef=0.0, space=SPACE)
    p = eng.propose(ctx(1, BROAD, {}, training_eval(BROAD, by_height)))
    assert p.record["replay"] is True and len(p.state["buffer"]) == len(BROAD)
    assert p.edit.kind == "reweight" and len(p.mixture) == len(BROAD)
    heights = {c.height: w for w, c in p.mixture}
    assert max(p.mixture, key=lambda wc: wc[0])[1].height == 4  # 4x4 half solved: learnable
    assert min(p.mixture.weights) >= 0.05 - 1e-9 and heights  # the floor keeps every level in play


def test_accel_edits_the_first_environment_on_its_first_new_decision_and_plr_does_not():
    """ACCEL's new levels are one-step edits of the buffer's top, from the first decision on: the
    PLR and ACCEL rows of a study differ (they were identical draws before)."""
    space = space_from_conf(BASE, SPACE)
    ev = training_eval(BROAD, by_height)
    acc = ACCELEngineer(levels=2, p_replay=0.0, space=SPACE).propose(ctx(1, BROAD, {}, ev))
    plr = PLREngineer(levels=2, p_replay=0.0, space=SPACE).propose(ctx(1, BROAD, {}, ev))
    new_a = [c for c in acc.mixture.configs if c not in BROAD.configs]
    new_p = [c for c in plr.mixture.configs if c not in BROAD.configs]
    assert len(new_a) == 2 and new_a != new_p
    parents = [c for c in BROAD.configs if c.height == 4]  # the most learnable levels
    for child in new_a:
        assert any(child in space.neighbours(parent) for parent in parents), child


def test_plr_never_reads_the_suite():
    eng = PLREngineer(levels=2, p_replay=0.5, space=SPACE)
    first = run(eng, by_height, 2)[-1]
    easy = {"id": 0, "values": {"size": 4}, "n": 4, "score": 0.5, "config": BASE.replace(height=4).to_dict()}
    hard = {"id": 1, "values": {"size": 8}, "n": 4, "score": 0.5,
            "config": BASE.replace(height=8, width=8, num_agents=4, max_steps=64).to_dict()}
    proposals = []
    for suite_score, cells in ((0.0, [dict(easy, score=0.0), dict(hard, score=1.0)]),
                               (1.0, [dict(easy, score=0.5), dict(hard, score=0.5)])):
        ev = training_eval(first.mixture, by_height, suite_score=suite_score, cells=cells)
        proposals.append(eng.propose(ctx(3, first.mixture, first.state, ev)))
    # suite results that the old PLR would have ranked differently change nothing
    assert proposals[0].mixture == proposals[1].mixture and proposals[0].state == proposals[1].state
    assert all(c.max_steps == BASE.max_steps for c in proposals[0].mixture.configs)  # no suite field leaks


def engineer_node(name):
    """``conf/engineer/<name>.yaml`` composed as the run composes it (accel extends plr)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        return compose("config", overrides=[f"engineer={name}"]).engineer


NODES = {}


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(["plr", "accel"]),
       successes=st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=6, max_size=6))
def test_proposals_always_lie_in_the_space(seed, name, successes):
    node = NODES.setdefault(name, engineer_node(name))
    eng = build_engineer(node)
    space = space_from_conf(BASE, OmegaConf.to_container(node.space))

    def success(config):  # a fixed arbitrary success per level
        return successes[hash(level_key(config)) % len(successes)]

    current = Mixture.of(BASE)
    for p in run(eng, success, 5, seed=seed):
        added = [(w, c) for w, c in p.mixture if c not in current.configs]
        if added:
            check_in_space(added, space, len(added))
        assert len(p.mixture) <= space.edits.max_components and abs(sum(p.mixture.weights) - 1.0) < 1e-9
        assert len(added) <= space.edits.max_add and p.edit is not None
        current = p.mixture


def test_replay_prefers_learnable_levels():
    eng = PLREngineer(levels=1, p_replay=1.0, min_replay=1, temperature=0.1, staleness_coef=0.0, space=SPACE)
    state = {"buffer": update_buffer([], [(BASE.replace(height=h), p, 8) for h, p in ((3, 1.0), (4, 0.5), (6, 0.0))],
                                     1, 32)}
    picks = [[c.height for c in eng.propose(ctx(2, Mixture.of(BASE), state, training_eval([(1.0, BASE)], by_height),
                                                seed=s)).mixture.configs if c != BASE] for s in range(40)]
    assert [p[0] for p in picks if p].count(4) >= 36  # rank 1 at temperature 0.1 holds ~99.9 % of the mass


def test_accel_edits_a_replayed_level_by_one_grid_step():
    eng = ACCELEngineer(levels=1, p_replay=0.0, min_replay=1, space=SPACE)
    parent = BASE.replace(height=4)
    state = {"buffer": update_buffer([], [(parent, 0.5, 8)], 1, 32), "proposed": [level_key(parent)], "replay": True}
    space = space_from_conf(BASE, SPACE)
    for seed in range(10):
        p = eng.propose(ctx(2, Mixture.of(parent), state, training_eval([(1.0, parent)], by_height), seed=seed))
        (child,) = [c for c in p.mixture.configs if c != parent]
        diff = [f for f in SPACE["editable"] if getattr(child, f) != getattr(parent, f)]
        assert len(diff) == 1 and child in space.neighbours(parent), (child, parent)
        assert p.record["replay"] is False and "edits" in p.reason


def test_configs_validate_and_build():
    for name, cls in (("plr", PLREngineer), ("accel", ACCELEngineer)):
        eng = build_engineer(NODES.setdefault(name, engineer_node(name)))
        assert type(eng) is cls and eng.name == name and eng.levels == 2 and eng.space_node == SPACE
    with pytest.raises(ConfigError, match=r"engineer.p_replay=1.5 not in \[0, 1\]"):
        PLREngineer(p_replay=1.5)
    with pytest.raises(ConfigError, match=r"engineer.min_replay=1 not in \[levels=2, capacity=32\]"):
        PLREngineer(levels=2, min_replay=1)


def test_equal_learnability_ties_despite_float_rounding():
    """p (1 - p) of 0.1 and 0.9 differ in the last bits; they are one tie and get equal mass."""
    a, b = learnability(0.1), learnability(0.9)
    assert a != b  # the rounding this test is about
    probs = rank_priorities([a, b, 0.01], temperature=0.3)
    assert probs[0] == pytest.approx(probs[1]) and probs[2] < probs[0]


@pytest.mark.parametrize("name", ["plr", "accel"])
def test_the_shipped_engineer_scores_its_levels_on_what_the_default_suite_evaluates(name):
    """The default suite (eval=large) scores greedy only. The shipped PLR and ACCEL read that
    mode, so after the first stage that trains on their levels the buffer holds them, scored
    (they once read `sampled`, found nothing after every stage and never replayed)."""
    from hydra import compose, initialize_config_dir

    from jaxlake.suite import decoding_modes

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=[f"engineer={name}"])
    modes = decoding_modes(OmegaConf.to_container(cfg.eval, resolve=True))
    assert cfg.eval.name == "large" and modes == [("greedy", 1)]
    eng = build_engineer(cfg.engineer)

    def greedy_only(current):
        ev = training_eval(current, by_height)
        return {"modes": {"greedy": ev["modes"]["greedy"]},
                "current_env": {"modes": {"greedy": ev["current_env"]["modes"]["greedy"]}}}

    current, state = Mixture.of(BASE), {}
    for stage in (1, 2):
        p = eng.propose(ctx(stage, current, state, greedy_only(current)))
        assert not any("no per-component success" in n for n in p.record["notes"])
        buffered = {level_key(e["config"]): e["last_seen"] for e in p.state["buffer"]}
        assert all(buffered.get(level_key(c)) == stage for c in current.configs)  # each scored on its own lakes
        current, state = p.mixture, p.state
