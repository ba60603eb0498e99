"""The engineer interface: what an engineer sees, what it answers, and the small base class.

After each training stage the pipeline hands an engineer an :class:`EngineerContext` (the
stage just finished, the mixture it trained on, the evaluation, the summary, the stage history
and the engineer's own state from the previous stage) and receives a :class:`Proposal`: the
next stage's :class:`~jaxlake.mixture.Mixture`, the decision, and a record that the pipeline
saves as ``engineer.json``. Every backend subclasses :class:`Engineer` and implements
:meth:`Engineer.propose`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import numpy as np

from jaxlake.config import ConfigError, LakeConfig
from jaxlake.mixture import Mixture, MixtureError, mixture_to_obj


class ProposalError(MixtureError):
    """An engineer's output could not be turned into a valid mixture in its space (no JSON in
    the answer, a value off the grid, a fixed field changed, too many components)."""


#: Evaluation modes an engineer may read its success signal from (``llm.training.evaluate``).
EVAL_MODES = ("greedy", "sampled")


def check_mode(mode: Any) -> str:
    """``mode`` if it is one of :data:`EVAL_MODES`, else a :class:`ConfigError` naming it."""
    if mode not in EVAL_MODES:
        raise ConfigError(f"engineer.mode={mode!r} not in {list(EVAL_MODES)}")
    return mode


@dataclass
class EngineerContext:
    """What an engineer sees after stage ``stage`` (1-based) finished.

    Attributes:
      stage: the stage just trained and evaluated; the proposal is for ``stage + 1``.
      current: the mixture that stage trained on.
      initial: the mixture of stage 1 (what the ``fixed`` baseline keeps).
      eval_result: the stage's ``eval.json`` content (see :mod:`llm.training.evaluate`).
      summary: the stage's ``summary.json`` content (see :mod:`jaxlake.summaries`).
      history: one entry per finished stage, oldest first (the summary's ``history``).
      state: this engineer's ``state`` from the previous stage's ``engineer.json`` (or {}).
      seed: run seed; backends derive their randomness from ``(seed, stage)``.
      stage_dir: the stage's directory (where the engineer may write extra files).
      checkpoint: the stage's trained policy checkpoint (``stage_dir/checkpoint``).
      base_checkpoint: where the stage-0 (untrained) policy comes from, or None for the
        run's initial model.
      run_cfg: the run's settings (``jaxlake.pipeline.settings.RunSettings`` from the pipeline:
        ``prompt``, ``model``, ...; a raw config elsewhere) for the LLM backends.
      load_model: ``load_model(which) -> (model, tokenizer)`` with ``which`` ``"policy"``
        (this stage's checkpoint) or ``"base"`` (the stage-0 model); given by the pipeline
        for the LLM backends.
      probe: ``probe(mixture, name, steps) -> record``: a short training stage of ``steps``
        from this stage's policy on ``mixture``, scored on a validation suite disjoint from
        the held-out one (:mod:`jaxlake.pipeline.probe`; the record's ``score`` is its greedy
        success); given by the pipeline, for the oracle engineer.
      rollouts: ``rollouts(mixture, lakes, samples) -> [{"p", "n"}, ...]``: this stage's
        policy's sampled success on ``lakes`` fresh lakes of each component of ``mixture``
        (``samples`` plays a lake), in its order; rollouts only, no training
        (:mod:`jaxlake.pipeline.probe`); given by the pipeline, for the learnability engineers.
      final: no later stage of this run will train on the proposal (the run's last stage; its
        ``next_env.yaml`` is for a run that goes on): an engineer may save its effort.
    """

    stage: int
    current: Mixture
    initial: Mixture
    eval_result: dict
    summary: dict
    history: list
    state: dict
    seed: int = 0
    stage_dir: Optional[Path] = None
    checkpoint: Optional[Path] = None
    base_checkpoint: Optional[Path] = None
    run_cfg: Any = None
    load_model: Optional[Callable[[str], Any]] = None
    probe: Optional[Callable[..., dict]] = None
    rollouts: Optional[Callable[..., list]] = None
    final: bool = False

    def __post_init__(self) -> None:
        self.current, self.initial = Mixture.of(self.current), Mixture.of(self.initial)

    @property
    def base(self) -> LakeConfig:
        """The heaviest current component: the reference for capacity and fixed fields."""
        return self.current.main

    def rng(self, salt: int = 0) -> np.random.Generator:
        return np.random.default_rng([int(self.seed), int(self.stage), int(salt)])


@dataclass
class Proposal:
    """An engineer's answer.

    Attributes:
      mixture: the next stage's environment.
      decision: ``"proposed"`` (a new environment), ``"kept"`` (the current one, on purpose),
        or ``"fallback"`` (every attempt failed; the current environment is kept).
      reason: one line on why.
      record: what ``engineer.json`` keeps beside it: prompt, raw output, parsed config,
        validation errors, attempts, ...
      state: the backend's state for its next call (saved in ``engineer.json``).
      edit: the :class:`~jaxlake.engineers.edits.Edit` of the current mixture that gave
        ``mixture`` (``engineer.json``'s ``edit``; None for a fallback).
    """

    mixture: Mixture
    decision: str
    reason: str = ""
    record: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)
    edit: Any = None

    def __post_init__(self) -> None:
        self.mixture = Mixture.of(self.mixture)  # validated: an engineer answers with a valid mixture

    def to_json(self, engineer: str, stage: int) -> dict:
        return {
            "engineer": engineer,
            "stage": stage,
            "next_stage": stage + 1,
            "decision": self.decision,
            "reason": self.reason,
            "proposal": mixture_to_obj(self.mixture),
            "edit": None if self.edit is None else self.edit.to_obj(),
            "state": self.state,
            **self.record,
        }


class Engineer(abc.ABC):
    """Proposes the next stage's environment from what the last stage showed."""

    #: Registered name (``engineer=<name>``).
    name: str = "engineer"

    @abc.abstractmethod
    def propose(self, ctx: EngineerContext) -> Proposal:
        """The next stage's environment. Must not raise on bad model output."""

    def initial_mixture(self, default: Mixture) -> Mixture:
        """Stage 1's environment, given the run's ``env`` (most backends keep it)."""
        return default


def stage_success(eval_result: Mapping[str, Any], mode: str = "greedy", signal: str = "current_env") -> Optional[float]:
    """Success used by the ladder: on lakes of the training environment when the
    evaluation has them (``signal="current_env"``), else the suite's aggregate score."""
    if signal == "current_env":
        cur = (eval_result.get("current_env") or {}).get("modes", {}).get(mode)
        if cur and cur.get("n", 0) > 0:
            return float(cur["score"])
    suite = (eval_result.get("modes") or {}).get(mode)
    if suite and suite.get("n", 0) > 0:
        return float(suite["score"])
    return None


