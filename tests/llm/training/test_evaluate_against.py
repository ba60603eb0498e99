"""``python -m llm.evaluate --against``: two evaluations of one suite paired lake by lake
(jaxlake.stats.paired_difference), checked against sums by hand, with scripted completions."""

import json
import math

import numpy as np
import pytest

from jaxlake import planner
from jaxlake.stats import paired_difference, sign_test_p
from jaxlake.text import format_plan


def test_paired_difference_by_hand():
    a = [1, 1, 0, 0, 1, 1, 0, 1]
    b = [1, 0, 1, 1, 1, 1, 0, 1]
    d = np.asarray(b, float) - np.asarray(a, float)
    got = paired_difference(a, b)
    assert (got.n, got.wins, got.losses) == (8, 2, 1)
    assert got.mean_a == 5 / 8 and got.mean_b == 6 / 8 and got.diff == pytest.approx(1 / 8)
    assert got.half_width == pytest.approx(2.364624 * d.std(ddof=1) / math.sqrt(8), rel=1e-6)  # t(7)
    assert got.p_value == 1.0  # 2 against 1: P(min <= 1 of 3) = 2 * 4 / 8, capped
    assert sign_test_p(0, 6) == pytest.approx(2 / 64) and sign_test_p(9, 1) == pytest.approx(2 * 11 / 1024)
    same = paired_difference([1, 0, 1], [1, 0, 1])
    assert (same.diff, same.half_width, same.p_value) == (0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="3 lakes against 2"):
        paired_difference([1, 0, 1], [1, 0])


@pytest.fixture
def scripted(monkeypatch):
    """``llm.training.evaluate.complete`` replaced: greedy plays the planner's plan except on
    the suite lakes in ``fail`` (set per call), sampled completions are junk."""
    import llm.training.evaluate as ev

    fail: set = set()

    def fake_complete(policy, prompter, lakes, *, temperature, **kw):
        sols = planner.solve_batch(lakes)
        n = np.asarray(lakes.num_agents)
        if temperature > 0:
            return ["no idea"] * len(n)
        return ["no idea" if i in fail else format_plan(s.actions, int(k))
                for i, (s, k) in enumerate(zip(sols.solutions, n))]

    monkeypatch.setattr(ev, "complete", fake_complete)
    return ev, fail


def test_against_pairs_two_evaluations_of_one_suite(tmp_path, scripted, capsys):
    ev, fail = scripted
    fail |= {0, 1, 2}
    a = tmp_path / "a.json"
    assert ev.main(["default", "--eval", "tiny", "--out", str(a)]) == 0
    fail.clear()
    fail |= {2, 5}  # lakes 0 and 1 won, 5 lost, 2 failed by both
    b = tmp_path / "b.json"
    capsys.readouterr()
    assert ev.main(["default", "--eval", "tiny", "--out", str(b), "--against", str(a)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(b.read_text())
    n = result["modes"]["greedy"]["n"]
    assert n == 16
    against = result["against"]
    assert against["path"] == str(a) and against["mode"] == "greedy"
    assert (against["wins"], against["losses"], against["n"]) == (2, 1, n)
    assert against["mean_a"] == (n - 3) / n and against["mean_b"] == (n - 2) / n
    assert against["diff"] == pytest.approx(1 / n)
    assert out[-3] == (f"against default (greedy): {(n - 3) / n:.3f} -> {(n - 2) / n:.3f} "
                       f"(+{1 / n:.3f} +- {against['half_width']:.3f}, 2 won, 1 lost, p = 1, {n} lakes)")
    # "no idea" is malformed: 3 failed lakes before, 2 after, none of another kind
    assert out[-2] == "failed lakes (greedy): collided 0 -> 0, fell 0 -> 0, malformed 3 -> 2, timed out 0 -> 0"
    # the cells of lakes 0 and 1 (won) and 5 (lost): the suite is cell-major, lakes_per_cell a cell
    from jaxlake.suite import cell_label

    per = result["suite"]["lakes_per_cell"]
    cells = result["suite"]["cells"]
    change = {}
    for lake, d in ((0, +1), (1, +1), (5, -1)):
        change[lake // per] = change.get(lake // per, 0) + d
    solved = {i: per - sum(1 for lake in (0, 1, 2) if lake // per == i) for i in range(len(cells))}
    moved = sorted((i for i in change if change[i]), key=lambda i: (-abs(change[i]), i))
    assert moved, "the scripted change moves at least one cell"
    assert out[-1] == "cells that moved (greedy, lakes solved): " + "; ".join(
        f"{cell_label(cells[i]['values'])}: {solved[i]} -> {solved[i] + change[i]} of {per}" for i in moved)


def test_failed_by_kind_counts_each_failed_lake_once_by_its_first_kind():
    from jaxlake.suite import failed_by_kind

    def rec(lake, success, *types, mode="greedy", sample=0):
        return {"lake": lake, "mode": mode, "sample": sample, "success": success, "failure_types": list(types)}

    episodes = [rec(0, True), rec(1, False, "conflict", "timeout"), rec(2, False, "fell", "conflict"),
                rec(3, False, "fell"), rec(4, False, "malformed", "fell"), rec(5, False, "timeout"),
                rec(6, False, "malformed", "timeout"), rec(7, False, "fell", sample=1), rec(8, False, "fell", mode="sampled")]
    assert failed_by_kind(episodes) == {"collided": 2, "fell": 2, "malformed": 1, "timed out": 1}
    assert failed_by_kind(episodes, "sampled") == {"collided": 0, "fell": 1, "malformed": 0, "timed out": 0}


def test_moved_cells_names_the_cells_whose_solved_lakes_changed_largest_first():
    from jaxlake.suite import cell_label, moved_cells

    cells = [{"id": i, "values": {"size": 4, "num_agents": 1 + i % 2, "hole_density": 0.2 * i, "conflict_density": 1.0}}
             for i in range(3)]

    def evaluation(solved):  # solved: {cell: lakes solved of 4}
        return [{"lake": 4 * c + j, "cell": c, "mode": "greedy", "sample": 0, "success": j < solved[c]}
                for c in range(3) for j in range(4)]

    before, after = evaluation({0: 3, 1: 1, 2: 2}), evaluation({0: 2, 1: 4, 2: 2})
    got = moved_cells(before, after, cells)
    assert [(c["id"], x, y, n) for c, x, y, n in got] == [(1, 1, 4, 4), (0, 3, 2, 4)]
    assert moved_cells(before, before, cells) == []
    assert moved_cells(before, after, cells, mode="sampled") == []  # no sampled episodes: nothing moved
    assert cell_label(cells[1]["values"]) == "size=4 n=2 holes=0.2 conflict=1"


def test_against_another_suite_or_a_bad_file_is_one_line_and_evaluates_nothing(tmp_path, scripted, capsys,
                                                                                   monkeypatch):
    ev, _ = scripted
    a = tmp_path / "a.json"
    assert ev.main(["default", "--eval", "tiny", "--out", str(a)]) == 0
    other = json.loads(a.read_text())
    other["suite"]["seed"] = 12
    moved = tmp_path / "other_suite.json"
    moved.write_text(json.dumps(other))
    monkeypatch.setattr(ev, "evaluate_policy", lambda *a, **k: pytest.fail("evaluated before checking --against"))
    out = tmp_path / "b.json"
    capsys.readouterr()
    assert ev.main(["default", "--eval", "tiny", "--out", str(out), "--against", str(moved)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --against {moved}: another suite (seed 12 there, 11 here); pair evaluations of the "
                   "same --eval"]
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert ev.main(["default", "--eval", "tiny", "--out", str(out), "--against", str(broken)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --against {broken}: ")
    assert not out.exists()
