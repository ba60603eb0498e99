"""One stage of the staged pipeline for the IPPO student: ``ippo.num_updates`` updates on a
stage's mixture, from the previous stage's parameters, resumable.

:func:`train_stage` is what ``python -m jaxlake.run student=ippo`` runs in each stage folder
(the pipeline's student protocol, :mod:`jaxlake.pipeline.student`, calls it): the trainer of
:func:`jaxlake.students.ippo.lake_student` on the stage's mixture, its parameters replaced by
the previous stage's (``init_params``; stage 1 starts from the network's initialisation), one
jitted chunk (``ippo.eval_every`` updates, then a greedy check on the mixture's own held-out
lakes) at a time. The optimiser starts afresh in every stage (its learning rate annealed over
the stage when ``ippo.anneal_lr``). Files, in the stage folder:

* ``checkpoint.npz`` -- the whole loop state after the last chunk (:mod:`jaxlake.students.checkpoint`);
  a stage that was cut short resumes from it, exactly where it stopped;
* ``metrics.jsonl`` -- one row per chunk (``phase: ippo``), row 0 the starting parameters;
* ``policy.npz`` -- the trained parameters, written last (the next stage starts from them).
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np

from jaxlake.config import LakeConfig
from jaxlake.metrics import JsonlWriter
from jaxlake.mixture import Mixture
from jaxlake.students import checkpoint
from jaxlake.students.compiled import jit
from jaxlake.students.config import IPPOConfig
from jaxlake.students.ippo import lake_student

__all__ = ["CHECKPOINT", "METRICS", "PHASE", "POLICY", "compiled", "init_params", "load_params", "train_stage"]

PHASE = "ippo"
CHECKPOINT = "checkpoint.npz"
METRICS = "metrics.jsonl"
POLICY = "policy.npz"


def _heldout(h: Any) -> dict:
    h = jax.device_get(h)
    return {k: float(getattr(h, k)) for k in ("success", "arrived", "fell", "timed_out")}


#: How many trainers :func:`compiled` keeps (least recently used dropped first).
KEEP_BUILT = 8


def compiled(config: IPPOConfig, mixture: Any) -> tuple[Any, Any, Any, Any]:
    """``(student, jit(init), jit(chunk), jit(evaluate))`` of :func:`lake_student`, built once per
    process for equal settings and mixture: the stages of a run (and the runs of a sweep in one
    process) that train the same mixture with the same settings reuse its compiled programs
    instead of tracing and compiling them again."""
    return _compiled(config, tuple((float(w), json.dumps(c.to_dict(), sort_keys=True)) for w, c in Mixture.of(mixture)))


@functools.lru_cache(maxsize=KEEP_BUILT)
def _compiled(config: IPPOConfig, components: tuple) -> tuple[Any, Any, Any, Any]:
    """:func:`compiled` by a hashable key: the mixture as ``(weight, config JSON)`` pairs."""
    student = lake_student(config, Mixture([(w, LakeConfig(**json.loads(c))) for w, c in components]))
    return student, jit(student.init), jit(student.chunk), jit(student.evaluate)


def init_params(config: IPPOConfig, mixture: Any, key: jax.Array) -> Any:
    """The network's initial parameters (what stage 1 starts from with ``key``)."""
    return compiled(config, mixture)[1](key).params


def load_params(path: str | Path, config: IPPOConfig, mixture: Any) -> Any:
    """Parameters saved by :func:`train_stage` (``policy.npz``), shaped for ``config``'s network."""
    student = compiled(config, mixture)[0]
    template = jax.eval_shape(student.init, jax.random.PRNGKey(0)).params
    return checkpoint.load(path, template)[0]


def train_stage(config: IPPOConfig, mixture: Any, folder: str | Path, *, key: jax.Array,
                init_from: Optional[str | Path] = None, progress: bool = False) -> dict:
    """Train (or finish) one stage in ``folder``; returns what ``train.json`` records (paths
    relative to ``folder``): ``policy``, ``updates``, ``env_steps``, ``eval_before`` /
    ``eval_after`` (greedy success on the mixture's own held-out lakes), ``resumed``, ``wall_s``."""
    t0 = time.perf_counter()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    student, init, chunk, evaluate = compiled(config, mixture)
    ckpt = folder / CHECKPOINT
    start = 0
    if ckpt.is_file():
        runner, meta = checkpoint.load(ckpt, jax.eval_shape(student.init, key))
        start = int(meta["chunk"])
    else:
        runner = init(key)
        if init_from is not None:
            runner = runner._replace(params=load_params(init_from, config, mixture))
    writer = JsonlWriter(folder / METRICS, phases=(PHASE,))
    writer.truncate(PHASE, start if start else -1)
    if not start:
        writer.append({"phase": PHASE, "step": 0, "update": 0, "env_steps": 0,
                       "heldout": _heldout(evaluate(runner.params))})
    for c in range(start, config.num_chunks):
        runner, m = chunk(runner)
        u = jax.device_get(m.updates)
        update = (c + 1) * config.eval_every
        writer.append({"phase": PHASE, "step": c + 1, "update": update,
                       "env_steps": update * config.num_envs * config.num_steps,
                       "train": {"success": float(np.mean(u.success)), "episodes": float(np.sum(u.episodes)),
                                 "reward": float(np.mean(u.reward)),
                                 **{k: float(np.mean(v)) for k, v in u.loss._asdict().items()}},
                       "heldout": _heldout(m.heldout)})
        checkpoint.save(ckpt, runner, {"chunk": c + 1, "update": update})
        if progress:
            print(f"[ippo] chunk {c + 1}/{config.num_chunks}: held-out {float(m.heldout.success):.3f}", flush=True)
    checkpoint.save(folder / POLICY, runner.params, {"updates": config.num_updates})
    rows = [r for r in writer.rows() if r.get("phase") == PHASE]
    return {
        "policy": POLICY,
        "checkpoint": CHECKPOINT,
        "updates": config.num_updates,
        "env_steps": config.env_steps,
        "eval_before": rows[0]["heldout"] if rows else None,
        "eval_after": rows[-1]["heldout"] if rows else None,
        "resumed": start > 0,
        "wall_s": round(time.perf_counter() - t0, 2),
    }
