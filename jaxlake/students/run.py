"""The IPPO student's command, ``python -m jaxlake.ippo`` (Hydra, ``conf/ippo.yaml``).

It trains :func:`jaxlake.students.ippo.lake_student` on the ``env`` mixture, one jitted chunk
(``ippo.eval_every`` updates, then a greedy held-out evaluation) at a time, and writes into
its run folder, Hydra's output folder: ``<runs_dir>/<experiment>`` (a sweep's job:
``<runs_dir>/<experiment>/multirun/<job>``):

* ``run.lock`` -- held while it runs (:class:`jaxlake.io.FolderLock`): a second command on the
  same folder refuses at once, naming the holder;
* ``settings.json`` -- the resolved settings (``env`` mixture, ``ippo``, ``seed``); a rerun with
  other settings is refused, so one folder never mixes two runs;
* ``checkpoint.npz`` -- the whole loop state after the last chunk (:mod:`jaxlake.students.checkpoint`);
  rerunning the same command resumes from it, and the resumed run equals an uninterrupted one;
* ``metrics.jsonl`` -- one row per chunk (``phase: ippo``, ``step`` 1, 2, ...): lake steps, the
  training episodes' success and losses, the held-out result, the process CPU time (user +
  sys) and wall time since the command started (start-up and compiles included; a resumed run
  adds the earlier sessions' totals at their last checkpoint; a sweep's later job counts from
  where the job before it ended), and row 0, the untrained policy on the held-out lakes; rows
  after the checkpoint are dropped on resume;
* ``curve.png`` -- the learning curve (:mod:`jaxlake.students.plots`);
* ``result.json`` -- the final and best held-out success and the first chunk at 0.9 (its
  update, lake steps, CPU and wall seconds).

A user's mistake (a bad setting, a locked folder, a folder of another run, an unwritable
file) ends with one line, ``error: <what>``, naming the field or the file, and exit status 1;
``HYDRA_FULL_ERROR=1`` shows the traceback instead.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Optional

import hydra
import jax
import numpy as np
from omegaconf import DictConfig

from jaxlake.config import cfg_get, to_plain
from jaxlake.conf import CONF_DIR
from jaxlake.io import FolderLock, read_json, write_json
from jaxlake.metrics import JsonlWriter
from jaxlake.mixture import mixture_from_node, mixture_to_obj
from jaxlake.students import checkpoint
from jaxlake.students.command import run_guarded
from jaxlake.students.compiled import jit
from jaxlake.students.config import IPPOConfig, StudentConfigError
from jaxlake.students.ippo import ChunkMetrics, lake_student
from jaxlake.students.plots import learning_curve

__all__ = ["PHASE", "TARGET", "main", "train_run"]

#: The metrics rows' phase.
PHASE = "ippo"
#: The held-out success the result reports the first chunk at.
TARGET = 0.9


_T0 = time.time()
#: Process CPU and wall seconds at the end of the previous run in this process (a sweep's jobs
#: run one after the other in one process: each counts from where the one before ended).
_BEFORE = {"cpu": 0.0, "wall": 0.0}


def _cpu_s() -> float:
    """This process's CPU seconds so far (user + sys, every thread)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _wall_s() -> float:
    """Seconds since this process started (Linux ``/proc``; elsewhere since this module's import)."""
    try:
        start_ticks = float(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time() - _T0


def _row(chunk: int, config: IPPOConfig, m: ChunkMetrics, cpu_s: float, wall_s: float) -> dict:
    u, h = jax.device_get(m.updates), jax.device_get(m.heldout)
    loss = {k: float(np.mean(v)) for k, v in u.loss._asdict().items()}
    update = (chunk + 1) * config.eval_every
    return {"phase": PHASE, "step": chunk + 1, "update": update,
            "env_steps": update * config.num_envs * config.num_steps,
            "train": {"success": float(np.mean(u.success)), "episodes": float(np.sum(u.episodes)),
                      "reward": float(np.mean(u.reward)), **loss},
            "heldout": {"success": float(h.success), "arrived": float(h.arrived), "fell": float(h.fell),
                        "timed_out": float(h.timed_out)},
            "cpu_s": round(cpu_s, 2), "wall_s": round(wall_s, 2)}


def _settings(cfg: Any) -> tuple[dict, IPPOConfig, Any, int]:
    config = IPPOConfig.from_node(cfg_get(cfg, "ippo", {}))
    mixture = mixture_from_node(cfg.env)
    config.check_batch(max(int(c.num_agents) for c in mixture.configs))  # the lakes' actors
    seed = to_plain(cfg_get(cfg, "seed", 0))
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise StudentConfigError(f"seed={seed!r} must be an integer in [0, inf)")
    record = {"env": mixture_to_obj(mixture), "ippo": config.to_dict(), "seed": seed}
    return record, config, mixture, seed


def _check_folder(run_dir: Path, record: dict) -> None:
    path = run_dir / "settings.json"
    if not path.is_file():
        return
    try:
        old = read_json(path)
    except ValueError as err:
        raise StudentConfigError(f"{path} is not valid JSON ({err}); restore it or delete the folder") from None
    changed = []
    for group in ("env", "ippo", "seed"):
        a, b = old.get(group), record[group]
        if isinstance(a, dict) and isinstance(b, dict):
            changed += [f"{group}.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
                        if a.get(k) != b.get(k)]
        elif a != b:
            changed.append(f"{group}: {a!r} -> {b!r}")
    if changed:
        raise StudentConfigError(f"{run_dir} holds a run with other settings ({'; '.join(changed[:4])}); "
                                 "choose another experiment=<name> or delete the folder")


def train_run(cfg: Any, run_dir: Optional[Path] = None) -> dict:
    """Train (or resume) the run of Hydra config ``cfg`` in its folder; returns ``result.json``'s record."""
    try:
        return _train_run(cfg, run_dir)
    finally:
        _BEFORE.update(cpu=_cpu_s(), wall=_wall_s())


def _train_run(cfg: Any, run_dir: Optional[Path]) -> dict:
    record, config, mixture, seed = _settings(cfg)
    default = Path(str(cfg_get(cfg, "runs_dir", "runs"))) / str(cfg_get(cfg, "experiment", "ippo"))
    run_dir = Path(run_dir or _hydra_dir() or default)
    progress = bool(cfg_get(cfg, "progress", True))
    run_dir.mkdir(parents=True, exist_ok=True)
    with FolderLock(run_dir / "run.lock", what="run folder"):
        _check_folder(run_dir, record)
        write_json(run_dir / "settings.json", record)
        student = lake_student(config, mixture)
        init, chunk = jit(student.init), jit(student.chunk)
        key = jax.random.PRNGKey(seed)
        ckpt = run_dir / "checkpoint.npz"
        start, cpu0, wall0 = 0, 0.0, 0.0
        if ckpt.is_file():
            runner, meta = checkpoint.load(ckpt, jax.eval_shape(student.init, key))
            start, cpu0, wall0 = int(meta["chunk"]), float(meta["cpu_s"]), float(meta["wall_s"])
            _say(f"resuming {run_dir} after chunk {start} of {config.num_chunks}")
        else:
            runner = init(key)
        writer = JsonlWriter(run_dir / "metrics.jsonl", phases=(PHASE,))
        writer.truncate(PHASE, start if start else -1)
        if not start:  # the untrained policy: the curve's first point
            h = jax.device_get(jit(student.evaluate)(runner.params))
            writer.append({"phase": PHASE, "step": 0, "update": 0, "env_steps": 0, "train": {},
                           "heldout": {k: float(getattr(h, k)) for k in ("success", "arrived", "fell", "timed_out")},
                           "cpu_s": round(_cpu_s() - _BEFORE["cpu"], 2),
                           "wall_s": round(_wall_s() - _BEFORE["wall"], 2)})
        bar = _bar(progress, start, config.num_chunks)
        for c in range(start, config.num_chunks):
            runner, m = chunk(runner)
            # earlier sessions + this process so far (less an earlier sweep job's share)
            cpu_s, wall_s = cpu0 + _cpu_s() - _BEFORE["cpu"], wall0 + _wall_s() - _BEFORE["wall"]
            row = _row(c, config, m, cpu_s, wall_s)
            writer.append(row)
            checkpoint.save(ckpt, runner, {"chunk": c + 1, "cpu_s": cpu_s, "wall_s": wall_s,
                                           "update": row["update"]})
            _show(bar, row, config.num_chunks)
        if bar is not None:
            bar.close()
        rows = [r for r in writer.rows() if r.get("phase") == PHASE]
        learning_curve(rows, run_dir / "curve.png", title=_title(mixture), target=TARGET)
        result = _result(rows, config, resumed=start > 0)
        write_json(run_dir / "result.json", result)
        return result


def _hydra_dir() -> Optional[Path]:
    """Hydra's output folder of this job (``hydra.run.dir``, or a sweep job's own folder), if
    running under Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except (ValueError, ImportError):
        return None


def _title(mixture: Any) -> str:
    c = mixture.main
    more = f" (+{len(mixture) - 1} more configs)" if len(mixture) > 1 else ""
    return f"IPPO, {c.height}x{c.width} lakes, {c.num_agents} agents, {c.hole_density:g} holes{more}"


def _result(rows: list, config: IPPOConfig, resumed: bool) -> dict:
    hit = next((r for r in rows if r["step"] > 0 and r["heldout"]["success"] >= TARGET), None)
    last = rows[-1] if rows else None
    return {
        "heldout_success": None if last is None else last["heldout"]["success"],
        "best_heldout_success": max((r["heldout"]["success"] for r in rows), default=None),
        "target": TARGET,
        "first_at_target": None if hit is None else {k: hit[k] for k in ("update", "env_steps", "cpu_s", "wall_s")},
        "updates": config.num_updates, "env_steps": config.env_steps,
        "cpu_s": None if last is None else last["cpu_s"], "wall_s": None if last is None else last["wall_s"],
        "backend": jax.default_backend(), "devices": jax.device_count(), "cpu_count": os.cpu_count(),
        "jax": jax.__version__, "resumed": resumed,
        "eval": {"lakes": config.eval_lakes, "seed": config.eval_seed, "mode": "greedy"},
    }


def _say(msg: str) -> None:
    print(f"[ippo] {msg}", file=sys.stderr, flush=True)


def _bar(progress: bool, start: int, total: int):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, desc="ippo chunks", file=sys.stderr, dynamic_ncols=True)


def _show(bar, row: dict, total: int) -> None:
    text = (f"held-out {row['heldout']['success']:.3f} train {row['train']['success']:.3f} "
            f"{row['env_steps'] / 1e6:.2f}M steps {row['cpu_s']:.0f} CPU s")
    if bar is None:
        _say(f"chunk {row['step']}/{total}: {text}")
    else:
        bar.set_postfix_str(text)
        bar.update(1)


def _guarded(cfg: DictConfig) -> Optional[dict]:
    return run_guarded(train_run, cfg)


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="ippo")
def _hydra_main(cfg: DictConfig) -> Optional[dict]:
    return _guarded(cfg)


def main() -> None:
    """``python -m jaxlake.ippo [key=value ...]``: Hydra's entry point (module docstring)."""
    _hydra_main()
