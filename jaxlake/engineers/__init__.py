"""The environment engineers: after each stage, the next stage's environment.

After each training stage the pipeline hands an engineer an :class:`EngineerContext` and
receives a :class:`Proposal`: the next stage's :class:`~jaxlake.mixture.Mixture` of lake
configs, the decision and a record saved as ``engineer.json``. The house:

* ``base``      -- the interface: :class:`EngineerContext`, :class:`Proposal`, the
  :class:`Engineer` base class, :func:`stage_success`, :class:`ProposalError`;
* ``space``     -- the space every engineer chooses from (:class:`ConfigSpace`,
  :func:`space_from_conf`) and the one check of a proposal against it (:func:`check_in_space`);
* ``protocol``  -- reading a model's answer (:func:`extract_json`: the last JSON object after
  any think block) and the ask / validate / retry / fall back loop (:func:`propose_with_retries`);
* one module per non-LLM backend, each a small :class:`Engineer` subclass:

  - ``fixed``     -- keeps the initial environment (the fixed-environment baseline);
  - ``manual``    -- a hand-written list of stage environments (``conf/engineer/manual.yaml``);
  - ``random``    -- a uniformly random valid config from the space;
  - ``heuristic`` -- a threshold ladder that settles on the last config that worked;
  - ``plr``       -- Prioritized Level Replay: a buffer of the levels it proposed, scored by
    learnability on the policy's own rollouts on each level, rank + staleness replay, the
    replay-or-new-level decision;
  - ``accel``     -- PLR whose new levels are one-step edits of replayed levels;
  - ``oracle``    -- the engineers' ceiling: short probe stages of a few candidates from the
    current policy, scored on a validation suite, the best proposed.

The LLM backends (``policy``, ``base``, ``external``) live in :mod:`llm.engineer.local` and use
this package's space, interface and protocol. Every backend is built from its Hydra node
(``conf/engineer/<name>.yaml``: ``_target_`` + parameters) by :func:`build_engineer`, which
imports a backend only when a config names it.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxlake.config import ConfigError
from jaxlake.engineers.accel import ACCELEngineer
from jaxlake.engineers.base import (
    EVAL_MODES,
    Engineer,
    EngineerContext,
    Proposal,
    ProposalError,
    check_mode,
    stage_success,
)
from jaxlake.engineers.fixed import FixedEngineer
from jaxlake.engineers.heuristic import HeuristicEngineer
from jaxlake.engineers.manual import ManualEngineer
from jaxlake.engineers.oracle import OracleEngineer
from jaxlake.engineers.plr import PLREngineer
from jaxlake.engineers.protocol import (
    FatalEngineerError,
    answer_text,
    extract_json,
    propose_with_retries,
    retry_prompt,
)
from jaxlake.engineers.random import RandomEngineer
from jaxlake.engineers.space import (
    DEFAULT_EDITABLE,
    FIELD_ORDER,
    ConfigSpace,
    check_in_space,
    format_value,
    space_from_conf,
)

__all__ = [
    "ACCELEngineer", "ConfigSpace", "DEFAULT_EDITABLE", "EVAL_MODES", "Engineer", "EngineerContext",
    "FIELD_ORDER", "FatalEngineerError", "FixedEngineer", "HeuristicEngineer", "ManualEngineer", "OracleEngineer", "PLREngineer",
    "Proposal", "ProposalError", "RandomEngineer", "answer_text", "build_engineer", "check_in_space", "check_mode",
    "extract_json", "format_value", "propose_with_retries", "retry_prompt", "space_from_conf", "stage_success",
]


def build_engineer(node: Any) -> Engineer:
    """Instantiate an engineer from its Hydra node (``_target_`` + parameters). A bad
    parameter raises the backend's own :class:`ConfigError` (one line naming the field)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, Mapping) and not isinstance(node, DictConfig):
        node = OmegaConf.create(dict(node))
    if "_target_" not in node:
        raise ConfigError(
            "engineer config has no _target_; select a backend with engineer=<name> "
            "(policy, base, external, heuristic, plr, accel, random, fixed, manual)"
        )
    try:
        engineer = instantiate(node, _convert_="all")
    except InstantiationException as err:
        if isinstance(err.__cause__, ConfigError):  # a bad value: its own one line, not Hydra's wrapper
            raise err.__cause__ from None
        raise
    if not isinstance(engineer, Engineer):
        raise ConfigError(f"engineer._target_={node._target_} did not build an Engineer")
    return engineer
