"""The environment of a training stage: a weighted **mixture** of :class:`~jaxlake.config.LakeConfig`.

One type and one validator for every consumer (the generator, the engineers, the pipeline,
the trainer). A :class:`Mixture` is an immutable sequence of ``(weight, LakeConfig)``
components whose weights are finite, positive and sum to one; it is checked and normalised
when it is built, so a ``Mixture`` in hand is always valid::

    Mixture([(3, a), (1, b)])           # -> ((0.75, a), (0.25, b)); zero weights are dropped
    Mixture.of(config)                  # one config -> ((1.0, config),)
    mixture_from_obj({"height": 6}, base)             # an engineer's JSON answer
    mixture_from_node(cfg.env)                        # a Hydra env node (config or {mixture: [...]})
    load_mixture("stage_2/env.yaml"), mixture_to_yaml(m), mixture_to_obj(m)

Serialised form (``env.yaml``, ``next_env.yaml``, ``engineer.json``)::

    mixture:
      - {weight: 0.75, config: {height: 5, width: 5, ...}}
      - {weight: 0.25, config: {...}}

Errors are :class:`MixtureError` (a :class:`~jaxlake.config.ConfigError`), naming the
component and the field (``mixture[1].weight=-1.0 not in [0, inf)``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np

from jaxlake.config import ConfigError, LakeConfig, reject_unknown, to_plain

#: Static capacity fields: every component of an engineer's proposal keeps the run's.
CAPACITY_FIELDS = ("max_height", "max_width", "max_agents")


class MixtureError(ConfigError):
    """A mixture (or an answer meant as one) is not valid; the message names the component."""


def check_weights(weights: Iterable[Any]) -> list[float]:
    """The weights as floats, checked: at least one, each a finite number ``>= 0``, a positive
    sum. Raises :class:`MixtureError` naming the offending entry. The one weight check, used by
    :class:`Mixture` and by the generator's :func:`~jaxlake.generator.mixture_counts`."""
    out = []
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise MixtureError(f"mixture[{i}].weight={w!r} must be a number")
        w = float(w)
        if not math.isfinite(w) or w < 0:
            raise MixtureError(f"mixture[{i}].weight={w} not in [0, inf)")
        out.append(w)
    if not out:
        raise MixtureError("mixture is empty: give at least one (weight, config) component")
    if sum(out) <= 0:
        raise MixtureError("mixture weights sum to 0; give at least one positive weight")
    return out


class Mixture(tuple):
    """An immutable, validated sequence of ``(weight, LakeConfig)`` components.

    Built from any iterable of pairs: weights are checked (:func:`check_weights`), components
    of weight 0 dropped and the rest rescaled to sum to one; every config must be a valid
    :class:`LakeConfig`. A mixture iterates, indexes and unpacks like the list of pairs it was
    built from and compares equal to it (``Mixture([(1.0, c)]) == [(1.0, c)]``).
    """

    def __new__(cls, components: Iterable[Any] = ()) -> "Mixture":
        if isinstance(components, Mixture):
            return components if cls is type(components) else tuple.__new__(cls, components)
        pairs = []
        for i, item in enumerate(components):
            try:
                w, c = item
            except (TypeError, ValueError):
                raise MixtureError(f"mixture[{i}] must be a (weight, LakeConfig) pair, got {item!r}") from None
            if not isinstance(c, LakeConfig):
                raise MixtureError(f"mixture[{i}].config must be a LakeConfig, got {type(c).__name__}")
            try:
                c.validate()
            except ConfigError as err:
                raise MixtureError(f"mixture[{i}].config: {err}") from None
            pairs.append((w, c))
        weights = check_weights(w for w, _ in pairs)
        total = sum(weights)
        return tuple.__new__(cls, tuple((w / total, c) for w, (_, c) in zip(weights, pairs) if w > 0))

    @classmethod
    def of(cls, env: Union["Mixture", LakeConfig, Sequence[Any]]) -> "Mixture":
        """``env`` as a mixture: a Mixture as it is, a LakeConfig as its one component, a
        sequence of ``(weight, config)`` pairs validated."""
        if isinstance(env, LakeConfig):
            return cls([(1.0, env)])
        return cls(env)

    def __getnewargs__(self):  # pickling / copying rebuilds through __new__ (re-validated)
        return (tuple(self),)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, (list, tuple)) or len(other) != len(self):
            return False
        try:
            return all(tuple(a) == tuple(b) for a, b in zip(self, other))
        except TypeError:
            return False

    def __ne__(self, other: Any) -> bool:
        return not self == other

    __hash__ = tuple.__hash__

    def __add__(self, other: Any) -> "Mixture":
        """Concatenation (re-normalised: ``m + [(0.5, c)]`` gives c a third of the mass when
        ``m`` sums to one)."""
        return Mixture(list(self) + list(other))

    def __repr__(self) -> str:
        return f"Mixture({list(self)!r})"

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(w for w, _ in self)

    @property
    def configs(self) -> tuple[LakeConfig, ...]:
        return tuple(c for _, c in self)

    @property
    def main(self) -> LakeConfig:
        """The heaviest component (the first on ties): what single-config consumers use, and
        the reference for an engineer's capacity and fixed fields."""
        return max(self, key=lambda wc: wc[0])[1]

    @property
    def horizon(self) -> int:
        """The largest ``max_steps`` of the components (one rollout horizon for all)."""
        return max(int(c.max_steps) for c in self.configs)


def same_mixture(a: Sequence[Any], b: Sequence[Any], tol: float = 1e-9) -> bool:
    """The same configs in the same order with weights equal within ``tol``."""
    return len(a) == len(b) and all(abs(wa - wb) < tol and ca == cb for (wa, ca), (wb, cb) in zip(a, b))


# ============================================================================ serialising
def mixture_to_obj(mixture: Sequence[Any]) -> list[dict[str, Any]]:
    """JSON/YAML-ready form: ``[{"weight": w, "config": {...}}, ...]``."""
    return [{"weight": round(float(w), 6), "config": c.to_dict()} for w, c in Mixture.of(mixture)]


def mixture_to_yaml(mixture: Sequence[Any]) -> str:
    """The ``env.yaml`` / ``next_env.yaml`` text of a mixture (``{mixture: [...]}``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml({"mixture": mixture_to_obj(mixture)})


def _config_from_fields(values: Any, base: LakeConfig, where: str) -> LakeConfig:
    if not isinstance(values, Mapping):
        raise MixtureError(f"{where} must be a JSON object of config fields, got {type(values).__name__}")
    reject_unknown(where, values, (f.name for f in dataclasses.fields(LakeConfig)), MixtureError)
    for cap in CAPACITY_FIELDS:
        if cap in values and values[cap] != getattr(base, cap):
            raise MixtureError(
                f"{where}.{cap}={values[cap]!r} cannot change: the run's capacity is fixed at "
                f"{cap}={getattr(base, cap)}"
            )
    try:
        return LakeConfig(**{**base.to_dict(), **dict(values)})
    except (ConfigError, TypeError) as err:  # TypeError: e.g. a list where a number belongs
        raise MixtureError(f"{where}: {err}") from None


def mixture_from_obj(obj: Any, base: LakeConfig) -> Mixture:
    """An answer object (an engineer's JSON, a manual curriculum entry) as a mixture.

    Accepted forms (fields missing from a config keep ``base``'s values; capacity fields
    must equal ``base``'s):

    * ``{"height": 6, "num_agents": 3, ...}`` -- one config;
    * ``{"mixture": [{"weight": 0.7, "config": {...}}, ...]}`` or the bare list
      (a missing weight is 1).
    """
    if isinstance(obj, Mapping) and "mixture" in obj:
        extra = sorted(set(obj) - {"mixture"})
        if extra:
            raise MixtureError(f"unexpected key(s) {extra} beside 'mixture'")
        obj = obj["mixture"]
    if isinstance(obj, Mapping):
        return Mixture([(1.0, _config_from_fields(obj, base, "config"))])
    if isinstance(obj, (list, tuple)):
        if not obj:
            raise MixtureError("mixture is empty: give at least one component")
        items = []
        for i, comp in enumerate(obj):
            if not isinstance(comp, Mapping) or "config" not in comp:
                raise MixtureError(f"mixture[{i}] must be an object {{\"weight\": w, \"config\": {{...}}}}")
            extra = sorted(set(comp) - {"weight", "config"})
            if extra:
                raise MixtureError(f"mixture[{i}]: unexpected key(s) {extra}")
            items.append((comp.get("weight", 1.0), _config_from_fields(comp["config"], base, f"mixture[{i}].config")))
        return Mixture(items)
    raise MixtureError(f"a mixture must be a JSON object or list, got {type(obj).__name__}")


def mixture_from_node(node: Any) -> Mixture:
    """A mixture from a Hydra env node or its plain form: a LakeConfig (or its mapping, every
    field given) or ``{mixture: [{weight, config}, ...]}``."""
    node = to_plain(node)
    if isinstance(node, LakeConfig):
        return Mixture.of(node)
    if isinstance(node, Mapping) and "mixture" in node:
        comps = node["mixture"]
        if not isinstance(comps, (list, tuple)):
            raise MixtureError(f"mixture must be a list of {{weight, config}}, got {type(comps).__name__}")
        items = []
        for i, comp in enumerate(comps):
            if not isinstance(comp, Mapping) or "config" not in comp:
                raise MixtureError(f"mixture[{i}] must be a mapping {{weight: w, config: {{...}}}}")
            try:
                items.append((comp.get("weight", 1.0), LakeConfig.from_dict(comp["config"])))
            except (ConfigError, TypeError) as err:
                raise MixtureError(f"mixture[{i}].config: {err}") from None
        return Mixture(items)
    if isinstance(node, Mapping):
        return Mixture.of(LakeConfig.from_dict(node))
    raise MixtureError(f"env must be a LakeConfig mapping or {{mixture: [...]}}, got {type(node).__name__}")


def load_mixture(path: os.PathLike | str) -> Mixture:
    """Read an ``env.yaml`` / ``next_env.yaml`` (or any env YAML) into a mixture. A file that is
    not YAML or holds a bad value raises :class:`MixtureError` naming the file
    (``stage_1/next_env.yaml: mixture[0].config: hole_density=1.5 not in [0.0, 0.9]``); a
    missing one ``FileNotFoundError``."""
    from omegaconf import OmegaConf

    try:
        node = OmegaConf.load(str(path))
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except Exception as err:  # noqa: BLE001 - yaml's and omegaconf's parse errors have no common base
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise MixtureError(f"{path}: not a valid env YAML file ({first})") from None
    try:
        return mixture_from_node(node)
    except (ConfigError, TypeError) as err:
        raise MixtureError(f"{path}: {err}") from None
