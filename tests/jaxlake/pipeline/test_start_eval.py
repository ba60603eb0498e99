"""The starting policy's suite evaluation (``pipeline.start_eval``, ``start_eval.json``): row 0 of the
stage table and the baseline of stage 1's paired change; the setting's error; the archive keeps
the file slimmed and restores it. The real command writes it in tests/jaxlake/pipeline/test_stages.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxlake.io import write_json
from jaxlake.pipeline.archive import archive_run, restore_runs
from jaxlake.pipeline.records import START_EVAL, paired_with_previous, run_gain_line, stage_table
from jaxlake.pipeline.settings import PipelineError, RunSettings
from jaxlake.stats import paired_difference

SUITE = {"name": "tiny", "seed": 5, "lakes_per_cell": 4, "cells": [{"id": 0}]}
ENV = [{"weight": 1.0, "config": {"height": 5, "width": 5, "num_agents": 2, "hole_density": 0.1,
                                  "conflict_density": 0.5}}]


def evaluation(successes: list, stage: int, own: float) -> dict:
    episodes = [{"cell": 0, "lake": i, "mode": "greedy", "sample": 0, "success": ok, "grid": [[0]]}
                for i, ok in enumerate(successes)]
    return {"format": "jaxlake.eval/1", "stage": stage, "checkpoint": "the shipped planner" if stage == 0 else "policy",
            "suite": SUITE, "modes": {"greedy": {"score": sum(successes) / len(successes)}},
            "episodes": episodes, "current_env": {"modes": {"greedy": {"score": own}}, "episodes": []}}


def record(run: Path, k: int, ev: dict) -> dict:
    (run / f"stage_{k}").mkdir(parents=True, exist_ok=True)
    write_json(run / f"stage_{k}" / "eval.json", ev)
    return {"stage": k, "dir": str(run / f"stage_{k}"), "env": ENV, "scores": {"greedy": ev["modes"]["greedy"]["score"]},
            "current_env": {"greedy": ev["current_env"]["modes"]["greedy"]["score"]}, "decision": "proposed",
            "reason": "valid"}


def test_row_0_is_the_start_and_stage_1_is_paired_with_it(tmp_path):
    start, one, two = [True, False, False, True], [True, True, False, True], [True, True, True, False]
    records = [record(tmp_path, 1, evaluation(one, 1, 0.5)), record(tmp_path, 2, evaluation(two, 2, 0.75))]
    # without start_eval.json (pipeline.start_eval=false, or a folder of an earlier version) there is no row 0
    rows = stage_table(records).splitlines()
    assert [r.split(" | ")[0] for r in rows[2:]] == ["| 1", "| 2"] and rows[2].split(" | ")[3] == "–"
    assert paired_with_previous(records[0]) is None
    write_json(tmp_path / START_EVAL, evaluation(start, 0, 0.25))
    rows = stage_table(records).splitlines()
    assert rows[2] == "| 0 | start: the shipped planner | 0.500 | – | 0.250 | – |"
    d = paired_with_previous(records[0])
    assert (d.wins, d.losses) == (1, 0) and d == paired_difference(start, one)
    assert rows[3].split(" | ")[3] == f"{d.diff:+.3f} ± {d.half_width:.3f} (1 won, 0 lost)"
    assert paired_with_previous(records[1]) == paired_difference(one, two)  # stage 2 still against stage 1
    # a table that does not start at stage 1 (+stage=2 alone) has no row 0
    assert "| 0 |" not in stage_table(records[1:])
    # the line under the table: the last stage against the start, on the same lakes
    gain = paired_difference(start, two)
    assert run_gain_line(records) == (f"stage 2 vs the start (stage 0), paired on the suite: {gain.diff:+.3f} ± "
                                      f"{gain.half_width:.3f} ({gain.wins} won, {gain.losses} lost)")
    assert (gain.wins, gain.losses) == (2, 1) and run_gain_line([]) is None


def test_start_eval_setting_is_checked():
    assert RunSettings.from_cfg({"pipeline": {}}).start_eval is True
    assert RunSettings.from_cfg({"pipeline": {"start_eval": False}}).start_eval is False
    with pytest.raises(PipelineError, match=r"pipeline\.start_eval='yes' must be true or false"):
        RunSettings.from_cfg({"pipeline": {"start_eval": "yes"}})


def test_the_archive_keeps_start_eval_slim_and_restores_it(tmp_path):
    run = tmp_path / "sweep" / "a_seed0"
    (run / "stage_1").mkdir(parents=True)
    write_json(run / "run.json", {"experiment": "x", "stages": 1})
    for name in ("env.yaml", "next_env.yaml", "summary.txt"):
        (run / "stage_1" / name).write_text("x\n")
    for name in ("train.json", "summary.json", "engineer.json"):
        write_json(run / "stage_1" / name, {})
    write_json(run / "stage_1" / "eval.json", evaluation([True, False, True, True], 1, 0.5))
    write_json(run / START_EVAL, evaluation([True, False, False, True], 0, 0.25))
    archived = archive_run(run, tmp_path / "archive")
    kept = json.loads((archived / START_EVAL).read_text())
    assert isinstance(kept["episodes"], dict) and "grid" not in kept["episodes"]  # slim: columns, no grids
    back = tmp_path / "restored"
    restore_runs(tmp_path / "archive", back)
    again = json.loads((back / "a_seed0" / START_EVAL).read_text())
    assert [e["success"] for e in again["episodes"]] == [True, False, False, True]


def test_short_env_names_a_config_a_few_components_or_a_broad_mixture_by_its_ranges():
    from jaxlake.conf import CONF_DIR
    from jaxlake.mixture import load_mixture, mixture_to_obj
    from jaxlake.pipeline.records import short_env

    tiny, broad = (mixture_to_obj(load_mixture(CONF_DIR / "env" / f"{n}.yaml")) for n in ("tiny", "broad"))
    assert short_env(tiny) == "5x5 n=2 holes=0.1 conflict=0.5"
    half = [dict(c, weight=0.5) for c in tiny]
    assert short_env(half + half) == "0.50*(5x5 n=2 holes=0.1 conflict=0.5) + 0.50*(5x5 n=2 holes=0.1 conflict=0.5)"
    assert short_env(broad) == "8 configs, equal weights: 4x4-6x6 n=1-2 holes=0-0.2 conflict=0-1"
    skewed = [dict(c, weight=w) for c, w in zip(broad, [0.3] + [0.1] * 7)]
    assert short_env(skewed).startswith("8 configs, weights 0.10-0.30: ")
