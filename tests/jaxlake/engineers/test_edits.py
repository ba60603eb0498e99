"""The edit space (jaxlake/engineers/edits.py): an engineer's answer keeps, re-weights, drops or
adds components of the current mixture; what each kind does, the floor and the share the old
mixture keeps, the errors that name the field, and every baseline answering in it."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from jaxlake.conf import CONF_DIR
from jaxlake.config import ConfigError, LakeConfig
from jaxlake.engineers import (
    EDIT_KINDS,
    Edit,
    EditRules,
    EngineerContext,
    ManualEngineer,
    ProposalError,
    apply_edit,
    build_engineer,
    check_edit,
    edit_between,
    edit_from_obj,
    random_edit,
    space_from_conf,
)
from jaxlake.engineers.edits import floor_weights
from jaxlake.mixture import Mixture, same_mixture

BASE = LakeConfig(height=5, width=5, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=16)
A, B, C = BASE.replace(height=4, width=4), BASE, BASE.replace(height=6, width=6)
MIX = Mixture([(0.5, A), (0.25, B), (0.25, C)])
SPACE = {"editable": ["height", "width", "num_agents", "hole_density", "conflict_density"],
         "values": {"hole_density": [0.0, 0.1, 0.2, 0.3], "conflict_density": [0.0, 0.25, 0.5, 0.75, 1.0]}}


def weights(m):
    return [round(w, 6) for w in m.weights]


def test_each_kind_does_what_it_says():
    rules = EditRules(floor=0.0)
    assert same_mixture(apply_edit(MIX, Edit("keep"), rules), MIX)
    re = apply_edit(MIX, edit_from_obj({"edit": "reweight", "weights": [1, 2, 1]}, MIX), rules)
    assert re.configs == MIX.configs and weights(re) == [0.25, 0.5, 0.25]
    dropped = apply_edit(MIX, edit_from_obj({"edit": "drop", "drop": 0}, MIX), rules)
    assert dropped.configs == (B, C) and weights(dropped) == [0.5, 0.5]  # the others keep their ratio
    new = {"height": 7, "width": 7}
    added = apply_edit(MIX, edit_from_obj({"edit": "add", "add": [{"weight": 0.2, "config": new}]}, MIX), rules)
    assert added.configs[:3] == MIX.configs and added.configs[3] == A.replace(height=7, width=7)  # fields from main
    assert weights(added) == [0.4, 0.2, 0.2, 0.2]  # the old mixture keeps its ratios in the other 0.8
    rep = apply_edit(Mixture.of(B), edit_from_obj({"edit": "replace", "drop": 0, "add": [{"config": new}]},
                                                  Mixture.of(B)), rules)
    assert rep == [(1.0, B.replace(height=7, width=7))]  # from one component: a new environment


def test_the_old_mixture_keeps_its_share_and_every_component_its_floor():
    rules = EditRules(floor=0.1, min_keep=0.5)
    many = edit_from_obj({"add": [{"weight": 0.5, "config": {"height": 7}}, {"weight": 0.5, "config": {"height": 8}}]},
                         MIX)
    out = apply_edit(MIX, many, rules)
    assert abs(sum(out.weights[:3]) - 0.5) < 1e-9  # the adds asked for all of it: scaled to half
    starved = apply_edit(MIX, edit_from_obj({"weights": [1000, 1, 1]}, MIX), rules)
    assert min(starved.weights) == pytest.approx(0.1) and abs(sum(starved.weights) - 1) < 1e-9
    assert len(starved) == 3  # only a drop removes a component


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12), st.floats(0.0, 0.2))
def test_floor_is_the_smallest_change_that_meets_it(raw, floor):
    total = sum(raw)
    w = [x / total for x in raw] if total > 0 else [1.0 / len(raw)] * len(raw)
    out = floor_weights(w, floor)
    assert abs(sum(out) - 1.0) < 1e-9
    f = min(floor, 1.0 / len(w))
    assert min(out) >= f - 1e-9
    for a, b in zip(w, out):
        if a >= f:  # components above the floor only give mass
            assert b <= a + 1e-9
    for i in range(len(w)):  # and keep their order among themselves
        for j in range(len(w)):
            if w[i] >= f and w[j] >= f and w[i] > w[j] + 1e-9:
                assert out[i] >= out[j] - 1e-9


@pytest.mark.parametrize("obj, message", [
    ({"edit": "grow"}, "edit='grow' not in ['keep', 'reweight', 'drop', 'add', 'replace']"),
    ({"edit": "reweight"}, "edit='reweight' needs 'weights'"),
    ({"edit": "keep", "drop": 1}, "edit='keep' takes no 'drop' (that is edit='drop')"),
    ({"weights": [1, 2]}, "weights must be a list of 3 numbers, one per current component (0..2)"),
    ({"weights": [1, -2, 1]}, "weights[1]=-2 not in (0, 1e+06]"),
    ({"drop": 3}, "drop=3 is not a component index: the mixture has components 0..2"),
    ({"drop": [1, 1]}, "names a component twice"),
    ({"add": [{"weight": 1.5, "config": {}}]}, "add[0].weight=1.5 not in (0, 1]"),
    ({"add": [{"weight": 0.5}]}, "add[0] must be an object"),
    ({"add": [{"config": {"height": 99}}]}, "height=99 exceeds max_height=8"),
    ({"edit": "add", "add": []}, "edit='add': add is empty"),
    ({"bogus": 1, "edit": "keep"}, "unknown edit field(s) ['bogus']"),
])
def test_bad_edits_fail_in_one_line_naming_the_field(obj, message):
    with pytest.raises(ConfigError) as err:
        edit_from_obj(obj, MIX)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_check_edit_enforces_the_rules_and_the_space_of_added_configs():
    space = space_from_conf(BASE, {**SPACE, "edits": {"max_add": 1, "max_drop": 1, "max_components": 4}})
    full = space_from_conf(BASE, {**SPACE, "edits": {"max_components": 3}})
    off = MIX + [(0.1, BASE.replace(hole_density=0.17))]  # the run's own components may be off the grid
    with pytest.raises(ProposalError, match="the edit adds 2 components; at most 1"):
        check_edit(Edit("add", None, (), ((0.1, A.replace(height=3)), (0.1, A.replace(height=7)))), MIX, space, space.edits)
    with pytest.raises(ProposalError, match=r"the edit drops 2 components; at most 1"):
        check_edit(Edit("drop", None, (0, 1)), MIX, space, space.edits)
    with pytest.raises(ProposalError, match=r"edit='add' is not allowed on a mixture of 3 component"):
        check_edit(Edit("add", None, (), ((0.1, A.replace(height=7)),)), MIX, full, full.edits)
    with pytest.raises(ProposalError, match=r"add\[0\]: hole_density=0.17 is not an allowed value"):
        check_edit(Edit("replace", None, (0,), ((0.1, BASE.replace(hole_density=0.17)),)), MIX, space, space.edits)
    kept = check_edit(Edit("reweight", (1, 1, 1, 1)), off, space, EditRules())
    assert len(kept) == 4  # re-weighting an off-grid component of the run is fine
    with pytest.raises(ConfigError, match=r"engineer.space.edits.floor=1.5 not in \[0, 1\)"):
        space_from_conf(BASE, {"edits": {"floor": 1.5}})
    with pytest.raises(ConfigError, match=r"unknown engineer.space.edits field\(s\) \['maxadd'\]"):
        space_from_conf(BASE, {"edits": {"maxadd": 1}})


def test_a_whole_environment_is_read_as_the_edit_that_makes_it():
    target = Mixture([(0.5, A), (0.5, C.replace(num_agents=1))])
    edit = edit_between(MIX, target)
    assert edit.kind == "replace" and edit.drop == (1, 2) and [c for _, c in edit.add] == [C.replace(num_agents=1)]
    from jaxlake.engineers.edits import ANY_EDIT
    assert same_mixture(apply_edit(MIX, edit, ANY_EDIT), target)
    assert edit_between(MIX, MIX).kind == "keep"
    assert edit_between(MIX, Mixture([(1, A), (1, B), (1, C)])).kind == "reweight"
    one = edit_from_obj({"height": 6, "width": 6}, Mixture.of(B))  # the form of earlier versions
    assert one.kind == "replace" and one.drop == (0,)
    json.dumps(one.to_obj())  # JSON-ready, as engineer.json keeps it


def test_random_edits_cover_every_kind_and_stay_valid():
    space = space_from_conf(BASE, SPACE)
    rng = np.random.default_rng(0)
    kinds = set()
    for _ in range(200):
        e = random_edit(space, MIX, rng)
        check_edit(e, MIX, space, space.edits)
        kinds.add(e.kind)
    assert kinds == set(EDIT_KINDS)


def ctx(current, stage=1, state=None, eval_result=None):
    return EngineerContext(stage=stage, current=current, initial=current, eval_result=eval_result or {},
                           summary={}, history=[], state=state or {}, seed=0)


def test_every_baseline_answers_with_an_edit_and_can_keep_reweight_drop_and_add():
    """fixed keeps; manual's entries may be edits (each kind); random covers every kind; the
    heuristic adds, re-weights, drops and keeps (tests/jaxlake/engineers/test_engineers.py runs
    its ladder); PLR and ACCEL re-weight and add (tests/jaxlake/engineers/test_plr.py)."""
    fixed = build_engineer(OmegaConf.load(CONF_DIR / "engineer" / "fixed.yaml")).propose(ctx(MIX))
    assert fixed.edit.kind == "keep" and fixed.decision == "kept" and fixed.to_json("fixed", 1)["edit"] == {"edit": "keep"}
    manual = ManualEngineer(stages=[{"mixture": [{"weight": 1, "config": A.to_dict()}, {"weight": 1, "config": B.to_dict()}]},
                                    {"edit": "add", "add": [{"weight": 0.5, "config": {"height": 6, "width": 6}}]},
                                    {"edit": "reweight", "weights": [1, 1, 2]},
                                    {"edit": "drop", "drop": 0},
                                    {"edit": "keep"}])
    current = manual.initial_mixture(Mixture.of(BASE))
    assert current.configs == (A, B)
    seen = []
    for stage in range(1, 5):
        p = manual.propose(ctx(current, stage=stage))
        seen.append(p.edit.kind)
        current = p.mixture
    assert seen == ["add", "reweight", "drop", "keep"] and current.configs == (B, A.replace(height=6, width=6))
    with pytest.raises(ConfigError, match=r"engineer.stages\[0\] is an edit"):
        ManualEngineer(stages=[{"edit": "keep"}])
    rnd = build_engineer(OmegaConf.load(CONF_DIR / "engineer" / "random.yaml"))
    kinds = {rnd.propose(ctx(MIX, stage=s)).edit.kind for s in range(1, 60)}
    assert kinds == set(EDIT_KINDS)
