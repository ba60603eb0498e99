"""Metric writers (jaxlake/metrics.py): JSONL, TensorBoard and W&B back ends with the same keys,
their resume semantics, the logger config and the pipeline's per-stage rows. TensorBoard event
files are read back with TensorBoard's own EventAccumulator. The tiny real training run whose
event files must equal its ``metrics.jsonl`` (after a kill and resume) is
tests/llm/training/test_train.py::test_end_to_end_stage_and_kill_resume."""

import math
import sys

import pytest

from jaxlake.config import ConfigError
from jaxlake.metrics import (
    JsonlWriter,
    LoggerConfig,
    MissingBackendError,
    TensorBoardWriter,
    WandbWriter,
    build_writer,
    flatten,
    read_tensorboard_scalars,
    row_scalars,
)

ROW = {"phase": "grpo", "step": 3, "reward": 0.25, "ok": True, "count": 7, "eval": {"success": 0.5, "n": 4},
       "examples": [{"completion": "A: R"}], "note": "kept", "nan": float("nan"), "none": None}


def assert_same(tb, js):
    """TensorBoard scalars equal JSONL ones: the same tags, each step once, the same values."""
    assert set(tb) == set(js)
    for tag in js:
        assert [s for s, _ in tb[tag]] == [s for s, _ in js[tag]], tag  # each step once, in order
        for (_, a), (_, b) in zip(tb[tag], js[tag]):
            assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6), (tag, a, b)  # event files hold float32


def test_flatten_keys():
    assert flatten(ROW) == {"grpo/reward": 0.25, "grpo/ok": 1.0, "grpo/count": 7.0, "grpo/eval/success": 0.5,
                            "grpo/eval/n": 4.0, "grpo/note": "kept"}


def test_logger_config_validation_names_the_field():
    assert LoggerConfig.from_cfg({}).backends == ("jsonl",)
    cfg = LoggerConfig.from_cfg({"logger": ["jsonl", "tensorboard"], "wandb": {"project": "p", "mode": "disabled"}})
    assert cfg.backends == ("jsonl", "tensorboard") and cfg.wandb_project == "p" and cfg.wandb_mode == "disabled"
    assert LoggerConfig.from_cfg({"logger": "wandb"}).backends == ("wandb",)
    with pytest.raises(ConfigError, match=r"logger: unknown back end 'tb'.*'jsonl', 'tensorboard', 'wandb'"):
        LoggerConfig.from_cfg({"logger": ["tb"]})
    with pytest.raises(ConfigError, match="at least one"):
        LoggerConfig.from_cfg({"logger": []})
    with pytest.raises(ConfigError, match="twice"):
        LoggerConfig.from_cfg({"logger": ["jsonl", "jsonl"]})
    with pytest.raises(ConfigError, match=r"wandb.mode='cloud'"):
        LoggerConfig.from_cfg({"wandb": {"mode": "cloud"}})
    with pytest.raises(ConfigError, match=r"unknown wandb field\(s\) \['projet'\]; allowed: \['entity', 'group', 'mode', 'project', 'tags'\]"):
        LoggerConfig.from_cfg({"wandb": {"projet": "x"}})


def test_missing_library_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails as if not installed
    with pytest.raises(MissingBackendError, match=r"pip install 'jaxlake\[tensorboard\]'"):
        TensorBoardWriter(tmp_path)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingBackendError, match=r"pip install 'jaxlake\[wandb\]'"):
        build_writer(LoggerConfig(backends=("jsonl", "wandb")), tmp_path)


def test_pipeline_rejects_a_bad_logger_before_any_work(tmp_path):
    from jaxlake.pipeline.stages import run_stage

    with pytest.raises(ConfigError, match="logger: unknown back end 'tensorbord'"):
        run_stage({"runs_dir": str(tmp_path), "experiment": "x", "stages": 1, "logger": ["tensorbord"]}, 1)
    assert not (tmp_path / "x").exists()


def test_rows_need_phase_and_step(tmp_path):
    with pytest.raises(ValueError, match="'phase' and 'step'"):
        JsonlWriter(tmp_path / "m.jsonl").append({"reward": 1.0})


def test_tensorboard_resume_purges_what_jsonl_drops(tmp_path):
    """A run killed after step 4 with its last checkpoint at 2 logs steps 3 and 4 again: JSONL
    drops the old rows, TensorBoard's event files lose the old summaries (scalars and text);
    both then agree."""
    pytest.importorskip("tensorboardX")
    cfg = LoggerConfig(backends=("jsonl", "tensorboard"))
    with build_writer(cfg, tmp_path, phases=("warmstart", "grpo")) as w:
        w.truncate("warmstart", 0)
        w.append({"phase": "warmstart", "step": 1, "nll": 2.0})
        w.truncate("grpo", 0)
        for k in range(1, 5):
            w.append({"phase": "grpo", "step": k, "reward": 0.1 * k, "eval": {"success": 0.0}, "note": "first"})
    with build_writer(cfg, tmp_path, phases=("warmstart", "grpo")) as w:
        w.truncate("warmstart", 1, drop_later=False)
        w.truncate("grpo", 2)
        for k in (3, 4):
            w.append({"phase": "grpo", "step": k, "reward": 1.0 * k, "eval": {"success": 1.0}, "note": "again"})
        rows = w.rows()
    assert [(r["phase"], r["step"]) for r in rows] == [("warmstart", 1)] + [("grpo", k) for k in range(1, 5)]
    tb = read_tensorboard_scalars(tmp_path / "tb" / "grpo")
    assert tb["grpo/reward"] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (3, 3.0), (4, 4.0)]
    assert_same(tb, row_scalars(rows, "grpo"))
    assert_same(read_tensorboard_scalars(tmp_path / "tb" / "warmstart"), row_scalars(rows, "warmstart"))
    # text too, for the legacy EventAccumulator (it purges a restart's scalars but no tensors)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb" / "grpo"))
    acc.Reload()
    text = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors("grpo/note/text_summary")]
    assert text == [(1, "first"), (2, "first"), (3, "again"), (4, "again")]
    assert not [f for f in (tmp_path / "tb" / "grpo").iterdir() if "purge" in f.name]  # no temporary file left


def test_wandb_offline_run_folder(tmp_path, monkeypatch):
    """W&B in offline mode writes a run folder under ``<folder>/wandb/`` with no network; the run
    holds the flattened keys (its summary = the last row) and a resumed writer continues the
    same run id."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    rows = [{"phase": "grpo", "step": k, "reward": 0.5 * k, "eval": {"success": 0.25 * k}, "note": f"s{k}"}
            for k in (1, 2)]
    writer = WandbWriter(tmp_path / "stage_1", project="jaxlake-test", mode="offline", config={"seed": 3})
    for row in rows:
        writer.append(row)
    run = writer.run
    assert run.settings.mode == "offline" and run.id == writer.run_id
    summary = {k: run.summary[k] for k in flatten(rows[-1])}
    assert summary == flatten(rows[-1])
    assert run.summary["grpo/step"] == 2
    writer.close()
    folders = sorted((tmp_path / "stage_1" / "wandb").glob(f"offline-run-*-{writer.run_id}"))
    assert len(folders) == 1
    data = (folders[0] / f"run-{writer.run_id}.wandb").read_bytes()
    for key in ("grpo/step", "grpo/reward", "grpo/eval/success", "grpo/note"):
        assert key.encode() in data, key
    again = WandbWriter(tmp_path / "stage_1", project="jaxlake-test", mode="offline")
    assert again.run_id == writer.run_id  # the same folder continues the same run
    assert wandb.run is None  # the finished run was closed


def test_default_config_logs_jsonl_only():
    from hydra import compose, initialize_config_dir

    from jaxlake.conf import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["logger=[jsonl,tensorboard]", "wandb.mode=disabled"])
        default = compose(config_name="config")
    assert LoggerConfig.from_cfg(default).backends == ("jsonl",)
    assert LoggerConfig.from_cfg(default).wandb_group == "default"  # ${experiment}
    got = LoggerConfig.from_cfg(cfg)
    assert got.backends == ("jsonl", "tensorboard") and got.wandb_mode == "disabled"


def test_stage_rows_of_the_pipeline(tmp_path):
    """The pipeline's per-stage row (suite scores, own-environment scores, engineer decision)
    goes to ``stages.jsonl`` and ``tb/stage``; a stage logged again replaces its old row."""
    pytest.importorskip("tensorboardX")
    from jaxlake.pipeline.records import log_stage

    cfg = {"runs_dir": str(tmp_path), "experiment": "x", "logger": ["jsonl", "tensorboard"]}

    def record(k, score):
        return {"stage": k, "scores": {"greedy": score, "sampled": None}, "current_env": {"greedy": score / 2},
                "decision": "proposed", "reason": f"stage {k}"}

    log_stage(cfg, record(1, 0.5), {"changed": True, "wall_s": 1.5})
    log_stage(cfg, record(2, 0.25), {"changed": False, "wall_s": 2.0})
    log_stage(cfg, record(2, 0.75), {"changed": True, "wall_s": 2.5})  # stage 2 rerun
    rows = JsonlWriter(tmp_path / "x" / "stages.jsonl").rows()
    assert rows == [
        {"phase": "stage", "step": 1, "suite": {"greedy": 0.5}, "current_env": {"greedy": 0.25},
         "engineer": {"decision": "proposed", "reason": "stage 1", "changed": True, "wall_s": 1.5}},
        {"phase": "stage", "step": 2, "suite": {"greedy": 0.75}, "current_env": {"greedy": 0.375},
         "engineer": {"decision": "proposed", "reason": "stage 2", "changed": True, "wall_s": 2.5}},
    ]
    tb = read_tensorboard_scalars(tmp_path / "x" / "tb" / "stage")
    assert tb["stage/suite/greedy"] == [(1, 0.5), (2, 0.75)]
    assert_same(tb, row_scalars(rows, "stage"))
