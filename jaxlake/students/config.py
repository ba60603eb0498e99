"""The IPPO student's typed settings (:class:`IPPOConfig`), resolved once from the Hydra node.

Every field is checked when the config is built; a bad value raises :class:`StudentConfigError`
(a :class:`~jaxlake.config.ConfigError`) whose message names the field and its allowed range,
``ippo.num_minibatches=3 must divide num_envs * num_steps * actors = 64 * 32 * 2 = 4096``, so
the entry point ends with that one line. Unknown keys are rejected the same way.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Mapping, Optional

from jaxlake.config import ConfigError, LakeConfig, check_int, check_number, reject_unknown, to_plain

__all__ = ["IPPOConfig", "StudentConfigError", "UEDConfig"]


class StudentConfigError(ConfigError):
    """A student setting is invalid; the message names the field (``ippo.<field>``)."""


def _int(name: str, value: Any, low: int) -> int:
    return check_int(f"ippo.{name}", value, low, error=StudentConfigError)


def _float(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    return check_number(f"ippo.{name}", value, low, high, low_open=low_open, error=StudentConfigError)


#: UED methods (:mod:`jaxlake.students.ued`) and their regret scores.
UED_METHODS = ("dr", "plr", "accel", "sfl")
UED_SCORES = ("pvl", "maxmc")
#: What ``ippo.num_updates`` counts with a UED method (:class:`UEDConfig`).
UED_BUDGETS = ("grad_steps", "lake_steps")


@dataclasses.dataclass(frozen=True)
class UEDConfig:
    """Which levels each update plays (``ippo.ued``; :mod:`jaxlake.students.ued`).

    Attributes:
      method: ``dr`` (a fresh pool from the mixture every update: the plain trainer), ``plr``
        (robust prioritised level replay over a level buffer), ``accel`` (PLR whose replay
        updates are followed by an update on mutations of the buffer's top levels) or ``sfl``
        (sampling for learnability: every ``sfl_every`` updates the current policy plays
        ``sfl_levels`` fresh levels ``sfl_repeats`` times, the ``sfl_buffer`` levels of highest
        ``p (1 - p)`` are kept, and every update's pool mixes ``sfl_ratio`` of them with fresh levels).
      budget: what ``ippo.num_updates`` counts: ``grad_steps`` (policy updates: an update that
        does not train, a robust method's new or mutated levels, comes on top, so every method
        gets the same gradient steps and learning-rate schedule) or ``lake_steps`` (every
        update, trained or not: every method plays the same lake steps; the learning rate is
        annealed by the updates played, so it reaches 0 at the end of the run as ``dr``'s does).
      score: the regret estimate of a level, ``pvl`` (positive value loss) or ``maxmc``.
      buffer_size: the level buffer's capacity (PLR, ACCEL).
      replay_prob: probability that an update replays buffer levels (once the buffer may);
        JaxUED's example's 0.8.
      min_fill: share of the buffer that must be filled before any replay.
      temperature: rank prioritisation's temperature (``h = rank ** (-1 / temperature)``).
      staleness_coef: weight of the staleness distribution in the replay distribution.
      robust: update the policy only on replayed levels (robust PLR, ACCEL); false: on every update.
      num_edits: at most this many edits per ACCEL child (each child draws 1 .. num_edits,
        :func:`jaxlake.levels.mutate` with :data:`jaxlake.levels.IN_SUPPORT_KINDS`).
      sfl_levels, sfl_repeats, sfl_buffer, sfl_ratio, sfl_every: SFL's scored levels, the
        episodes each plays to estimate its success rate ``p``, the levels kept, the share of an
        update's pool drawn from them, and the updates between two scorings (a divisor of
        ``ippo.eval_every``).
    """

    method: str = "dr"
    budget: str = "grad_steps"
    score: str = "maxmc"
    buffer_size: int = 4096
    replay_prob: float = 0.8
    min_fill: float = 0.5
    temperature: float = 0.3
    staleness_coef: float = 0.3
    robust: bool = True
    num_edits: int = 2
    sfl_levels: int = 1024
    sfl_repeats: int = 4
    sfl_buffer: int = 256
    sfl_ratio: float = 0.5
    sfl_every: int = 20

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen dataclass
        for name, choices in (("method", UED_METHODS), ("score", UED_SCORES), ("budget", UED_BUDGETS)):
            value = getattr(self, name)
            if value not in choices:
                raise StudentConfigError(f"ippo.ued.{name}={value!r} must be one of {', '.join(choices)}")
        for name, low in (("buffer_size", 1), ("num_edits", 1), ("sfl_levels", 1), ("sfl_repeats", 1),
                          ("sfl_buffer", 1), ("sfl_every", 1)):
            set_(name, _int(f"ued.{name}", getattr(self, name), low))
        for name, low, high, low_open in (("replay_prob", 0.0, 1.0, False), ("min_fill", 0.0, 1.0, False),
                                          ("temperature", 0.0, 1e3, True), ("staleness_coef", 0.0, 1.0, False),
                                          ("sfl_ratio", 0.0, 1.0, False)):
            set_(name, _float(f"ued.{name}", getattr(self, name), low, high, low_open=low_open))
        if not isinstance(self.robust, bool):
            raise StudentConfigError(f"ippo.ued.robust={self.robust!r} must be true or false")
        if self.sfl_buffer > self.sfl_levels:
            raise StudentConfigError(f"ippo.ued.sfl_buffer={self.sfl_buffer} must be in [1, ippo.ued.sfl_levels="
                                     f"{self.sfl_levels}] (the kept levels are among the scored ones)")

    @classmethod
    def from_value(cls, value: Any) -> "UEDConfig":
        if isinstance(value, UEDConfig):
            return value
        values = to_plain(value)
        if values is None:
            return cls()
        if not isinstance(values, Mapping):
            raise StudentConfigError(f"ippo.ued must be a mapping of settings, got {type(values).__name__}")
        reject_unknown("ippo.ued", values, (f.name for f in dataclasses.fields(cls)), StudentConfigError)
        return cls(**dict(values))


@dataclasses.dataclass(frozen=True)
class IPPOConfig:
    """Settings of one IPPO training run (``conf/ippo/*.yaml``; docs/guides/ippo.md).

    Attributes:
      num_envs: lakes played in parallel.
      num_steps: steps of every lake per update (the rollout length).
      num_updates: PPO updates in all (``num_envs * num_steps * num_updates`` environment steps;
        with a UED method, what they count is ``ued.budget``'s).
      update_epochs: passes over each rollout.
      num_minibatches: minibatches per pass (must divide the rollout's samples).
      lr: Adam's learning rate; ``anneal_lr`` decays it linearly to 0 over the run.
      gamma, gae_lambda: discount and GAE's lambda.
      clip_eps: PPO's ratio clip (and the value clip).
      ent_coef, vf_coef: weights of the entropy bonus and the value loss.
      max_grad_norm: global gradient-norm clip.
      hidden: widths of the actor's and the critic's hidden layers (separate torsos).
      conv: channels of 3x3 convolutions applied to the grid first (``[]``: an MLP only).
      radius: egocentric crop radius (``None``: the whole canvas, absolute positions).
      pool_lakes: fresh lakes generated per update, drawn uniformly as episodes end; 0: a
        new lake generated at every episode end (:func:`jaxlake.levels.step_batch`).
      arrive_reward, fall_reward: the simulator's rewards (docs/rules.md#rewards).
      eval_every: updates between two greedy evaluations on the held-out lakes (a chunk:
        the entry point checkpoints and logs once a chunk).
      eval_lakes: held-out lakes (:mod:`jaxlake.students.lakes`).
      eval_seed: seed of the held-out lakes (fixed: every run is scored on the same lakes).
      eval_env: ``None`` (the held-out lakes follow the training mixture) or a mapping of
        :class:`~jaxlake.config.LakeConfig` fields set on every component for the held-out
        lakes only (a suite beyond the training distribution, e.g. ``{height: 7, width: 7}``).
      log_every: updates between two progress lines printed from inside the jit
        (``jax.debug.callback``); 0: none (the default; the entry point logs per chunk).
      ued: which levels each update plays (:class:`UEDConfig`; a mapping is accepted).
    """

    num_envs: int = 64
    num_steps: int = 32
    num_updates: int = 400
    update_epochs: int = 4
    num_minibatches: int = 4
    lr: float = 5e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: tuple = (64, 64)
    conv: tuple = ()
    radius: Optional[int] = 4
    pool_lakes: int = 512
    arrive_reward: float = 1.0
    fall_reward: float = -1.0
    eval_every: int = 20
    eval_lakes: int = 1024
    eval_seed: int = 20240
    log_every: int = 0
    eval_env: Optional[Any] = None
    ued: UEDConfig = dataclasses.field(default_factory=UEDConfig)

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen dataclass
        set_("ued", UEDConfig.from_value(self.ued))
        if self.eval_env is not None:
            env = to_plain(self.eval_env)
            if not isinstance(env, Mapping):
                raise StudentConfigError(f"ippo.eval_env={env!r} must be null or a mapping of lake settings")
            reject_unknown("ippo.eval_env", env, (f.name for f in dataclasses.fields(LakeConfig)), StudentConfigError)
            set_("eval_env", dict(env))
        for name, low in (("num_envs", 1), ("num_steps", 1), ("num_updates", 1), ("update_epochs", 1),
                          ("num_minibatches", 1), ("pool_lakes", 0), ("eval_every", 1), ("eval_lakes", 1),
                          ("eval_seed", 0), ("log_every", 0)):
            set_(name, _int(name, getattr(self, name), low))
        for name, low, high, low_open in (("lr", 0.0, 1.0, True), ("gamma", 0.0, 1.0, False),
                                          ("gae_lambda", 0.0, 1.0, False), ("clip_eps", 0.0, 10.0, True),
                                          ("ent_coef", 0.0, 10.0, False), ("vf_coef", 0.0, 100.0, False),
                                          ("max_grad_norm", 0.0, 1e6, True), ("arrive_reward", -1e3, 1e3, False),
                                          ("fall_reward", -1e3, 1e3, False)):
            set_(name, _float(name, getattr(self, name), low, high, low_open=low_open))
        if not isinstance(self.anneal_lr, bool):
            raise StudentConfigError(f"ippo.anneal_lr={self.anneal_lr!r} must be true or false")
        for name in ("hidden", "conv"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise StudentConfigError(f"ippo.{name}={value!r} must be a list of positive integers")
            widths = tuple(value)
            for w in widths:
                if isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < 1:
                    raise StudentConfigError(f"ippo.{name}={list(widths)!r} must be a list of positive integers")
            set_(name, tuple(int(w) for w in widths))
        if not self.hidden:
            raise StudentConfigError("ippo.hidden=[] must name at least one layer width")
        if self.radius is not None:
            set_("radius", _int("radius", self.radius, 0))
        if self.num_updates % self.eval_every:
            raise StudentConfigError(f"ippo.num_updates={self.num_updates} must be a multiple of "
                                     f"ippo.eval_every={self.eval_every}")
        if self.pool_lakes % self.num_envs:
            raise StudentConfigError(f"ippo.pool_lakes={self.pool_lakes} must be 0 or a multiple of "
                                     f"ippo.num_envs={self.num_envs}")
        if self.ued.method != "dr" and not self.pool_lakes:
            raise StudentConfigError(f"ippo.pool_lakes=0 must be positive with ippo.ued.method={self.ued.method} "
                                     "(the levels of an update are a pool)")
        if self.ued.method == "sfl" and self.eval_every % self.ued.sfl_every:
            raise StudentConfigError(f"ippo.ued.sfl_every={self.ued.sfl_every} must divide ippo.eval_every="
                                     f"{self.eval_every} (SFL scores its levels at fixed updates of every chunk)")

    def check_batch(self, actors: int) -> None:
        """The minibatch split fits a rollout of ``actors`` actors per lake."""
        samples = self.num_envs * self.num_steps * int(actors)
        if samples % self.num_minibatches:
            raise StudentConfigError(f"ippo.num_minibatches={self.num_minibatches} must divide num_envs * "
                                     f"num_steps * actors = {self.num_envs} * {self.num_steps} * {actors} = {samples}")

    @property
    def env_steps(self) -> int:
        """Environment steps (lake steps, every agent's move counted once per lake) of the run:
        ``dr``'s, and a UED method's at ``ippo.ued.budget=lake_steps``; at ``grad_steps`` a robust
        method plays more (:attr:`jaxlake.students.ued.UEDMetrics.plays`), SFL scores on top."""
        return self.num_envs * self.num_steps * self.num_updates

    @property
    def num_chunks(self) -> int:
        """Chunks of ``eval_every`` updates, each ended by a greedy held-out evaluation."""
        return self.num_updates // self.eval_every

    @classmethod
    def from_node(cls, node: Any) -> "IPPOConfig":
        """From the ``ippo`` node of the Hydra config (or a plain mapping); unknown keys rejected."""
        values = to_plain(node)
        if values is None:
            return cls()
        if not isinstance(values, Mapping):
            raise StudentConfigError(f"ippo must be a mapping of settings, got {type(values).__name__}")
        reject_unknown("ippo", values, (f.name for f in dataclasses.fields(cls)), StudentConfigError)
        try:
            return cls(**dict(values))
        except TypeError as err:  # pragma: no cover - reject_unknown catches unknown names first
            raise StudentConfigError(f"ippo: {err}") from None

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["hidden"], out["conv"] = list(self.hidden), list(self.conv)
        out["ued"] = dataclasses.asdict(self.ued)
        out["eval_env"] = None if self.eval_env is None else dict(self.eval_env)
        return out
