"""The space an engineer chooses from: :class:`ConfigSpace` and :func:`check_in_space`.

A :class:`ConfigSpace` is the run's current config (``base``: capacity and fixed fields)
plus, for each editable field, a finite grid of allowed values, with the cross-field rules of
:class:`~jaxlake.config.LakeConfig` (two free cells per agent, distance bounds) respected by
construction: :meth:`ConfigSpace.choices` only offers values that still complete to a valid
config. Every engineer's proposal passes :func:`check_in_space` (the baselines before they
answer, model replies before they are accepted), so all engineers search the same space.
An engineer's ``space:`` node (``editable``, ``values``) becomes one with :func:`space_from_conf`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from jaxlake.config import DYNAMIC_FIELDS, FIELD_BOUNDS, ConfigError, LakeConfig, reject_unknown
from jaxlake.engineers.base import ProposalError
from jaxlake.mixture import CAPACITY_FIELDS, Mixture

#: Order in which fields are chosen (constrained decoding, random sampling); later fields'
#: allowed values depend on earlier choices (e.g. ``num_agents`` on the region size).
FIELD_ORDER = DYNAMIC_FIELDS
#: Fields an engineer may change by default; the rest stay at the current config's values.
DEFAULT_EDITABLE = ("height", "width", "num_agents", "hole_density", "conflict_density", "slip_prob", "max_steps")


@dataclass(frozen=True)
class EditRules:
    """What an engineer's edit may do, and how it is applied.

    Attributes:
      max_add: new components one edit may add.
      max_drop: components one edit may drop.
      max_components: components the edited mixture may have.
      floor: the least weight any component keeps after an edit (so a re-weight never makes a
        component vanish; capped at ``1 / components``).
      min_keep: the least share of the mass the kept components keep between them when
        components are added (adds asking for more are scaled down); 0 lets adds take all.
      weights: the relative weights constrained decoding offers for a re-weight.
      shares: the shares constrained decoding offers for an added component.
    """

    max_add: int = 2
    max_drop: int = 1
    max_components: int = 12
    floor: float = 0.05
    min_keep: float = 0.5
    weights: tuple = (0.5, 1.0, 2.0)
    shares: tuple = (0.1, 0.25, 0.5)

    def __post_init__(self) -> None:
        for name, low in (("max_add", 0), ("max_drop", 0), ("max_components", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"engineer.space.edits.{name}={v!r} must be an integer in [{low}, inf)")
        for name in ("floor", "min_keep"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) < 1.0:
                raise ConfigError(f"engineer.space.edits.{name}={v!r} not in [0, 1)")
        for name, hi in (("weights", math.inf), ("shares", 1.0)):
            vals = getattr(self, name)
            if (not isinstance(vals, (list, tuple)) or not vals
                    or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= hi for v in vals)):
                raise ConfigError(f"engineer.space.edits.{name}={vals!r} must be a non-empty list of numbers in (0, {hi}]")
        object.__setattr__(self, "weights", tuple(float(v) for v in self.weights))
        object.__setattr__(self, "shares", tuple(float(v) for v in self.shares))

    @classmethod
    def from_node(cls, node: Optional[Mapping[str, Any]]) -> "EditRules":
        """Rules from an engineer's ``space.edits`` node (missing keys at their defaults)."""
        node = dict(node or {})
        reject_unknown("engineer.space.edits", node, [f.name for f in dataclasses.fields(cls)])
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in node.items()})

    def kinds(self, components: int) -> list[str]:
        """The kinds of edit these rules allow on a mixture of ``components`` components."""
        out = ["keep"]
        if components >= 2:
            out.append("reweight")
        if components >= 2 and self.max_drop >= 1:
            out.append("drop")
        if self.max_add >= 1 and components + 1 <= self.max_components:
            out.append("add")
        if self.max_drop >= 1 and self.max_add >= 1:
            out.append("replace")
        return out


#: Loose rules: any edit (a hand-written curriculum, the oracle's "broad" candidate).
ANY_EDIT = EditRules(max_add=64, max_drop=64, max_components=64, floor=0.0, min_keep=0.0)


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

    ``edits`` are the rules of the engineer's answers, edits of the current mixture
    (:class:`~jaxlake.engineers.edits.EditRules`: how many components an edit may add and
    drop, the floor weight, ...). Each editable field has a finite grid of allowed values (``values``; defaults derive from
    :data:`~jaxlake.config.FIELD_BOUNDS` and the capacity of ``base``); fields not editable
    keep ``base``'s value. :meth:`choices` returns the values of a field that still admit a
    valid :class:`LakeConfig` given earlier choices (in :data:`FIELD_ORDER`), checked by
    validating the most permissive completion -- so choosing field by field from
    :meth:`choices` always ends in a valid config.
    """

    base: LakeConfig
    editable: tuple = DEFAULT_EDITABLE
    values: dict = field(default_factory=dict)
    edits: EditRules = field(default_factory=EditRules)

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

    def configs(self) -> list[LakeConfig]:
        """Every valid config of the space: the product of the editable fields' grids (in
        :data:`FIELD_ORDER` order), ``base``'s value for the rest, invalid combinations left
        out (thousands for the default space: 3750 around ``env=tiny``)."""
        import itertools

        names = [n for n in self.editable]
        out = []
        for combo in itertools.product(*(self.values[n] for n in names)):
            try:
                out.append(self.complete(dict(zip(names, combo))))
            except ConfigError:
                continue
        return out

    def mixture(self) -> Mixture:
        """:meth:`configs` as one mixture of equal weights: the whole space, each config as
        likely (what the tiny planner is pretrained on, ``python -m jaxlake.pretrain``)."""
        return Mixture([(1.0, c) for c in self.configs()])

    def sample(self, rng: np.random.Generator) -> LakeConfig:
        """A config chosen field by field, uniformly among the allowed values."""
        partial: dict[str, Any] = {}
        for name in self.editable:
            options = self.choices(name, partial)
            partial[name] = options[int(rng.integers(len(options)))]
        return self.complete(partial)

    def snap(self, config: LakeConfig, no_harder: bool = False) -> LakeConfig:
        """``config`` moved onto the grid: each editable field to its nearest allowed value
        (in field order, respecting constraints). With ``no_harder``, to the nearest allowed
        value that is no harder than the field's own (:data:`EASIER_WHEN_LARGER` says which way
        is easier), when one exists: an off-grid 0.28 holes snaps to 0.25, not 0.3."""
        partial: dict[str, Any] = {}
        for name in self.editable:
            options = self.choices(name, partial)
            target = getattr(config, name)
            if no_harder and target not in options:
                easier = [o for o in options if isinstance(o, (int, float)) and not isinstance(o, bool)
                          and (o >= target if name in EASIER_WHEN_LARGER else o <= target)]
                options = easier or options
            partial[name] = nearest_value(options, target)
        return self.complete(partial)

    def shift(self, config: LakeConfig, names: Sequence[str], rungs: int) -> Optional[LakeConfig]:
        """``config`` with each field of ``names`` moved ``rungs`` steps along its grid (from
        its nearest grid value); None when a field is not editable, would leave its grid, or
        the result is not a valid config or equals ``config``."""
        values = config.to_dict()
        for name in names:
            if name not in self.values:
                return None
            grid = self.values[name]
            i = grid.index(nearest_value(grid, values[name])) + int(rungs)
            if not 0 <= i < len(grid):
                return None
            values[name] = grid[i]
        try:
            moved = LakeConfig(**values)
        except ConfigError:
            return None
        return None if moved == config else moved

    def neighbours(self, config: LakeConfig) -> list[LakeConfig]:
        """Every valid config one grid step away from ``config`` in one editable field (in
        field order, down before up): the smallest edits the space allows."""
        out = []
        for name in self.editable:
            for rungs in (-1, 1):
                moved = self.shift(config, (name,), rungs)
                if moved is not None and moved not in out:
                    out.append(moved)
        return out


def _on_grid(value: Any, grid: Sequence[Any]) -> bool:
    """Whether ``value`` is one of ``grid``'s values (floats within 1e-6: ``0.1 + 0.2`` is 0.3)."""
    for g in grid:
        if isinstance(g, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
            if abs(float(value) - g) <= 1e-6:
                return True
        elif value == g and type(value) is type(g):
            return True
    return False


def check_in_space(mixture: Mixture, space: ConfigSpace, max_components: int = 1) -> None:
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


#: Editable fields whose larger values make a lake easier (more time); every other numeric
#: field (size, agents, holes, conflicts, slip, path lengths) is harder when larger.
EASIER_WHEN_LARGER = frozenset({"max_steps"})


def nearest_value(options: Sequence[Any], target: Any) -> Any:
    """``target`` if it is among ``options``, else the numerically nearest option (the lower
    one on ties), else the first option."""
    if target in options:
        return target
    numeric = [o for o in options if isinstance(o, (int, float)) and not isinstance(o, bool)]
    if numeric and isinstance(target, (int, float)):
        return min(numeric, key=lambda o: (abs(o - target), o))
    return options[0]


def space_from_conf(base: LakeConfig, node: Optional[Mapping[str, Any]]) -> ConfigSpace:
    """A :class:`ConfigSpace` from an engineer's ``space:`` node (``editable``, ``values``,
    ``edits``: :class:`~jaxlake.engineers.edits.EditRules`)."""
    node = dict(node or {})
    reject_unknown("engineer.space", node, ("editable", "values", "edits"))
    editable = tuple(node.get("editable") or DEFAULT_EDITABLE)
    values = {k: list(v) for k, v in dict(node.get("values") or {}).items()}
    bad = sorted(set(values) - set(editable))
    if bad:
        raise ConfigError(f"engineer.space.values names field(s) {bad} that are not editable ({list(editable)})")
    return ConfigSpace(base=base, editable=editable, values=values, edits=EditRules.from_node(node.get("edits")))


