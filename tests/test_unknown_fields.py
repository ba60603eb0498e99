"""One form for unknown config keys (issue 20, item 3): ``jaxlake.config.reject_unknown`` and
the model layer's own copy ``llm.model.errors.reject_unknown`` give the same one-line message,
``unknown <section> field(s) [...]; allowed: [...]``, and every former near-copy of the check
still raises its own error type naming its section."""

from __future__ import annotations

import re

import pytest

from jaxlake.config import ConfigError, LakeConfig, reject_unknown, unknown_message
from llm.model import errors as model_errors


def test_reject_unknown_names_section_unknown_and_allowed():
    with pytest.raises(ConfigError) as err:
        reject_unknown("train.grpo", {"steps": 1, "lakes": 2, "Zeta": 3}, ("steps", "mu"))
    assert str(err.value) == "unknown train.grpo field(s) ['Zeta', 'lakes']; allowed: ['mu', 'steps']"
    assert "\n" not in str(err.value)


def test_reject_unknown_passes_known_keys_and_takes_iterables():
    assert reject_unknown("x", {}, ()) is None
    assert reject_unknown("x", {"a": 1}, ["a", "b"]) is None
    assert reject_unknown("x", ["b"], (k for k in "ab")) is None


def test_reject_unknown_raises_the_given_error():
    class Mine(ValueError):
        pass

    with pytest.raises(Mine, match=r"unknown sec field\(s\) \['q'\]"):
        reject_unknown("sec", ["q"], ["p"], Mine)


def test_model_layer_copy_gives_the_same_message():
    for given, allowed in [({"b": 1, "a": 2}, ("c",)), (["x", 3], ("y", "z")), (["k"], ())]:
        with pytest.raises(ConfigError) as ours:
            reject_unknown("mesh", given, allowed)
        with pytest.raises(model_errors.ModelConfigError) as theirs:
            model_errors.reject_unknown("mesh", given, allowed)
        assert str(ours.value) == str(theirs.value) == unknown_message("mesh", [k for k in given if k not in allowed], allowed)


def _sites():
    from jaxlake.engineers import space_from_conf
    from jaxlake.metrics import LoggerConfig
    from jaxlake.mixture import MixtureError, mixture_from_obj
    from jaxlake.suite import SuiteError, SuiteSpec
    from jaxlake.text import parse_lake
    from llm.engineer.local import reasoning_settings
    from llm.engineer.prompt import context_flags
    from llm.generation.reasoning import ReasoningConfig, ReasoningError
    from llm.game.prompts import PromptConfig, PromptError
    from llm.game.rewards import RewardConfig
    from llm.model.errors import ModelConfigError
    from llm.model.config import Qwen3Config
    from llm.model.sharding import MeshConfig
    from llm.training.config import ModelConfig, TrainConfig

    base = LakeConfig(height=5, width=5, num_agents=2, max_steps=16)
    suite = {"seed": 0, "lakes_per_cell": 1, "grid": {"size": [4]}}
    return [
        ("LakeConfig", ConfigError, lambda: LakeConfig.from_dict({"colour": 1})),
        ("LakeConfig", ConfigError, lambda: parse_lake("A.\n.a", colour=1)),
        ("config", MixtureError, lambda: mixture_from_obj({"colour": 1}, base)),
        ("mixture[0].config", MixtureError, lambda: mixture_from_obj({"mixture": [{"config": {"colour": 1}}]}, base)),
        ("eval.base", SuiteError, lambda: SuiteSpec.from_conf({**suite, "base": {"colour": 1}})),
        ("eval.grid", SuiteError, lambda: SuiteSpec.from_conf({**suite, "grid": {"colour": [1]}})),
        ("engineer.space", ConfigError, lambda: space_from_conf(base, {"colour": 1})),
        ("engineer.reasoning", ConfigError, lambda: reasoning_settings({"colour": 1})),
        ("engineer.context", ConfigError, lambda: context_flags({"colour": 1})),
        ("wandb", ConfigError, lambda: LoggerConfig.from_cfg({"wandb": {"colour": 1}})),
        ("prompt", PromptError, lambda: PromptConfig.from_dict({"colour": 1})),
        ("prompt.reasoning", ReasoningError, lambda: ReasoningConfig.from_value({"colour": 1})),
        ("reward", ValueError, lambda: RewardConfig.from_dict({"colour": 1})),
        ("train", ValueError, lambda: TrainConfig.from_dict({"colour": 1})),
        ("train.grpo", ValueError, lambda: TrainConfig.from_dict({"grpo": {"colour": 1}})),
        ("train.grpo.optim", ValueError, lambda: TrainConfig.from_dict({"grpo": {"optim": {"colour": 1}}})),
        ("train.warmstart", ValueError, lambda: TrainConfig.from_dict({"warmstart": {"colour": 1}})),
        ("train.eval", ValueError, lambda: TrainConfig.from_dict({"eval": {"colour": 1}})),
        ("model", ValueError, lambda: ModelConfig.from_dict({"colour": 1})),
        ("model.architecture", ValueError, lambda: ModelConfig(architecture={"colour": 1})),
        ("mesh", ModelConfigError, lambda: MeshConfig.from_dict({"colour": 1})),
        ("Qwen3Config", ModelConfigError, lambda: Qwen3Config.from_dict({"colour": 1})),
    ]


@pytest.mark.parametrize("index", range(22))
def test_every_site_raises_the_one_form_with_its_section(index):
    section, error, call = _sites()[index]
    with pytest.raises(error) as err:
        call()
    assert re.fullmatch(rf"unknown {re.escape(section)} field\(s\) \['colour'\]; allowed: \[.+\]", str(err.value)), str(err.value)


def test_the_site_list_is_complete():
    assert len(_sites()) == 22
