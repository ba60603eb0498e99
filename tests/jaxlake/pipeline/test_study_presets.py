"""The headroom and hard-target studies' presets (conf/study/headroom.yaml, conf/study/hard.yaml):
they compose, every engineer they sweep builds, the hard target's env and eval presets are one
pair (the training mixture is the suite's cells), and the hand-made schedule ends on it."""

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from jaxlake.conf import CONF_DIR
from jaxlake.engineers import build_engineer
from jaxlake.mixture import Mixture, mixture_from_node, same_mixture
from jaxlake.pipeline.settings import RunSettings
from jaxlake.suite import SuiteSpec, cells_mixture, load_eval_conf


def composed(*overrides):
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("study", ["headroom", "hard"])
def test_every_swept_engineer_builds_and_the_run_settings_resolve(study):
    node = OmegaConf.load(CONF_DIR / "study" / f"{study}.yaml")
    engineers = str(node.hydra.sweeper.params.engineer).split(",")
    assert {"fixed", "oracle", "sfl", "plr", "accel", "random"} <= set(engineers)
    for name in engineers:
        run = composed(f"+study={study}", f"engineer={name}")
        RunSettings.from_cfg(run)  # every setting checked, as the run checks it
        assert build_engineer(run.engineer).name == name


def test_the_hard_target_is_one_env_and_eval_pair():
    target = mixture_from_node(OmegaConf.to_container(composed("env=hard").env, resolve=True))
    suite = cells_mixture(SuiteSpec.from_conf(OmegaConf.to_container(load_eval_conf("hard"), resolve=True)))
    assert len(target) == 12 and sorted(c.to_dict().items() for c in target.configs) == sorted(
        c.to_dict().items() for c in suite.configs)
    manual = build_engineer(composed("+study=hard", "engineer=manual_hard").engineer)
    first = manual.initial_mixture(target)
    assert not same_mixture(first, target) and max(c.height for c in first.configs) < 6  # it starts smaller
    last = manual._entry(5, first, first.main)[0]
    assert sorted(c.to_dict().items() for c in last.configs) == sorted(c.to_dict().items() for c in target.configs)
    assert isinstance(last, Mixture)
