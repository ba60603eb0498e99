"""End to end: ``python -m jaxlake.run`` over two tiny stages in a temporary folder, stage by
stage (``+stage=2`` after ``+stage=1``, and without it), resume after interruptions (in
training and between steps), a two-job multirun, and the report over those runs.

The entry point runs in this process (Hydra's ``main`` with ``sys.argv`` set) so that JAX
compilations are shared between the runs; a micro Qwen3 (one layer) stands in for the
default model to keep the runs short.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.support import run_cli, tiny_run_overrides
from jaxlake.conf import CONF_DIR

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def overrides(runs, micro, experiment, *extra):
    return [f"runs_dir={runs}", f"experiment={experiment}", "stages=2", *tiny_run_overrides(micro), *extra]


def stage_files(d):
    return {p.name for p in d.iterdir()}


def test_full_pipeline_two_stages_policy_engineer(monkeypatch, capsys, runs, micro_model):
    code = run_cli(monkeypatch, overrides(runs, micro_model, "full", "engineer=policy"))
    assert code is None
    out = capsys.readouterr().out
    assert "| stage | environment | suite greedy | suite sampled | own env (greedy) | engineer |" in out
    run = runs / "full"
    info = json.loads((run / "run.json").read_text())
    assert info["engineer"] == "policy" and info["stages"] == 2
    for k in (1, 2):
        d = run / f"stage_{k}"
        assert {"checkpoint", "metrics.jsonl", "eval.json", "summary.json", "summary.txt", "engineer.json",
                "next_env.yaml", "env.yaml", "train.json", "train_eval.json"} <= stage_files(d)
        ev = json.loads((d / "eval.json").read_text())
        assert ev["format"] == "jaxlake.eval/1" and ev["suite"]["name"] == "tiny"
        assert set(ev["modes"]) == {"greedy", "sampled"} and 0.0 <= ev["score"] <= 1.0
        eng = json.loads((d / "engineer.json").read_text())
        assert eng["engineer"] == "policy" and eng["decision"] in ("proposed", "fallback")
        for key in ("prompt", "raw_output", "parsed", "validation_errors", "attempts", "choices"):
            assert key in eng
        assert "## Policy behaviour" in eng["prompt"]
    # stage 2 trained on what the engineer proposed after stage 1, starting from stage 1's policy
    assert yaml.safe_load((run / "stage_2" / "env.yaml").read_text()) == yaml.safe_load(
        (run / "stage_1" / "next_env.yaml").read_text())
    t2 = json.loads((run / "stage_2" / "train.json").read_text())
    assert t2["init_from"].startswith(str(run / "stage_1")) and t2["warmstart_steps"] == 0
    summary = json.loads((run / "stage_2" / "summary.json").read_text())
    assert [h["stage"] for h in summary["history"]] == [1, 2]
    assert summary["history"][0]["engineer"]["engineer"] == "policy"
    assert (run / "report.md").is_file() and (run / "score_per_stage.png").is_file()


def test_stage_by_stage_with_interruptions(monkeypatch, capsys, runs, micro_model):
    import jaxlake.pipeline.stages as pipeline
    import llm.training.stage as train

    args = overrides(runs, micro_model, "staged", "engineer=heuristic")
    run = runs / "staged"
    # stage 2 alone, before stage 1: a clear error naming the file and the command
    assert run_cli(monkeypatch, args + ["+stage=2"]) == 1
    err = capsys.readouterr().err
    assert f"{run / 'stage_1' / 'next_env.yaml'}" in err
    assert "python -m jaxlake.run +stage=1" in err and "experiment=staged" in err
    assert not (run / "stage_2").exists()

    # stage 1, killed after one GRPO step (the trainer stops early), then resumed
    real = train.train_stage
    monkeypatch.setattr(train, "train_stage", lambda *a, **kw: real(*a, max_steps={"grpo": 1}, **kw))
    assert run_cli(monkeypatch, args + ["+stage=1"]) == 1
    assert "rerun the same command to resume" in capsys.readouterr().err
    assert not (run / "stage_1" / "train.json").exists()
    monkeypatch.setattr(train, "train_stage", real)
    assert run_cli(monkeypatch, args + ["+stage=1"]) is None
    t1 = json.loads((run / "stage_1" / "train.json").read_text())
    assert t1["resumed"] and t1["grpo_steps"] == 2
    rows = [json.loads(line) for line in (run / "stage_1" / "metrics.jsonl").read_text().splitlines()]
    grpo_steps = [r["step"] for r in rows if r.get("phase") == "grpo"]
    assert grpo_steps == sorted(set(grpo_steps)) and len(grpo_steps) == 2
    assert (run / "stage_1" / "next_env.yaml").is_file() and not (run / "stage_2").exists()

    # stage 2, killed between evaluation and summary, then the same command resumes it
    real_summary = pipeline.step_summary

    def killed(cfg, k, *a, **kw):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(pipeline, "step_summary", killed)
    with pytest.raises(KeyboardInterrupt):
        run_cli(monkeypatch, args + ["+stage=2"])
    d2 = run / "stage_2"
    assert {"eval.json", "train.json"} <= stage_files(d2) and "summary.json" not in stage_files(d2)
    before = {f: os.stat(d2 / f).st_mtime_ns for f in ("eval.json", "metrics.jsonl", "train.json")}
    stage1 = {p.name: os.stat(p).st_mtime_ns for p in (run / "stage_1").iterdir() if p.is_file()}
    monkeypatch.setattr(pipeline, "step_summary", real_summary)
    assert run_cli(monkeypatch, args + ["+stage=2"]) is None
    assert {f: os.stat(d2 / f).st_mtime_ns for f in before} == before      # not redone
    assert {p.name: os.stat(p).st_mtime_ns for p in (run / "stage_1").iterdir() if p.is_file()} == stage1
    assert {"summary.json", "engineer.json", "next_env.yaml"} <= stage_files(d2)
    # the whole pipeline now finds both stages complete and only prints the table
    assert run_cli(monkeypatch, args) is None
    assert "complete, skipped" in capsys.readouterr().err
    assert {f: os.stat(d2 / f).st_mtime_ns for f in before} == before


def test_multirun_and_report(monkeypatch, capsys, runs, micro_model):
    args = ["-m", *overrides(runs, micro_model, "sweep"), "engineer=heuristic,fixed", "stages=1"]
    assert run_cli(monkeypatch, args) is None
    sweep = runs / "sweep" / "multirun"
    engineers = sorted(json.loads((sweep / j / "run.json").read_text())["engineer"] for j in ("0", "1"))
    assert engineers == ["fixed", "heuristic"]
    for j in ("0", "1"):
        assert (sweep / j / "stage_1" / "next_env.yaml").is_file() and not (sweep / j / "stage_2").exists()
    fixed = sweep / ("0" if json.loads((sweep / "0" / "run.json").read_text())["engineer"] == "fixed" else "1")
    assert yaml.safe_load((fixed / "stage_1" / "next_env.yaml").read_text()) == yaml.safe_load(
        (fixed / "stage_1" / "env.yaml").read_text())
    out = subprocess.run([sys.executable, "-m", "jaxlake.report", str(sweep)], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    table = out.stdout
    assert "| engineer | stage 1 |" in table
    assert "| fixed | " in table and "| heuristic | " in table and "(n=1)" in table
    assert (sweep / "report.md").is_file()
    assert (sweep / "score_per_stage.png").stat().st_size > 0 and (sweep / "breakdown.png").stat().st_size > 0
    # every run of the session (other tests' runs included), reported together
    allrep = subprocess.run([sys.executable, "-m", "jaxlake.report", str(runs)], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert allrep.returncode == 0, allrep.stderr
    assert f"{len(list(runs.rglob('run.json')))} run(s)" in allrep.stdout


def test_launcher_configs_compose():
    """The cluster launcher configs compose (needs the optional Hydra launcher plugins)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    from hydra import compose, initialize_config_dir

    targets = {}
    for launcher in ("slurm", "local_gpus", "processes"):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
            targets[launcher] = cfg.hydra.launcher._target_.rsplit(".", 1)[-1]
    assert targets == {"slurm": "SlurmLauncher", "local_gpus": "LocalLauncher", "processes": "JoblibLauncher"}
