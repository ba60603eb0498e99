"""``LakeConfig``: the multi-dimensional environment configuration.

A ``LakeConfig`` is three things at once:

* a typed Python dataclass, validated on construction with errors that name the field and
  its allowed range (``ConfigError: num_agents=30 exceeds max_agents=8``);
* a Hydra structured config (``conf/env/*.yaml`` presets are checked against it);
* a JAX pytree whose *dynamic* fields are leaves and whose *static capacity*
  (``max_height``, ``max_width``, ``max_agents``) lives in the treedef. Configs of the same
  capacity therefore stack (:func:`stack_configs`) and ``jax.vmap(generate)`` runs a mixed
  batch in one compilation.

``on_goal`` is ``"vanish"`` or ``"stay"`` in Python; as a pytree leaf it becomes its integer
code (``types.ON_GOAL_VANISH`` / ``types.ON_GOAL_STAY``), so a config that went through
``jax.tree_util`` (for example a stacked one) may hold the code or an int array there. Use
:func:`on_goal_code` to read it either way.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlake.types import MAX_AGENTS_LIMIT, ON_GOAL_CODES


class ConfigError(ValueError):
    """A configuration value is out of its allowed range."""


def unknown_message(section: str, unknown: Iterable[Any], allowed: Iterable[Any]) -> str:
    """The one-line message of unknown keys: ``unknown <section> field(s) [...]; allowed: [...]``.

    Both lists are sorted (as strings), so the message does not depend on mapping order. The
    model layer (``llm.model.errors``, which imports nothing of jaxlake) builds the same form.
    """
    return f"unknown {section} field(s) {sorted(unknown, key=str)}; allowed: {sorted(allowed, key=str)}"


def reject_unknown(section: str, given: Iterable[Any], allowed: Iterable[Any],
                   error: type[Exception] = ConfigError) -> None:
    """Raise ``error`` naming ``section``, the keys of ``given`` not in ``allowed``, and the
    allowed ones (:func:`unknown_message`); nothing when every key is allowed.

    ``given`` is a mapping (its keys) or an iterable of names; ``section`` is the config path a
    user would edit (``train.grpo``, ``eval.base``, ``LakeConfig``).
    """
    allowed = set(allowed)
    unknown = [k for k in given if k not in allowed]
    if unknown:
        raise error(unknown_message(section, unknown, allowed))


def check_int(where: str, value: Any, low: int = 0, *, error: type[Exception] = ConfigError) -> int:
    """``value`` as an ``int`` when it is an integer (a bool is not) of at least ``low``; else
    ``error``, one line naming the field and its range: ``<where>=<value> must be an integer in
    [<low>, inf)`` (``where`` is the config path a user would edit, ``ippo.num_envs``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise error(f"{where}={value!r} must be an integer in [{low}, inf)")
    return int(value)


def check_number(where: str, value: Any, low: float, high: float, *, low_open: bool = False,
                 error: type[Exception] = ConfigError) -> float:
    """``value`` as a ``float`` when it is a real number (a bool is not) in ``[low, high]``
    (``(low, high]`` with ``low_open``); else ``error``, one line naming the field and its range:
    ``<where>=<value> must be a number in [<low>, <high>]`` (a number shown as a float)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise error(f"{where}={value!r} must be a number in {bracket}{low:g}, {high:g}]")
    return value


#: Hard limits of the static canvas.
MAX_CANVAS = 64

#: Bounds of every numeric field, for validation messages and for the environment
#: engineer's constrained decoding. ``None`` means "see the capacity fields".
FIELD_BOUNDS: dict[str, tuple[float, float]] = {
    "height": (2, MAX_CANVAS),
    "width": (2, MAX_CANVAS),
    "num_agents": (1, MAX_AGENTS_LIMIT),
    "hole_density": (0.0, 0.9),
    "conflict_density": (0.0, 1.0),
    "slip_prob": (0.0, 1.0),
    "max_steps": (1, 1024),
    "min_dist": (1, MAX_CANVAS * MAX_CANVAS),
    "max_dist": (1, MAX_CANVAS * MAX_CANVAS),
    "max_height": (2, MAX_CANVAS),
    "max_width": (2, MAX_CANVAS),
    "max_agents": (1, MAX_AGENTS_LIMIT),
}

#: Fields that are pytree leaves (in this order); the rest are static capacity.
DYNAMIC_FIELDS = (
    "height",
    "width",
    "num_agents",
    "hole_density",
    "conflict_density",
    "slip_prob",
    "max_steps",
    "min_dist",
    "max_dist",
    "on_goal",
)
STATIC_FIELDS = ("max_height", "max_width", "max_agents")
INT_FIELDS = ("height", "width", "num_agents", "max_steps", "min_dist", "max_dist")
FLOAT_FIELDS = ("hole_density", "conflict_density", "slip_prob")


def on_goal_code(value: Any) -> Any:
    """Integer code of an ``on_goal`` value given as a name, a code or an array of codes."""
    if isinstance(value, str):
        if value not in ON_GOAL_CODES:
            raise ConfigError(f"on_goal={value!r} not in {sorted(ON_GOAL_CODES)}")
        return ON_GOAL_CODES[value]
    return value


def _is_concrete_scalar(value: Any) -> bool:
    return isinstance(value, (numbers.Number, str, np.generic)) and not isinstance(value, bool)


@dataclass
class LakeConfig:
    """Environment configuration (docs/rules.md#configuration).

    Region ``height x width`` sits in the top-left of a static ``max_height x max_width``
    canvas; ``num_agents`` of ``max_agents`` slots are in play. ``hole_density`` and
    ``conflict_density`` are *targets* for the batch mean; the generator reports the achieved
    values per lake. ``min_dist``/``max_dist`` bound each agent's BFS start-goal distance
    (``max_dist=None`` means no upper bound).
    """

    height: int = 5
    width: int = 5
    num_agents: int = 2
    hole_density: float = 0.1
    conflict_density: float = 0.5
    slip_prob: float = 0.0
    max_steps: int = 16
    min_dist: int = 1
    max_dist: Optional[int] = None
    on_goal: str = "vanish"
    max_height: int = 8
    max_width: int = 8
    max_agents: int = 4

    def __post_init__(self) -> None:
        if all(_is_concrete_scalar(getattr(self, f)) for f in DYNAMIC_FIELDS if f != "max_dist"):
            self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> "LakeConfig":
        """Check every field; raise :class:`ConfigError` naming the field and its range."""
        for name in STATIC_FIELDS + INT_FIELDS:
            value = getattr(self, name)
            if name == "max_dist" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
                if isinstance(value, float) and float(value).is_integer():
                    setattr(self, name, int(value))
                else:
                    raise ConfigError(f"{name}={value!r} must be an integer")
        for name in FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
                raise ConfigError(f"{name}={value!r} must be a number")
            setattr(self, name, float(value))

        def check_range(name: str, lo: float, hi: float) -> None:
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ConfigError(f"{name}={value} not in [{lo}, {hi}]")

        for name in STATIC_FIELDS:
            check_range(name, *FIELD_BOUNDS[name])
        for cap, name in (("max_height", "height"), ("max_width", "width"), ("max_agents", "num_agents")):
            lo = FIELD_BOUNDS[name][0]
            value, limit = getattr(self, name), getattr(self, cap)
            if value > limit:
                raise ConfigError(f"{name}={value} exceeds {cap}={limit}")
            if value < lo:
                raise ConfigError(f"{name}={value} not in [{lo}, {cap}={limit}]")
        for name in ("hole_density", "conflict_density", "slip_prob", "max_steps"):
            check_range(name, *FIELD_BOUNDS[name])
        cells = self.height * self.width
        if 2 * self.num_agents > cells:
            raise ConfigError(
                f"num_agents={self.num_agents} needs {2 * self.num_agents} distinct start/goal "
                f"cells but the {self.height}x{self.width} region has only {cells}"
            )
        frozen = cells - int(round(self.hole_density * cells))
        if 2 * self.num_agents > frozen:
            raise ConfigError(
                f"hole_density={self.hole_density} leaves {frozen} frozen cells in the "
                f"{self.height}x{self.width} region, fewer than the {2 * self.num_agents} that "
                f"num_agents={self.num_agents} needs; lower hole_density"
            )
        longest = cells - 1
        if not 1 <= self.min_dist <= longest:
            raise ConfigError(f"min_dist={self.min_dist} not in [1, {longest}] for a {self.height}x{self.width} region")
        if self.max_dist is not None and not self.min_dist <= self.max_dist:
            raise ConfigError(f"max_dist={self.max_dist} not in [min_dist={self.min_dist}, {longest}]")
        on_goal_code(self.on_goal)
        if not isinstance(self.on_goal, str):
            raise ConfigError(f"on_goal={self.on_goal!r} not in ['stay', 'vanish']")
        return self

    # ------------------------------------------------------------------ conversions
    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "LakeConfig":
        """Build from a mapping (a Hydra/OmegaConf node, JSON); unknown keys are an error."""
        values = dict(values)
        values.pop("_target_", None)
        reject_unknown("LakeConfig", values, (f.name for f in dataclasses.fields(cls)))
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "LakeConfig":
        return dataclasses.replace(self, **changes)

    @property
    def capacity(self) -> tuple[int, int, int]:
        """Static capacity ``(max_height, max_width, max_agents)``."""
        return (self.max_height, self.max_width, self.max_agents)

    @property
    def effective_max_dist(self) -> int:
        return self.max_height * self.max_width if self.max_dist is None else self.max_dist


# ---------------------------------------------------------------------- pytree registration
def _flatten(config: LakeConfig):
    children = []
    for name in DYNAMIC_FIELDS:
        value = getattr(config, name)
        if name == "on_goal":
            value = on_goal_code(value)
        elif name == "max_dist" and value is None:
            value = config.max_height * config.max_width
        children.append(value)
    return tuple(children), tuple(getattr(config, name) for name in STATIC_FIELDS)


def _unflatten(aux, children) -> LakeConfig:
    config = object.__new__(LakeConfig)
    for name, value in zip(DYNAMIC_FIELDS, children):
        object.__setattr__(config, name, value)
    for name, value in zip(STATIC_FIELDS, aux):
        object.__setattr__(config, name, value)
    return config


jax.tree_util.register_pytree_node(LakeConfig, _flatten, _unflatten)


def config_arrays(config: LakeConfig) -> LakeConfig:
    """The config with every dynamic leaf as a typed jnp array (int32 / float32)."""
    leaves, treedef = jax.tree_util.tree_flatten(config)
    typed = []
    for name, leaf in zip(DYNAMIC_FIELDS, leaves):
        dtype = jnp.float32 if name in FLOAT_FIELDS else jnp.int32
        typed.append(jnp.asarray(leaf, dtype=dtype))
    return jax.tree_util.tree_unflatten(treedef, typed)


def stack_configs(configs: Sequence[LakeConfig]) -> LakeConfig:
    """Stack configs of one capacity into a config whose leaves have a leading ``[n]`` axis."""
    configs = list(configs)
    if not configs:
        raise ConfigError("stack_configs needs at least one config")
    first = configs[0]
    for i, c in enumerate(configs[1:], start=1):
        for name in STATIC_FIELDS:
            if getattr(c, name) != getattr(first, name):
                raise ConfigError(
                    f"configs[{i}].{name}={getattr(c, name)} differs from configs[0].{name}="
                    f"{getattr(first, name)}; stacked configs must share static capacity"
                )
    typed = [config_arrays(c) for c in configs]
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *typed)


def repeat_config(config: LakeConfig, n: int) -> LakeConfig:
    """A stacked config of ``n`` copies of ``config`` (leaves ``[n]``)."""
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n,) + jnp.shape(x)), config_arrays(config))


def common_capacity(configs: Iterable[LakeConfig]) -> tuple[int, int, int]:
    """The smallest capacity that holds every config (for mixing different capacities)."""
    configs = list(configs)
    return (
        max(c.height for c in configs) if configs else 0,
        max(c.width for c in configs) if configs else 0,
        max(c.num_agents for c in configs) if configs else 0,
    )


def with_capacity(config: LakeConfig, max_height: int, max_width: int, max_agents: int) -> LakeConfig:
    """The same environment on another static canvas (validated)."""
    return dataclasses.replace(config, max_height=max_height, max_width=max_width, max_agents=max_agents)


def register_hydra_schema() -> None:
    """Register ``LakeConfig`` in Hydra's ConfigStore as ``env/schema``."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="env", name="schema", node=LakeConfig)


# ============================================================================ raw config nodes
def to_plain(node: Any) -> Any:
    """An OmegaConf node (``DictConfig`` / ``ListConfig``, interpolations resolved) as plain
    Python dicts and lists; anything else is returned unchanged. A required value left unset
    (``???``, e.g. ``model.path`` of the paper recipes) raises ``MissingMandatoryValue`` naming
    its key, rather than passing on the string ``"???"``."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    return node


def cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` of a mapping, ``DictConfig`` or dataclass-like object; ``default`` when
    ``cfg`` is ``None``, the key is missing, or its value is ``None``."""
    if cfg is None:
        return default
    if isinstance(cfg, Mapping) or hasattr(cfg, "get"):
        value = cfg.get(key, default)
    else:
        value = getattr(cfg, key, default)
    return default if value is None else value
