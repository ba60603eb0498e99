"""The learnability engineer (jaxlake/engineers/sfl.py) with scripted rollouts: it scores the
current components and candidates by p (1 - p) of the policy's sampled success, moves the
mixture's weight toward the learnable ones, adds the most learnable candidates, keeps a share of
the old mixture, and its decision moves with what the policy can learn."""

import pytest
from omegaconf import OmegaConf

from jaxlake.conf import CONF_DIR
from jaxlake.config import ConfigError, LakeConfig
from jaxlake.engineers import EngineerContext, SFLEngineer, build_engineer, check_in_space, space_from_conf
from jaxlake.mixture import Mixture

BASE = LakeConfig(height=5, width=5, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=16)
MIX = Mixture([(0.5, BASE.replace(height=4, width=4)), (0.25, BASE), (0.25, BASE.replace(height=6, width=6))])
SPACE = {"editable": ["height", "width", "num_agents", "hole_density", "conflict_density"],
         "values": {"hole_density": [0.0, 0.1, 0.2, 0.3], "conflict_density": [0.0, 0.25, 0.5, 0.75, 1.0]}}


def rollouts_of(p_of, calls):
    def rollouts(mixture, lakes, samples):
        calls.append((mixture, lakes, samples))
        return [{"p": p_of(c), "n": lakes * samples} for c in mixture.configs]
    return rollouts


def ctx(p_of, calls=None, current=MIX, final=False, stage=1):
    return EngineerContext(stage=stage, current=current, initial=current, eval_result={}, summary={}, history=[],
                           state={}, seed=0, rollouts=rollouts_of(p_of, [] if calls is None else calls), final=final)


def five_by_five_learnable(c):
    return 0.5 if c.height == 5 else 1.0 if c.height <= 4 else 0.0


def test_sfl_shifts_weight_to_learnable_components_and_adds_learnable_candidates():
    calls = []
    eng = SFLEngineer(candidates=10, lakes=3, samples=2, shift=0.5, share=0.2, max_add=2, space=SPACE)
    p = eng.propose(ctx(five_by_five_learnable, calls))
    assert len(calls) == 1 and calls[0][1:] == (3, 2) and len(calls[0][0]) == 3 + 10  # one round, rollouts only
    cur = p.record["scores"]["current"]
    assert [round(s["learnability"], 3) for s in cur] == [0.0, 0.25, 0.0]
    assert p.mixture.configs[:3] == MIX.configs  # keeps the mixture
    assert p.mixture.weights[1] > MIX.weights[1] and p.mixture.weights[0] < MIX.weights[0]  # toward p(1-p)
    added = p.mixture.configs[3:]
    assert 1 <= len(added) <= 2 and all(c.height == 5 for c in added)  # only learnable candidates join
    assert sum(p.mixture.weights[:3]) >= 0.5 - 1e-9  # a share of the old mixture kept
    check_in_space(Mixture([(1.0, c) for c in added]), space_from_conf(BASE, SPACE), len(added))
    assert p.record["cost"]["plays"] == 13 * 3 * 2


def test_sfl_decisions_move_with_the_policy():
    """Decisions, not only validity: another policy (other success rates) gets another answer."""
    a = SFLEngineer(space=SPACE).propose(ctx(five_by_five_learnable))
    b = SFLEngineer(space=SPACE).propose(ctx(lambda c: 0.5 if c.height == 6 else 1.0))
    assert a.mixture != b.mixture
    assert b.mixture.weights[2] > MIX.weights[2] and a.mixture.weights[1] > MIX.weights[1]
    solved = SFLEngineer(space=SPACE).propose(ctx(lambda c: 1.0))  # nothing to learn anywhere: keep
    assert solved.decision == "kept" and solved.edit.kind == "keep"


def test_a_full_mixture_drops_its_least_learnable_component():
    eng = SFLEngineer(candidates=6, max_add=1, space={**SPACE, "edits": {"max_components": 3}})
    p = eng.propose(ctx(five_by_five_learnable))
    assert p.edit.kind == "replace" and len(p.mixture) == 3 and p.edit.drop in ((0,), (2,))


def test_after_the_last_stage_sfl_plays_nothing_and_settings_are_checked():
    calls = []
    p = SFLEngineer(space=SPACE).propose(ctx(five_by_five_learnable, calls, final=True))
    assert not calls and p.decision == "kept"
    with pytest.raises(ConfigError, match="rollouts"):
        SFLEngineer(space=SPACE).propose(EngineerContext(stage=1, current=MIX, initial=MIX, eval_result={}, summary={},
                                                         history=[], state={}))
    with pytest.raises(ConfigError, match=r"engineer.shift=2 not in \[0.0, 1.0\]"):
        SFLEngineer(shift=2)
    with pytest.raises(ConfigError, match=r"engineer.lakes=0 must be an integer in \[1, inf\)"):
        SFLEngineer(lakes=0)
    eng = build_engineer(OmegaConf.load(CONF_DIR / "engineer" / "sfl.yaml"))
    assert isinstance(eng, SFLEngineer) and eng.name == "sfl" and eng.candidates == 8
