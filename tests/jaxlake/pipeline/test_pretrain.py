"""The tiny planner's pretraining (``python -m jaxlake.pretrain``, jaxlake/pipeline/pretrain.py) and
the pretrained planner the package ships (llm/game/planner), the default starting point.

* the shipped folder loads, is what a run without ``model.path`` starts from, and scores on
  the held-out suite what its record says (greedy decoding is deterministic);
* ``model.pretrained=false`` starts from fresh weights instead;
* (slow) the command, end to end with a one-layer model and a few steps: the warm start on
  every config of the engineer's space, the suite curve, the record, shipping to a folder,
  and a rerun that re-reads the finished folder;
* its settings are checked before anything runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxlake.io import read_json

ROOT = Path(__file__).resolve().parents[3]
#: A one-layer model of the tiny planner's vocabulary (fresh weights: model.pretrained=false).
MICRO = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1",
         "model.num_attention_heads=2", "model.num_key_value_heads=1", "model.head_dim=16"]


def _leaves(policy):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(policy.state)]


def test_the_default_starts_from_the_shipped_planner_at_its_recorded_level(tmp_path):
    """The shipped folder is what a run without model.path loads, and ``python -m
    llm.evaluate llm/game/planner`` (no --prompt: the run config's prompt, the one its record
    says it was trained on, recorded in eval.json) scores on the record's suite, greedy, what
    the record says (greedy decoding is deterministic)."""
    from omegaconf import OmegaConf

    from jaxlake.pipeline.pretrain import _greedy_only
    from jaxlake.suite import load_eval_conf
    from llm.game.default import PLANNER_DIR, planner_dir
    from llm.game.prompts import PromptConfig, default_prompt_name, load_prompt_config
    from llm.model.hf_io import from_pretrained
    from llm.training.config import ModelConfig
    from llm.training.evaluate import main
    from llm.training.policy import Policy, load_policy

    assert planner_dir() == str(PLANNER_DIR), "the package ships no pretrained planner (llm/game/planner)"
    record = read_json(PLANNER_DIR / "pretrain.json")
    assert record["format"] == "jaxlake.pretrain/1" and record["command"].startswith("python -m jaxlake.pretrain")
    assert record.get("total_steps", record["steps"]) >= 1000 and record["space_configs"] >= 1000
    policy = load_policy(ModelConfig())  # no model.path: the shipped planner
    module, _ = from_pretrained(PLANNER_DIR)
    for a, b in zip(_leaves(policy), _leaves(Policy.from_model(module, policy.tokenizer))):
        np.testing.assert_array_equal(a, b)
    fresh = load_policy(ModelConfig(pretrained=False))  # from scratch: the embedded default's fresh weights
    assert any(a.shape == b.shape and not np.array_equal(a, b) for a, b in zip(_leaves(fresh), _leaves(policy)))

    prompt = load_prompt_config(default_prompt_name())
    assert prompt == PromptConfig.from_dict(record["settings"]["prompt"])
    suite = tmp_path / "suite.yaml"
    OmegaConf.save(OmegaConf.create(_greedy_only(load_eval_conf(record["suite"]))), suite)
    out = tmp_path / "eval.json"
    assert main([str(PLANNER_DIR), "--eval", str(suite), "--out", str(out)]) == 0
    result = read_json(out)
    assert PromptConfig.from_dict(result["settings"]["prompt"]) == prompt
    n = result["modes"]["greedy"]["n"]
    assert n == record["curve"][-1]["n"]
    assert abs(result["score"] - record["success"]) <= 1.0 / n + 1e-9, (result["score"], record["success"])


def test_a_continuation_of_the_shipped_planner_records_it():
    """model.pretrained=true without model.path continues the shipped planner: its record is
    the new one's started_from; a run from scratch or from a folder has none."""
    from types import SimpleNamespace

    from jaxlake.pipeline.pretrain import started_from
    from llm.game.default import PLANNER_DIR
    from llm.training.config import ModelConfig

    shipped = read_json(PLANNER_DIR / "pretrain.json")
    assert started_from(SimpleNamespace(model=ModelConfig(pretrained=True))) == shipped
    assert started_from(SimpleNamespace(model=ModelConfig(pretrained=False))) is None
    assert started_from(SimpleNamespace(model=ModelConfig(path=str(PLANNER_DIR)))) is None


def test_a_run_from_the_shipped_planner_with_another_prompt_is_warned():
    """The shipped planner reads the prompt it was trained on (its pretrain.json records it);
    a run that starts from it with another prompt gets one line naming the fields that differ,
    and a run from scratch or with the planner's own prompt gets none."""
    from types import SimpleNamespace

    from jaxlake.pipeline.folder import planner_prompt_warning
    from llm.game.default import PLANNER_DIR
    from llm.game.prompts import PromptConfig, load_prompt_config
    from llm.training.config import ModelConfig

    trained = PromptConfig.from_dict(read_json(PLANNER_DIR / "pretrain.json")["settings"]["prompt"])
    run = lambda prompt, **model: SimpleNamespace(model=ModelConfig(**model), prompt=prompt)  # noqa: E731
    assert planner_prompt_warning(run(trained)) is None
    other = load_prompt_config("default")
    assert planner_prompt_warning(run(other, pretrained=False)) is None
    line = planner_prompt_warning(run(other))
    assert line.startswith("the shipped planner was trained on another prompt") and "prompt.user" in line
    assert "\n" not in line and "prompt.chat_template_kwargs" in line


def test_a_run_from_the_shipped_planner_records_which_planner():
    """run.json's settings name the shipped planner by its weights' hash, so a folder started
    from one planner is refused (settings differ) after the package ships another; a run from
    a folder or from scratch records none."""
    import hashlib

    from jaxlake.pipeline.settings import _run_settings
    from llm.game.default import PLANNER_DIR, planner_fingerprint

    want = hashlib.sha256((PLANNER_DIR / "model.safetensors").read_bytes()).hexdigest()[:16]
    assert planner_fingerprint() == want
    assert _run_settings({"model": {"pretrained": True}}, "first")["model.planner"] == want
    assert "model.planner" not in _run_settings({"model": {"pretrained": False}}, "first")
    assert "model.planner" not in _run_settings({"model": {"pretrained": True, "path": "/x"}}, "first")


def test_pretrain_settings_are_checked():
    from jaxlake.pipeline.pretrain import PretrainSettings
    from jaxlake.pipeline.settings import PipelineError

    assert PretrainSettings.from_node({"ship": True, "ship_to": "x"}).ship_to == Path("x")
    with pytest.raises(PipelineError, match=r"unknown pretrain field\(s\) \['shipp'\]"):
        PretrainSettings.from_node({"shipp": True})
    with pytest.raises(PipelineError, match="pretrain.curve='yes' must be true or false"):
        PretrainSettings.from_node({"curve": "yes"})


def _pretrain(tmp_path, *extra, timeout=900):
    import os

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    args = [f"runs_dir={tmp_path}", "experiment=p", "eval=tiny", *MICRO, "train.warmstart.steps=4",
            "train.warmstart.batch_size=8", "train.warmstart.checkpoint_every=2", "train.warmstart.log_every=2",
            "train.warmstart.pack_rows=4",  # conf/pretrain.yaml packs (16 rows of a batch of 32): the same code path
            "train.progress=false", "train.plot=false",
            "prompt.reasoning.thinking_tokens=8",  # the planner prompt thinks first: a short budget
            *extra]
    return subprocess.run([sys.executable, "-m", "jaxlake.pretrain", *args], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_bad_pretrain_setting_is_one_line(tmp_path):
    proc = _pretrain(tmp_path, "train.grpo.enabled=true", timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: pretraining is the supervised warm start alone: set train.grpo.enabled=false")
    assert not list((tmp_path / "p").rglob("*")) if (tmp_path / "p").exists() else True  # nothing written


@pytest.mark.slow
def test_pretrain_command_trains_scores_ships_and_resumes(tmp_path):
    from jaxlake.mixture import load_mixture
    from llm.training.config import ModelConfig
    from llm.training.policy import load_policy

    shipped = tmp_path / "shipped"
    proc = _pretrain(tmp_path, "pretrain.ship=true", f"pretrain.ship_to={shipped}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = tmp_path / "p"
    space = load_mixture(d / "space.yaml")
    assert len(space) == 3750  # every valid config of the policy engineer's space around env=tiny
    assert {c.num_agents for c in space.configs} == {1, 2, 3, 4} and {c.height for c in space.configs} == set(range(2, 9))
    rows = [r for r in map(__import__("json").loads, (d / "stage" / "metrics.jsonl").read_text().splitlines())]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["phase"] == "warmstart" for r in rows)
    curve = read_json(d / "curve.json")
    assert [p["step"] for p in curve] == [2, 4]
    assert 0 < curve[0]["train_minutes"] < curve[1]["train_minutes"]
    assert all(0.0 <= p["success"] <= 1.0 and p["n"] == 16 for p in curve)
    record = read_json(d / "pretrain.json")
    assert record["steps"] == 4 and record["space_configs"] == 3750 and record["curve"] == curve
    assert record["success"] == curve[-1]["success"] and "pretrain.ship=true" in record["command"]
    # shipped: the Hugging Face folder and the record, loadable as any model.path
    assert read_json(shipped / "pretrain.json") == record
    a = load_policy(ModelConfig(path=str(shipped)))
    b = load_policy(ModelConfig(path=str(d / "stage" / "policy")))
    for x, y in zip(_leaves(a), _leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert not list(tmp_path.glob(".shipped.ship-*"))  # no staging folder left behind
    # the same command again: the finished folder is re-read, nothing retrained
    again = _pretrain(tmp_path, "pretrain.ship=true", f"pretrain.ship_to={shipped}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_json(d / "curve.json") == curve
    assert len((d / "stage" / "metrics.jsonl").read_text().splitlines()) == 4
