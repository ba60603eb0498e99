"""The held-out suite: fixed seeds, cells, skipped cells; episode scoring on hand-made lakes;
the evaluation's bookkeeping with scripted completions."""

import json
import types

import jax
import numpy as np
import pytest

from jaxlake import planner
from jaxlake.suite import (
    EVAL_CONF_DIR,
    SuiteError,
    SuiteSpec,
    build_suite,
    cell_values,
    load_eval_conf,
    score_texts,
)
from jaxlake.text import format_plan, parse_lake, render_text

CAP = dict(max_height=3, max_width=3, max_agents=2)


def stack(lakes):
    return jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *lakes)


@pytest.fixture(scope="module")
def scored():
    fall_lake = parse_lake("A . ~\n. . a", max_steps=4, **CAP)
    swap_lake = parse_lake("A B\nb a", max_steps=2, **CAP)
    lakes = stack([fall_lake, fall_lake, fall_lake, swap_lake])
    texts = ["A: R R", "A: D R R", "A: R\nZ: U", "A: R\nB: L"]
    opt = [3, 3, 3, -1]
    return score_texts(lakes, texts, jax.random.PRNGKey(0), lake_ids=[7, 7, 7, 9], cell_ids=[1, 1, 1, 2],
                       opt_soc=opt, mode="greedy", horizon=4)


def test_fall_recorded_with_step_and_cell(scored):
    r = scored[0]
    assert (r["lake"], r["cell"], r["mode"]) == (7, 1, "greedy")
    assert not r["success"] and r["fell"] == 1 and r["timed_out"] == 0 and r["arrived_share"] == 0.0
    assert r["events"]["first_fall"] == {"agent": "A", "step": 2, "cell": [0, 2]}
    assert r["events"]["first_conflict"] is None
    assert r["failure_types"] == ["fell"] and r["plan"] == "A: R R" and r["plan_len"] == 2


def test_success_costs_against_planner(scored):
    r = scored[1]
    assert r["success"] and r["soc"] == 3 and r["opt_soc"] == 3 and r["solvable"]
    assert r["failure_types"] == [] and r["arrived_share"] == 1.0 and r["plan_len"] == 3


def test_malformed_line_still_runs_then_times_out(scored):
    r = scored[2]
    assert r["malformed"] and "not in play" in r["malformed_reasons"][0]
    assert r["events"]["timeouts"] == [{"agent": "A", "cell": [0, 1], "goal": [1, 2], "step": 4}]
    assert r["failure_types"] == ["malformed", "timeout"]


def test_swap_conflict_recorded(scored):
    r = scored[3]
    assert r["conflicts"] == 2 and r["timed_out"] == 2 and r["solvable"] is False
    assert r["events"]["first_conflict"] == {"agent": "A", "step": 1, "kind": "swap", "cell": [0, 0], "action": "R"}
    assert r["failure_types"] == ["conflict", "timeout"]
    json.dumps(scored)


def test_spec_errors_name_the_key():
    with pytest.raises(SuiteError, match=r"unknown eval.grid field\(s\) \['colour'\]; allowed: .*'size'"):
        SuiteSpec.from_conf({"seed": 0, "lakes_per_cell": 1, "grid": {"colour": [1]}})
    with pytest.raises(SuiteError, match="eval.lakes_per_cell=0"):
        SuiteSpec.from_conf({"seed": 0, "lakes_per_cell": 0, "grid": {"size": [3]}})
    with pytest.raises(SuiteError, match="either size or height/width"):
        SuiteSpec.from_conf({"seed": 0, "lakes_per_cell": 1, "grid": {"size": [3], "height": [3]}})
    with pytest.raises(SuiteError, match="eval.seed is missing"):
        SuiteSpec.from_conf({"lakes_per_cell": 1, "grid": {"size": [3]}})


def test_eval_conf_inheritance():
    tiny = load_eval_conf("tiny")
    assert tiny.name == "tiny" and tiny.base.max_steps == 8 and tiny.base.on_goal == "vanish"
    assert tiny.sampled.num_samples == 2 and tiny.sampled.top_p == 1.0   # inherited from default
    spec = SuiteSpec.from_conf(load_eval_conf("default"))
    assert len(cell_values(spec)) == 3 * 3 * 2 * 2 and spec.lakes_per_cell == 20


def test_a_suite_file_of_ones_own_starts_from_the_packages(tmp_path):
    own = tmp_path / "own.yaml"
    own.write_text("defaults:\n  - small\n  - _self_\nname: own\nlakes_per_cell: 3\nsampled:\n  num_samples: 32\n")
    conf = load_eval_conf(own)
    assert conf.name == "own" and conf.lakes_per_cell == 3 and conf.sampled.num_samples == 32
    assert conf.grid == load_eval_conf("small").grid and conf.base.max_steps == 16  # small's, then default's
    (tmp_path / "small.yaml").write_text("defaults:\n  - default\n  - _self_\nname: mine\nlakes_per_cell: 5\n")
    (tmp_path / "default.yaml").write_text((EVAL_CONF_DIR / "default.yaml").read_text())
    assert load_eval_conf(own).grid == load_eval_conf("default").grid  # a file beside it comes first
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults:\n  - nosuch\n  - _self_\n")
    with pytest.raises(SuiteError, match=r"defaults entry 'nosuch' is neither .*nosuch.yaml nor a suite of"):
        load_eval_conf(bad)


def test_large_holds_small_cells_with_lakes_of_its_own():
    """conf/eval/large.yaml: the check a stage is measured by, on the cells every stage reports
    (small's) but not on the lakes the shipped planner was chosen on."""
    small, large = load_eval_conf("small"), load_eval_conf("large")
    assert cell_values(SuiteSpec.from_conf(large)) == cell_values(SuiteSpec.from_conf(small))
    assert large.lakes_per_cell == 8 * small.lakes_per_cell and large.sampled.num_samples == 0
    a, b = build_suite(small, solve=False), build_suite(large, solve=False)
    assert b.size == 768 and b.describe()["cells"] == a.describe()["cells"]
    assert large.seed != small.seed
    shared = sum(g in set(a.grids) for g in b.grids)  # by chance only: an open 4x4 lake with one agent
    assert shared <= 0.02 * b.size, shared            # has few layouts (6 of 768 here)


@pytest.fixture(scope="module")
def tiny_suite():
    return build_suite(load_eval_conf("tiny"))


def test_suite_fixed_and_matches_cells(tiny_suite):
    s = tiny_suite
    assert s.size == 16 and len(s.cells) == 8 and s.skipped == []
    from jaxlake.suite import _build_suite_cached

    fresh = _build_suite_cached.__wrapped__(s.spec, True)
    assert fresh.grids == s.grids and np.array_equal(fresh.opt_soc, s.opt_soc)
    n_agents = np.asarray(s.lakes.num_agents)
    heights, widths = np.asarray(s.lakes.height), np.asarray(s.lakes.width)
    for i, pos in enumerate(s.cell_of):
        values = s.cells[pos]["values"]
        assert n_agents[i] == values["num_agents"] and heights[i] == widths[i] == values["size"]
        assert s.grids[i] == render_text(jax.tree_util.tree_map(lambda x: np.asarray(x)[i], s.lakes))
    assert (s.opt_soc >= 0).all()   # open tiny lakes are solvable
    d = s.describe()
    assert d["num_lakes"] == 16 and d["dims"] == ["size", "num_agents", "hole_density", "conflict_density"]


def test_invalid_cells_skipped_with_reason(tiny_suite):
    spec = load_eval_conf("tiny")
    spec.grid = {"size": [2, 3], "num_agents": [1, 2, 3], "hole_density": [0.0], "conflict_density": [0.0]}
    spec.lakes_per_cell = 4       # 4 valid cells x 4 = 16 lakes: the same batch shape as the tiny suite
    s = build_suite(spec, solve=False)
    assert [c["values"]["num_agents"] for c in s.cells] == [1, 2, 1, 2]
    assert [sk["id"] for sk in s.skipped] == [2, 5]
    assert "num_agents=3 exceeds max_agents=2" in s.skipped[0]["error"]
    assert s.opt_soc is None and s.size == 16


def test_evaluate_policy_bookkeeping(tiny_suite, monkeypatch):
    """Scripted completions (planner plans greedy, junk sampled) through llm.training.evaluate."""
    import llm.training.evaluate as ev
    from jaxlake.config import LakeConfig
    from llm.game import default as default_model
    from llm.model.hf_io import load_tokenizer

    tok = load_tokenizer(default_model.default_model_dir())
    calls = []

    def fake_complete(policy, prompter, lakes, *, temperature, **kw):
        calls.append(temperature)
        sols = planner.solve_batch(lakes)
        n = np.asarray(lakes.num_agents)
        if temperature == 0.0:  # on the training mixture (calls 3, 4) only 1-agent lakes are solved
            return [format_plan(s.actions, int(k)) if len(calls) < 3 or k == 1 else "no idea"
                    for s, k in zip(sols.solutions, n)]
        return ["no idea"] * len(n)

    monkeypatch.setattr(ev, "complete", fake_complete)
    policy = types.SimpleNamespace(tokenizer=tok)
    one = LakeConfig(height=3, width=3, num_agents=1, hole_density=0.0, max_height=4, max_width=4, max_agents=2)
    cur = [(0.75, one), (0.25, one.replace(num_agents=2))]
    conf = load_eval_conf("tiny")
    conf.current_env_lakes = 16   # the suite's batch shape: no new generator compilation
    result = ev.evaluate_policy(policy, conf, None, current=cur, stage=2, suite=tiny_suite)
    assert calls == [0.0, 1.0, 0.0, 1.0]
    g, s = result["modes"]["greedy"], result["modes"]["sampled"]
    assert result["score"] == g["score"] == 1.0 and g["n"] == 16 and g["soc_ratio"] == 1.0
    assert s["n"] == 32 and s["score"] == 0.0 and s["malformed_rate"] == 1.0
    assert set(g["by_dim"]["size"]) == {"3", "4"} and g["by_dim"]["hole_density"]["0.2"]["n"] == 8
    assert len(result["episodes"]) == 48 and len(result["grids"]) == 16
    # the training mixture: pooled over its 12 + 4 lakes, and each component on its own lakes
    cur_g = result["current_env"]["modes"]["greedy"]
    assert cur_g["score"] == 0.75 and result["current_env"]["modes"]["sampled"]["n"] == 32
    assert [(c["weight"], c["config"]["num_agents"], c["n"], c["score"]) for c in cur_g["by_component"]] == \
        [(0.75, 1, 12, 1.0), (0.25, 2, 4, 0.0)]
    assert result["settings"]["max_new_tokens"] > 0
    json.dumps(result)


def test_decoding_modes_is_the_one_rule_for_what_an_eval_group_scores():
    from jaxlake.suite import decoding_modes
    from llm.training.evaluate import _modes

    for node, want in [({}, [("greedy", 1)]), ({"sampled": {"num_samples": 0}}, [("greedy", 1)]),
                       ({"sampled": {"num_samples": 3}}, [("greedy", 1), ("sampled", 3)]),
                       ({"greedy": False, "sampled": {"num_samples": 2}}, [("sampled", 2)]),
                       ({"greedy": False}, [])]:
        assert decoding_modes(node) == want
        if want:  # the LLM's evaluation decodes exactly these modes, as many samples each
            assert [(m, d["num_samples"]) for m, d in _modes(node)] == want
