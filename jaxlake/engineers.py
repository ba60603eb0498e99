"""The environment engineer: one interface, the non-LLM backends and the proposal contract.

After each training stage the pipeline hands an engineer an :class:`EngineerContext`
(the stage just finished, the environment it trained on, the evaluation, the summaries,
the stage history and the engineer's own state from the previous stage) and receives a
:class:`Proposal`: the next stage's environment as a weighted **mixture** of
:class:`~jaxlake.config.LakeConfig` (``[(weight, config), ...]``, weights summing to one),
the decision, and a record that the pipeline saves as ``engineer.json``.

Backends here know nothing of language models:

* ``fixed``      -- keeps the current environment (the fixed-environment baseline);
* ``manual``     -- a hand-written list of stage environments from ``conf/engineer/manual.yaml``;
* ``random``     -- a uniformly random valid config from the :class:`ConfigSpace`;
* ``heuristic``  -- a threshold ladder: raise one dimension a rung when success is above
  ``raise_above``; when a raised config fails (below ``lower_below``) go back to the last
  config that worked and stay there; otherwise keep;
* ``plr``        -- prioritized replay over configs (the held-out suite's cells plus every
  visited config) scored by learnability ``p (1 - p)``, rank-prioritised with a staleness
  bonus; proposes a mixture of the top configs.

The LLM backends (``policy``, ``base``, ``external``) live in :mod:`llm.engineer` and reuse
:class:`ConfigSpace` (constrained decoding), :func:`parse_proposal_text` and
:func:`propose_with_retries` from this module. Every engineer that has a space validates
its proposal against it with :func:`check_in_space` (grid values, fixed fields, number of
mixture components); model answers that fail it are shown the error and retried. Every backend is built from its Hydra node
(``conf/engineer/<name>.yaml``, ``_target_`` + parameters) by :func:`build_engineer`.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from jaxlake.config import DYNAMIC_FIELDS, FIELD_BOUNDS, ConfigError, LakeConfig, to_plain

#: A weighted mixture of environment configs; weights are positive and sum to one.
Mixture = list  # list[tuple[float, LakeConfig]]

#: Order in which fields are chosen (constrained decoding, random sampling); later fields'
#: allowed values depend on earlier choices (e.g. ``num_agents`` on the region size).
FIELD_ORDER = DYNAMIC_FIELDS
#: Fields an engineer may change by default; the rest stay at the current config's values.
DEFAULT_EDITABLE = ("height", "width", "num_agents", "hole_density", "conflict_density", "slip_prob", "max_steps")
CAPACITY_FIELDS = ("max_height", "max_width", "max_agents")


class ProposalError(ValueError):
    """An engineer's output could not be turned into a valid mixture of configs."""


# ============================================================================ mixtures
def normalize_mixture(items: Iterable[tuple[float, LakeConfig]]) -> Mixture:
    """Validate weights (finite, >= 0, positive sum) and rescale them to sum to one.

    Components with weight 0 are dropped. Raises :class:`ProposalError` naming the problem.
    """
    items = [(w, c) for w, c in items]
    if not items:
        raise ProposalError("mixture is empty: give at least one config")
    out = []
    for i, (w, c) in enumerate(items):
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise ProposalError(f"mixture[{i}].weight={w!r} must be a number")
        w = float(w)
        if not math.isfinite(w) or w < 0:
            raise ProposalError(f"mixture[{i}].weight={w} not in [0, inf)")
        if not isinstance(c, LakeConfig):
            raise ProposalError(f"mixture[{i}].config must be a LakeConfig, got {type(c).__name__}")
        out.append((w, c))
    total = sum(w for w, _ in out)
    if total <= 0:
        raise ProposalError("mixture weights sum to 0; give at least one positive weight")
    return [(w / total, c) for w, c in out if w > 0]


def mixture_to_obj(mixture: Mixture) -> list[dict[str, Any]]:
    """JSON/YAML-ready form: ``[{"weight": w, "config": {...}}, ...]``."""
    return [{"weight": round(float(w), 6), "config": c.to_dict()} for w, c in mixture]


def _config_from_fields(values: Mapping[str, Any], base: LakeConfig, where: str) -> LakeConfig:
    if not isinstance(values, Mapping):
        raise ProposalError(f"{where} must be a JSON object of config fields, got {type(values).__name__}")
    known = {f.name for f in dataclasses.fields(LakeConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ProposalError(f"{where}: unknown config field(s) {unknown}; known: {sorted(known)}")
    for cap in CAPACITY_FIELDS:
        if cap in values and values[cap] != getattr(base, cap):
            raise ProposalError(
                f"{where}.{cap}={values[cap]!r} cannot change: the run's capacity is fixed at "
                f"{cap}={getattr(base, cap)}"
            )
    merged = {**base.to_dict(), **dict(values)}
    try:
        return LakeConfig(**merged)
    except ConfigError as err:
        raise ProposalError(f"{where}: {err}") from None
    except TypeError as err:  # e.g. a list where a number belongs
        raise ProposalError(f"{where}: {err}") from None


def mixture_from_obj(obj: Any, base: LakeConfig) -> Mixture:
    """Read a proposal object into a validated mixture.

    Accepted forms (fields missing from a config keep ``base``'s values; capacity fields
    must equal ``base``'s):

    * ``{"height": 6, "num_agents": 3, ...}`` -- one config;
    * ``{"mixture": [{"weight": 0.7, "config": {...}}, ...]}`` or the bare list.
    """
    if isinstance(obj, Mapping) and "mixture" in obj:
        extra = sorted(set(obj) - {"mixture"})
        if extra:
            raise ProposalError(f"unexpected key(s) {extra} beside 'mixture'")
        obj = obj["mixture"]
    if isinstance(obj, Mapping):
        return [(1.0, _config_from_fields(obj, base, "config"))]
    if isinstance(obj, (list, tuple)):
        if not obj:
            raise ProposalError("mixture is empty: give at least one component")
        items = []
        for i, comp in enumerate(obj):
            if not isinstance(comp, Mapping) or "config" not in comp:
                raise ProposalError(f"mixture[{i}] must be an object {{\"weight\": w, \"config\": {{...}}}}")
            extra = sorted(set(comp) - {"weight", "config"})
            if extra:
                raise ProposalError(f"mixture[{i}]: unexpected key(s) {extra}")
            items.append((comp.get("weight", 1.0), _config_from_fields(comp["config"], base, f"mixture[{i}].config")))
        return normalize_mixture(items)
    raise ProposalError(f"proposal must be a JSON object or list, got {type(obj).__name__}")


def answer_text(text: str) -> str:
    """The answer part of a reply: the text after the last ``</think>`` (a reasoning model
    thinks first, and may quote configurations while it does). Raises :class:`ProposalError`
    when a ``<think>`` block is opened and never closed (the reply has no answer)."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        raise ProposalError("the think block was never closed (no </think>): there is no answer after it")
    return text


def extract_json(text: str) -> Any:
    """The **last** complete JSON object or array in the answer part of ``text``.

    The answer part is the text after any think block (:func:`answer_text`); in it, every
    top-level JSON value is read left to right (code fences and chatter around them allowed;
    a value nested in an earlier one is part of that one) and the last object or array wins,
    so a reply that quotes the current configuration and then gives its proposal is read as
    the proposal. Raises :class:`ProposalError` when there is none or it does not parse.
    """
    if not isinstance(text, str):
        raise ProposalError(f"output must be text, got {type(text).__name__}")
    chunk = answer_text(text)
    decoder = json.JSONDecoder()
    last_error = None
    found: Any = None
    i = 0
    while i < len(chunk):
        if chunk[i] in "{[":
            try:
                obj, end = decoder.raw_decode(chunk, i)
            except json.JSONDecodeError as err:
                last_error = err
                i += 1
                continue
            if isinstance(obj, (dict, list)):
                found = obj
                i = end
                continue
        i += 1
    if found is not None:
        return found
    if last_error is not None:
        raise ProposalError(f"no parseable JSON object in the output ({last_error.msg} at char {last_error.pos})")
    raise ProposalError("no JSON object in the output")


def parse_proposal_text(text: str, base: LakeConfig) -> Mixture:
    """Raw engineer output -> validated mixture (raises :class:`ProposalError`)."""
    return mixture_from_obj(extract_json(text), base)


def mixture_to_yaml(mixture: Mixture) -> str:
    """The ``next_env.yaml`` text of a mixture."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml({"mixture": mixture_to_obj(mixture)})


def mixture_from_env_node(node: Any) -> Mixture:
    """A mixture from a Hydra env node: a LakeConfig mapping or ``{mixture: [...]}``."""
    node = to_plain(node)
    if isinstance(node, LakeConfig):
        return [(1.0, node)]
    if isinstance(node, Mapping) and "mixture" in node:
        items = []
        for i, comp in enumerate(node["mixture"]):
            try:
                items.append((comp.get("weight", 1.0), LakeConfig.from_dict(comp["config"])))
            except (ConfigError, KeyError, TypeError) as err:
                raise ConfigError(f"mixture[{i}]: {err}") from None
        try:
            return normalize_mixture(items)
        except ProposalError as err:
            raise ConfigError(str(err)) from None
    if isinstance(node, Mapping):
        return [(1.0, LakeConfig.from_dict(node))]
    raise ConfigError(f"env must be a LakeConfig mapping or {{mixture: [...]}}, got {type(node).__name__}")


def load_mixture(path: os.PathLike) -> Mixture:
    """Read a ``next_env.yaml`` (or any env YAML) into a mixture."""
    from omegaconf import OmegaConf

    return mixture_from_env_node(OmegaConf.load(str(path)))


def main_config(mixture: Mixture) -> LakeConfig:
    """The heaviest component (first on ties): what single-config consumers use."""
    return max(mixture, key=lambda wc: wc[0])[1]


def same_mixture(a: Mixture, b: Mixture) -> bool:
    return len(a) == len(b) and all(abs(wa - wb) < 1e-9 and ca == cb for (wa, ca), (wb, cb) in zip(a, b))


# ============================================================================ config space
def _float_grid(lo: float, hi: float, step: float) -> list[float]:
    n = int(math.floor((hi - lo) / step + 1e-9))
    return [round(lo + i * step, 4) for i in range(n + 1)]


def format_value(value: Any) -> str:
    """How a field value is written in the engineer's JSON (``0.15``, ``6``, ``"stay"``, ``null``)."""
    if isinstance(value, float):
        return json.dumps(round(value, 4))
    return json.dumps(value)


@dataclass
class ConfigSpace:
    """The discrete space an engineer chooses from, with cross-field constraints.

    Each editable field has a finite grid of allowed values (``values``; defaults derive from
    :data:`~jaxlake.config.FIELD_BOUNDS` and the capacity of ``base``); fields not editable
    keep ``base``'s value. :meth:`choices` returns the values of a field that still admit a
    valid :class:`LakeConfig` given earlier choices (in :data:`FIELD_ORDER`), checked by
    validating the most permissive completion -- so choosing field by field from
    :meth:`choices` always ends in a valid config.
    """

    base: LakeConfig
    editable: tuple = DEFAULT_EDITABLE
    values: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.editable = tuple(self.editable)
        unknown = [f for f in self.editable if f not in FIELD_ORDER]
        if unknown:
            raise ConfigError(f"editable field(s) {unknown} unknown; choose from {list(FIELD_ORDER)}")
        grids = {}
        for name in self.editable:
            given = self.values.get(name) if self.values else None
            grid = list(given) if given is not None else self._default_grid(name)
            grid = [self._coerce(name, v) for v in grid]
            if not grid:
                raise ConfigError(f"space.values.{name} is empty")
            grids[name] = sorted(set(grid), key=lambda v: (v is None, v if not isinstance(v, str) else 0, str(v)))
        self.values = grids
        if self.editable and not self.choices(self.editable[0], {}):
            raise ConfigError(f"no valid config in the space around {self.base}")

    # ------------------------------------------------------------------ grids
    def _default_grid(self, name: str) -> list:
        b = self.base
        if name == "height":
            return list(range(FIELD_BOUNDS["height"][0], b.max_height + 1))
        if name == "width":
            return list(range(FIELD_BOUNDS["width"][0], b.max_width + 1))
        if name == "num_agents":
            return list(range(1, b.max_agents + 1))
        if name == "hole_density":
            return _float_grid(0.0, FIELD_BOUNDS["hole_density"][1], 0.05)
        if name == "conflict_density":
            return _float_grid(0.0, 1.0, 0.1)
        if name == "slip_prob":
            return _float_grid(0.0, 1.0, 0.1)
        if name == "max_steps":
            cells = b.max_height * b.max_width
            return [v for v in (2, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128) if v <= max(16, 2 * cells)]
        if name == "min_dist":
            return list(range(1, min(b.max_height * b.max_width - 1, 32) + 1))
        if name == "max_dist":
            return [None] + list(range(1, min(b.max_height * b.max_width - 1, 32) + 1))
        if name == "on_goal":
            return ["vanish", "stay"]
        raise ConfigError(f"no grid for field {name}")

    @staticmethod
    def _coerce(name: str, v: Any) -> Any:
        if name == "on_goal":
            if v not in ("vanish", "stay"):
                raise ConfigError(f"space.values.on_goal value {v!r} not in ['stay', 'vanish']")
            return v
        if name == "max_dist" and v is None:
            return None
        if name in ("hole_density", "conflict_density", "slip_prob"):
            lo, hi = FIELD_BOUNDS[name]
            v = round(float(v), 4)
            if not lo <= v <= hi:
                raise ConfigError(f"space.values.{name} value {v} not in [{lo}, {hi}]")
            return v
        lo, hi = FIELD_BOUNDS[name]
        if float(v) != int(v) or not lo <= int(v) <= hi:
            raise ConfigError(f"space.values.{name} value {v!r} must be an integer in [{lo}, {hi}]")
        return int(v)

    # ------------------------------------------------------------------ constraints
    def _permissive(self, name: str) -> Any:
        grid = self.values[name]
        if name in ("height", "width"):
            return max(grid)
        if name in ("num_agents", "hole_density", "min_dist"):
            return min(grid)
        if name == "max_dist":
            return None if None in grid else max(grid)
        base_value = getattr(self.base, name)
        return base_value if base_value in grid else grid[0]

    def feasible(self, partial: Mapping[str, Any]) -> bool:
        """Whether ``partial`` (some editable fields chosen) extends to a valid config."""
        try:
            self.complete(partial, permissive=True)
            return True
        except ConfigError:
            return False

    def complete(self, partial: Mapping[str, Any], permissive: bool = False) -> LakeConfig:
        """The config with ``partial``'s values, ``base``'s for fixed fields and, for editable
        fields not in ``partial``, ``base``'s value (or the most permissive one)."""
        values = self.base.to_dict()
        for name in self.editable:
            if name in partial:
                values[name] = partial[name]
            elif permissive:
                values[name] = self._permissive(name)
        return LakeConfig(**values)

    def choices(self, name: str, partial: Mapping[str, Any]) -> list:
        """Allowed values of editable field ``name`` given the earlier choices in ``partial``."""
        if name not in self.values:
            raise ConfigError(f"field {name} is not editable here; editable: {list(self.editable)}")
        return [v for v in self.values[name] if self.feasible({**partial, name: v})]

    def sample(self, rng: np.random.Generator) -> LakeConfig:
        """A config chosen field by field, uniformly among the allowed values."""
        partial: dict[str, Any] = {}
        for name in self.editable:
            options = self.choices(name, partial)
            partial[name] = options[int(rng.integers(len(options)))]
        return self.complete(partial)

    def snap(self, config: LakeConfig) -> LakeConfig:
        """``config`` moved onto the grid: each editable field to its nearest allowed value
        (in field order, respecting constraints)."""
        partial: dict[str, Any] = {}
        for name in self.editable:
            options = self.choices(name, partial)
            target = getattr(config, name)
            partial[name] = _nearest(options, target)
        return self.complete(partial)


def _on_grid(value: Any, grid: Sequence[Any]) -> bool:
    """Whether ``value`` is one of ``grid``'s values (floats within 1e-6: ``0.1 + 0.2`` is 0.3)."""
    for g in grid:
        if isinstance(g, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
            if abs(float(value) - g) <= 1e-6:
                return True
        elif value == g and type(value) is type(g):
            return True
    return False


def check_in_space(mixture: Mixture, space: "ConfigSpace", max_components: int = 1) -> None:
    """Raise :class:`ProposalError` unless every component of ``mixture`` lies in ``space``.

    The one validation every engineer's proposal passes (free-text and external replies in
    :func:`propose_with_retries`, the baselines before they answer), so that all engineers
    search the same space:

    * at most ``max_components`` components;
    * each editable field on its grid (``hole_density=0.37`` is rejected when the grid is
      0.1 steps), the error naming the field and its allowed values;
    * each field that is not editable equal to the run's value (``space.base``): fields the
      prompt shows as fixed (``slip_prob``, ``max_steps``, ``on_goal``, ...) cannot change.

    Cross-field rules (two free cells per agent, distance bounds) are :class:`LakeConfig`'s.
    """
    if len(mixture) > int(max_components):
        raise ProposalError(
            f"the mixture has {len(mixture)} components; at most {int(max_components)} allowed "
            f"(max_components={int(max_components)})"
        )
    base = space.base.to_dict()
    for i, (_, config) in enumerate(mixture):
        where = "config" if len(mixture) == 1 else f"mixture[{i}].config"
        values = config.to_dict()
        for name in FIELD_ORDER:
            value = values[name]
            if name in space.values:
                if not _on_grid(value, space.values[name]):
                    allowed = space.values[name]
                    shown = (f"[{allowed[0]}, {allowed[1]}, ..., {allowed[-1]}] (integers)"
                             if len(allowed) > 12 and all(isinstance(v, int) for v in allowed) else str(allowed))
                    raise ProposalError(f"{where}.{name}={value!r} is not an allowed value; allowed: {shown}")
            elif not _on_grid(value, [base[name]]):
                raise ProposalError(
                    f"{where}.{name}={value!r} is fixed at {base[name]!r} in this run; the fields you may change "
                    f"are {list(space.editable)}"
                )
        for cap in CAPACITY_FIELDS:
            if values[cap] != base[cap]:
                raise ProposalError(f"{where}.{cap}={values[cap]!r} cannot change: the run's capacity is "
                                    f"{cap}={base[cap]}")


def _nearest(options: Sequence[Any], target: Any) -> Any:
    if target in options:
        return target
    numeric = [o for o in options if isinstance(o, (int, float)) and not isinstance(o, bool)]
    if numeric and isinstance(target, (int, float)):
        return min(numeric, key=lambda o: (abs(o - target), o))
    return options[0]


def space_from_conf(base: LakeConfig, node: Optional[Mapping[str, Any]]) -> ConfigSpace:
    """A :class:`ConfigSpace` from an engineer's ``space:`` node (``editable``, ``values``)."""
    node = dict(node or {})
    unknown = sorted(set(node) - {"editable", "values"})
    if unknown:
        raise ConfigError(f"engineer.space: unknown key(s) {unknown}; known: ['editable', 'values']")
    editable = tuple(node.get("editable") or DEFAULT_EDITABLE)
    values = {k: list(v) for k, v in dict(node.get("values") or {}).items()}
    bad = sorted(set(values) - set(editable))
    if bad:
        raise ConfigError(f"engineer.space.values names field(s) {bad} that are not editable ({list(editable)})")
    return ConfigSpace(base=base, editable=editable, values=values)


# ============================================================================ interface
@dataclass
class EngineerContext:
    """What an engineer sees after stage ``stage`` (1-based) finished.

    Attributes:
      stage: the stage just trained and evaluated; the proposal is for ``stage + 1``.
      current: the mixture that stage trained on.
      initial: the mixture of stage 1 (what the ``fixed`` baseline keeps).
      eval_result: the stage's ``eval.json`` content (see :mod:`llm.evaluate`).
      summary: the stage's ``summary.json`` content (see :mod:`jaxlake.summaries`).
      history: one entry per finished stage, oldest first (the summary's ``history``).
      state: this engineer's ``state`` from the previous stage's ``engineer.json`` (or {}).
      seed: run seed; backends derive their randomness from ``(seed, stage)``.
      stage_dir: the stage's directory (where the engineer may write extra files).
      checkpoint: the stage's trained policy checkpoint (``stage_dir/checkpoint``).
      base_checkpoint: where the stage-0 (untrained) policy comes from, or None for the
        run's initial model.
      run_cfg: the whole run config (model settings for the LLM backends).
      load_model: ``load_model(which) -> (model, tokenizer)`` with ``which`` ``"policy"``
        (this stage's checkpoint) or ``"base"`` (the stage-0 model); given by the pipeline
        for the LLM backends.
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

    @property
    def base(self) -> LakeConfig:
        """The heaviest current component: the reference for capacity and fixed fields."""
        return main_config(self.current)

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
    """

    mixture: Mixture
    decision: str
    reason: str = ""
    record: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)

    def to_json(self, engineer: str, stage: int) -> dict:
        return {
            "engineer": engineer,
            "stage": stage,
            "next_stage": stage + 1,
            "decision": self.decision,
            "reason": self.reason,
            "proposal": mixture_to_obj(self.mixture),
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


# ============================================================================ fixed
class FixedEngineer(Engineer):
    """The fixed-environment baseline: every stage trains on the initial environment."""

    name = "fixed"

    def __init__(self, name: str = "fixed", **_: Any) -> None:
        self.name = name

    def propose(self, ctx: EngineerContext) -> Proposal:
        return Proposal(ctx.initial, "kept", "fixed baseline: the initial environment every stage")


# ============================================================================ manual
class ManualEngineer(Engineer):
    """A hand-written curriculum: ``stages[i]`` is the environment of stage ``i + 1``.

    Entries are LakeConfig field mappings (missing fields keep the current values) or
    ``{mixture: [{weight, config}, ...]}``; past the end of the list the last entry repeats.
    With ``first_is_stage_1`` (default) ``stages[0]`` replaces the run's ``env`` for stage 1;
    otherwise stage 1 trains on ``env`` and ``stages[0]`` is stage 2's environment.
    """

    name = "manual"

    def __init__(self, stages: Sequence[Any], name: str = "manual", first_is_stage_1: bool = True, **_: Any) -> None:
        stages = to_plain(stages)
        if not stages:
            raise ConfigError("engineer.stages: give at least one stage environment")
        self.stages = list(stages)
        self.first_is_stage_1 = bool(first_is_stage_1)
        self.name = name

    def _entry(self, index: int, base: LakeConfig) -> Mixture:
        index = min(index, len(self.stages) - 1)
        try:
            return mixture_from_obj(self.stages[index], base)
        except ProposalError as err:
            raise ConfigError(f"engineer.stages[{index}]: {err}") from None

    def initial_mixture(self, default: Mixture) -> Mixture:
        return self._entry(0, main_config(default)) if self.first_is_stage_1 else default

    def propose(self, ctx: EngineerContext) -> Proposal:
        index = ctx.stage if self.first_is_stage_1 else ctx.stage - 1
        index = min(index, len(self.stages) - 1)
        return Proposal(self._entry(index, ctx.base), "proposed", f"manual curriculum entry {index}",
                        record={"entry": index})


# ============================================================================ random
class RandomEngineer(Engineer):
    """A uniformly random valid config from the space each stage."""

    name = "random"

    def __init__(self, space: Optional[Mapping[str, Any]] = None, name: str = "random", **_: Any) -> None:
        self.space_node = space
        self.name = name

    def propose(self, ctx: EngineerContext) -> Proposal:
        space = space_from_conf(ctx.base, self.space_node)
        config = space.sample(ctx.rng(1))
        check_in_space([(1.0, config)], space, 1)
        return Proposal([(1.0, config)], "proposed", "uniform random config")


# ============================================================================ heuristic
_LADDER_FIELDS = ("size", "height", "width", "num_agents", "hole_density", "conflict_density", "slip_prob", "max_steps")


def _shift(space: ConfigSpace, config: LakeConfig, name: str, rungs: int) -> Optional[LakeConfig]:
    """``config`` with ``name`` (``size`` = height and width) moved ``rungs`` grid steps;
    None when it cannot move (end of the grid, or no valid config that way)."""
    names = ("height", "width") if name == "size" else (name,)
    values = config.to_dict()
    for n in names:
        if n not in space.values:
            return None
        grid = space.values[n]
        current = _nearest(grid, values[n])
        i = grid.index(current) + rungs
        if not 0 <= i < len(grid):
            return None
        values[n] = grid[i]
    try:
        moved = LakeConfig(**values)
    except ConfigError:
        return None
    return None if moved == config else moved


#: Evaluation modes an engineer may read its success signal from (``llm.evaluate``).
EVAL_MODES = ("greedy", "sampled")


def _check_mode(mode: Any) -> str:
    if mode not in EVAL_MODES:
        raise ConfigError(f"engineer.mode={mode!r} not in {list(EVAL_MODES)}")
    return mode


class HeuristicEngineer(Engineer):
    """A threshold ladder that climbs while the policy succeeds and settles where it failed.

    With ``p`` the success on the current environment (``mode`` decoding, see
    :func:`stage_success`), one step of the ladder is, in this order:

    1. ``p`` unknown -- keep the environment.
    2. **settled** (a raise has failed before, ``state["settled"]`` is that last good config):
       keep it for the rest of the run; only if the settled config itself fails
       (``p < lower_below``) lower it one rung (the ladder's last dimension that can go down)
       and settle there instead. It never raises again, so it cannot oscillate.
    3. ``p >= raise_above`` -- the config worked: remember it as ``last_good`` and raise the
       next dimension of ``ladder`` (round robin, skipping dimensions at their top) by its
       ``step`` grid rungs.
    4. ``p < lower_below`` -- too hard: with a ``last_good`` config other than the current one,
       go back to it and **settle** there (step 2 from now on); without one (the first config
       is already too hard), lower one rung and keep climbing from there.
    5. otherwise keep the current config (it is being learned; a later success raises on).

    So a success sequence ``0.9, 0.9, 0.1, 0.9, ...`` from ``A`` trains on ``A, B, C, B, B, ...``:
    ``C`` failed, ``B`` was the last config that worked, and the ladder stays there.
    Every proposal lies in the engineer's ``space`` (:func:`check_in_space`).
    """

    name = "heuristic"

    def __init__(
        self,
        ladder: Sequence[Mapping[str, Any]] = (
            {"field": "size", "step": 1},
            {"field": "num_agents", "step": 1},
            {"field": "hole_density", "step": 2},
            {"field": "conflict_density", "step": 2},
        ),
        raise_above: float = 0.7,
        lower_below: float = 0.3,
        signal: str = "current_env",
        mode: str = "greedy",
        space: Optional[Mapping[str, Any]] = None,
        name: str = "heuristic",
        **_: Any,
    ) -> None:
        ladder = to_plain(ladder)
        self.ladder = []
        for i, rung in enumerate(ladder):
            f, step = rung.get("field"), int(rung.get("step", 1))
            if f not in _LADDER_FIELDS:
                raise ConfigError(f"engineer.ladder[{i}].field={f!r} not in {list(_LADDER_FIELDS)}")
            if step < 1:
                raise ConfigError(f"engineer.ladder[{i}].step={step} not in [1, inf)")
            self.ladder.append((f, step))
        if not self.ladder:
            raise ConfigError("engineer.ladder: give at least one rung")
        if not 0.0 <= lower_below <= raise_above <= 1.0:
            raise ConfigError(
                f"engineer thresholds need 0 <= lower_below <= raise_above <= 1, got "
                f"lower_below={lower_below}, raise_above={raise_above}"
            )
        if signal not in ("current_env", "suite"):
            raise ConfigError(f"engineer.signal={signal!r} not in ['current_env', 'suite']")
        self.raise_above, self.lower_below = float(raise_above), float(lower_below)
        self.signal, self.mode, self.space_node, self.name = signal, _check_mode(mode), space, name

    def _lower(self, space: ConfigSpace, config: LakeConfig) -> Optional[tuple[str, LakeConfig]]:
        for f, step in reversed(self.ladder):
            moved = _shift(space, config, f, -step)
            if moved is not None:
                return f, moved
        return None

    def propose(self, ctx: EngineerContext) -> Proposal:
        space = space_from_conf(ctx.base, self.space_node)
        proposal = self._step(ctx, space)
        if proposal.decision == "proposed":  # a kept environment is the run's, on the grid or not
            # fields the ladder did not move may still be off the grid (the run's initial env)
            proposal.mixture = [(w, space.snap(c)) for w, c in proposal.mixture]
            check_in_space(proposal.mixture, space, 1)
        return proposal

    def _step(self, ctx: EngineerContext, space: ConfigSpace) -> Proposal:
        current = ctx.base
        state = dict(ctx.state or {})
        pointer = int(state.get("next_rung", 0)) % len(self.ladder)
        p = stage_success(ctx.eval_result, self.mode, self.signal)
        new_state = {"next_rung": pointer, "last_good": state.get("last_good"), "settled": state.get("settled"),
                     "success": p}

        def go(config: LakeConfig, why: str) -> Proposal:
            if [(1.0, config)] == ctx.current or (len(ctx.current) == 1 and ctx.current[0][1] == config):
                return Proposal(ctx.current, "kept", why, state=new_state)
            return Proposal([(1.0, config)], "proposed", why, state=new_state)

        if p is None:
            return Proposal(ctx.current, "kept", "no success measurement; keeping the environment", state=new_state)
        if new_state["settled"]:
            settled = LakeConfig.from_dict(new_state["settled"])
            if p < self.lower_below and current == settled:
                lowered = self._lower(space, settled)
                if lowered is not None:
                    new_state["settled"] = lowered[1].to_dict()
                    return go(lowered[1], f"success {p:.2f} < {self.lower_below} on the settled config: "
                                          f"lower {lowered[0]} and settle there")
            return go(settled, f"success {p:.2f}; settled on the last config that worked after a failed raise")
        if p >= self.raise_above:
            new_state["last_good"] = current.to_dict()
            for offset in range(len(self.ladder)):
                i = (pointer + offset) % len(self.ladder)
                f, step = self.ladder[i]
                moved = _shift(space, current, f, step)
                if moved is not None:
                    new_state["next_rung"] = (i + 1) % len(self.ladder)
                    return go(moved, f"success {p:.2f} >= {self.raise_above}: raise {f}")
            return go(current, f"success {p:.2f} but every dimension is at its top")
        if p < self.lower_below:
            last_good = new_state["last_good"]
            if last_good and LakeConfig.from_dict(last_good) != current:
                new_state["settled"] = last_good
                return go(LakeConfig.from_dict(last_good),
                          f"success {p:.2f} < {self.lower_below}: back to the last config that worked, settled there")
            lowered = self._lower(space, current)
            if lowered is not None:
                return go(lowered[1], f"success {p:.2f} < {self.lower_below}: lower {lowered[0]}")
            return go(current, f"success {p:.2f} but nothing can be lowered")
        return go(current, f"success {p:.2f} in [{self.lower_below}, {self.raise_above}): keep what is being learned")


# ============================================================================ PLR
def _config_key(config: LakeConfig) -> str:
    return json.dumps(config.to_dict(), sort_keys=True)


class PLREngineer(Engineer):
    """Prioritized level replay over configs, scored by learnability ``p (1 - p)``.

    The buffer holds the held-out suite's cell configs (their success ``p`` measured by this
    stage's evaluation, ``mode`` results) and every config trained so far (``p`` from the
    current-environment evaluation when available). Priorities are rank-based,
    ``h_i = rank_i^(-1/temperature)``, mixed with a staleness term (stages since a config
    was last trained): ``P = (1 - staleness_coef) P_score + staleness_coef P_stale``.
    The proposal is a mixture of ``top_k`` configs drawn without replacement from ``P``,
    weighted by their priorities; with probability ``explore_prob`` one of them is a random
    config from the space instead.
    """

    name = "plr"

    def __init__(
        self,
        top_k: int = 2,
        temperature: float = 0.3,
        staleness_coef: float = 0.3,
        explore_prob: float = 0.1,
        mode: str = "sampled",
        space: Optional[Mapping[str, Any]] = None,
        name: str = "plr",
        **_: Any,
    ) -> None:
        if int(top_k) < 1:
            raise ConfigError(f"engineer.top_k={top_k} not in [1, inf)")
        if not temperature > 0:
            raise ConfigError(f"engineer.temperature={temperature} not in (0, inf)")
        if not 0.0 <= staleness_coef <= 1.0:
            raise ConfigError(f"engineer.staleness_coef={staleness_coef} not in [0, 1]")
        if not 0.0 <= explore_prob <= 1.0:
            raise ConfigError(f"engineer.explore_prob={explore_prob} not in [0, 1]")
        self.top_k, self.temperature = int(top_k), float(temperature)
        self.staleness_coef, self.explore_prob = float(staleness_coef), float(explore_prob)
        self.mode, self.space_node, self.name = _check_mode(mode), space, name

    def _buffer(self, ctx: EngineerContext, space: ConfigSpace) -> dict[str, dict]:
        """key -> {config, p, last_trained}; suite cells moved onto the run's capacity."""
        buffer: dict[str, dict] = {k: dict(v) for k, v in (ctx.state or {}).get("buffer", {}).items()}
        base = ctx.base
        mode = self.mode if self.mode in (ctx.eval_result.get("modes") or {}) else "greedy"
        for cell in (ctx.eval_result.get("modes") or {}).get(mode, {}).get("by_cell", []):
            cfg_dict = cell.get("config")
            if not cfg_dict or cell.get("n", 0) == 0:
                continue
            values = {**cfg_dict, **{c: getattr(base, c) for c in CAPACITY_FIELDS}}
            try:
                # onto the engineer's space: the suite's fixed fields (max_steps, slip_prob, ...)
                # become the run's, editable ones move to their nearest allowed value
                config = space.snap(LakeConfig(**values))
            except (ConfigError, IndexError):
                continue  # does not fit the run's capacity
            key = _config_key(config)
            entry = buffer.setdefault(key, {"config": config.to_dict(), "last_trained": None})
            entry["p"] = float(cell["score"])
        p_current = stage_success(ctx.eval_result, mode, "current_env")
        for _, config in ctx.current:
            key = _config_key(config)
            entry = buffer.setdefault(key, {"config": config.to_dict(), "p": None})
            entry["last_trained"] = ctx.stage
            if p_current is not None:
                entry["p"] = p_current
        return buffer

    def propose(self, ctx: EngineerContext) -> Proposal:
        space = space_from_conf(ctx.base, self.space_node)
        rng = ctx.rng(2)
        buffer = self._buffer(ctx, space)
        keys = [k for k, v in buffer.items() if v.get("p") is not None]
        if not keys:
            config = space.sample(rng)
            return Proposal([(1.0, config)], "proposed", "no scored configs yet: a random one",
                            state={"buffer": buffer})
        scores = np.array([buffer[k]["p"] * (1.0 - buffer[k]["p"]) for k in keys])
        order = np.argsort(-scores, kind="stable")
        ranks = np.empty(len(keys))
        ranks[order] = np.arange(1, len(keys) + 1)
        h = ranks ** (-1.0 / self.temperature)
        p_score = h / h.sum()
        stale = np.array(
            [ctx.stage - (buffer[k]["last_trained"] if buffer[k].get("last_trained") is not None else 0) for k in keys],
            dtype=float,
        )
        p_stale = stale / stale.sum() if stale.sum() > 0 else np.full(len(keys), 1.0 / len(keys))
        prob = (1.0 - self.staleness_coef) * p_score + self.staleness_coef * p_stale
        k = min(self.top_k, len(keys))
        picked = rng.choice(len(keys), size=k, replace=False, p=prob)
        items = [(float(prob[i]), LakeConfig.from_dict(buffer[keys[i]]["config"])) for i in picked]
        explored = False
        if rng.random() < self.explore_prob:
            items[-1] = (items[-1][0], space.sample(rng))
            explored = True
        # trained configs may predate the space (the run's initial env): moved onto it too
        mixture = normalize_mixture([(w, space.snap(c)) for w, c in items])
        check_in_space(mixture, space, self.top_k)
        table = [
            {"config": buffer[keys[i]]["config"], "p": buffer[keys[i]]["p"], "learnability": float(scores[i]),
             "priority": float(prob[i])}
            for i in order[: min(10, len(keys))]
        ]
        return Proposal(
            mixture,
            "proposed",
            f"replayed {k} config(s) by learnability p(1-p)" + (" (+1 random)" if explored else ""),
            record={"top_priorities": table},
            state={"buffer": buffer},
        )


# ============================================================================ retries
def retry_prompt(prompt: str, raw: str, error: str) -> str:
    """The prompt of the next attempt: the original plus the rejected answer and why (its
    think block left out, as Qwen3's chat template drops earlier thinking)."""
    if "</think>" in raw:
        raw = raw.rsplit("</think>", 1)[1].lstrip("\n")
    shown = raw if len(raw) <= 2000 else raw[:2000] + " ..."
    return (
        f"{prompt}\n\nYour previous answer was:\n{shown}\n\nIt was rejected: {error}\n"
        "Answer again with exactly one JSON object that fixes this."
    )


class FatalEngineerError(RuntimeError):
    """A failure that another attempt cannot fix (a prompt over the endpoint's context, a
    refused redirect, HTTP 400/401/403/404): :func:`propose_with_retries` stops at once."""


def propose_with_retries(
    ask: Callable[[str, int], str],
    prompt: str,
    ctx: EngineerContext,
    retries: int = 2,
    space: Optional["ConfigSpace"] = None,
    max_components: int = 1,
) -> Proposal:
    """Ask, validate, retry with the error shown, fall back to the current environment.

    ``ask(prompt, attempt) -> raw text`` may raise (network errors, ...): that counts as a
    failed attempt (a :class:`FatalEngineerError` ends the attempts at once). Each answer is
    parsed and validated (:class:`LakeConfig`; with ``space``, :func:`check_in_space` with
    ``max_components``) and a rejected answer is shown to the model with the error in the
    next prompt (:func:`retry_prompt`). Never raises on bad output. The record holds every
    attempt's prompt, raw output, parsed object and errors.
    """
    attempts = []
    current_prompt = prompt
    for attempt in range(int(retries) + 1):
        entry: dict[str, Any] = {"attempt": attempt, "prompt": current_prompt}
        try:
            raw = ask(current_prompt, attempt)
        except Exception as err:  # noqa: BLE001 - a backend failure must not crash the run
            entry.update(raw_output=None, parsed=None, errors=[f"{type(err).__name__}: {err}"])
            attempts.append(entry)
            if isinstance(err, FatalEngineerError):
                break  # the same request would fail the same way
            current_prompt = prompt  # nothing to show; ask again
            continue
        entry["raw_output"] = raw
        try:
            parsed = extract_json(raw)
            entry["parsed"] = parsed
            mixture = mixture_from_obj(parsed, ctx.base)
            if space is not None:
                check_in_space(mixture, space, max_components)
        except ProposalError as err:
            entry.setdefault("parsed", None)
            entry["errors"] = [str(err)]
            attempts.append(entry)
            current_prompt = retry_prompt(prompt, raw, str(err))
            continue
        entry["errors"] = []
        attempts.append(entry)
        return Proposal(
            mixture,
            "proposed",
            f"valid proposal on attempt {attempt + 1}",
            record=_attempt_record(attempts),
        )
    return Proposal(
        ctx.current,
        "fallback",
        f"no valid proposal in {len(attempts)} attempt(s); keeping the current environment",
        record=_attempt_record(attempts),
    )


def _attempt_record(attempts: list[dict]) -> dict:
    last = attempts[-1] if attempts else {}
    return {
        "prompt": attempts[0]["prompt"] if attempts else None,
        "raw_output": last.get("raw_output"),
        "parsed": last.get("parsed"),
        "validation_errors": [e for a in attempts for e in a.get("errors", [])],
        "attempts": attempts,
    }


# ============================================================================ factory
def build_engineer(node: Any) -> Engineer:
    """Instantiate an engineer from its Hydra node (``_target_`` + parameters)."""
    from hydra.utils import instantiate
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, Mapping) and not isinstance(node, DictConfig):
        node = OmegaConf.create(dict(node))
    if "_target_" not in node:
        raise ConfigError(
            "engineer config has no _target_; select a backend with engineer=<name> "
            "(policy, base, external, heuristic, plr, random, fixed, manual)"
        )
    engineer = instantiate(node, _convert_="all")
    if not isinstance(engineer, Engineer):
        raise ConfigError(f"engineer._target_={node._target_} did not build an Engineer")
    return engineer
