"""The pipeline's typed settings (jaxlake.pipeline.settings.RunSettings): resolved once from the
Hydra config, typed pieces, per-stage trainer settings, errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from jaxlake.conf import CONF_DIR
from jaxlake.mixture import Mixture, mixture_from_node
from jaxlake.pipeline.settings import EvalSettings, PipelineError, RunSettings
from jaxlake.suite import SuiteSpec


def _cfg(*overrides):
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        return compose("config", overrides=list(overrides))


def test_settings_are_typed_pieces_of_the_config(tmp_path):
    from llm.game.prompts import PromptConfig
    from llm.training.config import ModelConfig, StageConfig

    cfg = _cfg(f"runs_dir={tmp_path}", "experiment=x", "seed=2", "stages=4", "eval=tiny", "engineer=policy", "+stage=3")
    s = RunSettings.from_cfg(cfg)
    assert (s.experiment, s.runs_dir, s.run_dir, s.stages, s.stage, s.seed) == ("x", tmp_path, tmp_path / "x", 4, 3, 2)
    assert isinstance(s.env, Mixture) and s.env == mixture_from_node(cfg.env)
    assert isinstance(s.eval, EvalSettings) and s.eval.suite == SuiteSpec.from_conf(cfg.eval) and s.eval.name == "tiny"
    assert (s.eval.k_failures, s.eval.env_stats_lakes, s.eval.summary_mode) == (4, 8, "greedy")
    assert isinstance(s.train, StageConfig) and s.train == StageConfig.from_cfg(cfg)
    assert isinstance(s.prompt, PromptConfig) and isinstance(s.model, ModelConfig)
    assert s.engineer["_target_"].startswith("llm.") and s.share_stages is None and s.archive is None and s.warmstart == "first"
    assert s.stage_dir(2) == tmp_path / "x" / "stage_2"
    assert s.command_for_stage(1) == "python -m jaxlake.run +stage=1 experiment=x"
    assert RunSettings.of(s) is s
    with pytest.raises(Exception):
        s.seed = 3  # frozen


def test_stage_config_seeds_each_stage_and_drops_the_later_warm_starts():
    s = RunSettings.from_cfg(_cfg("seed=1", "train.seed=5"))
    first, second = s.stage_config(1), s.stage_config(2)
    assert first.train.seed == 5 + 7919 and second.train.seed == 5 + 7919 + 1
    assert first.train.warmstart.enabled and not second.train.warmstart.enabled
    assert second.record["seed"] == second.train.seed and second.record["warmstart"]["enabled"] is False
    assert s.train.train.seed == 5  # the run's record is unchanged
    keep = RunSettings.from_cfg(_cfg("pipeline.warmstart=all"))
    assert keep.stage_config(3).train.warmstart.enabled


def test_run_json_settings_are_the_plain_groups():
    cfg = _cfg()
    s = RunSettings.from_cfg(cfg)
    rec = s.record()
    # model.novice: the default starts from the shipped novice, named by its weights' hash
    assert set(rec) == {"env", "model", "train", "reward", "prompt", "eval", "pipeline.warmstart", "model.novice"}
    assert "progress" not in rec["train"] and rec["pipeline.warmstart"] == "first"
    rec["train"]["grpo"]["steps"] = -1
    assert s.record()["train"]["grpo"]["steps"] == 30  # a fresh copy each time


@pytest.mark.parametrize("override, message", [
    ("stages=0", "stages=0 must be an integer in [1, inf)"),
    ("seed=x", "seed='x' must be an integer"),
    ("pipeline.warmstart=some", "pipeline.warmstart='some' not in ['first', 'all']"),
    ("eval.summary.k_failures=-1", "eval.summary.k_failures=-1 must be an integer in [0, inf)"),
    ("train.grpo.group_size=1", "train.grpo.group_size=1 must be an integer >= 2"),
    ("env=tiny +env.colour=1", "env: unknown LakeConfig field(s) ['colour']"),
    ("env=tiny env.hole_density=1.5", "env.hole_density=1.5 not in [0.0, 0.9]"),
    # read only by the evaluation after training: checked before anything is written
    ("eval.batch_size=0", "eval.batch_size=0 must be an integer in [1, inf)"),
    ("eval=small eval.sampled.top_p=0", "eval.sampled.top_p=0 must be a number in (0, 1]"),
    ("eval.lakes_per_cell=0", "eval.lakes_per_cell=0 must be an integer"),
    ("logger=[tensorbord]", "logger: unknown back end 'tensorbord'"),
])
def test_errors_name_the_field(override, message):
    with pytest.raises((ValueError, PipelineError)) as err:  # the layers' own errors, or the pipeline's
        RunSettings.from_cfg(_cfg(*override.split()))
    assert message in str(err.value)


def test_missing_groups_fail_where_they_are_needed(tmp_path):
    from jaxlake.pipeline import stages

    s = RunSettings.from_cfg({"runs_dir": str(tmp_path), "experiment": "x", "stages": 1})
    assert s.env is None and s.eval is None and s.engineer is None and s.run_dir == Path(tmp_path) / "x"
    with pytest.raises(PipelineError, match="the config has no `env`"):
        stages.initial_mixture(s, None)


def test_the_engineer_reads_the_prompt_from_the_settings():
    from jaxlake.engineers import EngineerContext
    from llm.engineer.local import run_reasons

    def ctx(s):
        return EngineerContext(stage=1, current=s.env, initial=s.env, eval_result={}, summary={}, history=[],
                               state={}, seed=0, stage_dir=Path("."), checkpoint=Path("."), run_cfg=s)

    assert not run_reasons(ctx(RunSettings.from_cfg(_cfg("prompt=compact"))))
    assert run_reasons(ctx(RunSettings.from_cfg(_cfg("prompt=reasoning"))))
    # the planner thinks in templated path traces: no analysis of its own to write
    assert not run_reasons(ctx(RunSettings.from_cfg(_cfg("prompt=planner"))))
    assert run_reasons(ctx(RunSettings.from_cfg(_cfg("prompt=planner", "prompt.reasoning.warmstart=false"))))
