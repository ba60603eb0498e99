"""A run folder resumes only under the settings that made it: changing what a run computes
(model, training, reward, prompt, suite, initial environment, warm-start policy) names the
changed keys; cosmetic switches and a longer run (more stages) are fine."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from jaxlake.conf import CONF_DIR

from jaxlake.engineers import build_engineer
from jaxlake.io import read_json
from jaxlake.pipeline.folder import write_run_info
from jaxlake.pipeline.settings import PipelineError

ROOT = Path(__file__).resolve().parents[3]


def _write(tmp_path, *overrides):
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=[f"runs_dir={tmp_path}", "experiment=x", "engineer=fixed", "env=tiny", *overrides])
    write_run_info(cfg, build_engineer(cfg.engineer))
    return read_json(tmp_path / "x" / "run.json")


def test_same_or_cosmetic_settings_resume(tmp_path):
    info = _write(tmp_path)
    assert info["settings"]["train"]["grpo"]["steps"] == 30 and "progress" not in info["settings"]["train"]
    _write(tmp_path)
    _write(tmp_path, "train.progress=false", "train.plot=false", "stages=5")


@pytest.mark.parametrize("override, key", [
    ("train.grpo.steps=31", "train.grpo.steps: 30 -> 31"),
    ("+model.path=/ckpt/Qwen3-4B", "model.path: None -> '/ckpt/Qwen3-4B'"),
    ("eval=tiny", "eval.base.max_agents: 4 -> 2"),
    ("env.hole_density=0.2", "env.hole_density: 0.1 -> 0.2"),
    ("pipeline.warmstart=all", "pipeline.warmstart: 'first' -> 'all'"),
])
def test_changed_settings_are_refused_with_the_keys(tmp_path, override, key):
    _write(tmp_path)
    with pytest.raises(PipelineError, match="other settings") as err:
        _write(tmp_path, override)
    assert key in str(err.value) and "experiment=<name>" in str(err.value)


def test_settings_of_a_switched_off_block_do_not_refuse_a_resume(tmp_path):
    """Self-play off: its other settings never ran, so a folder resumes whatever they are; once
    it is on they count (train.engineer_selfplay, jaxlake.pipeline.folder.SWITCHED)."""
    _write(tmp_path, "train.engineer_selfplay.every=4")
    _write(tmp_path, "train.engineer_selfplay.every=3")
    with pytest.raises(PipelineError, match="train.engineer_selfplay.enabled: False -> True"):
        _write(tmp_path, "train.engineer_selfplay.enabled=true")


def test_old_run_folders_without_settings_still_resume(tmp_path):
    info = _write(tmp_path)
    del info["settings"]
    (tmp_path / "x" / "run.json").write_text(__import__("json").dumps(info))
    assert _write(tmp_path, "train.grpo.steps=31")["settings"]["train"]["grpo"]["steps"] == 31


def test_a_moved_folder_s_old_absolute_paths_point_into_it(tmp_path):
    """Run folders of earlier versions recorded absolute paths (train.json); moved or copied, the
    folder resolves them into itself, and the next run.json rewrites them there."""
    import json

    from jaxlake.pipeline.folder import stage_path
    from jaxlake.pipeline.settings import RunSettings
    from jaxlake.pipeline.stages import previous_policy

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=[f"runs_dir={tmp_path}", "experiment=x", "engineer=fixed"])
    s, engineer = RunSettings.from_cfg(cfg), build_engineer(cfg.engineer)
    old = tmp_path / "gone" / "x"  # where the run was made; it no longer exists
    write_run_info(s, engineer)
    info = read_json(tmp_path / "x" / "run.json")
    (tmp_path / "x" / "run.json").write_text(json.dumps({**info, "run_dir": str(old)}))
    d1 = tmp_path / "x" / "stage_1"
    (d1 / "policy").mkdir(parents=True)
    record = {"checkpoint_dir": f"{old}/stage_1/checkpoint", "policy_dir": f"{old}/stage_1/policy",
              "elsewhere": f"{old}_b/stage_1"}
    (d1 / "train.json").write_text(json.dumps(record))
    assert previous_policy(s, 2) == d1 / "policy"
    assert stage_path(s, d1, "policy") == d1 / "policy"  # what the pipeline writes now: relative
    write_run_info(s, engineer)
    moved = read_json(d1 / "train.json")
    here = (tmp_path / "x").resolve()
    assert moved == {"checkpoint_dir": f"{here}/stage_1/checkpoint", "policy_dir": f"{here}/stage_1/policy",
                     "elsewhere": f"{old}_b/stage_1"}  # only paths inside the old folder move
    assert read_json(tmp_path / "x" / "run.json")["run_dir"] == str(here)


def _drop(tree: dict, dotted: str) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        tree = tree[key]
    del tree[last]


def test_a_folder_older_than_a_setting_resumes_at_its_default(tmp_path):
    """A run folder made before a setting existed lacks it in run.json; the run resumes when the
    setting sits at its typed default (the behaviour the folder ran with), and is refused, naming
    the setting, when it does not."""
    import json

    info = _write(tmp_path)
    for dotted in ("train.grpo.loss.negative_weight", "train.grpo.screen", "train.warmstart.pack_rows"):
        _drop(info["settings"], dotted)
    (tmp_path / "x" / "run.json").write_text(json.dumps(info))
    _write(tmp_path)  # the folder's run.json is rewritten with every setting
    (tmp_path / "x" / "run.json").write_text(json.dumps(info))
    with pytest.raises(PipelineError, match="other settings") as err:
        _write(tmp_path, "train.grpo.screen.lakes=64")
    assert "train.grpo.screen: None -> {'lakes': 64}" in str(err.value)
    with pytest.raises(PipelineError, match=r"train.grpo.loss.negative_weight: None -> 0\.5"):
        _write(tmp_path, "train.grpo.loss.negative_weight=0.5")
