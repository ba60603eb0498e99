"""Engineer interface, config space, proposal parsing, retries and the non-LLM backends."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from jaxlake.config import ConfigError, LakeConfig
from jaxlake.conf import CONF_DIR
from jaxlake.engineers import (
    ConfigSpace,
    EngineerContext,
    FixedEngineer,
    HeuristicEngineer,
    ManualEngineer,
    PLREngineer,
    ProposalError,
    RandomEngineer,
    build_engineer,
    extract_json,
    propose_with_retries,
    space_from_conf,
)
from jaxlake.mixture import MixtureError, load_mixture, mixture_from_node, mixture_from_obj, mixture_to_yaml

CONF = CONF_DIR / "engineer"
BASE = LakeConfig(height=5, width=5, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=16)


def ctx(stage=1, current=None, eval_result=None, state=None, seed=0, initial=None):
    current = current or [(1.0, BASE)]
    return EngineerContext(stage=stage, current=current, initial=initial or current,
                           eval_result=eval_result or {}, summary={}, history=[], state=state or {}, seed=seed)


def eval_with(p_current=None, p_suite=None, cells=(), current=None):
    """An ``eval.json`` stand-in: suite scores (``cells``) and, with ``current`` (the training
    mixture), the training-environment success ``p_current`` of every component."""
    ev = {"modes": {}}
    if p_suite is not None:
        ev["modes"]["greedy"] = {"n": 10, "score": p_suite, "by_cell": list(cells)}
        ev["modes"]["sampled"] = {"n": 20, "score": p_suite, "by_cell": list(cells)}
    if p_current is not None:
        comps = [{"weight": w, "config": c.to_dict(), "n": 8, "score": p_current} for w, c in (current or [])]
        ev["current_env"] = {"modes": {m: {"n": 8, "score": p_current, "by_component": comps}
                                       for m in ("greedy", "sampled")}}
    return ev


# ----------------------------------------------------------------------------- config space
def test_choices_respect_cross_field_constraints():
    space = ConfigSpace(base=BASE)
    assert space.choices("num_agents", {"height": 2, "width": 2}) == [1, 2]
    # 2 agents on a 2x2 region need all 4 cells frozen: round(hd * 4) == 0.
    assert space.choices("hole_density", {"height": 2, "width": 2, "num_agents": 2}) == [0.0, 0.05, 0.1]
    assert space.choices("height", {}) == list(range(2, 9))
    # fixed (non-editable) num_agents=4 and hole_density=0.1 need 8 frozen cells: a 2x4 region
    # has round(0.8) = 1 hole (7 frozen), a 2x5 region 1 hole (9 frozen)
    fixed = ConfigSpace(base=BASE.replace(num_agents=4), editable=("height", "width"))
    assert fixed.choices("height", {}) == list(range(2, 9))
    assert fixed.choices("width", {"height": 2}) == [5, 6, 7, 8]
    assert ConfigSpace(base=BASE.replace(num_agents=4, hole_density=0.0), editable=("height", "width")).choices(
        "width", {"height": 2}) == [4, 5, 6, 7, 8]


BASES = st.builds(
    lambda h, w, n, cap: LakeConfig(height=min(h, cap), width=min(w, cap), num_agents=n, max_height=cap,
                                    max_width=cap, max_agents=4),
    st.integers(2, 6), st.integers(2, 6), st.integers(1, 2), st.integers(6, 8),
)


@settings(max_examples=40, deadline=None)
@given(BASES, st.integers(0, 2**31 - 1), st.sampled_from([None, ("height", "width", "num_agents", "hole_density"),
                                                          ("num_agents", "slip_prob", "max_steps", "min_dist", "max_dist", "on_goal")]))
def test_sampled_configs_always_valid_and_on_grid(base, seed, editable):
    space = ConfigSpace(base=base) if editable is None else ConfigSpace(base=base, editable=editable)
    cfg = space.sample(np.random.default_rng(seed))
    assert isinstance(cfg, LakeConfig)
    cfg.validate()
    for name in space.editable:
        assert getattr(cfg, name) in space.values[name]
    assert cfg.capacity == base.capacity
    assert space.snap(cfg) == cfg


def test_space_from_conf_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"unknown engineer.space field\(s\) \['bogus'\]"):
        space_from_conf(BASE, {"editable": ["height"], "bogus": 1})
    with pytest.raises(ConfigError, match="not editable"):
        space_from_conf(BASE, {"editable": ["height"], "values": {"width": [3]}})
    with pytest.raises(ConfigError, match=r"space.values.hole_density value 1.5 not in \[0.0, 0.9\]"):
        space_from_conf(BASE, {"values": {"hole_density": [0.0, 1.5]}})


# ----------------------------------------------------------------------------- proposals
def test_mixture_forms_and_partial_fields():
    (w, cfg), = mixture_from_obj({"height": 6, "width": 6}, BASE)
    assert w == 1.0 and cfg.height == 6 and cfg.num_agents == BASE.num_agents
    mix = mixture_from_obj({"mixture": [{"weight": 3, "config": {"num_agents": 1}},
                                        {"weight": 1, "config": {"num_agents": 3}}]}, BASE)
    assert [round(w, 6) for w, _ in mix] == [0.75, 0.25]
    assert [c.num_agents for _, c in mix] == [1, 3]
    assert mixture_from_obj([{"config": {"height": 4}}, {"config": {"height": 3}}], BASE)[1][0] == 0.5


@pytest.mark.parametrize(
    "obj, message",
    [
        ({"height": 99}, "config: height=99 exceeds max_height=8"),
        ({"max_height": 16}, "max_height=16 cannot change"),
        ({"colour": "blue"}, "unknown config field(s) ['colour']; allowed: ["),
        ({"mixture": [{"weight": -1, "config": {}}]}, "mixture[0].weight=-1.0 not in [0, inf)"),
        ({"mixture": []}, "mixture is empty"),
        ({"mixture": [{"weight": 0, "config": {}}]}, "weights sum to 0"),
        ({"mixture": [{"height": 3}]}, "mixture[0] must be an object"),
        ("text", "must be a JSON object or list"),
    ],
)
def test_mixture_errors_are_clear(obj, message):
    with pytest.raises(MixtureError) as err:
        mixture_from_obj(obj, BASE)
    assert message in str(err.value)


def test_extract_json_from_chatter_and_fences():
    assert extract_json('Sure! {"height": 4} hope this helps') == {"height": 4}
    assert extract_json('```json\n{"mixture": [{"weight": 1, "config": {}}]}\n```') == {"mixture": [{"weight": 1, "config": {}}]}
    assert extract_json('{bad json} then {"num_agents": 1}') == {"num_agents": 1}
    with pytest.raises(ProposalError, match="no JSON object"):
        extract_json("no braces at all")
    with pytest.raises(ProposalError, match="no parseable JSON"):
        extract_json('{"height": ')
    # the one-pass scanner (issue 23): brackets inside strings are text; a candidate that does not
    # parse gives way to the last value inside it that does; a string broken by a line end, or a
    # wrong closing bracket, ends the values around it
    assert extract_json('{"s": "} ] {\\" ["}') == {"s": '} ] {" ['}
    assert extract_json('{"note": 1, {"height": 4}} trailing') == {"height": 4}
    assert extract_json('{"a": "x\ny"} {"b": 2}') == {"b": 2}
    assert extract_json('{"a": [1, 2} {"b": 3} ]') == {"b": 3}
    # deeper than max_depth: the outer brackets are dropped, the value inside still counts
    assert extract_json("[[[[[1]]]]]", max_depth=4) == [[[[1]]]]
    assert extract_json("[[[[[1]]]]]", max_depth=5) == [[[[[1]]]]]
    with pytest.raises(ProposalError, match="nested deeper than 2 levels"):
        extract_json("[[[", max_depth=2)
    with pytest.raises(ProposalError, match="a value of 12 characters, more than 10"):
        extract_json('{"a": "xxx"}', max_chars=10)


def test_yaml_roundtrip(tmp_path):
    mix = mixture_from_obj({"mixture": [{"weight": 1, "config": {"height": 4}}, {"weight": 1, "config": {"on_goal": "stay"}}]}, BASE)
    path = tmp_path / "next_env.yaml"
    path.write_text(mixture_to_yaml(mix))
    back = load_mixture(path)
    assert [(round(w, 6), c) for w, c in back] == [(0.5, mix[0][1]), (0.5, mix[1][1])]
    assert mixture_from_node(OmegaConf.create(BASE.to_dict())) == [(1.0, BASE)]


# ----------------------------------------------------------------------------- retries
def test_retry_shows_error_then_accepts():
    prompts = []

    def ask(prompt, attempt):
        prompts.append(prompt)
        return "I think height 40" if attempt == 0 else '{"height": 40}' if attempt == 1 else '{"height": 6}'

    p = propose_with_retries(ask, "PROMPT", ctx(), retries=2)
    assert p.decision == "proposed" and p.mixture[0][1].height == 6
    assert "no JSON object" in prompts[1] and "I think height 40" in prompts[1]
    assert "height=40 exceeds max_height=8" in prompts[2]
    assert p.record["validation_errors"][1] == "config: height=40 exceeds max_height=8"
    assert len(p.record["attempts"]) == 3 and p.record["parsed"] == {"height": 6}
    assert p.record["prompt"] == "PROMPT"


def test_malformed_then_fallback_keeps_current_and_never_raises():
    calls = []

    def ask(prompt, attempt):
        calls.append(attempt)
        if attempt == 1:
            raise ConnectionError("endpoint down")
        return "{{{{ not json"

    current = [(1.0, BASE.replace(num_agents=1))]
    p = propose_with_retries(ask, "P", ctx(current=current), retries=2)
    assert calls == [0, 1, 2]
    assert p.decision == "fallback" and p.mixture == current
    assert any("ConnectionError: endpoint down" in e for e in p.record["validation_errors"])
    assert p.record["raw_output"] == "{{{{ not json"


# ----------------------------------------------------------------------------- backends
def test_fixed_keeps_initial():
    init = [(1.0, BASE)]
    p = FixedEngineer().propose(ctx(current=[(1.0, BASE.replace(height=3))], initial=init))
    assert p.mixture == init and p.decision == "kept"


def test_manual_follows_list_then_repeats_last():
    eng = build_engineer(OmegaConf.load(CONF / "manual.yaml"))
    assert isinstance(eng, ManualEngineer)
    first = eng.initial_mixture([(1.0, BASE)])
    assert first[0][1].height == 4 and first[0][1].num_agents == 1
    p1 = eng.propose(ctx(stage=1))
    assert p1.mixture[0][1].height == 5 and p1.mixture[0][1].hole_density == 0.1
    p2 = eng.propose(ctx(stage=2))
    assert [round(w, 3) for w, _ in p2.mixture] == [0.5, 0.5]
    assert [c.num_agents for _, c in p2.mixture] == [2, 3]
    assert eng.propose(ctx(stage=3)).mixture == eng.propose(ctx(stage=9)).mixture
    keep = ManualEngineer(stages=[{"height": 3}], first_is_stage_1=False)
    assert keep.initial_mixture([(1.0, BASE)]) == [(1.0, BASE)]
    assert keep.propose(ctx(stage=1)).mixture[0][1].height == 3
    with pytest.raises(ConfigError, match=r"engineer.stages\[0\]: config: height=30 exceeds"):
        ManualEngineer(stages=[{"height": 30}]).propose(ctx(stage=0))


def test_random_valid_deterministic_and_varied():
    eng = build_engineer(OmegaConf.load(CONF / "random.yaml"))
    assert isinstance(eng, RandomEngineer)
    a = [eng.propose(ctx(stage=s, seed=3)).mixture[0][1] for s in range(1, 7)]
    b = [eng.propose(ctx(stage=s, seed=3)).mixture[0][1] for s in range(1, 7)]
    assert a == b
    assert len({(c.height, c.width, c.num_agents, c.hole_density) for c in a}) > 1
    for c in a:
        assert c.hole_density in (0.0, 0.1, 0.2, 0.3) and c.slip_prob == BASE.slip_prob


def test_heuristic_ladder():
    """The ladder in edits: a raise adds the harder config beside the one that worked, a failed
    raise is dropped and the ladder settles, a config being learned gets more weight."""
    eng = build_engineer(OmegaConf.load(CONF / "heuristic.yaml"))
    assert isinstance(eng, HeuristicEngineer)
    # success above 0.7: add size 5 -> 6 (first rung) beside BASE, remember BASE as last good
    p = eng.propose(ctx(eval_result=eval_with(p_current=0.9, p_suite=0.1)))
    assert p.edit.kind == "add" and p.decision == "proposed"
    assert [c for _, c in p.mixture] == [BASE, BASE.replace(height=6, width=6)]
    assert [round(w, 3) for w in p.mixture.weights] == [0.5, 0.5]
    assert p.state["next_rung"] == 1 and p.state["last_good"] == BASE.to_dict()
    assert p.state["frontier"] == BASE.replace(height=6, width=6).to_dict()
    # the frontier works too: the second rung (num_agents 2 -> 3) joins, read from its own lakes
    ev = eval_with(p_current=0.8, current=p.mixture)
    p2 = eng.propose(ctx(stage=2, current=p.mixture, eval_result=ev, state=p.state))
    assert p2.edit.kind == "add" and [c.num_agents for _, c in p2.mixture] == [2, 2, 3]
    # the new frontier fails: drop it, keep what worked, settle
    p3 = eng.propose(ctx(stage=3, current=p2.mixture, eval_result=eval_with(p_current=0.1, current=p2.mixture),
                         state=p2.state))
    assert p3.edit.kind == "drop" and p3.edit.drop == (2,) and "kept" not in p3.decision
    assert [c for _, c in p3.mixture] == [c for _, c in p.mixture]
    # settled: keep, whatever it reads
    p4 = eng.propose(ctx(stage=4, current=p3.mixture, eval_result=eval_with(p_current=0.95, current=p3.mixture),
                         state=p3.state))
    assert p4.decision == "kept" and p4.mixture == p3.mixture
    # in between on a mixture: twice the weight on the frontier
    mid = eng.propose(ctx(stage=2, current=p.mixture, eval_result=eval_with(p_current=0.5, current=p.mixture),
                          state=p.state))
    assert mid.edit.kind == "reweight" and mid.mixture.weights[1] > mid.mixture.weights[0]
    # no last good config and too hard: replace it one rung lower on the last ladder dimension
    p5 = eng.propose(ctx(eval_result=eval_with(p_current=0.0)))
    assert p5.edit.kind == "replace" and p5.mixture.main.conflict_density == 0.25 and len(p5.mixture) == 1
    # suite signal when the current-env evaluation is missing
    assert eng.propose(ctx(eval_result=eval_with(p_suite=0.95))).mixture[1][1].height == 6
    with pytest.raises(ConfigError, match="lower_below <= raise_above"):
        HeuristicEngineer(raise_above=0.2, lower_below=0.5)


def test_build_engineer_requires_target():
    with pytest.raises(ConfigError, match="no _target_"):
        build_engineer({"name": "x"})


# ----------------------------------------------------------------------------- one allowed space (issue 13 item 2)
HEUR_SPACE = {"editable": ["height", "width", "num_agents", "hole_density", "conflict_density"],
              "values": {"hole_density": [0.0, 0.1, 0.2, 0.3], "conflict_density": [0.0, 0.25, 0.5, 0.75, 1.0]}}


@pytest.mark.parametrize(
    "reply, message",
    [
        ('{"hole_density": 0.37}', "add[0]: hole_density=0.37 is not an allowed value; allowed: [0.0, 0.1, 0.2, 0.3]"),
        ('{"slip_prob": 0.2}', "add[0]: slip_prob=0.2 is fixed at 0.0 in this run"),
        ('{"max_steps": 64}', "add[0]: max_steps=64 is fixed at 16 in this run"),
        ('{"on_goal": "stay"}', "add[0]: on_goal='stay' is fixed at 'vanish' in this run"),
        ('{"mixture": [{"weight": 1, "config": {"height": 3}}, {"weight": 1, "config": {"height": 4}}, '
         '{"weight": 1, "config": {"height": 6}}]}', "the edit adds 3 components; at most 2"),
        ('{"mixture": [{"weight": 1, "config": {"conflict_density": 0.3}}]}',
         "add[0]: conflict_density=0.3 is not an allowed value; allowed: [0.0, 0.25, 0.5, 0.75, 1.0]"),
        ('{"edit": "drop", "drop": 0}', "edit='drop' is not allowed on a mixture of 1 component(s)"),
        ('{"edit": "add", "drop": 0, "add": [{"config": {"height": 4}}]}', "edit='add' takes no 'drop'"),
        ('{"edit": "reweight", "weights": [1, 2]}', "weights must be a list of 1 numbers"),
    ],
)
def test_replies_outside_the_space_are_rejected_and_shown_on_retry(reply, message):
    from jaxlake.engineers import check_in_space

    space = space_from_conf(BASE, HEUR_SPACE)
    prompts = []

    def ask(prompt, attempt):
        prompts.append(prompt)
        return reply if attempt == 0 else '{"height": 6}'

    p = propose_with_retries(ask, "PROMPT", ctx(), retries=1, space=space)
    assert p.decision == "proposed" and p.mixture[0][1].height == 6 and p.edit.kind == "replace"
    assert message in p.record["validation_errors"][0]
    assert message in prompts[1] and "It was rejected" in prompts[1]
    # the same check, directly: the on-space answer passes
    check_in_space(p.mixture, space, max_components=1)


def test_check_in_space_accepts_on_grid_and_rejects_by_name():
    from jaxlake.engineers import check_in_space

    space = space_from_conf(BASE, HEUR_SPACE)
    ok = mixture_from_obj({"mixture": [{"weight": 1, "config": {"hole_density": 0.1 + 0.2}},
                                       {"weight": 1, "config": {"num_agents": 3}}]}, BASE)
    check_in_space(ok, space, max_components=2)  # 0.30000000000000004 is on the 0.1 grid
    with pytest.raises(ProposalError, match=r"mixture\[1\].config.slip_prob=0.5 is fixed at 0.0 in this run"):
        check_in_space(mixture_from_obj({"num_agents": 3}, BASE) + [(0.5, BASE.replace(slip_prob=0.5))], space, 2)


def test_every_baseline_stays_in_its_space():
    from jaxlake.engineers import check_in_space

    for name in ("random", "heuristic", "plr", "accel"):
        node = OmegaConf.load(CONF / f"{name}.yaml")
        eng = build_engineer(node)
        space = space_from_conf(BASE, OmegaConf.to_container(node.get("space")) if node.get("space") else None)
        cells = [{"id": 0, "values": {"size": 4}, "n": 4, "score": 0.5,
                  "config": LakeConfig(height=4, width=4, num_agents=1, max_steps=24, slip_prob=0.1).to_dict()}]
        state = {}
        current = [(1.0, BASE)]
        for stage, p_cur in enumerate((0.9, 0.9, 0.1, 0.5, 0.9), start=1):
            p = eng.propose(ctx(stage=stage, current=current, state=state,
                                eval_result=eval_with(p_current=p_cur, p_suite=0.5, cells=cells, current=current)))
            # every component the engineer brought in lies in the space; the run's own ones may not
            added = [(w, c) for w, c in p.mixture if c not in [c0 for _, c0 in current]]
            if added:
                check_in_space(added, space, max_components=len(added))
            assert len(p.mixture) <= space.edits.max_components and p.edit is not None
            current, state = p.mixture, p.state


# ----------------------------------------------------------------------------- the ladder (issue 13 item 4)
def _ladder_run(eng, successes, start=BASE):
    """Feed the ladder one success per stage (on every component's lakes); return the configs of
    every stage's mixture (stage 1 = start)."""
    current, state, configs = [(1.0, start)], {}, [[start]]
    for stage, p_cur in enumerate(successes, start=1):
        p = eng.propose(ctx(stage=stage, current=current, state=state,
                            eval_result=eval_with(p_current=p_cur, current=current)))
        current, state = p.mixture, p.state
        configs.append([c for _, c in current])
    return configs


def test_heuristic_returns_to_last_good_and_stays():
    eng = HeuristicEngineer(ladder=[{"field": "size", "step": 1}, {"field": "num_agents", "step": 1}],
                            space=HEUR_SPACE)
    a = BASE
    b = BASE.replace(height=6, width=6)           # size raised
    c = b.replace(num_agents=3)                   # agents raised
    # works, works, fails (c dropped), works again, ...: stays on a + b
    got = _ladder_run(eng, [0.9, 0.9, 0.1, 0.9, 0.95, 0.8, 0.5])
    assert got == [[a], [a, b], [a, b, c], [a, b], [a, b], [a, b], [a, b], [a, b]]
    # at the settled config a failure still lowers it (it is no longer known to work)
    got = _ladder_run(eng, [0.9, 0.1, 0.1, 0.9])
    assert got[:3] == [[a], [a, b], [a]] and got[3] == [a.replace(num_agents=1)] and got[4] == got[3]
    # in-between success keeps the harder config being learned, with more weight; a later success raises on
    got = _ladder_run(eng, [0.9, 0.5, 0.8])
    assert got == [[a], [a, b], [a, b], [a, b, c]]


def test_heuristic_mode_is_validated():
    with pytest.raises(ConfigError, match=r"engineer.mode='sample' not in \['greedy', 'sampled'\]"):
        HeuristicEngineer(mode="sample")
    with pytest.raises(ConfigError, match=r"engineer.mode='sample' not in \['greedy', 'sampled'\]"):
        PLREngineer(mode="sample")
    assert HeuristicEngineer(mode="sampled").mode == "sampled"


def test_baselines_keep_an_off_grid_run_environment_without_error():
    # the run's env may lie off an engineer's grid (env=classic: hole_density 0.25); keeping it is
    # not a proposal, and anything proposed is on the grid
    off = BASE.replace(hole_density=0.25)
    eng = build_engineer(OmegaConf.load(CONF / "heuristic.yaml"))
    kept = eng.propose(ctx(current=[(1.0, off)], eval_result=eval_with(p_current=0.5)))
    assert kept.decision == "kept" and kept.mixture == [(1.0, off)]
    raised = eng.propose(ctx(current=[(1.0, off)], eval_result=eval_with(p_current=0.9)))
    assert raised.decision == "proposed" and raised.mixture[0][1] == off  # kept as it is, beside ...
    assert raised.mixture[1][1].hole_density in (0.2, 0.3)                # ... the raise, on the grid
    plr = build_engineer(OmegaConf.load(CONF / "plr.yaml"))
    p = plr.propose(ctx(current=[(1.0, off)], eval_result=eval_with(p_current=0.5)))
    assert all(c.hole_density in (0.0, 0.1, 0.2, 0.3) for _, c in p.mixture if c != off) and len(p.mixture) > 1


HARDER_WHEN_LARGER = ("height", "width", "num_agents", "hole_density", "conflict_density", "slip_prob")


def _harder_fields(new, old):
    harder = [f for f in HARDER_WHEN_LARGER if getattr(new, f) > getattr(old, f) + 1e-12]
    return harder + (["max_steps"] if new.max_steps < old.max_steps else [])


@pytest.mark.parametrize("start", [
    BASE.replace(hole_density=0.28),                                   # snapped to 0.3 before
    BASE.replace(conflict_density=0.65),                               # 0.75 before
    BASE.replace(conflict_density=0.7, hole_density=0.12),
    BASE.replace(height=6, width=6, num_agents=3, conflict_density=0.65, hole_density=0.28),
])
@pytest.mark.parametrize("p_current", [0.0, 0.1, 0.5])
def test_heuristic_never_raises_a_field_while_failing_from_an_off_grid_start(start, p_current):
    """From a run environment off the engineer's grid, a failing or in-between policy gets no
    harder field (the run's off-grid values snap toward easier); a succeeding one gets exactly
    the one ladder dimension it raised."""
    eng = HeuristicEngineer(space=HEUR_SPACE)
    prop = eng.propose(ctx(current=[(1.0, start)], eval_result=eval_with(p_current=p_current, current=[(1.0, start)])))
    for _, new in prop.mixture:
        assert _harder_fields(new, start) == [], (prop.decision, prop.reason, new)
    raised = eng.propose(ctx(current=[(1.0, start)], eval_result=eval_with(p_current=0.9, current=[(1.0, start)])))
    assert raised.mixture[0][1] == start and raised.edit.kind == "add"
    assert _harder_fields(raised.mixture[1][1], start) in (["height", "width"], ["num_agents"]), raised.reason


def test_fixed_broad_trains_every_stage_on_env_broad():
    """engineer=fixed_broad is the fixed baseline from the broad start: stage 1 and every later
    stage on conf/env/broad.yaml's mixture, whatever the run's env."""
    import yaml

    from jaxlake.conf import CONF_DIR
    from jaxlake.engineers import EngineerContext, build_engineer
    from jaxlake.mixture import Mixture, load_mixture, same_mixture

    broad, tiny = load_mixture(CONF_DIR / "env" / "broad.yaml"), load_mixture(CONF_DIR / "env" / "tiny.yaml")
    eng = build_engineer(yaml.safe_load((CONF_DIR / "engineer" / "fixed_broad.yaml").read_text()))
    assert eng.name == "fixed_broad" and same_mixture(eng.initial_mixture(tiny), broad)
    ctx = EngineerContext(stage=2, current=broad, initial=broad, eval_result={}, summary={}, history=[], state={})
    assert same_mixture(eng.propose(ctx).mixture, broad) and len(broad) == 8


@pytest.mark.parametrize("overrides", [[], ["engineer=fixed_broad"], ["engineer=policy", "env=tiny"]])
def test_every_default_engineer_space_is_the_3750_configs_around_the_run(overrides):
    """The space a warm start or anchor draws from (pipeline.warmstart_env=space) is the standard
    one for the default engineers too: a `fixed` without a space node would take every field's
    default grid (millions of configs)."""
    from hydra import compose, initialize_config_dir

    from jaxlake.conf import CONF_DIR
    from jaxlake.pipeline.pretrain import space_mixture
    from jaxlake.pipeline.settings import RunSettings

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        s = RunSettings.from_cfg(compose("config", overrides=overrides))
    assert len(space_mixture(s)) == 3750
