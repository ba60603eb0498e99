"""``python -m jaxlake.run +recipe=screened`` (conf/recipe/screened.yaml): the stage recipe that raised
the shipped planner on the `large` suite -- greedy screening of GRPO's lakes, the supervised anchor
on every config the engineer may choose, three times the default step and steps. Its settings,
and one real stage of it on the micro model with the lake counts shrunk on the command line."""

import json

import pytest
from tests.support import run_cli, tiny_run_overrides

from jaxlake.conf import CONF_DIR

pytestmark = pytest.mark.slow


def test_the_recipe_composes_into_its_settings():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from llm.training.config import TrainConfig

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=["+recipe=screened"])
    assert cfg.experiment == "screened" and cfg.eval.name == "large" and cfg.pipeline.warmstart_env == "space"
    assert cfg.engineer.name == "policy" and cfg.model.pretrained  # the default run's engineer and start
    train = TrainConfig.from_dict(OmegaConf.to_container(cfg.train, resolve=True), OmegaConf.to_container(cfg.reward),
                                  OmegaConf.to_container(cfg.prompt))
    g = train.grpo
    assert g.screen.lakes == 64 and g.anchor.weight == 1.0 and g.optim.lr == 3e-4 and g.steps == 90
    assert (train.warmstart.blocked_share, train.warmstart.mark_weight) == (0.75, 3.0)
    assert g.dynamic_sampling.enabled and g.lakes_per_step == 8 and not g.guidance.enabled  # as measured


def test_one_screened_stage_runs_and_logs_its_screen(monkeypatch, tmp_path, micro_model):
    shrink = ["stages=1", "train.grpo.screen.lakes=4", "train.grpo.anchor.lakes=2", "train.grpo.anchor.screen_lakes=4"]
    assert run_cli(monkeypatch, [f"runs_dir={tmp_path}", "+recipe=screened", *tiny_run_overrides(micro_model),
                                 *shrink]) is None
    run = tmp_path / "screened"
    settings = json.loads((run / "run.json").read_text())["settings"]["train"]["grpo"]
    assert settings["screen"] == {"lakes": 4} and settings["anchor"]["weight"] == 1.0
    rows = [json.loads(line) for line in (run / "stage_1" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    grpo_rows = [r for r in rows if r.get("phase") == "grpo"]
    assert [r["step"] for r in grpo_rows] == [1, 2]
    for r in grpo_rows:
        # a random micro model fails every lake: the screen's lakes are all greedy failures
        assert r["screen_failed_share"] == 1.0 and r["screen_kept_failed"] == 2 and r["time/screen_s"] > 0
        assert r["anchor_screen_failed_share"] == 1.0 and r["anchor_screen_kept_failed"] == 2
        assert r["anchor_nll"] > 0 and r["lr"] > 0
    assert (run / "stage_1" / "policy" / "config.json").is_file()
