"""The UED study of the IPPO student: ``python -m jaxlake.students.study`` (Hydra,
``conf/ued_study.yaml``; page docs/research/ued-study.md).

Every *method* of ``study.methods`` (an ``ippo.ued`` setting: ``dr``, ``plr``, ``accel``,
``sfl``, ...) trains the IPPO student on the ``env`` mixture with the ``ippo`` settings. With
``ippo.ued.budget=grad_steps`` (the default) every method makes the same ``ippo.num_updates``
policy updates with the same learning-rate schedule, and the lake steps each one played (a
robust method's new and mutated levels, SFL's scoring rollouts) are measured in the jit and
recorded beside them; a row of ``budget: lake_steps`` plays ``dr``'s lake steps instead (fewer
policy updates), the comparison at equal lake steps. Seed ``s`` is the key ``PRNGKey(s)``, the run
``python -m jaxlake.ippo seed=<s> ippo.ued.method=<m>`` would train (``study.seed_batch`` seeds
are vmapped in one program, so floats may differ in the last bits). Each trained policy is
then played greedily on the *held-out suite*: ``study.lakes_per_cell`` held-out lakes
(:func:`jaxlake.students.lakes.heldout_lakes`, seed ``study.suite_seed``) of every cell of
``study.cells`` (the ``env`` mixture with some lake fields set: hard lakes the training generator
makes too, and more holes, larger lakes, more agents than training ever had; the page marks
which, :func:`in_support`), the same lakes for every method and seed.

**Units and records.** The study runs in units of one method x one batch of seeds, batch by
batch (every method on seeds 0-3, then every method on seeds 4-7, ...), so a study cut short
leaves every method with the same seeds. A finished unit is a record,
``<runs_dir>/<experiment>/<method>_seeds<a>-<b>.json`` (:func:`run_unit`): the seeds, the
success of every suite lake per seed (packed bits, hex), the in-jit learning curve, the gradient
steps and lake steps of every seed, CPU and wall seconds. Records are copied into the archive beside the page
(``<page stem>/runs/<experiment>/``),
and restored from it before the study runs: rerunning the command skips every unit that has a
record, on this machine or in a fresh checkout. A record of other settings (env, ippo, suite)
is refused, naming what differs, and so is a method's record whose ``ippo.ued`` settings are not the
row's (a record of the trainer before a change of its defaults).

**The page** (:mod:`jaxlake.students.study_page`). :func:`summarize` turns the records into the page's JSON (``<page stem>.json``):
per method and seed the suite's and every cell's success, and the paired comparison with
``study.baseline`` (:func:`paired`): per seed, the difference of the suite success on the same
lakes, then mean ± 95 % t interval over seeds; and the lake-paired difference pooled over
seeds (:func:`jaxlake.stats.paired_difference` over every (seed, lake) pair, with won / lost
counts and the sign test). :func:`render` writes the generated block from that JSON alone
(between ``<!-- ued-study:begin -->`` and ``<!-- ued-study:end -->``; the rest of the page is
hand-written and kept), so the block is rebuilt identically from the JSON, and the JSON from
the archive.
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from jaxlake.config import ConfigError, cfg_get, reject_unknown, to_plain
from jaxlake.io import FolderLock, read_json, write_json
from jaxlake.mixture import Mixture, mixture_from_node, mixture_to_obj
from jaxlake.students.command import run_guarded
from jaxlake.students.compiled import jit
from jaxlake.students.config import IPPOConfig, UEDConfig
from jaxlake.students.study_page import (BEGIN, COMMAND, END, decode, encode, page_block, paired, payload, render, ued_text,
                                         verdict, write_page)

# the page's pieces (jaxlake.students.study_page) are re-exported: the study's one import
__all__ = ["BEGIN", "END", "Study", "StudyError", "decode", "encode", "in_support", "load_records", "main", "page_block",
           "paired", "render", "run_study", "run_unit", "steps_of", "summarize", "ued_text", "verdict", "write_page"]

_NAME = re.compile(r"^[A-Za-z0-9_]+$")


class StudyError(ConfigError):
    """The study cannot run or has nothing to report; the message names the field or file."""


# ============================================================================ settings
@dataclasses.dataclass(frozen=True)
class Study:
    """The study's resolved settings (``conf/ued_study.yaml``)."""

    config: IPPOConfig
    mixture: Mixture
    methods: dict
    baseline: str
    seeds: tuple
    seed_batch: int
    cells: dict
    lakes_per_cell: int
    suite_seed: int
    engineers: tuple = ()
    engineer_stages: int = 2
    engineer_seeds: int = 4
    engineer_eval: str = "small"

    @classmethod
    def from_cfg(cls, cfg: Any) -> "Study":
        config = IPPOConfig.from_node(cfg_get(cfg, "ippo", {}))
        if config.radius is None:
            raise StudyError("ippo.radius=null: the suite's lakes differ in size, so the study needs the egocentric crop")
        mixture = mixture_from_node(cfg_get(cfg, "env"))
        config.check_batch(max(int(c.num_agents) for c in mixture.configs))
        node = to_plain(cfg_get(cfg, "study", {})) or {}
        reject_unknown("study", node, ("seeds", "seed_batch", "baseline", "methods", "cells", "lakes_per_cell",
                                       "suite_seed", "results", "archive", "run", "engineers", "engineer_stages",
                                       "engineer_seeds", "engineer_eval"), StudyError)
        seeds, batch = node.get("seeds", 16), node.get("seed_batch", 4)
        for name, value in (("seeds", seeds), ("seed_batch", batch), ("lakes_per_cell", node.get("lakes_per_cell", 1024))):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StudyError(f"study.{name}={value!r} must be an integer in [1, inf)")
        methods = node.get("methods") or {}
        if not isinstance(methods, Mapping) or not methods:
            raise StudyError("study.methods must map at least one row name to its ippo.ued settings")
        for name, ued in methods.items():
            if not _NAME.match(str(name)):
                raise StudyError(f"study.methods.{name}: a row name is letters, digits and _ only")
            try:
                UEDConfig.from_value({**dataclasses.asdict(config.ued), **(ued or {})})
            except ConfigError as err:
                raise StudyError(f"study.methods.{name}: {err}") from None
        baseline = node.get("baseline", "dr")
        if baseline not in methods:
            raise StudyError(f"study.baseline={baseline!r} must be one of study.methods ({', '.join(methods)})")
        cells = node.get("cells") or {}
        if not isinstance(cells, Mapping) or not cells:
            raise StudyError("study.cells must map at least one cell name to lake fields ({} for env's own lakes)")
        for name, fields in cells.items():
            if not _NAME.match(str(name)):
                raise StudyError(f"study.cells.{name}: a cell name is letters, digits and _ only")
            try:
                cell_mixture(mixture, fields)
            except ConfigError as err:
                raise StudyError(f"study.cells.{name}: {err}") from None
        suite_seed = node.get("suite_seed", 20241)
        if isinstance(suite_seed, bool) or not isinstance(suite_seed, int) or suite_seed < 0:
            raise StudyError(f"study.suite_seed={suite_seed!r} must be an integer in [0, inf)")
        engineers = [str(e) for e in (node.get("engineers") or [])]
        stages, eng_seeds = node.get("engineer_stages", 2), node.get("engineer_seeds", 4)
        for name, value in (("engineer_stages", stages), ("engineer_seeds", eng_seeds)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StudyError(f"study.{name}={value!r} must be an integer in [1, inf)")
        if engineers:
            from jaxlake.conf import CONF_DIR

            known = sorted(q.stem for q in (CONF_DIR / "engineer").glob("*.yaml"))
            for e in engineers:
                if e not in known:
                    raise StudyError(f"study.engineers: {e!r} is not an engineer (conf/engineer/: {', '.join(known)})")
            per = config.num_updates // stages
            if config.num_updates % stages or per % config.eval_every:
                raise StudyError(f"study.engineer_stages={stages} must split ippo.num_updates={config.num_updates} "
                                 f"into stages of a multiple of ippo.eval_every={config.eval_every} updates")
            if len(mixture) != 1:
                raise StudyError("study.engineers needs an env of one component (the engineers' runs start from it)")
        return cls(config=config, mixture=mixture, methods={str(k): dict(v or {}) for k, v in methods.items()},
                   baseline=str(baseline), seeds=tuple(range(seeds)), seed_batch=int(batch),
                   cells={str(k): dict(v or {}) for k, v in cells.items()},
                   lakes_per_cell=int(node.get("lakes_per_cell", 1024)), suite_seed=int(suite_seed),
                   engineers=tuple(engineers), engineer_stages=int(stages), engineer_seeds=int(eng_seeds),
                   engineer_eval=str(node.get("engineer_eval", "small")))

    def method_config(self, method: str) -> IPPOConfig:
        """The ``ippo`` settings with ``method``'s ``ippo.ued`` settings."""
        ued = UEDConfig.from_value({**dataclasses.asdict(self.config.ued), **self.methods[method]})
        return dataclasses.replace(self.config, ued=ued)

    def batches(self) -> list[tuple]:
        """The seeds in batches of ``seed_batch``."""
        s = self.seeds
        return [s[i:i + self.seed_batch] for i in range(0, len(s), self.seed_batch)]

    def settings(self) -> dict:
        """What every record must share (its ``settings``): the lakes, the training settings but
        the UED method, and the suite."""
        ippo = self.config.to_dict()
        ippo.pop("ued")
        return {"env": mixture_to_obj(self.mixture), "ippo": ippo, "cells": self.cells,
                "lakes_per_cell": self.lakes_per_cell, "suite_seed": self.suite_seed}


def cell_mixture(mixture: Mixture, fields: Mapping[str, Any]) -> Mixture:
    """``mixture`` with ``fields`` set on every component (a ConfigError names a bad field)."""
    from jaxlake.config import LakeConfig

    reject_unknown("cell", fields or {}, (f.name for f in dataclasses.fields(LakeConfig)), StudyError)
    return Mixture([(w, c.replace(**dict(fields or {}))) for w, c in mixture])


def _hole_counts(c: Any) -> set:
    """The hole counts the generator can give a lake of config ``c`` (its stochastic rounding of
    ``hole_density * cells`` in 16-bit fixed point, the cap, and the hole-free last attempt)."""
    cells = int(c.height) * int(c.width)
    fixed = int(np.round(np.float32(c.hole_density) * np.float32(1 << 16)))
    cap = cells - 2 * int(c.num_agents)
    return {0} | {min(max((fixed * cells + u) >> 16, 0), cap) for u in (0, (1 << 16) - 1)}


def in_support(env: Mixture, cell: Mixture) -> bool:
    """Every lake ``cell`` makes is one some component of ``env`` (the training generator) can
    make: the same region, agents, slip, horizon and goal rule, hole counts among the
    component's, distance bounds within its (conflict targets only shift how likely a lake is)."""
    def covers(e: Any, c: Any) -> bool:
        same = all(getattr(e, f) == getattr(c, f) for f in ("height", "width", "num_agents", "slip_prob",
                                                            "max_steps", "on_goal"))
        dist = int(c.min_dist) >= int(e.min_dist) and (e.max_dist is None or (c.max_dist is not None
                                                                              and int(c.max_dist) <= int(e.max_dist)))
        return same and dist and _hole_counts(c) <= _hole_counts(e)

    return all(any(covers(e, c) for e in env.configs) for c in cell.configs)


# ============================================================================ training a unit
def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _Programs:
    """The jitted programs of one process: a trainer per method, an evaluation per cell, and
    the suite's lakes (built once)."""

    def __init__(self, study: Study):
        self.study = study
        self.train: dict = {}
        self.suite: Optional[dict] = None

    def trainer(self, method: str):
        import jax

        if method not in self.train:
            from jaxlake.students.ippo import lake_student

            student = lake_student(self.study.method_config(method), self.study.mixture)
            self.train[method] = (student, jit(jax.vmap(student.train)))
        return self.train[method]

    def cells(self, network) -> dict:
        import jax

        from jaxlake.students.evaluate import evaluate_greedy
        from jaxlake.students.lakes import heldout_lakes

        if self.suite is None:
            s = self.study
            key = jax.random.fold_in(jax.random.PRNGKey(s.suite_seed), 1)
            self.suite = {}
            for name, fields in s.cells.items():
                mix = cell_mixture(s.mixture, fields)
                lakes, _ = heldout_lakes(mix, s.lakes_per_cell, s.suite_seed)
                actors, horizon = max(int(c.num_agents) for c in mix.configs), mix.horizon

                def play(params, lakes, actors=actors, horizon=horizon):
                    return evaluate_greedy(params, network.apply, lakes, actors=actors, radius=s.config.radius,
                                           horizon=horizon, key=key).per_lake

                self.suite[name] = (lakes, jit(jax.vmap(play, in_axes=(0, None))))
        return self.suite


def record_name(method: str, seeds: Sequence[int]) -> str:
    return f"{method}_seeds{seeds[0]}-{seeds[-1]}.json"


def run_unit(study: Study, method: str, seeds: Sequence[int], programs: Optional[_Programs] = None) -> dict:
    """Train ``method`` on ``seeds`` (vmapped) and score every policy on the suite; the record."""
    import jax
    import jax.numpy as jnp

    programs = programs or _Programs(study)
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    student, train = programs.trainer(method)
    keys = jnp.stack([jax.random.PRNGKey(int(s)) for s in seeds])
    state, metrics = train(keys)
    outcomes = {}
    for name, (lakes, play) in programs.cells(student.network).items():
        per_lake = np.asarray(jax.device_get(play(state.params, lakes))) > 0.5  # [S, N]
        outcomes[name] = [encode(row) for row in per_lake]
    config = study.method_config(method)
    curve = np.asarray(jax.device_get(metrics.heldout.success))  # [S, chunks]
    grad, lake, scoring = steps_of(config, metrics.updates, len(seeds))
    return {
        "variant": method, "ued": dataclasses.asdict(config.ued), "seeds": [int(s) for s in seeds],
        "updates": config.num_updates, "env_steps": config.env_steps,
        "grad_steps": grad, "lake_steps": lake, "scoring_steps": scoring,
        "cpu_s": round(_cpu_s() - cpu0, 1), "wall_s": round(time.perf_counter() - wall0, 1),
        "curve": {"update": [(c + 1) * config.eval_every for c in range(config.num_chunks)],
                  "success": [[round(float(x), 4) for x in row] for row in curve]},
        "outcomes": outcomes, "settings": study.settings(),
        "machine": {"backend": jax.default_backend(), "cpu_count": os.cpu_count(), "jax": jax.__version__},
    }


def steps_of(config: IPPOConfig, updates: Any, seeds: int) -> tuple[list, list, list]:
    """Per seed: the policy updates (gradient updates of ``update_epochs x num_minibatches``
    minibatches each), the lake steps played (every play of ``num_envs x num_steps``, SFL's
    scoring rollouts included) and the scoring rollouts' share, from the trainer's metrics
    ``[S, chunks, eval_every]`` (``dr``: one trained play an update)."""
    import jax

    ued = updates.ued
    per_play = config.num_envs * config.num_steps
    if ued is None:
        return [config.num_updates] * seeds, [config.env_steps] * seeds, [0] * seeds
    plays, learned, scored = (np.asarray(jax.device_get(x), np.float64).reshape(seeds, -1)
                              for x in (ued.plays, ued.learned, ued.scored_steps))
    grad = [int(round(x)) for x in learned.sum(axis=1)]
    scoring = [int(round(x)) for x in scored.sum(axis=1)]
    lake = [int(round(p * per_play)) + c for p, c in zip(plays.sum(axis=1), scoring)]
    return grad, lake, scoring


def _override(value: Any) -> str:
    """A Hydra override's value: lists, null, booleans and numbers as Hydra reads them."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override(v) for v in value) + "]"
    return str(value)


def engineer_command(study: Study, engineer: str, seed: int, runs_dir: Path) -> list[str]:
    """``python -m jaxlake.run student=ippo engineer=<engineer>`` on the study's lakes and IPPO
    settings, ``engineer_stages`` stages of ``ippo.num_updates / engineer_stages`` updates each
    (the same lake steps as a method row), domain randomisation inside every stage."""
    ippo = study.config.to_dict()
    ippo.pop("ued")
    ippo.pop("eval_env")
    ippo["num_updates"] = study.config.num_updates // study.engineer_stages
    lake = study.mixture.configs[0].to_dict()
    return [sys.executable, "-m", "jaxlake.run", "student=ippo", f"engineer={engineer}",
            f"stages={study.engineer_stages}", f"seed={int(seed)}", f"eval={study.engineer_eval}",
            f"runs_dir={runs_dir}", f"experiment={engineer}_seed{int(seed)}", "pipeline.start_eval=false",
            "env=tiny",  # a one-config preset, every field of which is then set to the study's lake
            *[f"env.{k}={_override(v)}" for k, v in lake.items()],
            *[f"ippo.{k}={_override(v)}" for k, v in ippo.items()]]


def run_engineer_unit(study: Study, engineer: str, seed: int, root: Path,
                      programs: Optional[_Programs] = None) -> dict:
    """One engineer run (:func:`engineer_command`, resumed if its folder holds a part of it),
    its last stage's policy scored on the suite; the record."""
    import jax

    from jaxlake.students.stage import POLICY, load_params

    programs = programs or _Programs(study)
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    runs = Path(root) / "engineer_runs"
    runs.mkdir(parents=True, exist_ok=True)
    cmd = engineer_command(study, engineer, seed, runs)
    log = runs / f"{engineer}_seed{int(seed)}.log"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "a", encoding="utf-8") as out:
        t0 = time.perf_counter()
        code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
        child_s = time.perf_counter() - t0
    if code != 0:
        raise StudyError(f"python -m jaxlake.run student=ippo engineer={engineer} seed={seed} exited with status "
                         f"{code}; see {log}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    policy = runs / f"{engineer}_seed{int(seed)}" / f"stage_{study.engineer_stages}" / POLICY
    params = load_params(policy, study.config, study.mixture)
    stacked = jax.tree_util.tree_map(lambda x: x[None], params)
    student, _ = programs.trainer(study.baseline)
    outcomes = {}
    for name, (lakes, play) in programs.cells(student.network).items():
        per_lake = np.asarray(jax.device_get(play(stacked, lakes))) > 0.5
        outcomes[name] = [encode(row) for row in per_lake]
    return {
        "variant": f"engineer_{engineer}", "ued": {"method": "engineer", "engineer": engineer,
                                                  "stages": study.engineer_stages, "eval": study.engineer_eval},
        "seeds": [int(seed)], "updates": study.config.num_updates, "env_steps": study.config.env_steps,
        "grad_steps": [study.config.num_updates], "lake_steps": [study.config.env_steps], "scoring_steps": [0],
        "cpu_s": round(_cpu_s() - cpu0 + child_cpu, 1), "wall_s": round(time.perf_counter() - wall0, 1),
        "run_s": round(child_s, 1), "curve": None, "outcomes": outcomes, "settings": study.settings(),
        "machine": {"backend": jax.default_backend(), "cpu_count": os.cpu_count(), "jax": jax.__version__},
    }


def _differ(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return [d for k in sorted(set(a) | set(b)) for d in _differ(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def load_records(folder: Path, study: Optional[Study] = None) -> list[dict]:
    """The records in ``folder`` (sorted by name); with ``study``, one measured with other
    settings raises :class:`StudyError` naming what differs."""
    out = []
    for path in sorted(Path(folder).glob("*_seeds*-*.json")):
        rec = read_json(path)
        if study is not None:
            diff = _differ(rec.get("settings"), study.settings())
            if not diff and rec.get("variant") in study.methods:
                want = dataclasses.asdict(study.method_config(rec["variant"]).ued)
                diff = [f"ued.{d}" for d in _differ(rec.get("ued"), want)]
            if diff:
                raise StudyError(f"{path} was measured with other settings ({'; '.join(diff[:3])}); choose another "
                                 "experiment=<name> and study.archive=<folder> (or study.results=<page>), or delete it")
        out.append(rec)
    return out


def run_study(study: Study, root: Path, archive: Optional[Path] = None, log=print) -> list[dict]:
    """Every unit without a record, batch by batch; each record written to ``root`` and copied
    to ``archive``. Returns every record of the study."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with FolderLock(root / "study.lock", what="study folder"):
        if archive is not None and Path(archive).is_dir():
            for path in sorted(Path(archive).glob("*_seeds*-*.json")):
                if not (root / path.name).is_file():
                    shutil.copy2(path, root / path.name)
        load_records(root, study)  # refuses records of other settings before any training
        programs = _Programs(study)
        units = [(m, b) for b in study.batches() for m in study.methods]
        units += [(f"engineer_{e}", (s,)) for s in range(study.engineer_seeds) for e in study.engineers]
        for i, (method, seeds) in enumerate(units):
            path = root / record_name(method, seeds)
            if not path.is_file():
                if method in study.methods:
                    rec = run_unit(study, method, seeds, programs)
                else:
                    rec = run_engineer_unit(study, method[len("engineer_"):], seeds[0], root, programs)
                write_json(path, rec)
                log(f"[ued-study] unit {i + 1}/{len(units)}: {method} seeds {seeds[0]}-{seeds[-1]}: {rec['cpu_s']:.0f} "
                    f"CPU s, {rec['wall_s']:.0f} wall s")
            if archive is not None:
                Path(archive).mkdir(parents=True, exist_ok=True)
                if not (Path(archive) / path.name).is_file():
                    shutil.copy2(path, Path(archive) / path.name)
    return load_records(root, study)


def summarize(records: Sequence[dict], study_node: Mapping[str, Any], commit: Optional[str] = None,
              command: str = COMMAND) -> dict:
    """The page's JSON from the records (:func:`jaxlake.students.study_page.payload`), with each
    cell marked in or out of the training generator's support (:func:`in_support`)."""
    if not records:
        raise StudyError("no finished units: run the study first (python -m jaxlake.students.study)")
    from jaxlake.config import LakeConfig
    from jaxlake.mixture import mixture_from_obj

    settings = records[0]["settings"]
    env = mixture_from_obj(settings["env"], LakeConfig())
    support = {c: in_support(env, cell_mixture(env, fields)) for c, fields in settings["cells"].items()}
    return payload(records, study_node, support, commit=commit, command=command)


def _command() -> str:
    """This command line as run (its Hydra overrides, the logging ones left out)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        task = list(HydraConfig.get().overrides.task)
    except (ValueError, ImportError):
        return COMMAND
    import shlex

    shown = [o for o in task if not o.startswith("hydra/") and o.split("=", 1)[0].lstrip("+~") != "study.run"]
    return " ".join([COMMAND, *(shlex.quote(o) for o in shown)])


def _commit() -> Optional[str]:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


# ============================================================================ the command
def study_main(cfg: Any) -> dict:
    """Run (or resume) the study of Hydra config ``cfg`` and write its page; returns the JSON."""
    study = Study.from_cfg(cfg)
    node = to_plain(cfg_get(cfg, "study", {})) or {}
    page = Path(str(node.get("results") or "docs/research/ued-study.md"))
    archive = node.get("archive")
    experiment = str(cfg_get(cfg, "experiment", "ued_fair"))
    archive = (None if archive is False else Path(str(archive)) if archive
               else page.parent / page.stem / "runs" / experiment)
    root = Path(str(cfg_get(cfg, "runs_dir", "runs"))) / experiment
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if node.get("run", True):
        records = run_study(study, root, archive, log=say)
    else:
        folder = root if root.is_dir() and any(root.glob("*_seeds*-*.json")) else archive
        records = load_records(folder, study) if folder is not None and Path(folder).is_dir() else []
    payload = summarize(records, {"baseline": study.baseline, "methods": study.methods,
                                  "engineers": list(study.engineers)}, commit=_commit(), command=_command())
    write_page(page, payload)
    say(f"[ued-study] wrote {page} and {page.with_suffix('.json')}")
    print(verdict(payload))
    return payload


def _guarded(cfg: Any) -> Optional[dict]:
    return run_guarded(study_main, cfg)


def main() -> None:
    """``python -m jaxlake.students.study [key=value ...]`` (Hydra, ``conf/ued_study.yaml``)."""
    import hydra

    from jaxlake.conf import CONF_DIR

    hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="ued_study")(_guarded)()


if __name__ == "__main__":
    main()
