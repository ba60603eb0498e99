"""The engineer's teacher (jaxlake/engineers/teacher.py) answers from what the summary shows:
its edit moves with the success it reads and the failures it sees, keeps the components, and a
strong policy's answer is harder than a weak one's by the difficulty measure, which is itself
checked against what makes lakes harder."""

from __future__ import annotations

import numpy as np
import pytest

from jaxlake.config import LakeConfig
from jaxlake.engineers.edits import apply_edit
from jaxlake.engineers.space import ConfigSpace, EditRules
from jaxlake.engineers.teacher import (EASY_BELOW, HARD_AT, difficulty, focus_of, level_of, read_summary,
                                       teacher_edit)
from jaxlake.mixture import Mixture

BASE = LakeConfig(height=5, width=5, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=16,
                  max_height=8, max_width=8, max_agents=4)
SPACE = ConfigSpace(BASE, editable=("height", "width", "num_agents", "hole_density", "conflict_density"),
                    values={"hole_density": [0.0, 0.1, 0.2, 0.3], "conflict_density": [0.0, 0.25, 0.5, 0.75, 1.0]},
                    edits=EditRules())


def summary(score, fall=0.0, conflict=0.0, timeout=0.0, where="current_env"):
    node = {"score": score, "fall_rate": fall, "conflict_rate": conflict, "timeout_rate": timeout}
    b = {"overall": {"score": 0.5, "fall_rate": 0.0, "conflict_rate": 0.0, "timeout_rate": 0.5}}
    if where == "current_env":
        b["current_env"] = node
    else:
        b["overall"] = node
    return {"behaviour": b}


def test_it_reads_the_training_environment_line_else_the_suite():
    assert read_summary(summary(0.7, fall=0.2))["where"] == "current_env"
    seen = read_summary(summary(0.7, fall=0.2))
    assert seen["success"] == 0.7 and seen["rates"]["fell"] == 0.2
    assert read_summary(summary(0.1, conflict=0.3, where="suite")) == {
        "success": 0.1, "rates": {"fell": 0.0, "conflict": 0.3, "timeout": 0.0}, "where": "suite"}


def test_level_and_focus_thresholds():
    assert [level_of(x) for x in (0.0, EASY_BELOW - 1e-6, EASY_BELOW, HARD_AT - 1e-6, HARD_AT, 1.0)] == [-1, -1, 0, 0, 1, 1]
    assert focus_of({"fell": 0.3, "conflict": 0.1, "timeout": 0.2}) == "fell"
    assert focus_of({"fell": 0.05, "conflict": 0.05, "timeout": 0.09}) is None
    assert focus_of({"fell": 0.0, "conflict": 0.15, "timeout": 0.6}) == "conflict"  # the cause, not its timeout
    assert focus_of({"fell": 0.05, "conflict": 0.0, "timeout": 0.6}) == "timeout"
    assert focus_of({"fell": 0.2, "conflict": 0.2, "timeout": 0.0}) == "fell"  # ties: the listed order


def _added(edit):
    return edit.add[0][1]


def test_the_answer_moves_with_the_success_it_reads():
    mix = Mixture.of(BASE)
    weak, _ = teacher_edit(summary(0.1, timeout=0.9), mix, SPACE)
    mid, _ = teacher_edit(summary(0.4, timeout=0.05), mix, SPACE)
    again, _ = teacher_edit(summary(0.4, timeout=0.6), mix, SPACE)
    strong, _ = teacher_edit(summary(0.9, timeout=0.1), mix, SPACE)
    assert weak.kind == strong.kind == "add"
    assert (_added(weak).height, _added(weak).num_agents) == (4, 1)  # easier: one agent, a row and a column fewer
    assert (_added(strong).height, _added(strong).width) == (6, 6)  # harder: a row and a column more
    assert weak.add[0][0] == 0.5 and strong.add[0][0] == 0.25
    # same size; no failure reaches the focus, so an agent more
    assert mid.kind == "add" and (_added(mid).height, _added(mid).num_agents) == (5, 3)
    assert again.kind == "keep"  # half way and timing out: train on it again
    # the old component is kept in every answer
    for e in (weak, mid, strong, again):
        assert BASE in apply_edit(mix, e, SPACE.edits).configs


def test_failures_of_one_kind_move_the_answer_toward_that_kind_of_lake():
    mix = Mixture.of(BASE)
    plain, _ = teacher_edit(summary(0.4, timeout=0.3), mix, SPACE)
    falls, seen = teacher_edit(summary(0.4, fall=0.5, timeout=0.3), mix, SPACE)
    crowd, _ = teacher_edit(summary(0.4, conflict=0.5, timeout=0.3), mix, SPACE)
    assert seen["focus"] == "fell" and plain.kind == "keep"

    def mean(edit, field):
        after = apply_edit(mix, edit, SPACE.edits)
        return sum(w * getattr(c, field) for w, c in after)

    assert mean(falls, "hole_density") > mean(plain, "hole_density")
    assert mean(crowd, "conflict_density") > mean(plain, "conflict_density") and _added(crowd).num_agents >= 2


def test_a_config_already_in_the_mixture_is_reweighted_and_a_full_mixture_replaces():
    bigger = LakeConfig(**{**BASE.to_dict(), "height": 6, "width": 6})
    mix = Mixture.of([(0.5, BASE), (0.5, bigger)])
    e, _ = teacher_edit(summary(0.9), Mixture.of([(0.6, BASE), (0.4, bigger)]), SPACE)
    assert e.kind == "reweight" and e.weights == (1.0, 2.0)
    full = ConfigSpace(BASE, editable=SPACE.editable, values=SPACE.values, edits=EditRules(max_components=2))
    e, _ = teacher_edit(summary(0.1, fall=0.5), Mixture.of([(0.7, bigger), (0.3, BASE)]), full)
    assert e.kind == "replace" and e.drop == (1,)
    assert len(apply_edit(mix, e, full.edits)) == 2


def test_difficulty_grows_with_size_agents_and_holes():
    def d(**kw):
        return difficulty(Mixture.of(LakeConfig(**{**BASE.to_dict(), **kw})), lakes=24)

    assert d(height=3, width=3, num_agents=1) < d(height=5, width=5, num_agents=1) < d(height=8, width=8, num_agents=1)
    assert d(num_agents=1) < d(num_agents=2) < d(num_agents=4)
    assert d(hole_density=0.0, height=8, width=8) <= d(hole_density=0.3, height=8, width=8)


def test_a_strong_policys_answer_is_harder_than_a_weak_ones():
    mix = Mixture.of(BASE)
    for rates in ({"timeout": 0.5}, {"fall": 0.5}, {"conflict": 0.5}):
        weak, _ = teacher_edit(summary(0.1, **rates), mix, SPACE)
        strong, _ = teacher_edit(summary(0.9, **rates), mix, SPACE)
        assert difficulty(apply_edit(mix, strong, SPACE.edits)) > difficulty(apply_edit(mix, weak, SPACE.edits))


@pytest.mark.parametrize("seed", range(3))
def test_every_answer_is_a_valid_edit_of_random_mixtures(seed):
    from jaxlake.engineers.edits import check_edit

    rng = np.random.default_rng(seed)
    for _ in range(20):
        configs = []
        while len(configs) < int(rng.integers(1, 4)):
            c = SPACE.sample(rng)
            if c not in configs:
                configs.append(c)
        mix = Mixture.of([(float(w), c) for w, c in zip(rng.dirichlet(np.ones(len(configs))), configs)])
        s = summary(float(rng.random()), fall=float(rng.random()), conflict=float(rng.random()),
                    timeout=float(rng.random()))
        e, _ = teacher_edit(s, mix, SPACE)
        check_edit(e, mix, SPACE, SPACE.edits)
