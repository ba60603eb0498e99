"""End to end: ``python -m jaxlake.run`` over two tiny stages in a temporary folder: once as a
user runs it (a real subprocess: the per-stage table on stdout, every stage's files; the same
command started again meanwhile is refused by the run folder's lock; a finished run rerun as a
no-op), then stage by stage (``+stage=2`` after ``+stage=1``, and without it, the advice of
its error run as given) with resume after interruptions (in training and between steps), in
a copy of the run folder, a stale lock taken over and one-line errors for bad values and an
unwritable folder.

The stage-by-stage runs call the entry point in this process (Hydra's ``main`` with
``sys.argv`` set); a micro Qwen3 (one layer) stands in for the default model to keep the
runs short. Compilations are shared with the subprocess through the session's persistent
XLA cache (tests/conftest.py). A multirun sweep and ``python -m jaxlake.report`` over its
runs are covered by the study's end-to-end test (tests/jaxlake/pipeline/test_study.py),
whose sweep is such a multirun; a stage number out of range by tests/jaxlake/pipeline/test_run_stage.py.
"""

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tests.support import planner_prompt_overrides, run_cli, tiny_run_overrides, unwritable
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


@pytest.fixture(scope="module")
def full_run(runs, micro_model, tmp_path_factory):
    """The whole pipeline, two stages with the policy engineer, run once by the real command;
    the tests below inspect its folder. While it runs, the same command is started a second
    time (two terminals, a script run twice): it finds the run folder locked and refuses at
    once, touching nothing."""
    args = overrides(runs, micro_model, "full", "engineer=policy")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("HYDRA_FULL_ERROR", None)
    logs = tmp_path_factory.mktemp("full_logs")
    with open(logs / "out", "w") as out_f, open(logs / "err", "w") as err_f:
        first = subprocess.Popen([sys.executable, "-m", "jaxlake.run", *args], cwd=str(ROOT), env=env,
                                 stdout=out_f, stderr=err_f, text=True)
    lock = runs / "full" / "run.lock"
    try:
        deadline = time.monotonic() + 600
        while not lock.is_file() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert lock.is_file(), (logs / "err").read_text()[-4000:]
        second = subprocess.run([sys.executable, "-m", "jaxlake.run", *args], cwd=str(ROOT), env=env,
                                capture_output=True, text=True, timeout=600)
        first.wait(timeout=1800)
    finally:
        if first.poll() is None:
            first.kill()
    out = subprocess.CompletedProcess(first.args, first.returncode, (logs / "out").read_text(),
                                      (logs / "err").read_text())
    assert out.returncode == 0, out.stderr[-4000:]
    return runs / "full", out, args, (first.pid, second)


def test_a_second_command_is_refused_while_the_first_runs(full_run):
    run, out, _, (pid, second) = full_run
    assert second.returncode == 1 and second.stdout == ""
    # one line, naming the holder's PID and host, without Hydra's "Error executing job" traceback
    last = second.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: the run folder {run} is in use by process {pid} on host {socket.gethostname()}")
    assert last.endswith(f"wait for it to finish, or stop it first (kill {pid})")
    assert "Traceback" not in second.stderr and "Error executing job" not in second.stderr
    assert not (run / "run.lock").exists()  # the first released it when it ended
    # the first's files are its own: one row per step (test_full_pipeline_two_stages_policy_engineer),
    # its Hydra record is its command's
    assert yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text()) == full_run[2]


def micro_model_path(full_run) -> str:
    return next(a.split("=", 1)[1] for a in full_run[2] if a.startswith("+model.path="))


def test_full_pipeline_two_stages_policy_engineer(full_run):
    run, out, _, _ = full_run
    assert ("| stage | environment | suite greedy | suite sampled | greedy vs previous stage | own env (greedy) "
            "| engineer |") in out.stdout
    info = json.loads((run / "run.json").read_text())
    assert info["engineer"] == "policy" and info["stages"] == 2
    for k in (1, 2):
        d = run / f"stage_{k}"
        assert {"checkpoint", "metrics.jsonl", "eval.json", "summary.json", "summary.txt", "engineer.json",
                "next_env.yaml", "env.yaml", "train.json", "train_eval.json", "policy"} <= stage_files(d)
        for name in ("policy/config.json", "policy/model.safetensors"):
            assert (d / name).is_file(), name
        ev = json.loads((d / "eval.json").read_text())
        assert ev["format"] == "jaxlake.eval/1" and ev["suite"]["name"] == "tiny"
        assert set(ev["modes"]) == {"greedy", "sampled"} and 0.0 <= ev["score"] <= 1.0
        eng = json.loads((d / "engineer.json").read_text())
        assert eng["engineer"] == "policy" and eng["decision"] in ("proposed", "fallback")
        for key in ("prompt", "raw_output", "parsed", "validation_errors", "attempts", "choices"):
            assert key in eng
        assert "## Policy behaviour" in eng["prompt"]
    # one warm-start step in stage 1 only, two GRPO steps per stage, one row per step
    for k, ws in ((1, [("warmstart", 1)]), (2, [])):
        rows = (run / f"stage_{k}" / "metrics.jsonl").read_text().splitlines()
        assert [(json.loads(r)["phase"], json.loads(r)["step"]) for r in rows] == ws + [("grpo", 1), ("grpo", 2)]
    # stage 2 trained on what the engineer proposed after stage 1, starting from stage 1's policy
    assert yaml.safe_load((run / "stage_2" / "env.yaml").read_text()) == yaml.safe_load(
        (run / "stage_1" / "next_env.yaml").read_text())
    t2 = json.loads((run / "stage_2" / "train.json").read_text())
    assert t2["init_from"] == "../stage_1/policy" and t2["warmstart_steps"] == 0  # relative: the folder can move
    summary = json.loads((run / "stage_2" / "summary.json").read_text())
    assert [h["stage"] for h in summary["history"]] == [1, 2]
    assert summary["history"][0]["engineer"]["engineer"] == "policy"
    assert (run / "report.md").is_file() and (run / "score_per_stage.png").is_file()
    # the starting policy (the micro model of model.path) on the suite, once, before stage 1: row 0
    start = json.loads((run / "start_eval.json").read_text())
    assert start["format"] == "jaxlake.eval/1" and start["suite"]["name"] == "tiny" and start["stage"] == 0
    assert start["checkpoint"] == str(micro_model_path(full_run))
    # the table pairs each stage's greedy suite episodes with the stage before's (stage 1's with
    # the start's), lake by lake
    from jaxlake.stats import paired_difference

    files = [run / "start_eval.json"] + [run / f"stage_{k}" / "eval.json" for k in (1, 2)]
    greedy = [{(e["cell"], e["lake"]): e["success"] for e in json.loads(f.read_text())["episodes"]
               if e["mode"] == "greedy"} for f in files]
    rows = {line.split(" | ")[0]: line.split(" | ") for line in out.stdout.splitlines() if line.startswith("| ")}
    assert rows["| 0"][1] == f"start: {start['checkpoint']}" and rows["| 0"][2] == f"{start['modes']['greedy']['score']:.3f}"
    for k in (1, 2):
        d = paired_difference([greedy[k - 1][key] for key in sorted(greedy[0])],
                              [greedy[k][key] for key in sorted(greedy[0])])
        assert rows[f"| {k}"][4] == f"{d.diff:+.3f} ± {d.half_width:.3f} ({d.wins} won, {d.losses} lost)"


def test_finished_run_rerun_is_a_no_op(full_run, monkeypatch, capsys):
    """The same command again (in this process: the real command ran above, twice) finds both
    stages complete and rewrites nothing of them."""
    run, _, args, _ = full_run
    files = {p: os.stat(p).st_mtime_ns for p in run.rglob("*") if p.is_file() and p.parent.name.startswith("stage_")}
    assert run_cli(monkeypatch, args) is None
    again = capsys.readouterr()
    assert again.err.count("complete, skipped") == 2  # both stages
    assert "| stage | environment | suite greedy |" in again.out
    assert {p: os.stat(p).st_mtime_ns for p in files} == files  # nothing trained, evaluated or rewritten


def _last_line(err):
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "Error executing job" not in err, err[-4000:]
    return lines[-1]


def test_stage_by_stage_with_interruptions(monkeypatch, capsys, runs, micro_model):
    import jaxlake.pipeline.stages as pipeline
    import llm.training.stage as train
    from jaxlake.io import lock_record

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    args = overrides(runs, micro_model, "staged", "engineer=heuristic", *planner_prompt_overrides())  # the default prompt
    run = runs / "staged"
    # a bad value is refused before anything is written (the corrected command, below, runs in the
    # same folder); its one line is tests/jaxlake/pipeline/test_run_stage.py's, and the
    # HYDRA_FULL_ERROR=1 switch gives the exception with its traceback instead
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(pipeline.PipelineError, match=r"^env\.hole_density=1\.5 not in \[0\.0, 0\.9\]$"):
        run_cli(monkeypatch, args + ["+stage=1", "env.hole_density=1.5"])
    monkeypatch.delenv("HYDRA_FULL_ERROR")
    assert "Error executing job" in capsys.readouterr().err  # Hydra's own report, as before
    assert not (run / "run.json").exists() and not (run / ".hydra").exists()
    # the lock of a run that was killed (its process is gone) is taken over with a message
    dead = subprocess.Popen(["true"])
    dead.wait()
    run.mkdir(parents=True, exist_ok=True)
    (run / "run.lock").write_text(json.dumps(lock_record(pid=dead.pid)))
    # stage 2 alone, before stage 1: a clear error naming the file and the command that makes it
    assert run_cli(monkeypatch, args + ["+stage=2"]) == 1
    err = capsys.readouterr().err
    assert f"took over the stale lock of {run}: process {dead.pid}" in err
    line = _last_line(err)
    assert f"{run / 'stage_1' / 'next_env.yaml'}" in line and "experiment=staged" in line
    assert not (run / "stage_2").exists() and not (run / "run.lock").exists()
    advice = shlex.split(line.split("Run stage 1 first: ", 1)[1])
    assert advice[:3] == ["python", "-m", "jaxlake.run"] and "+stage=1" in advice

    # the advice, killed after one GRPO step (the trainer stops early), then resumed by the same command
    real = train.train_stage
    monkeypatch.setattr(train, "train_stage", lambda *a, **kw: real(*a, max_steps={"grpo": 1}, **kw))
    assert run_cli(monkeypatch, advice[3:]) == 1
    assert "rerun the same command to resume" in _last_line(capsys.readouterr().err)
    assert not (run / "stage_1" / "train.json").exists()
    monkeypatch.setattr(train, "train_stage", real)
    assert run_cli(monkeypatch, advice[3:]) is None
    t1 = json.loads((run / "stage_1" / "train.json").read_text())
    assert t1["resumed"] and t1["grpo_steps"] == 2
    rows = [json.loads(line) for line in (run / "stage_1" / "metrics.jsonl").read_text().splitlines()]
    grpo_steps = [r["step"] for r in rows if r.get("phase") == "grpo"]
    assert grpo_steps == sorted(set(grpo_steps)) and len(grpo_steps) == 2
    assert (run / "stage_1" / "next_env.yaml").is_file() and not (run / "stage_2").exists()

    # the run folder, copied: the copy goes on from its own files (the original's policy is gone)
    copy = runs / "staged_copy"
    shutil.copytree(run, copy)
    for name in ("policy", "checkpoint", "warmstart"):
        shutil.rmtree(run / "stage_1" / name)
    args = overrides(runs, micro_model, "staged_copy", "engineer=heuristic", *planner_prompt_overrides())
    run = copy

    # stage 2, killed between evaluation and summary, then the same command resumes it
    real_summary = pipeline.step_summary

    def killed(cfg, k, *a, **kw):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(pipeline, "step_summary", killed)
    with pytest.raises(KeyboardInterrupt):
        run_cli(monkeypatch, args + ["+stage=2"])
    assert not (run / "run.lock").exists()  # released on the way out
    d2 = run / "stage_2"
    assert {"eval.json", "train.json"} <= stage_files(d2) and "summary.json" not in stage_files(d2)
    t2 = json.loads((d2 / "train.json").read_text())
    assert (d2 / t2["init_from"]).resolve() == (copy / "stage_1" / "policy").resolve()
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
    # a finished run folder that cannot be written: one line naming it (nothing is half done)
    with unwritable(run):
        assert run_cli(monkeypatch, args) == 1
        assert _last_line(capsys.readouterr().err).startswith(f"error: cannot write in the run folder {run} (")


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
