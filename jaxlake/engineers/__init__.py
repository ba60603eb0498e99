"""The environment engineers: after each stage, the next stage's environment.

After each training stage the pipeline hands an engineer an :class:`EngineerContext` and
receives a :class:`Proposal`: the next stage's :class:`~jaxlake.mixture.Mixture` of lake
configs, the decision and a record saved as ``engineer.json``. The house:

* ``base``      -- the interface: :class:`EngineerContext`, :class:`Proposal`, the
  :class:`Engineer` base class, :func:`stage_success`, :class:`ProposalError`;
* ``space``     -- the space every engineer chooses from (:class:`ConfigSpace`,
  :func:`space_from_conf`) and the one check of a config against it (:func:`check_in_space`);
* ``edits``     -- what every engineer answers: an :class:`Edit` of the current mixture (keep,
  re-weight, drop, add, replace) under :class:`EditRules`, applied by :func:`apply_edit` and
  checked by :func:`check_edit`;
* ``protocol``  -- reading a model's answer (:func:`extract_json`: the last JSON object after
  any think block) and the ask / validate / retry / fall back loop (:func:`propose_with_retries`);
* one module per non-LLM backend, each a small :class:`Engineer` subclass:

  - ``fixed``     -- keeps the initial environment (the fixed-environment baseline);
  - ``manual``    -- a hand-written list of stage environments (``conf/engineer/manual.yaml``);
  - ``random``    -- a uniformly random edit;
  - ``heuristic`` -- a threshold ladder on the mixture's frontier that adds the raised config
    and settles on the last config that worked;
  - ``plr``       -- Prioritized Level Replay: a buffer of the levels trained on (the first
    environment's too), scored by learnability on the policy's own rollouts on each level,
    rank + staleness replay as a re-weighting, new levels as additions;
  - ``accel``     -- PLR whose new levels are one-step edits of the buffer's top levels;
  - ``sfl``       -- sampling for learnability: the components and candidates from the space
    scored by ``p (1 - p)`` of the policy's sampled success, the mixture shifted toward it and
    the most learnable candidates added;
  - ``oracle``    -- the engineers' ceiling: short probe stages of structured edits of the
    mixture (or, ``oracle_single``, of single configs from the space) from the current policy,
    scored on a validation suite, the best proposed.

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
from jaxlake.engineers.edits import (
    EDIT_KINDS,
    Edit,
    EditRules,
    apply_edit,
    check_edit,
    edit_between,
    edit_from_obj,
    edit_proposal,
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
from jaxlake.engineers.random import RandomEngineer, random_edit
from jaxlake.engineers.sfl import SFLEngineer
from jaxlake.engineers.space import (
    DEFAULT_EDITABLE,
    FIELD_ORDER,
    ConfigSpace,
    check_in_space,
    format_value,
    space_from_conf,
)

__all__ = [
    "ACCELEngineer", "ConfigSpace", "DEFAULT_EDITABLE", "EDIT_KINDS", "EVAL_MODES", "Edit", "EditRules", "Engineer",
    "EngineerContext", "FIELD_ORDER", "FatalEngineerError", "FixedEngineer", "HeuristicEngineer", "ManualEngineer",
    "OracleEngineer", "PLREngineer", "Proposal", "ProposalError", "RandomEngineer", "SFLEngineer", "answer_text",
    "apply_edit", "build_engineer", "check_edit", "check_in_space", "check_mode", "edit_between", "edit_from_obj",
    "edit_proposal", "extract_json", "format_value", "propose_with_retries", "random_edit", "retry_prompt",
    "space_from_conf", "stage_success",
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
            "(policy, base, external, heuristic, plr, accel, sfl, oracle, random, fixed, manual)"
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
