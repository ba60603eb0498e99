"""Engineer contexts of scripted policies (jaxlake/engineers/contexts.py): every number a
summary shows comes from real rollouts of the plan each lake was given, the policy's skill and
failure profile move what the summary shows, and the teacher's label moves with it."""

from __future__ import annotations

import numpy as np
import pytest

from jaxlake.config import LakeConfig, to_plain
from jaxlake.engineers.contexts import BEHAVIOURS, ContextPool, ScriptedPolicy, lake_load
from jaxlake.engineers.space import ConfigSpace
from jaxlake.engineers.teacher import read_summary, teacher_edit
from jaxlake.suite import build_suite, load_eval_conf
from jaxlake.summaries import render_summary

BASE = LakeConfig(height=4, width=4, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=12,
                  max_height=5, max_width=5, max_agents=3)
SPACE = ConfigSpace(BASE, editable=("height", "width", "num_agents", "hole_density", "conflict_density"),
                    values={"height": [3, 4, 5], "width": [3, 4, 5], "hole_density": [0.0, 0.1, 0.2, 0.3],
                            "conflict_density": [0.0, 0.5, 1.0]})


@pytest.fixture(scope="module")
def pool():
    return ContextPool(build_suite(to_plain(load_eval_conf("tiny")), solve=True), SPACE, mixtures=3,
                       current_env_lakes=8, env_stats_lakes=8, k_failures=4, seed=3)


def test_each_behaviour_plays_what_it_names(pool):
    recs = pool.suite_records
    ref = [r["success"] for r in recs["reference"]]
    solvable = pool.suite.opt_soc >= 0
    assert np.mean(ref) == pytest.approx(np.mean(solvable))  # the planner's plan wins where it found one
    assert not any(r["fell"] for r in recs["alone"])  # shortest paths around holes never fall
    holes = np.asarray([c["values"]["hole_density"] > 0 for c in pool.suite.cells])[pool.suite.cell_of]
    fell = np.asarray([bool(r["fell"]) for r in recs["straight"]])
    assert fell[holes].mean() > 0 and not fell[~holes].any()  # the blind walk falls only where there are holes
    short = [r for r in recs["short"] if r["opt_soc"] is not None and r["opt_soc"] > 1]
    assert short and np.mean([r["success"] for r in short]) < 0.2  # cut at half its length: it times out
    assert np.mean([r["timed_out"] > 0 for r in short]) > 0.8


def test_a_context_is_deterministic_and_its_numbers_are_its_rollouts(pool):
    ctx, label = pool.context(5)
    again, label2 = pool.context(5)
    assert ctx.summary == again.summary and label["edit"] == label2["edit"]
    cur = ctx.eval_result["current_env"]["episodes"]
    assert len(cur) == 8
    assert ctx.summary["behaviour"]["current_env"]["score"] == pytest.approx(np.mean([r["success"] for r in cur]), abs=1e-3)
    assert ctx.summary["behaviour"]["n"] == pool.suite.size
    text = render_summary(ctx.summary)
    assert "on the training environment (8 lakes)" in text and f"stage {ctx.stage}:" in text
    assert len(ctx.summary["history"]) == ctx.stage


def test_skill_moves_the_success_and_the_profile_moves_the_failures(pool):
    load = lake_load(pool.suite.lakes)
    rng = np.random.default_rng(0)
    strong = ScriptedPolicy(0.95, (1 / 3, 1 / 3, 1 / 3)).choose(load, rng)
    weak = ScriptedPolicy(0.2, (1 / 3, 1 / 3, 1 / 3)).choose(load, rng)
    assert (strong == 0).mean() > (weak == 0).mean() + 0.3
    falls = ScriptedPolicy(0.2, (0.0, 1.0, 0.0)).choose(load, rng)
    assert set(np.unique(falls)) <= {0, BEHAVIOURS.index("straight")}
    skills, success = [], []
    for i in range(40):
        ctx, label = pool.context(i)
        skills.append(label["skill"])
        success.append(read_summary(ctx.summary)["success"])
    assert np.corrcoef(skills, success)[0, 1] > 0.4


def test_the_label_is_the_teachers_answer_and_moves_with_the_context(pool):
    kinds, reads = set(), set()
    for i in range(40):
        ctx, label = pool.context(i)
        edit, read = teacher_edit(ctx.summary, ctx.current, SPACE)
        assert edit == label["edit"] and read == label["read"]
        kinds.add(edit.kind)
        reads.add((read["level"], read["focus"]))
    assert len(reads) >= 4 and {"add"} < kinds


def test_a_start_grows_the_mixtures_a_curriculum_from_it_visits():
    """With ``start``, the first mixtures are the start and the teacher's edits from it (each
    keeps a component of a mixture reached before it); contexts fall on the start about
    ``start_share`` of the time."""
    start = LakeConfig(height=4, width=4, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=12,
                       max_height=5, max_width=5, max_agents=3)
    pool = ContextPool(build_suite(to_plain(load_eval_conf("tiny")), solve=True), SPACE, mixtures=6,
                       current_env_lakes=4, env_stats_lakes=4, k_failures=2, seed=2, start=start, reachable=0.5,
                       start_share=0.3)
    assert list(pool.envs[0].mixture.configs) == [start] and pool.reached == 3 and len(pool.envs) == 6
    for i in range(1, pool.reached):
        earlier = [c for e in pool.envs[:i] for c in e.mixture.configs]
        assert any(c in earlier for c in pool.envs[i].mixture.configs)
    rng = np.random.default_rng(0)
    drawn = np.asarray([pool.draw_env(rng) for _ in range(2000)])
    assert abs((drawn == 0).mean() - 0.3) < 0.04 and abs(((drawn > 0) & (drawn < 3)).mean() - 0.5) < 0.04


def test_the_teachers_levels_are_balanced(pool):
    """The skill is drawn for a success uniform on the training environment: each of the
    teacher's levels (easier < 0.25 <= same < 0.6 <= harder) labels a fair share of contexts."""
    levels = [pool.context(i)[1]["read"]["level"] for i in range(60)]
    shares = {lv: levels.count(lv) / len(levels) for lv in set(levels)}
    assert len(shares) == 3 and min(shares.values()) >= 0.12, shares


def test_for_success_hits_its_target():
    load = np.asarray([0.5, 1.0, 2.0, 4.0])
    for target in (0.05, 0.3, 0.9):
        p = ScriptedPolicy.for_success(target, load, (1.0, 0.0, 0.0))
        assert np.mean(p.skill ** load) == pytest.approx(target, abs=1e-3)
    wins = np.asarray([[1, 1, 0, 1], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]])  # no failing plan fails lake 0
    p = ScriptedPolicy.for_success(0.6, load, (1.0, 0.0, 0.0), wins)
    s = p.skill ** load
    assert np.mean(s * wins[0] + (1 - s) * np.asarray([1, 0, 0, 0])) == pytest.approx(0.6, abs=1e-3)


def test_a_failing_lake_gets_a_plan_that_fails_there():
    wins = np.asarray([[1, 1, 1, 1], [1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 1, 0]])
    choice = ScriptedPolicy(1e-6, (0.5, 0.5, 0.0)).choose(np.ones(4), np.random.default_rng(0), wins)
    # lake 0: the walk fails it; lake 1: the paths alone; lake 2: none fails it (the reference); lake 3: either
    assert choice[0] == 2 and choice[1] == 1 and choice[2] == 0 and choice[3] in (1, 2)


def test_expected_success_is_what_the_policy_plays_on_unseen_lakes(pool):
    """``success`` is the mean of ``choose`` without ``wins`` (the reference plan with
    probability ``skill ** load``, else a failing plan by the profile, winning where that plan
    wins); and ``learnability`` follows the policy a context describes: a strong policy learns
    most from large crowded lakes and a weak one from small ones, and a policy that walks
    blind into holes learns from holes, one that stops short does not care."""
    rng = np.random.default_rng(0)
    load = np.asarray([0.5, 1.0, 2.0, 3.0])
    wins = np.asarray([[1, 1, 1, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]], float)
    policy = ScriptedPolicy(0.7, (0.2, 0.5, 0.3))
    played = np.stack([policy.choose(load, rng) for _ in range(20000)])  # behaviour indices
    empirical = wins[played, np.arange(4)[None]].mean(0)
    np.testing.assert_allclose(policy.success(load, wins), empirical, atol=0.015)

    small = LakeConfig(height=3, width=3, num_agents=1, hole_density=0.0, conflict_density=0.0, max_steps=12,
                       max_height=6, max_width=6, max_agents=3)
    ladder = [small, small.replace(height=4, width=4, num_agents=2, conflict_density=0.5),
              small.replace(height=6, width=6, num_agents=3, conflict_density=1.0)]
    weak, strong = ScriptedPolicy(0.3, (1 / 3, 1 / 3, 1 / 3)), ScriptedPolicy(0.95, (1 / 3, 1 / 3, 1 / 3))
    best = {name: int(np.argmax([pool.learnability(p, [(1.0, c)], 16, seed=3) for c in ladder]))
            for name, p in (("weak", weak), ("strong", strong))}
    assert best["weak"] < best["strong"] == 2  # the strong policy learns most from the largest
    mid = small.replace(height=5, width=5, num_agents=2)
    falls, stalls = ScriptedPolicy(0.6, (0.0, 1.0, 0.0)), ScriptedPolicy(0.6, (0.0, 0.0, 1.0))
    holes = {(name, h): pool.learnability(p, [(1.0, mid.replace(hole_density=h))], 16, seed=3)
             for name, p in (("falls", falls), ("stalls", stalls)) for h in (0.0, 0.3)}
    assert holes["falls", 0.3] > holes["falls", 0.0] + 0.1
    assert abs(holes["stalls", 0.3] - holes["stalls", 0.0]) < holes["falls", 0.3] - holes["falls", 0.0]
