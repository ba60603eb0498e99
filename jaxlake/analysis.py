"""What a configuration does to its lakes: batch statistics for plots and tables (host side).

The generator treats ``hole_density`` and ``conflict_density`` as targets for the *batch mean*
(docs/rules.md#densities) and reports the achieved values per lake; the reference planner
(:mod:`jaxlake.planner`) says which lakes it can solve and how long its paths are. This
module turns batches of lakes into the numbers behind such pictures:

* :func:`generate_groups`: ``n`` lakes for each of ``K`` configs in **one** compiled call
  (the configs are stacked, docs/rules.md#generator), lakes in group blocks ``[K * n]``;
* :func:`generate_sweep`: the same for one field swept over values of a base config;
* :func:`group_mean_ci`: per-group mean and 95 % t interval of any per-lake quantity;
* :func:`achieved_vs_target`: the achieved density of each lake against its target;
* :func:`agent_path_lengths`: BFS start-goal distances of the agents in play;
* :func:`planner_stats`: what the reference planner makes of a batch (solved, sum of costs,
  makespan, and each agent's *delay*: its arrival step minus its BFS distance, the waits and
  detours that the other agents force).

Everything returns numpy arrays; nothing here is a hot path (plots of at most a few thousand
lakes). ``jaxlake`` knows nothing of language models, and neither does this module.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import numpy as np

from jaxlake.config import DYNAMIC_FIELDS, ConfigError, LakeConfig
from jaxlake.generator import generate_per_lake
from jaxlake.planner import solve_batch
from jaxlake.stats import mean_ci
from jaxlake.types import Lake

#: Fields whose achieved per-lake value the generator reports in ``lake.stats``.
ACHIEVED_FIELDS = ("hole_density", "conflict_density")


@dataclasses.dataclass(frozen=True)
class LakeGroups:
    """``K`` groups of ``n`` lakes generated in one call.

    Attributes:
      configs: the ``K`` validated configs (one capacity).
      n: lakes per group.
      lakes: a batched :class:`Lake` with leading axis ``K * n``; group ``k`` is the block
        ``[k * n, (k + 1) * n)``.
      field: the swept field (:func:`generate_sweep`) or ``None``.
      values: ``K`` swept values (or ``None``).
    """

    configs: tuple[LakeConfig, ...]
    n: int
    lakes: Lake
    field: Optional[str] = None
    values: Optional[tuple[Any, ...]] = None

    @property
    def num_groups(self) -> int:
        return len(self.configs)

    def group(self, k: int) -> Lake:
        """The ``n`` lakes of group ``k`` (leading axis ``n``)."""
        if not 0 <= k < self.num_groups:
            raise IndexError(f"group k={k} not in [0, {self.num_groups - 1}]")
        return jax.tree_util.tree_map(lambda x: x[k * self.n:(k + 1) * self.n], self.lakes)

    def per_group(self, values: Any) -> np.ndarray:
        """A per-lake array ``[K * n, ...]`` reshaped to ``[K, n, ...]``."""
        values = np.asarray(values)
        if values.shape[:1] != (self.num_groups * self.n,):
            raise ValueError(f"expected a leading axis of K * n = {self.num_groups * self.n}, got shape {values.shape}")
        return values.reshape((self.num_groups, self.n) + values.shape[1:])


def generate_groups(key: jax.Array, configs: Sequence[LakeConfig], n: int, **options: Any) -> LakeGroups:
    """``n`` lakes for each config, all in one ``jit(vmap(generate))`` call.

    Lake ``i`` (group ``i // n``) is ``generate(split(key, K * n)[i], configs[i // n])``, so
    each lake equals the one generated alone from the same key and config.

    Args:
      key: PRNG key.
      configs: ``K >= 1`` configs of one static capacity (``max_height``, ``max_width``,
        ``max_agents``); validated here.
      n: lakes per config, at least 1.
      options: generator options (:func:`jaxlake.generator.generate_many`).

    Raises:
      ConfigError: for ``n < 1``, no configs, or configs of different capacities (naming
        the field).
    """
    configs = tuple(c.validate() for c in configs)
    if not configs:
        raise ConfigError("generate_groups needs at least one config")
    if isinstance(n, bool) or int(n) != n or int(n) < 1:
        raise ConfigError(f"n={n!r} not in [1, inf)")
    n = int(n)
    ids = np.repeat(np.arange(len(configs)), n)
    lakes = generate_per_lake(jax.random.split(key, len(configs) * n), configs, ids, **options)
    return LakeGroups(configs=configs, n=n, lakes=lakes)


def generate_sweep(key: jax.Array, base: LakeConfig, field: str, values: Sequence[Any], n: int,
                   **options: Any) -> LakeGroups:
    """``n`` lakes of ``base`` with ``field`` set to each of ``values`` (one compiled call).

    Raises:
      ConfigError: ``field`` is not a dynamic config field, or a value is out of its range
        (the config's own message names the field and the range).
    """
    if field not in DYNAMIC_FIELDS:
        raise ConfigError(f"field={field!r} cannot be swept in one batch; dynamic fields: {list(DYNAMIC_FIELDS)}")
    values = tuple(values)
    if not values:
        raise ConfigError(f"sweep of {field} needs at least one value")
    configs = [base.replace(**{field: v}) for v in values]
    groups = generate_groups(key, configs, n, **options)
    return dataclasses.replace(groups, field=field, values=values)


def group_mean_ci(groups: LakeGroups, per_lake: Any, mask: Optional[Any] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-group ``(mean [K], half-width of the 95 % t interval [K], count [K])``.

    Args:
      groups: the groups the per-lake values belong to.
      per_lake: ``[K * n]`` numbers (bools count as 0/1).
      mask: optional ``[K * n]`` bool; only those lakes count (a group with none gives NaN).

    A group of one value has a NaN half-width (no interval from one sample).
    """
    vals = groups.per_group(np.asarray(per_lake, dtype=np.float64))
    keep = np.ones(vals.shape, bool) if mask is None else groups.per_group(np.asarray(mask, bool))
    means, halves, counts = [], [], []
    for k in range(groups.num_groups):
        m, h, c = mean_ci(vals[k][keep[k]].tolist())
        means.append(np.nan if m is None else m)
        halves.append(np.nan if h is None else h)
        counts.append(c)
    return np.asarray(means), np.asarray(halves), np.asarray(counts, np.int64)


@dataclasses.dataclass(frozen=True)
class TargetCurve:
    """Achieved against target for one density field.

    Attributes:
      field: ``hole_density`` or ``conflict_density``.
      targets: ``[K]`` the targets (the configs' values of ``field``).
      achieved: ``[K, n]`` per-lake achieved values.
      mean / ci95: ``[K]`` batch mean and 95 % t half-width per target.
    """

    field: str
    targets: np.ndarray
    achieved: np.ndarray
    mean: np.ndarray
    ci95: np.ndarray

    @property
    def max_abs_error(self) -> float:
        """Largest ``|batch mean - target|`` over the targets."""
        return float(np.max(np.abs(self.mean - self.targets)))


def achieved_vs_target(groups: LakeGroups, field: Optional[str] = None) -> TargetCurve:
    """The achieved ``field`` of every lake against its group's target.

    ``field`` defaults to the swept field; it must be one of :data:`ACHIEVED_FIELDS`.
    """
    field = field or groups.field
    if field not in ACHIEVED_FIELDS:
        raise ValueError(f"field={field!r} has no achieved value in lake.stats; one of {list(ACHIEVED_FIELDS)}")
    per_lake = np.asarray(getattr(groups.lakes.stats, field), np.float64)
    mean, ci, _ = group_mean_ci(groups, per_lake)
    targets = np.asarray([float(getattr(c, field)) for c in groups.configs])
    return TargetCurve(field=field, targets=targets, achieved=groups.per_group(per_lake), mean=mean, ci95=ci)


def agent_path_lengths(lakes: Lake) -> np.ndarray:
    """BFS start-goal distances (``lake.stats.path_len``) of every agent in play, flattened.

    Works on one lake or a batch; absent slots are left out.
    """
    path = np.asarray(lakes.stats.path_len)
    mask = np.asarray(lakes.agent_mask)
    return path[mask].astype(np.int64)


@dataclasses.dataclass(frozen=True)
class PlannerStats:
    """The reference planner on a batch of ``B`` lakes.

    Attributes:
      found: ``[B]`` bool, a collision-free plan was found within the budget.
      sum_of_costs / makespan: ``[B]`` int (-1 where not found).
      delay: ``[B, max_agents]`` int, planner arrival step minus BFS distance for agents in
        play of solved lakes (waits and detours caused by the other agents); -1 elsewhere.
      actions: ``[B, max_agents, T]`` the plans (all STAY where not found).
    """

    found: np.ndarray
    sum_of_costs: np.ndarray
    makespan: np.ndarray
    delay: np.ndarray
    actions: np.ndarray

    @property
    def solved_share(self) -> float:
        return float(np.mean(self.found)) if self.found.size else 0.0

    def delays(self) -> np.ndarray:
        """Flattened delays of the agents of solved lakes."""
        return self.delay[self.delay >= 0]


def planner_stats(lakes: Lake, **solve_kwargs: Any) -> PlannerStats:
    """Run :func:`jaxlake.planner.solve_batch` on a batched ``lakes`` and summarise it.

    ``solve_kwargs`` go to the planner (``max_expansions``, ``max_time``, ...). Host-side:
    one search per lake.
    """
    sols = solve_batch(lakes, **solve_kwargs)
    bfs = np.asarray(lakes.stats.path_len)
    mask = np.asarray(lakes.agent_mask) & sols.found[:, None]
    delay = np.where(mask, sols.path_len - bfs, -1).astype(np.int64)
    return PlannerStats(found=sols.found, sum_of_costs=sols.sum_of_costs, makespan=sols.makespan, delay=delay,
                        actions=sols.actions)
