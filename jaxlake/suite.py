"""The fixed held-out benchmark suite, and scoring of plans on lakes.

A suite is a grid of **cells** over config dimensions (``conf/eval/<name>.yaml``: grid size,
agents, hole density, conflict density -- any :class:`~jaxlake.config.LakeConfig` field, or
``size`` for a square ``height = width``), each cell holding ``lakes_per_cell`` lakes
generated from fixed seeds: cell ``c`` (in grid order) draws its lakes from
``fold_in(PRNGKey(seed), c)``, so the suite is the same in every run, stage and engineer.
All cells share one static capacity (``base``), so the whole suite is one batched
:class:`~jaxlake.types.Lake` made by one ``vmap(generate)`` over stacked configs. Cells whose
config is invalid (e.g. too many agents for the region) are skipped and listed with the
reason.

Scoring (:func:`score_texts`) parses completions with :func:`jaxlake.text.parse_plan_detailed`,
runs them with one jitted ``vmap`` of :func:`jaxlake.env.rollout` and returns one
JSON-ready **episode record** per completion: success, share arrived, falls, timeouts,
cancelled moves, malformed flag, written plan length, the plan's sum of costs against the
reference planner's, and the first fall / first conflict / the timeouts with their step and
cell (what the failure summaries show). :func:`aggregate` turns episode records into the
metrics of ``eval.json``: overall, per cell and per value of every dimension.

Episode record keys: ``lake cell mode sample num_agents success arrived_share fell
timed_out conflicts malformed malformed_reasons plan_len soc opt_soc solvable events plan
completion failure_types``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlake import env as lake_env
from jaxlake.config import ConfigError, LakeConfig, reject_unknown, stack_configs, to_plain
from jaxlake.generator import mixture_components
from jaxlake.mixture import Mixture
from jaxlake.text import format_plan, parse_plan_detailed, render_text
from jaxlake.types import ACTION_LETTERS, Lake
from jaxlake.conf import CONF_DIR

#: Failure types an episode can show (a failed episode may show several).
FAILURE_TYPES = ("malformed", "fell", "conflict", "timeout")
#: Metrics of :func:`metrics` (all floats; ``score`` is the success mean).
METRIC_KEYS = (
    "score",
    "arrived_share",
    "fall_rate",
    "timeout_rate",
    "conflict_rate",
    "malformed_rate",
    "agents_fell",
    "agents_timed_out",
    "conflicts_per_episode",
    "plan_len",
    "soc_ratio",
    "solvable",
)
_COMPLETION_CHARS = 600


class SuiteError(ValueError):
    """The suite's configuration is invalid; the message names the key."""


# ============================================================================ spec
@dataclasses.dataclass(frozen=True)
class SuiteSpec:
    """What defines a suite (``conf/eval/<name>.yaml`` keys ``name seed lakes_per_cell base grid``).

    Attributes:
      name: suite name (recorded in ``eval.json``).
      seed: base seed; cell ``c`` uses ``fold_in(PRNGKey(seed), c)``.
      lakes_per_cell: lakes generated per cell.
      base: LakeConfig fields shared by all cells (capacity included).
      grid: ``{dimension: [values]}``; the cells are the product in this order. A dimension
        is a LakeConfig field or ``size`` (``height = width``).
    """

    name: str
    seed: int
    lakes_per_cell: int
    base: tuple
    grid: tuple

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(d for d, _ in self.grid)

    @property
    def base_config(self) -> dict:
        return dict(self.base)

    @classmethod
    def from_conf(cls, node: Mapping[str, Any]) -> "SuiteSpec":
        """From an eval node (a Hydra ``DictConfig`` or a dict)."""
        node = dict(to_plain(node))
        for key in ("seed", "lakes_per_cell", "grid"):
            if key not in node:
                raise SuiteError(f"eval.{key} is missing (see conf/eval/default.yaml)")
        n = node["lakes_per_cell"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SuiteError(f"eval.lakes_per_cell={n!r} must be an integer in [1, inf)")
        grid = node["grid"]
        if not isinstance(grid, Mapping) or not grid:
            raise SuiteError("eval.grid must map dimensions to lists of values")
        known = {f.name for f in dataclasses.fields(LakeConfig)} | {"size"}
        items = []
        reject_unknown("eval.grid", grid, known, SuiteError)
        for dim, values in grid.items():
            if not isinstance(values, (list, tuple)) or not values:
                raise SuiteError(f"eval.grid.{dim} must be a non-empty list")
            items.append((dim, tuple(values)))
        dims = [d for d, _ in items]
        if "size" in dims and ({"height", "width"} & set(dims)):
            raise SuiteError("eval.grid: use either size or height/width, not both")
        base = dict(node.get("base") or {})
        reject_unknown("eval.base", base, known - {"size"}, SuiteError)
        return cls(
            name=str(node.get("name", "suite")),
            seed=int(node["seed"]),
            lakes_per_cell=int(n),
            base=tuple(sorted(base.items())),
            grid=tuple(items),
        )


def cell_values(spec: SuiteSpec) -> list[dict[str, Any]]:
    """Every cell's ``{dimension: value}`` in grid order (the product of the grid lists)."""
    dims = spec.dims
    return [dict(zip(dims, combo)) for combo in itertools.product(*(v for _, v in spec.grid))]


def cell_config(spec: SuiteSpec, values: Mapping[str, Any]) -> LakeConfig:
    """The LakeConfig of a cell (raises :class:`~jaxlake.config.ConfigError` when invalid)."""
    fields = spec.base_config
    for dim, v in values.items():
        if dim == "size":
            fields["height"] = fields["width"] = v
        else:
            fields[dim] = v
    return LakeConfig(**fields)


def split_cells(spec: SuiteSpec) -> tuple[list, list]:
    """``(cells, skipped)``: the grid's cells with a valid config (``{"id", "values",
    "config"}``; ``id`` is the grid index) and those without (``{"id", "values", "error"}``).
    Raises :class:`SuiteError` when no cell is valid."""
    cells, skipped = [], []
    for i, values in enumerate(cell_values(spec)):
        try:
            cfg = cell_config(spec, values)
        except ConfigError as err:
            skipped.append({"id": i, "values": values, "error": str(err)})
            continue
        cells.append({"id": i, "values": values, "config": cfg})
    if not cells:
        raise SuiteError(f"suite {spec.name!r}: no valid cell, every one is invalid, e.g. {skipped[0]['error']}")
    return cells, skipped


def cells_mixture(spec: SuiteSpec) -> Mixture:
    """The suite's valid cells (:func:`split_cells`) as one mixture of equal weights. Its lakes
    are drawn fresh from a training key, never the suite's own: the warm start of
    ``pipeline.warmstart_env=suite`` trains on the suite's distribution, not on its lakes."""
    return Mixture([(1.0, c["config"]) for c in split_cells(spec)[0]])


#: ``conf/eval``: the suites shipped in the package.
EVAL_CONF_DIR = CONF_DIR / "eval"


def decoding_modes(node: Mapping[str, Any]) -> list[tuple[str, int]]:
    """``(mode, samples per lake)`` of every decoding mode an ``eval`` group scores, on the suite
    and on the training environment alike: ``("greedy", 1)`` unless ``greedy: false``, then
    ``("sampled", sampled.num_samples)`` when that is above 0. The one place this rule lives (the
    LLM's evaluation, the IPPO student's and the engineer-mode check all read it)."""
    samples = int((node.get("sampled") or {}).get("num_samples", 0) or 0)
    return ([("greedy", 1)] if node.get("greedy", True) else []) + ([("sampled", samples)] if samples > 0 else [])


def load_eval_conf(name_or_path: str | os.PathLike = "default") -> Any:
    """An eval node from ``conf/eval/<name>.yaml`` (or a YAML path), its ``defaults`` list
    (other files of the same folder, else the package's ``conf/eval/`` of that name, then
    ``_self_``) merged as Hydra would: a file of one's own can start from ``small``."""
    from omegaconf import OmegaConf

    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = EVAL_CONF_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        choices = sorted(p.stem for p in EVAL_CONF_DIR.glob("*.yaml"))
        raise SuiteError(f"eval config {str(path)!r} not found (choices in {EVAL_CONF_DIR}: {choices})")
    node = OmegaConf.load(path)
    defaults = list(node.pop("defaults", []) or [])
    merged = OmegaConf.create()
    self_done = False
    for entry in defaults:
        if entry == "_self_":
            merged = OmegaConf.merge(merged, node)
            self_done = True
        else:
            beside = path.parent / f"{entry}.yaml"
            if not beside.is_file() and (EVAL_CONF_DIR / f"{entry}.yaml").is_file():
                beside = EVAL_CONF_DIR / f"{entry}.yaml"
            if not beside.is_file():
                raise SuiteError(f"{path}: defaults entry {entry!r} is neither {beside} nor a suite of "
                                 f"{EVAL_CONF_DIR} ({sorted(p.stem for p in EVAL_CONF_DIR.glob('*.yaml'))})")
            merged = OmegaConf.merge(merged, load_eval_conf(beside))
    if not self_done:
        merged = OmegaConf.merge(merged, node)
    return merged


# ============================================================================ suite
@dataclasses.dataclass
class Suite:
    """A built suite.

    Attributes:
      spec: the :class:`SuiteSpec`.
      cells: kept cells, ``{"id", "values", "config"}`` (``id`` is the grid index).
      skipped: cells with an invalid config, ``{"id", "values", "error"}``.
      lakes: batched :class:`Lake`, ``N = len(cells) * lakes_per_cell`` (cell-major).
      cell_of: ``[N]`` int, the position in ``cells`` of each lake's cell.
      grids: ``N`` rendered grids (``render_text``).
      opt_soc: ``[N]`` int, the reference planner's sum of costs (-1: no plan found), or
        None when the planner was not run.
    """

    spec: SuiteSpec
    cells: list
    skipped: list
    lakes: Lake
    cell_of: np.ndarray
    grids: list
    opt_soc: Optional[np.ndarray] = None

    @property
    def size(self) -> int:
        return int(self.cell_of.shape[0])

    @property
    def dims(self) -> tuple[str, ...]:
        return self.spec.dims

    def describe(self) -> dict:
        """JSON-ready description (``eval.json["suite"]``)."""
        return {
            "name": self.spec.name,
            "seed": self.spec.seed,
            "lakes_per_cell": self.spec.lakes_per_cell,
            "dims": list(self.dims),
            "num_lakes": self.size,
            "cells": [
                {"id": c["id"], "values": c["values"], "config": c["config"].to_dict()} for c in self.cells
            ],
            "skipped": self.skipped,
            "planner_solvable": None if self.opt_soc is None else float(np.mean(self.opt_soc >= 0)),
        }


def generate_lakes(keys: jax.Array, configs: Sequence[LakeConfig]) -> Lake:
    """``vmap(generate)`` over ``keys [N]`` and ``N`` configs of one capacity (one compile)."""
    from jaxlake.generator import generate_many

    return generate_many(keys, stack_configs(list(configs)))


def build_suite(spec: SuiteSpec | Mapping[str, Any], solve: bool = True) -> Suite:
    """Generate the suite's lakes (deterministic in ``spec``); optionally run the planner.

    Built suites are cached in the process (by spec), so every stage of a run reuses them.
    Raises :class:`SuiteError` when no cell is valid.
    """
    if not isinstance(spec, SuiteSpec):
        spec = SuiteSpec.from_conf(spec)
    return _build_suite_cached(spec, bool(solve))


@functools.lru_cache(maxsize=4)
def _build_suite_cached(spec: SuiteSpec, solve: bool) -> Suite:
    cells, skipped = split_cells(spec)
    lakes, cell_of = cell_lakes(spec.seed, cells, spec.lakes_per_cell)
    grids = render_grids(lakes)
    opt = reference_soc(lakes) if solve else None
    return Suite(spec=spec, cells=cells, skipped=skipped, lakes=lakes, cell_of=cell_of, grids=grids, opt_soc=opt)


def lake_keys(lakes: Lake) -> list[bytes]:
    """One key per lake of a batch: equal keys are the same game (holes, region, starts, goals,
    agents, slip, horizon and goal rule; the generator's report left out)."""
    leaves = [np.asarray(x) for x in (lakes.holes, lakes.region, lakes.starts, lakes.goals, lakes.num_agents,
                                      lakes.slip_prob, lakes.max_steps, lakes.on_goal)]
    n = int(leaves[0].shape[0])
    rows = [x.reshape(n, -1) for x in leaves]
    return [b"".join(r[i].tobytes() for r in rows) for i in range(n)]


#: How many lakes per cell :func:`validation_suite` draws for each one it keeps: the spare
#: replaces the held-out suite's own lakes (the small cells hold few distinct lakes).
VALIDATION_DRAWS = 4


def validation_suite(held_out: SuiteSpec | Mapping[str, Any], seed: int, lakes_per_cell: int,
                     solve: bool = True) -> tuple[Suite, dict]:
    """A suite of the held-out suite's cells whose lakes are **none of the held-out suite's**:
    what a method may tune on (the oracle engineer's probes) without reading the test.

    Each cell draws ``VALIDATION_DRAWS * lakes_per_cell`` lakes from ``seed`` (as
    :func:`cell_lakes` draws), drops every lake equal to one of the held-out suite's
    (:func:`lake_keys`) and repeats of its own, and keeps the first ``lakes_per_cell`` left (fewer
    where a cell has too few distinct lakes). Returns ``(suite, report)``: the report counts
    the dropped lakes and the cells cut short. Deterministic in its arguments.
    """
    if not isinstance(held_out, SuiteSpec):
        held_out = SuiteSpec.from_conf(held_out)
    if int(seed) == held_out.seed:
        raise SuiteError(f"validation seed={seed} equals the held-out suite's seed; choose another")
    n = int(lakes_per_cell)
    if n < 1:
        raise SuiteError(f"validation lakes_per_cell={lakes_per_cell!r} must be an integer in [1, inf)")
    test = set(lake_keys(build_suite(held_out, solve=False).lakes))
    spec = dataclasses.replace(held_out, name=f"{held_out.name}-validation", seed=int(seed), lakes_per_cell=n)
    cells, skipped = split_cells(spec)
    drawn, cell_of = cell_lakes(spec.seed, cells, VALIDATION_DRAWS * n)
    keys = lake_keys(drawn)
    keep, seen, short, dropped = [], set(), [], 0
    for c in range(len(cells)):
        kept = 0
        for i in np.flatnonzero(cell_of == c):
            key = keys[i]
            if key in test or key in seen:
                dropped += int(key in test)
                continue
            seen.add(key)
            if kept < n:
                keep.append(int(i))
                kept += 1
        if kept < n:
            short.append({"id": cells[c]["id"], "lakes": kept})
    index = np.asarray(keep)
    lakes = take_lakes(drawn, index)
    suite = Suite(spec=spec, cells=cells, skipped=skipped, lakes=lakes, cell_of=cell_of[index],
                  grids=render_grids(lakes), opt_soc=reference_soc(lakes) if solve else None)
    return suite, {"seed": int(seed), "lakes": int(index.size), "held_out_lakes_dropped": dropped,
                   "cells_cut_short": short}


def cell_lakes(seed: int, cells: Sequence[Mapping[str, Any]], lakes_per_cell: int) -> tuple[Lake, np.ndarray]:
    """The suite's lakes, cell-major, and ``cell_of``: cell ``c`` (``{"id", "config"}``)
    draws ``lakes_per_cell`` lakes from ``split(fold_in(PRNGKey(seed), c["id"]))``."""
    n = int(lakes_per_cell)
    root = jax.random.PRNGKey(int(seed))
    keys = jnp.concatenate([jax.random.split(jax.random.fold_in(root, int(c["id"])), n) for c in cells])
    lakes = generate_lakes(keys, [c["config"] for c in cells for _ in range(n)])
    return lakes, np.repeat(np.arange(len(cells)), n)


def described_lakes(description: Mapping[str, Any]) -> Lake:
    """The lakes of a suite from its :meth:`Suite.describe` (``eval.json["suite"]``): the same
    lakes, in the same order, as the suite that wrote it."""
    cells = [{"id": c["id"], "config": LakeConfig.from_dict(c["config"])} for c in description["cells"]]
    return cell_lakes(description["seed"], cells, description["lakes_per_cell"])[0]


def unbatch(lakes: Lake) -> list[Lake]:
    """Host-side single lakes of a batched lake."""
    host = jax.tree_util.tree_map(np.asarray, lakes)
    n = int(np.shape(host.num_agents)[0])
    return [jax.tree_util.tree_map(lambda x, b=b: x[b], host) for b in range(n)]


def render_grids(lakes: Lake) -> list[str]:
    """``render_text`` of every lake of a batch."""
    return [render_text(lake) for lake in unbatch(lakes)]


def reference_soc(lakes: Lake, **solve_kwargs: Any) -> np.ndarray:
    """``[N]`` planner sum of costs per lake (-1 when it found no plan)."""
    from jaxlake import planner

    return np.asarray(planner.solve_batch(lakes, **solve_kwargs).sum_of_costs, dtype=np.int64)


def lake_outcomes(episodes: Sequence[Mapping[str, Any]], mode: str = "greedy") -> dict:
    """``{(cell, lake): success}`` of the ``mode`` episodes of a suite evaluation
    (:func:`score_texts`' records), the first sample of each lake: what two evaluations of one
    suite are paired on."""
    return {(int(r.get("cell", -1)), int(r["lake"])): bool(r["success"]) for r in episodes
            if r.get("mode") == mode and int(r.get("sample", 0)) == 0}


#: What :func:`failed_by_kind` counts, each kind with the :func:`failure_types` entry that
#: shows it, in the order a failed lake is assigned one: a lake with any conflict collided (a
#: collision usually ends in a timeout or a fall too), else fell if an agent fell, else was
#: malformed (an answer that does not parse leaves its agents standing, so it times out too),
#: else timed out.
FAILURE_KINDS = {"collided": "conflict", "fell": "fell", "malformed": "malformed", "timed out": "timeout"}


def failed_by_kind(episodes: Sequence[Mapping[str, Any]], mode: str = "greedy") -> dict[str, int]:
    """``{kind: lakes}`` over :data:`FAILURE_KINDS`: the failed lakes of a suite evaluation's
    ``mode`` episodes (each lake's first sample, as :func:`lake_outcomes` pairs them), each
    counted once, by the first kind its :func:`failure_types` show in that order."""
    counts = dict.fromkeys(FAILURE_KINDS, 0)
    for rec in episodes:
        if rec.get("mode") != mode or int(rec.get("sample", 0)) != 0 or rec["success"]:
            continue
        shown = rec["failure_types"] if "failure_types" in rec else failure_types(rec)
        kind = next((k for k, t in FAILURE_KINDS.items() if t in shown), "timed out")
        counts[kind] += 1
    return counts


#: Short names of the suite dimensions in :func:`cell_label` (others keep their own).
_DIM_LABELS = {"num_agents": "n", "hole_density": "holes", "conflict_density": "conflict"}


def cell_label(values: Mapping[str, Any]) -> str:
    """A suite cell's values in one line: ``size=4 n=2 holes=0.2 conflict=1``."""
    return " ".join(f"{_DIM_LABELS.get(k, k)}={v:g}" if isinstance(v, (int, float)) else f"{_DIM_LABELS.get(k, k)}={v}"
                    for k, v in values.items())


def moved_cells(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]],
                cells: Sequence[Mapping[str, Any]], mode: str = "greedy") -> list[tuple[Mapping[str, Any], int, int, int]]:
    """``[(cell, solved before, solved after, lakes)]`` for the suite cells (``{"id", "values",
    ...}``, :meth:`Suite.describe`'s) whose count of solved lakes differs between two
    evaluations of one suite (``mode`` episodes, each lake's first sample), the largest change
    first (ties in cell order). A change of the aggregate spread over all cells is noise; one
    held in a few cells says what a stage taught, and what it traded for it."""
    b = lake_outcomes(after, mode)
    counts: dict[int, list[int]] = {}  # cell id -> [solved before, solved after, lakes]
    for (cell, lake), won in lake_outcomes(before, mode).items():
        n = counts.setdefault(cell, [0, 0, 0])
        n[0], n[1], n[2] = n[0] + won, n[1] + bool(b.get((cell, lake))), n[2] + 1
    moved = [(c, *counts[int(c["id"])]) for c in cells if int(c["id"]) in counts]
    return sorted((m for m in moved if m[1] != m[2]), key=lambda m: -abs(m[2] - m[1]))


def take_lakes(lakes: Lake, index: np.ndarray) -> Lake:
    """Rows ``index`` of a batched lake (e.g. to repeat lakes for several samples)."""
    index = jnp.asarray(index)
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x)[index], lakes)


# ============================================================================ scoring
@functools.partial(jax.jit, static_argnames=("horizon",))
def _play(lakes: Lake, plans: jax.Array, keys: jax.Array, horizon: int) -> dict:
    """Vmapped rollouts plus what the records need; every output has leading axis ``B``."""

    def one(lake, plan, key):
        roll = lake_env.rollout(key, lake, plan, horizon=horizon)
        out, traj = roll.outcome, roll.trajectory
        info = traj.info
        present = lake.agent_mask

        def first_event(flags):  # flags [T, A] -> (found, step (1-based), agent)
            flags = flags & present[None, :]
            any_t = jnp.any(flags, axis=1)
            t = jnp.argmax(any_t)
            agent = jnp.argmax(flags[t])
            return jnp.any(any_t), t, agent

        fell_found, fell_t, fell_a = first_event(info.fell)
        cancel = info.vertex_conflict | info.swap_conflict | info.blocked
        conf_found, conf_t, conf_a = first_event(cancel)
        kind = jnp.where(
            info.vertex_conflict[conf_t, conf_a], 0, jnp.where(info.swap_conflict[conf_t, conf_a], 1, 2)
        )
        # The cell where the conflicted agent stood (before the step = after it, it stayed).
        conf_cell = traj.pos[conf_t, conf_a]
        return {
            "arrived": out.arrived & present,
            "fell": out.fell & present,
            "timed_out": out.timed_out & present,
            "steps": out.steps,
            "conflicts": jnp.sum((out.vertex_conflicts + out.swap_conflicts + out.blocks) * present),
            "success": out.success,
            "final_pos": roll.final_state.pos,
            "fell_found": fell_found,
            "fell_t": fell_t + 1,
            "fell_agent": fell_a,
            "fell_cell": traj.pos[fell_t, fell_a],
            "conf_found": conf_found,
            "conf_t": conf_t + 1,
            "conf_agent": conf_a,
            "conf_kind": kind,
            "conf_cell": conf_cell,
            "conf_action": plan[conf_a, conf_t],
        }

    return jax.vmap(one)(lakes, plans, keys)


_CONFLICT_KINDS = ("vertex", "swap", "blocked")


def _letter(i: int) -> str:
    return chr(ord("A") + int(i))


def score_texts(
    lakes: Lake,
    texts: Sequence[str],
    key: jax.Array,
    *,
    lake_ids: Optional[Sequence[int]] = None,
    cell_ids: Optional[Sequence[int]] = None,
    opt_soc: Optional[Sequence[int]] = None,
    mode: str = "greedy",
    samples: Optional[Sequence[int]] = None,
    horizon: Optional[int] = None,
) -> list[dict]:
    """Episode records of ``B`` completions on their lakes (row ``b`` of ``lakes``).

    Args:
      lakes: batched lake ``[B]`` (repeat a lake for several samples).
      texts: ``B`` completions.
      key: PRNG key for slips (split per completion).
      lake_ids / cell_ids: recorded as ``lake`` / ``cell`` (default: ``range(B)`` / -1).
      opt_soc: ``[B]`` planner sum of costs (-1: none); None leaves ``opt_soc`` None.
      mode: recorded as ``mode``; samples: recorded as ``sample`` (default 0).
      horizon: rollout length (static, ``>=`` every ``max_steps``; default the batch max).
    """
    texts = list(texts)
    b = len(texts)
    num_agents = np.asarray(lakes.num_agents).astype(int)
    if num_agents.shape != (b,):
        raise ValueError(f"lakes hold {num_agents.shape} lakes for {b} completions")
    max_steps = np.asarray(lakes.max_steps).astype(int)
    if horizon is None:
        horizon = int(max_steps.max()) if b else 1
    max_agents = lakes.max_agents
    plans = np.zeros((b, max_agents, horizon), np.int32)
    parsed = []
    for i, (text, n) in enumerate(zip(texts, num_agents)):
        p = parse_plan_detailed(text, int(n), horizon)
        plans[i, :n] = p.actions
        parsed.append(p)
    if b == 0:
        return []
    # pad the batch to a power of two (>= 64) so that few shapes compile
    padded = max(64, 1 << (b - 1).bit_length())
    index = np.concatenate([np.arange(b), np.zeros(padded - b, dtype=np.int64)])
    keys = jax.random.split(key, b)
    out = _play(take_lakes(lakes, index), jnp.asarray(plans[index]), keys[jnp.asarray(index)], horizon=horizon)
    out = {k: np.asarray(v)[:b] for k, v in jax.device_get(out).items()}
    goals = np.asarray(lakes.goals)
    records = []
    for i in range(b):
        n = int(num_agents[i])
        p = parsed[i]
        arrived = out["arrived"][i][:n]
        steps = out["steps"][i][:n]
        success = bool(out["success"][i])
        soc = int(np.sum(steps[arrived])) if success else None
        opt = None if opt_soc is None else int(opt_soc[i])
        written = [int(np.max(np.nonzero(row)[0]) + 1) if np.any(row) else 0 for row in p.actions]
        events: dict[str, Any] = {"first_fall": None, "first_conflict": None, "timeouts": []}
        if out["fell_found"][i]:
            events["first_fall"] = {
                "agent": _letter(out["fell_agent"][i]),
                "step": int(out["fell_t"][i]),
                "cell": [int(x) for x in out["fell_cell"][i]],
            }
        if out["conf_found"][i]:
            events["first_conflict"] = {
                "agent": _letter(out["conf_agent"][i]),
                "step": int(out["conf_t"][i]),
                "kind": _CONFLICT_KINDS[int(out["conf_kind"][i])],
                "cell": [int(x) for x in out["conf_cell"][i]],
                "action": ACTION_LETTERS[int(out["conf_action"][i])],
            }
        for a in np.nonzero(out["timed_out"][i][:n])[0]:
            events["timeouts"].append(
                {
                    "agent": _letter(a),
                    "cell": [int(x) for x in out["final_pos"][i][a]],
                    "goal": [int(x) for x in goals[i][a]],
                    "step": int(max_steps[i]),
                }
            )
        rec = {
            "lake": int(lake_ids[i]) if lake_ids is not None else i,
            "cell": int(cell_ids[i]) if cell_ids is not None else -1,
            "mode": mode,
            "sample": int(samples[i]) if samples is not None else 0,
            "num_agents": n,
            "success": success,
            "arrived_share": float(np.mean(arrived)) if n else 0.0,
            "fell": int(np.sum(out["fell"][i])),
            "timed_out": int(np.sum(out["timed_out"][i])),
            "conflicts": int(out["conflicts"][i]),
            "malformed": bool(p.malformed),
            "malformed_reasons": list(p.reasons[:5]),
            "plan_len": max(written) if written else 0,
            "soc": soc,
            "opt_soc": opt,
            "solvable": None if opt is None else opt >= 0,
            "events": events,
            "plan": format_plan(p.actions, n) if n else "",
            "completion": _clip(texts[i]),
        }
        rec["failure_types"] = failure_types(rec)
        records.append(rec)
    return records


def _clip(text: Any) -> str:
    text = text if isinstance(text, str) else repr(text)
    return text if len(text) <= _COMPLETION_CHARS else text[:_COMPLETION_CHARS] + " ..."


def failure_types(rec: Mapping[str, Any]) -> list[str]:
    """The failure types an episode record shows ([] for a success)."""
    if rec["success"]:
        return []
    kinds = []
    if rec["malformed"]:
        kinds.append("malformed")
    if rec["fell"] > 0:
        kinds.append("fell")
    if rec["conflicts"] > 0:
        kinds.append("conflict")
    if rec["timed_out"] > 0:
        kinds.append("timeout")
    return kinds


# ============================================================================ aggregation
def metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Means over episode records (see :data:`METRIC_KEYS`); ``n`` is the number of records.

    Rates are shares of episodes with at least one such event (``fall_rate``,
    ``timeout_rate``, ``conflict_rate``, ``malformed_rate``); ``agents_fell`` /
    ``agents_timed_out`` are shares of agents. ``soc_ratio`` is the plan's sum of costs over
    the planner's, on successes where the planner found a plan (None without any);
    ``solvable`` the share of lakes the planner solved (None when it was not run).
    """
    n = len(records)
    if n == 0:
        return {"n": 0, **{k: None for k in METRIC_KEYS}}

    def mean(xs):
        xs = list(xs)
        return float(np.mean(xs)) if xs else None

    agents = sum(r["num_agents"] for r in records)
    ratios = [r["soc"] / r["opt_soc"] for r in records if r["success"] and r.get("opt_soc") and r["opt_soc"] > 0]
    solv = [bool(r["solvable"]) for r in records if r.get("solvable") is not None]
    return {
        "n": n,
        "score": mean(r["success"] for r in records),
        "arrived_share": mean(r["arrived_share"] for r in records),
        "fall_rate": mean(r["fell"] > 0 for r in records),
        "timeout_rate": mean(r["timed_out"] > 0 for r in records),
        "conflict_rate": mean(r["conflicts"] > 0 for r in records),
        "malformed_rate": mean(r["malformed"] for r in records),
        "agents_fell": sum(r["fell"] for r in records) / max(agents, 1),
        "agents_timed_out": sum(r["timed_out"] for r in records) / max(agents, 1),
        "conflicts_per_episode": mean(r["conflicts"] for r in records),
        "plan_len": mean(r["plan_len"] for r in records),
        "soc_ratio": mean(ratios),
        "solvable": mean(solv),
    }


def value_key(value: Any) -> str:
    """How a dimension value is written as a JSON key (``4``, ``0.2``, ``vanish``)."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def aggregate(records: Sequence[Mapping[str, Any]], cells: Sequence[Mapping[str, Any]], dims: Sequence[str]) -> dict:
    """Overall metrics plus ``by_cell`` (one entry per cell, with its values and config) and
    ``by_dim`` (``{dim: {value: metrics}}``) of one mode's episode records.

    ``cells`` are the suite's cells (``{"id", "values", "config"}``; config a LakeConfig or
    dict); records refer to them by ``cell`` id.
    """
    by_id: dict[int, list] = {}
    for r in records:
        by_id.setdefault(int(r["cell"]), []).append(r)
    by_cell = []
    for c in cells:
        cfg = c["config"]
        cfg = cfg.to_dict() if isinstance(cfg, LakeConfig) else dict(cfg)
        by_cell.append({"id": c["id"], "values": dict(c["values"]), "config": cfg, **metrics(by_id.get(c["id"], []))})
    by_dim: dict[str, dict[str, Any]] = {}
    for dim in dims:
        groups: dict[str, list] = {}
        order: list[str] = []
        for c in cells:
            k = value_key(c["values"][dim])
            if k not in groups:
                groups[k] = []
                order.append(k)
            groups[k].extend(by_id.get(c["id"], []))
        by_dim[dim] = {k: metrics(groups[k]) for k in order}
    return {**metrics(records), "by_dim": by_dim, "by_cell": by_cell}


# ============================================================================ the training environment
def current_env_eval(mixture: Mixture, lakes: Any, n: int, modes: Sequence[tuple[str, int]], solve: bool,
                     play: Callable[..., list]) -> dict:
    """``eval.json["current_env"]``: a student on ``n`` lakes drawn from its training mixture.

    ``lakes`` come in ``mixture``'s component blocks (:func:`jaxlake.generator.generate_mixture`),
    so each component is one cell; ``play(lakes, cells_of=..., opt_soc=...)`` plays them in every
    mode of ``modes`` and returns the episodes (the student's own rollouts: the LLM's
    :func:`run_modes`, the IPPO student's in :mod:`jaxlake.pipeline.student`); ``solve``: the
    reference planner's sums of costs for the optimality gap. Each mode's metrics are pooled
    and per component (:func:`_by_component`).
    """
    opt_soc = reference_soc(lakes) if solve else None
    cells = [{"id": i, "values": {}, "config": c} for i, c in enumerate(mixture.configs)]
    episodes = play(lakes, cells_of=mixture_components(mixture, n).astype(np.int64), opt_soc=opt_soc)
    return {
        "env": [{"weight": float(w), "config": c.to_dict()} for w, c in mixture],
        "grids": render_grids(lakes),
        "modes": {mode: by_component(aggregate([e for e in episodes if e["mode"] == mode], cells, []),
                                      mixture.weights) for mode, _ in modes},
        "episodes": episodes,
    }


def by_component(agg: Mapping[str, Any], weights: Sequence[float]) -> dict:
    """A mode's metrics on the training mixture: pooled over its lakes, and ``by_component``
    (each component's weight, config and metrics on its own lakes, in the mixture's order:
    the per-level success that PLR scores)."""
    out = {k: v for k, v in agg.items() if k not in ("by_dim", "by_cell")}
    out["by_component"] = [{"weight": float(w), "config": c["config"], **{k: v for k, v in c.items()
                                                                           if k not in ("id", "values", "config")}}
                           for w, c in zip(weights, agg["by_cell"])]
    return out
