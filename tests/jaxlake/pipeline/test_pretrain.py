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
from omegaconf import OmegaConf

from jaxlake.io import read_json

ROOT = Path(__file__).resolve().parents[3]
#: A one-layer model of the tiny planner's vocabulary (fresh weights: model.pretrained=false).
MICRO = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1",
         "model.num_attention_heads=2", "model.num_key_value_heads=1", "model.head_dim=16"]


def _leaves(policy):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(policy.state)]


def start_prompt(name):
    """The prompt ``start=<name>`` gives a run (conf/start/<name>.yaml with conf/config.yaml)."""
    from hydra import compose, initialize_config_dir

    from jaxlake.conf import CONF_DIR
    from llm.game.prompts import PromptConfig

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=[f"start={name}"])
    return PromptConfig.from_dict(OmegaConf.to_container(cfg.prompt, resolve=True))


@pytest.mark.parametrize("name", ["novice", "planner"])
def test_each_shipped_policy_loads_and_scores_its_recorded_level(tmp_path, name):
    """The shipped folder is what a run without model.path and with ``start=<name>`` loads (the
    novice by default), ``start=<name>`` prompts it as its record says it was trained, and
    ``python -m llm.evaluate llm/game/<name>`` (no --prompt: the prompt its pretrain.json
    records, kept in eval.json) scores on the record's suite, greedy, what the record says
    (greedy decoding is deterministic)."""
    from jaxlake.pipeline.pretrain import _greedy_only
    from jaxlake.suite import load_eval_conf
    from llm.game.default import DEFAULT_SHIPPED, SHIPPED_DIRS, shipped_dir
    from llm.game.prompts import PromptConfig, default_prompt_name, load_prompt_config
    from llm.model.hf_io import from_pretrained
    from llm.training.config import ModelConfig
    from llm.training.evaluate import main
    from llm.training.policy import Policy, load_policy

    folder = SHIPPED_DIRS[name]
    assert shipped_dir(name) == str(folder), f"the package ships no {name} (llm/game/{name})"
    record = read_json(folder / "pretrain.json")
    assert record["format"] == "jaxlake.pretrain/1" and record["command"].startswith("python -m jaxlake.pretrain")
    assert record.get("total_steps", record["steps"]) >= 1000 and record["space_configs"] >= 1000
    policy = load_policy(ModelConfig(shipped=name))  # no model.path: the shipped policy
    module, _ = from_pretrained(folder)
    for a, b in zip(_leaves(policy), _leaves(Policy.from_model(module, policy.tokenizer))):
        np.testing.assert_array_equal(a, b)
    if name == DEFAULT_SHIPPED:
        for a, b in zip(_leaves(load_policy(ModelConfig())), _leaves(policy)):
            np.testing.assert_array_equal(a, b)
        assert load_prompt_config(default_prompt_name()) == start_prompt(name)
    fresh = load_policy(ModelConfig(pretrained=False))  # from scratch: the embedded default's fresh weights
    assert any(a.shape == b.shape and not np.array_equal(a, b) for a, b in zip(_leaves(fresh), _leaves(policy)))

    prompt = start_prompt(name)
    assert prompt == PromptConfig.from_dict(record["settings"]["prompt"])
    suite = tmp_path / "suite.yaml"
    OmegaConf.save(OmegaConf.create(_greedy_only(load_eval_conf(record["suite"]))), suite)
    out = tmp_path / "eval.json"
    assert main([str(folder), "--eval", str(suite), "--out", str(out)]) == 0
    result = read_json(out)
    assert PromptConfig.from_dict(result["settings"]["prompt"]) == prompt
    n = result["modes"]["greedy"]["n"]
    assert n == record["curve"][-1]["n"]
    assert abs(result["score"] - record["success"]) <= 1.0 / n + 1e-9, (result["score"], record["success"])


def test_the_novice_leaves_room_to_learn_below_the_expert():
    """The default start is the weaker one: its recorded suite score is below the expert's by a
    wide margin (the stages have something to teach)."""
    from llm.game.default import SHIPPED_DIRS

    novice, expert = (read_json(SHIPPED_DIRS[n] / "pretrain.json")["success"] for n in ("novice", "planner"))
    assert novice + 0.3 < expert and novice > 0.1


@pytest.mark.parametrize("name", ["novice", "planner"])
def test_a_continuation_of_a_shipped_policy_records_it(name):
    """model.pretrained=true without model.path continues the shipped policy model.shipped
    names: its record is the new one's started_from; a run from scratch or from a folder has none."""
    from types import SimpleNamespace

    from jaxlake.pipeline.pretrain import started_from
    from llm.game.default import SHIPPED_DIRS
    from llm.training.config import ModelConfig

    shipped = read_json(SHIPPED_DIRS[name] / "pretrain.json")
    assert started_from(SimpleNamespace(model=ModelConfig(pretrained=True, shipped=name))) == shipped
    assert started_from(SimpleNamespace(model=ModelConfig(pretrained=False, shipped=name))) is None
    assert started_from(SimpleNamespace(model=ModelConfig(path=str(SHIPPED_DIRS[name]), shipped=name))) is None


def test_a_run_from_a_shipped_policy_with_another_prompt_is_warned():
    """A shipped policy reads the prompt it was trained on (its pretrain.json records it); a
    run that starts from it with another prompt gets one line naming the fields that differ,
    and a run from scratch or with the policy's own prompt gets none."""
    from types import SimpleNamespace

    from jaxlake.pipeline.folder import planner_prompt_warning
    from llm.game.default import SHIPPED_DIRS
    from llm.game.prompts import PromptConfig, load_prompt_config
    from llm.training.config import ModelConfig

    trained = PromptConfig.from_dict(read_json(SHIPPED_DIRS["planner"] / "pretrain.json")["settings"]["prompt"])
    run = lambda prompt, **model: SimpleNamespace(model=ModelConfig(**model), prompt=prompt)  # noqa: E731
    assert planner_prompt_warning(run(trained, shipped="planner")) is None
    other = load_prompt_config("default")
    assert planner_prompt_warning(run(other, pretrained=False, shipped="planner")) is None
    line = planner_prompt_warning(run(other, shipped="planner"))
    assert line.startswith("the shipped planner was trained on another prompt") and "prompt.user" in line
    assert "\n" not in line and "prompt.chat_template_kwargs" in line
    assert planner_prompt_warning(run(load_prompt_config("compact"))) is None  # the novice's own
    assert planner_prompt_warning(run(trained)).startswith("the shipped novice was trained on another prompt")


def test_a_run_from_a_shipped_policy_records_which_one():
    """run.json's settings name the shipped policy by its weights' hash, so a folder started
    from one is refused (settings differ) after the package ships another, or with the other
    start; a run from a folder or from scratch records none."""
    import hashlib

    from jaxlake.pipeline.settings import _run_settings
    from llm.game.default import SHIPPED_DIRS, planner_fingerprint, shipped_fingerprint

    want = {n: hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()[:16] for n, d in SHIPPED_DIRS.items()}
    assert planner_fingerprint() == want["planner"] and shipped_fingerprint("novice") == want["novice"]
    assert want["planner"] != want["novice"]
    assert _run_settings({"model": {"pretrained": True}}, "first")["model.novice"] == want["novice"]
    # the expert's key is the one its runs always recorded: their folders (the study's archive) resume
    assert _run_settings({"model": {"pretrained": True, "shipped": "planner"}}, "first")["model.planner"] == want["planner"]
    for model in ({"pretrained": False}, {"pretrained": True, "path": "/x"}):
        assert not [k for k in _run_settings({"model": model}, "first") if k in ("model.novice", "model.planner")]


def test_a_bad_shipped_name_is_one_line():
    from llm.training.config import ModelConfig

    with pytest.raises(ValueError, match=r"model.shipped='expert' not in \['novice', 'planner'\]"):
        ModelConfig.from_dict({"shipped": "expert"})


def test_pretrain_settings_are_checked():
    from jaxlake.pipeline.pretrain import PretrainSettings
    from jaxlake.pipeline.settings import PipelineError

    assert PretrainSettings.from_node({"ship": True, "ship_to": "x"}).ship_to == Path("x")
    with pytest.raises(PipelineError, match=r"unknown pretrain field\(s\) \['shipp'\]"):
        PretrainSettings.from_node({"shipp": True})
    with pytest.raises(PipelineError, match="pretrain.curve='yes' must be true or false"):
        PretrainSettings.from_node({"curve": "yes"})
    assert PretrainSettings.from_node({}).engineer.rows == 0  # plans only unless asked
    from llm.engineer.local import taught_analysis
    from llm.training.config import ModelConfig

    assert not taught_analysis(ModelConfig()) and not taught_analysis(ModelConfig(pretrained=False))  # the novice
    assert PretrainSettings.from_node({"engineer": {"rows": 2, "contexts": 8}}).engineer.contexts == 8
    with pytest.raises(PipelineError, match=r"pretrain.engineer.rows=-1 must be an integer in \[0, inf\)"):
        PretrainSettings.from_node({"engineer": {"rows": -1}})
    with pytest.raises(PipelineError, match=r"unknown pretrain.engineer field\(s\) \['row'\]"):
        PretrainSettings.from_node({"engineer": {"row": 1}})
    with pytest.raises(PipelineError, match=r"pretrain.engineer.start_share=1.5 not in \[0, 1\]"):
        PretrainSettings.from_node({"engineer": {"start_share": 1.5}})


def _pretrain(tmp_path, *extra, timeout=900):
    import os

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    args = [f"runs_dir={tmp_path}", "experiment=p", "eval=tiny", *MICRO, "train.warmstart.steps=4",
            "train.warmstart.batch_size=8", "train.warmstart.checkpoint_every=2", "train.warmstart.log_every=2",
            "train.warmstart.pack_rows=4",  # conf/pretrain.yaml packs (16 rows of a batch of 32): the same code path
            "train.progress=false", "train.plot=false",
            "start=planner", "prompt.reasoning.thinking_tokens=8",  # the expert's prompt thinks first: a short budget
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
    # with the engineer's role beside the plans (pretrain.engineer): 3 examples, one a step
    role = ["pretrain.engineer.rows=1", "pretrain.engineer.contexts=3", "pretrain.engineer.mixtures=2",
            "pretrain.engineer.eval=tiny"]
    proc = _pretrain(tmp_path, "pretrain.ship=true", f"pretrain.ship_to={shipped}", *role)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = tmp_path / "p"
    space = load_mixture(d / "space.yaml")
    assert len(space) == 3750  # every valid config of the policy engineer's space around env=tiny
    assert {c.num_agents for c in space.configs} == {1, 2, 3, 4} and {c.height for c in space.configs} == set(range(2, 9))
    rows = [r for r in map(__import__("json").loads, (d / "stage" / "metrics.jsonl").read_text().splitlines())]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["phase"] == "warmstart" for r in rows)
    assert all(r["engineer_nll"] > 0 for r in rows)
    examples = [__import__("json").loads(x) for x in (d / "engineer_examples.jsonl").read_text().splitlines()]
    # pretrain.engineer.analysis (the default): the teacher's analysis in the think block, then the edit
    assert len(examples) == 3 and all(e["prompt"].endswith("<think>\n") and "## Answer" in e["prompt"] and
                                      e["answer"].split("\n</think>\n\n")[1].startswith('{"edit": "')
                                      for e in examples)
    curve = read_json(d / "curve.json")
    assert [p["step"] for p in curve] == [2, 4]
    assert 0 < curve[0]["train_minutes"] < curve[1]["train_minutes"]
    assert all(0.0 <= p["success"] <= 1.0 and p["n"] == 16 for p in curve)
    record = read_json(d / "pretrain.json")
    assert record["steps"] == 4 and record["space_configs"] == 3750 and record["curve"] == curve
    assert record["success"] == curve[-1]["success"] and "pretrain.ship=true" in record["command"]
    assert record["engineer"]["rows"] == 1 and record["engineer"]["contexts"] == 3 and record["engineer"]["analysis"]
    assert record["engineer"]["shown_share"] == pytest.approx(sum(e["shows"] for e in examples) / 3, abs=1e-4)
    from llm.engineer.local import taught_analysis
    assert taught_analysis(ModelConfig(path=str(shipped)))  # a run from it turns the engineer's think block on
    # shipped: the Hugging Face folder and the record, loadable as any model.path
    assert read_json(shipped / "pretrain.json") == record
    a = load_policy(ModelConfig(path=str(shipped)))
    b = load_policy(ModelConfig(path=str(d / "stage" / "policy")))
    for x, y in zip(_leaves(a), _leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert not list(tmp_path.glob(".shipped.ship-*"))  # no staging folder left behind
    # the same command again: the finished folder is re-read, nothing retrained
    again = _pretrain(tmp_path, "pretrain.ship=true", f"pretrain.ship_to={shipped}", *role)
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_json(d / "curve.json") == curve
    assert len((d / "stage" / "metrics.jsonl").read_text().splitlines()) == 4
