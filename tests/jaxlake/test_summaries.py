"""Summaries on a synthetic evaluation: metrics, breakdowns, failure selection, rendering."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlake.config import LakeConfig
from jaxlake.suite import FAILURE_TYPES, aggregate, failure_types, metrics
from jaxlake.summaries import (
    PARTS,
    behaviour,
    brief_config,
    failure_cases,
    history_entry,
    render_summary,
    select_failures,
    summarize,
)


def rec(lake, cell, *, success=False, n=2, arrived=0, fell=0, timed_out=0, conflicts=0, malformed=False,
        plan_len=3, soc=None, opt=None, mode="greedy", sample=0, events=None):
    r = {
        "lake": lake, "cell": cell, "mode": mode, "sample": sample, "num_agents": n, "success": success,
        "arrived_share": arrived / n, "fell": fell, "timed_out": timed_out, "conflicts": conflicts,
        "malformed": malformed, "malformed_reasons": ["line 2: stray text 'hello'"] if malformed else [],
        "plan_len": plan_len, "soc": soc, "opt_soc": opt, "solvable": None if opt is None else opt >= 0,
        "events": events or {"first_fall": None, "first_conflict": None, "timeouts": []},
        "plan": "A: R R\nB: D", "completion": "A: R R\nB: D",
    }
    r["failure_types"] = failure_types(r)
    return r


CELLS = [
    {"id": 0, "values": {"size": 4, "num_agents": 1}, "config": LakeConfig(height=4, width=4, num_agents=1)},
    {"id": 1, "values": {"size": 4, "num_agents": 2}, "config": LakeConfig(height=4, width=4, num_agents=2)},
    {"id": 3, "values": {"size": 6, "num_agents": 2}, "config": LakeConfig(height=6, width=6, num_agents=2)},
]

FALL = {"first_fall": {"agent": "B", "step": 3, "cell": [2, 1]}, "first_conflict": None, "timeouts": []}
CONFLICT = {"first_fall": None, "first_conflict": {"agent": "A", "step": 2, "kind": "swap", "cell": [0, 1], "action": "R"},
            "timeouts": [{"agent": "A", "cell": [0, 1], "goal": [3, 3], "step": 8}]}
TIMEOUT = {"first_fall": None, "first_conflict": None, "timeouts": [{"agent": "B", "cell": [1, 1], "goal": [2, 2], "step": 8}]}

RECORDS = [
    rec(0, 0, success=True, n=1, arrived=1, soc=4, opt=4),                      # cell 0
    rec(1, 0, success=True, n=1, arrived=1, soc=6, opt=4),                      # cell 0
    rec(2, 1, arrived=1, fell=1, events=FALL),                                  # cell 1: fell
    rec(3, 1, arrived=0, timed_out=1, conflicts=2, events=CONFLICT),            # cell 1: conflict+timeout
    rec(4, 3, arrived=1, timed_out=1, events=TIMEOUT, opt=-1),                  # cell 3: timeout
    rec(5, 3, malformed=True, arrived=0, timed_out=2, events=TIMEOUT),          # cell 3: malformed+timeout
]


def test_metrics_hand_computed():
    m = metrics(RECORDS)
    assert m["n"] == 6
    assert m["score"] == pytest.approx(2 / 6)
    # arrived shares: 1, 1, .5, 0, .5, 0
    assert m["arrived_share"] == pytest.approx(3 / 6)
    assert m["fall_rate"] == pytest.approx(1 / 6)
    assert m["timeout_rate"] == pytest.approx(3 / 6)
    assert m["conflict_rate"] == pytest.approx(1 / 6)
    assert m["malformed_rate"] == pytest.approx(1 / 6)
    assert m["agents_fell"] == pytest.approx(1 / 10)       # 2*1 + 4*2 = 10 agents
    assert m["agents_timed_out"] == pytest.approx(4 / 10)
    assert m["soc_ratio"] == pytest.approx((4 / 4 + 6 / 4) / 2)
    # records with a planner result: lakes 0, 1 (solvable), 4 (not)
    assert m["solvable"] == pytest.approx(2 / 3)
    assert metrics([])["score"] is None and metrics([])["n"] == 0


def test_aggregate_breakdowns_follow_cells():
    agg = aggregate(RECORDS, CELLS, ["size", "num_agents"])
    assert agg["score"] == pytest.approx(2 / 6)
    assert agg["by_dim"]["size"]["4"]["n"] == 4
    assert agg["by_dim"]["size"]["4"]["score"] == pytest.approx(2 / 4)
    assert agg["by_dim"]["size"]["6"]["score"] == 0.0
    assert agg["by_dim"]["num_agents"]["1"]["score"] == 1.0
    assert agg["by_dim"]["num_agents"]["2"]["n"] == 4
    assert [c["id"] for c in agg["by_cell"]] == [0, 1, 3]
    assert agg["by_cell"][2]["config"]["height"] == 6
    json.dumps(agg)  # JSON-ready


def synthetic_eval():
    grids = [f"A . .\n. ~ .\n. . a  # lake {i}" for i in range(6)]
    return {
        "suite": {"name": "synthetic", "dims": ["size", "num_agents"],
                  "cells": [{"id": c["id"], "values": c["values"], "config": c["config"].to_dict()} for c in CELLS]},
        "modes": {"greedy": aggregate(RECORDS, CELLS, ["size", "num_agents"]),
                  "sampled": aggregate(RECORDS[:2], CELLS, ["size", "num_agents"])},
        "current_env": {"modes": {"greedy": metrics(RECORDS[:3])}},
        "episodes": RECORDS,
        "grids": grids,
    }


def test_failure_cases_cover_every_type_with_grid_plan_step_cause():
    f = failure_cases(synthetic_eval(), k=3)
    assert f["types_present"] == ["malformed", "fell", "conflict", "timeout"]
    assert f["types_covered"] == f["types_present"]   # 3 cases suffice for 4 types
    assert len(f["cases"]) == 3
    by_lake = {c["lake"]: c for c in f["cases"]}
    fall = by_lake[2]
    assert fall["grid"].endswith("lake 2")
    assert fall["plan"] == "A: R R\nB: D"
    assert fall["step"] == 3
    assert fall["cause"] == "step 3: agent B fell into the hole at row 2 col 1"
    conflict = by_lake[3]
    assert conflict["causes"][0].startswith("step 2: agent A's move R from row 0 col 1 was cancelled (swap conflict)")
    assert "timed out" in conflict["causes"][1]
    malformed = by_lake[5]
    assert malformed["step"] == 0 and malformed["cause"].startswith("malformed answer")
    assert all(c["cell"] is not None for c in f["cases"])


FAILS = st.lists(
    st.tuples(st.sets(st.sampled_from(FAILURE_TYPES)), st.integers(0, 4), st.booleans()), min_size=0, max_size=25
)


@settings(max_examples=60, deadline=None)
@given(FAILS, st.integers(0, 8))
def test_select_failures_covers_types_first(specs, k):
    records = []
    for i, (types, cell, success) in enumerate(specs):
        r = rec(i, cell, success=success and not types, malformed="malformed" in types,
                fell=int("fell" in types), conflicts=int("conflict" in types), timed_out=int("timeout" in types))
        records.append(r)
    chosen = select_failures(records, k)
    failed = [r for r in records if not r["success"]]
    assert len(chosen) == min(k, len(failed))
    assert all(not r["success"] for r in chosen)
    assert len({r["lake"] for r in chosen}) == len(chosen)
    present = {t for r in failed for t in r["failure_types"]}
    covered = {t for r in chosen for t in r["failure_types"]}
    if k >= len(FAILURE_TYPES):
        assert covered == present
    # never more cells repeated than needed: distinct cells first
    cells_failed = {r["cell"] for r in failed}
    if len(chosen) <= len(cells_failed) and k >= len(FAILURE_TYPES) + len(cells_failed):
        assert len({r["cell"] for r in chosen}) == len(chosen)


def test_summary_json_and_text_parts_switchable():
    hist = [history_entry(1, [(1.0, LakeConfig())], synthetic_eval(), train={"reward": 0.5, "step": 2},
                          engineer={"engineer": "heuristic", "decision": "proposed", "reason": "raise size"})]
    env_stats = {"lakes": 4, "overall": {"hole_density": 0.1, "conflict_density": 0.5, "path_len_mean": 3.0,
                                         "dist_ok": 1.0, "solvable": 0.75},
                 "components": [{"weight": 1.0, "config": LakeConfig().to_dict(), "lakes": 4, "hole_density": 0.12,
                                 "target_hole_density": 0.1, "conflict_density": 0.5, "target_conflict_density": 0.5,
                                 "path_len_mean": 3.0, "path_len_min": 1, "path_len_max": 6, "dist_ok": 1.0,
                                 "attempts_mean": 1.0, "solvable": 0.75}]}
    s = summarize(synthetic_eval(), env_stats, hist, k_failures=4)
    json.dumps(s)
    assert set(s) == set(PARTS)
    assert s["behaviour"]["overall"]["score"] == pytest.approx(0.333)
    assert s["behaviour"]["current_env"]["score"] == pytest.approx(0.667)
    assert s["behaviour"]["scores"] == {"greedy": 0.333, "sampled": 1.0}
    assert s["behaviour"]["by_dim"]["size"]["4"]["score"] == 0.5
    full = render_summary(s)
    for header in ("## Policy behaviour", "## Failure cases", "## Training environment statistics", "## Stage history"):
        assert header in full
    assert "by size: 4: success 0.50" in full
    assert "stage 1: env 1.00 x (height=5" in full and "engineer proposed: raise size" in full
    assert "solvable by the planner 0.75" in full
    only = render_summary(s, parts=["behaviour", "history"])
    assert "## Failure cases" not in only and "## Training environment statistics" not in only
    assert "## Policy behaviour" in only and "## Stage history" in only
    assert render_summary(s, parts=[]) == ""
    with pytest.raises(ValueError, match="unknown summary part"):
        render_summary(s, parts=["gossip"])


def test_malformed_case_shows_the_answer_as_written():
    bad = rec(0, 1, malformed=True, timed_out=2, events=TIMEOUT)
    bad["completion"] = "A: U\nB: L\nC: R"
    bad["plan"] = "A: U\nB: L"
    ev = {"episodes": [bad], "grids": ["A . a\nB . b"], "suite": {"cells": CELLS}}
    text = render_summary({"failures": failure_cases(ev, 2)}, parts=["failures"])
    assert "answer as written:\nA: U\nB: L\nC: R\nplan as read:\nA: U\nB: L" in text
    good = rec(1, 1, fell=1, events=FALL)
    text = render_summary({"failures": failure_cases({**ev, "episodes": [good]}, 2)}, parts=["failures"])
    assert "plan:\nA: R R\nB: D" in text and "answer as written" not in text


def test_behaviour_falls_back_to_available_mode():
    ev = synthetic_eval()
    del ev["modes"]["greedy"]
    b = behaviour(ev, "greedy")
    assert b["mode"] == "sampled" and b["overall"]["score"] == 1.0


def test_malformed_shown_per_dimension_and_not_counted_as_timeout():
    ev = synthetic_eval()
    # the training environment: one success, one well-formed timeout, two malformed answers that ran out of time
    cur = [rec(10, 0, success=True, n=1, arrived=1), rec(11, 0, timed_out=1, events=TIMEOUT),
           rec(12, 0, malformed=True, timed_out=2, events=TIMEOUT), rec(13, 0, malformed=True, timed_out=1)]
    ev["current_env"] = {"modes": {"greedy": metrics(cur)}, "episodes": cur}
    b = behaviour(ev)
    # size 6 = lakes 4 (a timeout) and 5 (malformed, and so timed out): the aggregate says timeout 1.0
    assert ev["modes"]["greedy"]["by_dim"]["size"]["6"]["timeout_rate"] == 1.0
    six = b["by_dim"]["size"]["6"]
    assert six["timeout_rate"] == 0.5 and six["malformed_rate"] == 0.5
    assert b["by_dim"]["size"]["4"]["timeout_rate"] == 0.25 and b["by_dim"]["size"]["4"]["malformed_rate"] == 0.0
    assert b["overall"]["timeout_rate"] == pytest.approx(2 / 6, abs=1e-3)  # lakes 3 and 4; not 5
    assert b["current_env"]["timeout_rate"] == 0.25 and b["current_env"]["malformed_rate"] == 0.5
    text = render_summary(summarize(ev), parts=["behaviour"])
    assert "6: success 0.00 fall 0.00 conflict 0.00 timeout 0.50 malformed 0.50" in text
    assert "success 0.25, arrived 0.25, fall 0.00, conflict 0.00, timeout 0.25, malformed 0.50" in text
    assert "timeouts count well-formed answers only" in text


def test_each_training_mixture_component_gets_its_own_line():
    ev = synthetic_eval()
    a, b = LakeConfig(height=4, width=4, num_agents=1), LakeConfig(height=6, width=6, num_agents=3)
    ok, bad = [rec(20, 0, success=True, n=1, arrived=1)] * 3, [rec(21, 0, malformed=True)]
    comps = [{"weight": 0.75, "config": a.to_dict(), **metrics(ok)}, {"weight": 0.25, "config": b.to_dict(), **metrics(bad)}]
    ev["current_env"] = {"modes": {"greedy": {**metrics(ok + bad), "by_component": comps}}}
    c = behaviour(ev)["current_env"]
    assert c["score"] == 0.75  # pooled
    assert [(x["weight"], x["score"], x["malformed_rate"], x["n"]) for x in c["components"]] == \
        [(0.75, 1.0, 0.0, 3), (0.25, 0.0, 1.0, 1)]
    text = render_summary(summarize(ev), parts=["behaviour"])
    assert "- component #1, weight 0.25: height=6, width=6, num_agents=3" in text
    assert "(1 lakes): success 0.00, fall 0.00, malformed 1.00" in text


def test_the_brief_summary_keeps_the_numbers_a_reader_acts_on_in_fewer_words():
    ev = synthetic_eval()
    configs = [LakeConfig(height=h, width=h, num_agents=n, hole_density=d) for h in (4, 6) for n in (1, 2) for d in (0.0, 0.2)]
    ok = [rec(20, 0, success=True, n=1, arrived=1)] * 3
    comps = [{"weight": 0.125, "config": c.to_dict(), **metrics(ok)} for c in configs]
    ev["current_env"] = {"modes": {"greedy": {**metrics(ok), "by_component": comps}}}
    s = summarize(ev, None, [history_entry(1, [(0.125, c) for c in configs], ev)], k_failures=2)
    full, brief = render_summary(s), render_summary(s, brief=True)
    line = [x for x in full.splitlines() if x.startswith("on the training environment")][0]
    # the training environment's line, word for word; then a line a component, by its number
    assert line in brief.splitlines() and "- #7: success 1.00, fall 0.00" in brief
    assert "success by size: 4 0.50, 6 0.00" in brief and "## Failure cases" in brief
    assert "(6x6, 2 agents, holes 0.2, conflict 0.50)" in brief and "slip_prob" not in brief
    assert len(brief) < 0.6 * len(full)
    assert brief_config(LakeConfig(height=5, width=3, num_agents=1, slip_prob=0.1, min_dist=2, max_dist=4).to_dict()) \
        == "5x3, 1 agent, holes 0.1, conflict 0.50, slip 0.10, distance 2-4"
