"""``pipeline.warmstart_env``: what a stage's supervised warm start trains on, while its GRPO stays on
the engineer's mixture. ``suite`` is the held-out suite's cells (jaxlake.suite.cells_mixture)."""

import json

import pytest
from tests.support import run_cli, tiny_run_overrides

from jaxlake.config import LakeConfig
from jaxlake.suite import SuiteError, SuiteSpec, build_suite, cells_mixture, load_eval_conf


def test_cells_mixture_is_the_suites_valid_cells_at_equal_weights():
    spec = SuiteSpec.from_conf(load_eval_conf("small"))
    mix = cells_mixture(spec)
    assert len(mix) == 16 and {w for w, _ in mix} == {1 / 16}
    suite = build_suite(spec, solve=False)
    assert [c for _, c in mix] == [c["config"] for c in suite.cells]
    assert {(c.height, c.num_agents, c.hole_density, c.conflict_density) for _, c in mix} == {
        (s, n, h, k) for s in (4, 6) for n in (1, 2) for h in (0.0, 0.2) for k in (0.0, 1.0)}


def test_cells_mixture_leaves_out_the_invalid_cells_as_the_suite_does():
    conf = load_eval_conf("tiny")
    conf["grid"] = {"size": [1, 3], "num_agents": [1]}  # a 1x1 lake holds no start and goal apart
    spec = SuiteSpec.from_conf(conf)
    suite = build_suite(spec, solve=False)
    assert len(suite.skipped) == 1
    assert [c for _, c in cells_mixture(spec)] == [c["config"] for c in suite.cells]
    conf["grid"] = {"size": [1]}
    with pytest.raises(SuiteError, match="no valid cell"):
        cells_mixture(SuiteSpec.from_conf(conf))


@pytest.mark.slow
def test_a_stage_warm_starts_on_the_suite_cells_and_runs_grpo_on_its_own(monkeypatch, tmp_path, micro_model):
    import llm.training.stage as stage

    seen = {}
    real_ws, real_grpo = stage.run_warmstart, stage.run_grpo

    def warmstart(policy, config, env, *a, **kw):
        seen["warmstart"] = env
        return real_ws(policy, config, env, *a, **kw)

    def grpo(policy, state, config, env, *a, **kw):
        seen["grpo"] = env
        return real_grpo(policy, state, config, env, *a, **kw)

    monkeypatch.setattr(stage, "run_warmstart", warmstart)
    monkeypatch.setattr(stage, "run_grpo", grpo)
    assert run_cli(monkeypatch, [f"runs_dir={tmp_path}", "experiment=ws_suite", "stages=1",
                                 *tiny_run_overrides(micro_model), "pipeline.warmstart_env=suite"]) is None
    spec = SuiteSpec.from_conf(load_eval_conf("tiny"))
    assert seen["warmstart"] == cells_mixture(spec)
    stage_env = seen["grpo"]
    assert len(stage_env) == 1 and stage_env[0][1] == LakeConfig.from_dict(load_env("tiny"))
    run = json.loads((tmp_path / "ws_suite" / "run.json").read_text())
    assert run["settings"]["pipeline.warmstart_env"] == "suite"


def load_env(name):
    from omegaconf import OmegaConf

    from jaxlake.conf import CONF_DIR

    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / "env" / f"{name}.yaml"))


def test_suite_is_an_allowed_warmstart_env_and_a_wrong_one_is_named(tmp_path):
    from jaxlake.pipeline.settings import WARMSTART_ENVS, PipelineError, RunSettings

    assert "suite" in WARMSTART_ENVS
    with pytest.raises(PipelineError, match="pipeline.warmstart_env='suites'"):
        RunSettings.from_cfg({"experiment": "x", "runs_dir": str(tmp_path), "pipeline": {"warmstart_env": "suites"}})
    with pytest.raises(PipelineError, match="warmstart_env=suite needs a held-out suite"):
        RunSettings.from_cfg({"experiment": "x", "runs_dir": str(tmp_path), "pipeline": {"warmstart_env": "suite"}})
