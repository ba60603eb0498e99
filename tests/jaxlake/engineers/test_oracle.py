"""The oracle engineer (jaxlake/engineers/oracle.py) with a scripted probe, its validation suite
(jaxlake.suite.validation_suite). One real pipeline run of it with the IPPO student (its probes
train and score for real) is in tests/jaxlake/pipeline/test_student_ippo.py, beside the other
IPPO runs whose compiled programs it shares."""

import json

import numpy as np
import pytest

from jaxlake import LakeConfig
from jaxlake.config import ConfigError, to_plain
from jaxlake.engineers import EngineerContext, OracleEngineer, build_engineer, check_in_space, space_from_conf
from jaxlake.mixture import Mixture, same_mixture
from jaxlake.suite import SuiteSpec, build_suite, lake_keys, load_eval_conf, validation_suite

TINY = LakeConfig(height=5, width=5, num_agents=2, hole_density=0.1, max_steps=16, max_height=8, max_width=8,
                  max_agents=4)
SPACE = {"editable": ["height", "width", "num_agents", "hole_density", "conflict_density"],
         "values": {"hole_density": [0.0, 0.1, 0.2, 0.3], "conflict_density": [0.0, 0.5, 1.0]}}


def context(probe, stage=1, seed=0, current=None, rollouts=None):
    current = Mixture.of(current or TINY)
    return EngineerContext(stage=stage, current=current, initial=current, eval_result={},
                           summary={}, history=[], state={}, seed=seed, probe=probe, rollouts=rollouts)


def scripted_rollouts(p_of):
    """``ctx.rollouts`` whose success on a config is ``p_of(config)``; records every call."""
    calls = []

    def rollouts(mixture, lakes, samples):
        calls.append((mixture, lakes, samples))
        return [{"p": p_of(c), "n": lakes * samples} for c in mixture.configs]

    return rollouts, calls


def scripted(score_of):
    calls = []

    def probe(mixture, name, **settings):
        calls.append((mixture, name, settings))
        return {"score": score_of(mixture), "n": 10, "wall_s": 0.0}

    return probe, calls


def area(mixture):
    return sum(w * c.height * c.width for w, c in mixture)


def test_the_oracle_proposes_the_candidate_whose_probe_scored_best():
    probe, calls = scripted(area)  # the largest lakes "teach" most
    eng = OracleEngineer(candidates=5, probe_steps=3, validation_lakes_per_cell=2, space=SPACE, candidates_from="space")
    p = eng.propose(context(probe))
    assert len(calls) == 5 and {c[2]["steps"] for c in calls} == {3} and {c[2]["lakes_per_cell"] for c in calls} == {2}
    assert same_mixture(calls[0][0], Mixture.of(TINY))  # the current environment is probed first
    assert len({json.dumps(r["mixture"], sort_keys=True) for r in p.record["probes"]}) == 5  # no two alike
    best = max(area(c[0]) for c in calls)
    assert area(p.mixture) == best and p.decision == ("kept" if area(Mixture.of(TINY)) == best else "proposed")
    assert p.record["probes"][p.record["best"]]["score"] == best
    space = space_from_conf(TINY, SPACE)
    for m, _, _ in calls[1:]:
        check_in_space(m, space, 1)


def test_ties_keep_the_current_environment_and_draws_are_reproducible():
    probe, calls = scripted(lambda m: 0.5)
    p = OracleEngineer(candidates=3, space=SPACE, candidates_from="space").propose(context(probe))
    assert p.decision == "kept" and same_mixture(p.mixture, Mixture.of(TINY))
    again, calls2 = scripted(lambda m: 0.5)
    OracleEngineer(candidates=3, space=SPACE, candidates_from="space").propose(context(again))
    assert all(same_mixture(a[0], b[0]) for a, b in zip(calls, calls2))
    other, calls3 = scripted(lambda m: 0.5)
    OracleEngineer(candidates=3, space=SPACE, candidates_from="space").propose(context(other, stage=2))
    assert not all(same_mixture(a[0], b[0]) for a, b in zip(calls[1:], calls3[1:]))  # another stage, other draws


def test_mixture_candidates_stay_in_the_space():
    probe, calls = scripted(lambda m: float(len(m)))
    p = OracleEngineer(candidates=6, max_components=3, keep_current=False, space=SPACE,
                       candidates_from="space").propose(context(probe))
    assert len(calls) == 6 and max(len(c[0]) for c in calls) > 1
    space = space_from_conf(TINY, SPACE)
    for m, _, _ in calls:
        check_in_space(m, space, 3)
    assert len(p.mixture) == max(len(c[0]) for c in calls)


@pytest.mark.parametrize("bad, field", [({"candidates": 1}, "candidates"), ({"probe_steps": 0}, "probe_steps"),
                                        ({"validation_lakes_per_cell": -1}, "validation_lakes_per_cell"),
                                        ({"max_components": True}, "max_components")])
def test_bad_settings_fail_in_one_line_naming_the_field(bad, field):
    with pytest.raises(ConfigError, match=f"engineer.{field}") as err:
        OracleEngineer(**bad)
    assert "\n" not in str(err.value)


def test_without_probes_the_oracle_refuses():
    with pytest.raises(ConfigError, match="probe"):
        OracleEngineer().propose(context(None))


def test_the_shipped_configs_build():
    from jaxlake.conf import CONF_DIR
    import yaml

    eng = build_engineer(yaml.safe_load((CONF_DIR / "engineer" / "oracle.yaml").read_text()))
    assert isinstance(eng, OracleEngineer) and eng.candidates_from == "edits" and eng.reference is not None
    assert len(eng.reference) == 8  # env=broad
    with pytest.raises(ConfigError, match="engineer.candidates_from='x' not in"):
        OracleEngineer(candidates_from="x")
    with pytest.raises(ConfigError, match="engineer.reference_env='nope' is not an env preset"):
        OracleEngineer(reference_env="nope")


MIX = Mixture([(0.5, TINY), (0.25, TINY.replace(height=6, width=6)), (0.25, TINY.replace(num_agents=1))])


def test_the_oracle_over_edits_probes_structured_edits_of_the_mixture():
    """Candidates: keep, re-weighted toward learnability, plus sfl's additions, the least
    learnable component dropped, env=broad; distinct, each probed once, the best proposed and
    recorded as the edit that makes it."""
    # learnable: 6x6 lakes (p = 0.5); solved: one agent (p = 1); never: the rest (p = 0)
    rollouts, rcalls = scripted_rollouts(lambda c: 0.5 if c.height == 6 else 1.0 if c.num_agents == 1 else 0.0)
    probe, calls = scripted(lambda m: sum(w for w, c in m if c.height == 6))  # more 6x6 weight teaches more
    eng = OracleEngineer(probe_steps=2, validation_lakes_per_cell=2, space=SPACE, pool=6, lakes=3, samples=2)
    p = eng.propose(context(probe, current=MIX, rollouts=rollouts))
    names = [r["name"] for r in p.record["probes"]]
    assert names[0] == "keep" and p.record["probes"][0]["current"]
    assert set(names) <= {"keep", "reweight", "sfl", "drop", "reference"} and "reference" in names
    assert {"reweight", "drop"} <= set(names)
    assert len(rcalls) == 1 and rcalls[0][1:] == (3, 2) and len(rcalls[0][0]) == 3 + 6  # one round of rollouts
    mixtures = {r["name"]: r["mixture"] for r in p.record["probes"]}
    assert len({json.dumps(m, sort_keys=True) for m in mixtures.values()}) == len(mixtures)  # no two alike
    by_name = dict(zip(names, (c[0] for c in calls)))
    six = lambda m: sum(w for w, c in m if c.height == 6)  # noqa: E731
    assert six(by_name["reweight"]) > six(MIX)  # weight moved to the learnable component
    assert len(by_name["drop"]) == 2  # one of the never-solved / always-solved components dropped
    best = max(six(c[0]) for c in calls)
    assert six(p.mixture) == best and p.edit is not None


def test_the_oracle_over_edits_answers_move_with_what_the_policy_can_learn():
    """Decisions, not only validity: with the same probes, other rollouts give other candidates."""
    probe, _ = scripted(lambda m: 0.0)
    a = OracleEngineer(space=SPACE, reference_env=None).edit_candidates(
        context(probe, current=MIX, rollouts=scripted_rollouts(lambda c: 0.5 if c.height == 6 else 1.0)[0]))[0]
    b = OracleEngineer(space=SPACE, reference_env=None).edit_candidates(
        context(probe, current=MIX, rollouts=scripted_rollouts(lambda c: 0.5 if c.num_agents == 1 else 0.0)[0]))[0]
    wa, wb = dict(a)["reweight"], dict(b)["reweight"]
    assert not same_mixture(wa, wb)
    assert wa.weights[1] > MIX.weights[1] and wb.weights[2] > MIX.weights[2]


# ---------------------------------------------------------------------------- validation suite
def test_the_validation_suite_holds_none_of_the_held_out_lakes():
    node = to_plain(load_eval_conf("large"))  # 48 lakes a cell: the 4x4 one-agent cells repeat lakes
    spec = SuiteSpec.from_conf(node)
    held_out = set(lake_keys(build_suite(spec, solve=False).lakes))
    suite, report = validation_suite(spec, spec.seed + 1, 48, solve=False)
    keys = lake_keys(suite.lakes)
    assert not held_out & set(keys) and len(set(keys)) == len(keys)
    assert report["lakes"] == len(keys) == suite.cell_of.shape[0] == len(suite.grids)
    # the same seed's plain draw does meet the held-out lakes in the small cells: the filter is needed
    plain = set(lake_keys(build_suite(SuiteSpec.from_conf({**node, "seed": spec.seed + 1}), solve=False).lakes))
    assert plain & held_out and report["held_out_lakes_dropped"] > 0
    counts = np.bincount(suite.cell_of, minlength=len(suite.cells))
    short = {c["id"]: c["lakes"] for c in report["cells_cut_short"]}
    for i, cell in enumerate(suite.cells):
        assert counts[i] == short.get(cell["id"], 48)
    again, _ = validation_suite(spec, spec.seed + 1, 48, solve=False)
    assert lake_keys(again.lakes) == keys
    with pytest.raises(ValueError, match="seed"):
        validation_suite(spec, spec.seed, 48)


def test_after_the_runs_last_stage_the_oracle_probes_nothing():
    probe, calls = scripted(area)
    ctx = context(probe)
    ctx.final = True
    p = OracleEngineer(candidates=3, space=SPACE).propose(ctx)
    assert not calls and p.decision == "kept" and same_mixture(p.mixture, Mixture.of(TINY))


def test_a_probe_trains_the_steps_asked_and_nothing_else():
    """The students' probe settings: the LLM's are `steps` GRPO steps, no warm start, no held-out
    evaluation, export, plot or back end but jsonl; IPPO's are `steps` updates in one chunk; the
    rest of the run's settings as they were."""
    from hydra import compose, initialize_config_dir

    from jaxlake.conf import CONF_DIR
    from jaxlake.pipeline.settings import RunSettings
    from jaxlake.pipeline.student import IPPOStudent, LLMStudent

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        llm = RunSettings.from_cfg(compose("config", overrides=["logger=[jsonl,tensorboard]"]))
        ippo = RunSettings.from_cfg(compose("config", overrides=["student=ippo", "ippo=smoke"]))
    short = LLMStudent().probe_settings(llm, 5)
    t, before = short.train.train, llm.train.train
    assert t.grpo.steps == 5 and t.grpo.checkpoint_every == 5 and t.grpo.eval_every == 0
    assert not t.warmstart.enabled and t.eval.num_lakes == 0 and not t.export_hf and not t.plot
    assert short.train.logger.backends == ("jsonl",) and llm.train.logger.backends == ("jsonl", "tensorboard")
    assert t.grpo.optim == before.grpo.optim and t.grpo.loss == before.grpo.loss and short.model == llm.model
    assert short.stage_config(2).train.seed == llm.stage_config(2).train.seed  # the next stage's seeds
    s = IPPOStudent().probe_settings(ippo, 3)
    assert s.ippo.num_updates == 3 and s.ippo.num_chunks == 1 and s.ippo.lr == ippo.ippo.lr
