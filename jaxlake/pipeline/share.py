"""Stages shared between runs (``pipeline.share_stages``): a sweep over engineers trains each
distinct stage once.

A stage's training and held-out evaluation depend only on the settings :func:`stage_key` hashes:
the run's settings (not the engineer), its seed, the stage's number and the environments of
this stage and every earlier one (the earlier ones fix the policy it starts from). Stage 1 comes
before the engineer's first decision, so it is the same for every engineer of a seed; a later
stage is shared whenever two engineers chose the same environments so far (in the CPU study
the policy engineer and its context ablations often do, and ``heuristic`` often keeps
``fixed``'s environment).

The first run stores its finished stage (without the engineer's files) under the key
(:func:`store_shared_stage`, atomically); later runs with the same key copy it
(:func:`restore_shared_stage`) and then run their own summary (after stage 1 it reads the
engineer's history) and their own engineer. The store has its own lock per key
(``<store>/<key>.lock``), independent of the run folders' locks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from jaxlake.io import FolderLock, read_json, write_json
from jaxlake.mixture import Mixture, load_mixture, mixture_to_obj
from jaxlake.pipeline.folder import log, rewrite_paths
from jaxlake.pipeline.settings import RunSettings

#: How long a run waits for another one's copy into or out of the shared store.
STORE_WAIT_S = 600.0
#: Stage files that belong to the engineer (never shared).
_ENGINEER_FILES = ("engineer.json", "next_env.yaml")
#: Files a stage after the first never shares: its summary reads the engineer's earlier decisions.
_SUMMARY_FILES = ("summary.json", "summary.txt")
_SOURCE_FILE = "shared_from.json"


def stage_key(cfg: Any, k: int, mixtures: Sequence[Mixture]) -> str:
    """Hash of everything stage ``k``'s training and held-out evaluation depend on: the run's
    settings (``run.json``'s, less ``env``, which the engineer replaces), its seed, ``k``,
    whether each stage up to ``k`` warm-starts, and ``mixtures``: the environments of stages
    1..k. ``cfg``: the :class:`RunSettings` or a raw config."""
    s = RunSettings.of(cfg)
    k = int(k)
    if len(mixtures) != k:
        raise ValueError(f"stage_key: stage {k} needs the environments of stages 1..{k}, got {len(mixtures)}")
    settings = s.record()
    for later in ("env", "pipeline.warmstart"):
        settings.pop(later)
    payload = {"settings": settings, "seed": s.seed, "stage": k,
               "warmstart": [bool(s.stage_config(j).train.warmstart.enabled) for j in range(1, k + 1)],
               "env": [mixture_to_obj(m) for m in mixtures]}
    blob = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_stage_key(s: RunSettings, k: int, mixture: Mixture) -> str:
    """:func:`stage_key` of this run's stage ``k``: the earlier stages' environments are read
    from their ``env.yaml``."""
    earlier = [load_mixture(s.stage_dir(j) / "env.yaml") for j in range(1, k)]
    return stage_key(s, k, [*earlier, mixture])


def _store_lock(share: Path, key: str) -> FolderLock:
    """The shared store's own lock for ``key`` (``<store>/<key>.lock``): runs of a sweep copy
    into and out of the store one at a time; a run waits for another's copy (up to
    :data:`STORE_WAIT_S`) instead of refusing."""
    return FolderLock(share / f"{key}.lock", what="shared stage store", wait_s=STORE_WAIT_S,
                      on_stale=lambda r: log(f"took over a stale lock of the shared stage store {share} "
                                              f"(process {r.get('pid')} on {r.get('host')} is gone)"))


def _private(k: int) -> tuple[str, ...]:
    """The files of stage ``k`` each run writes itself."""
    return _ENGINEER_FILES + (_SUMMARY_FILES if k > 1 else ())


def restore_shared_stage(s: RunSettings, k: int, d: Path, mixture: Mixture) -> bool:
    """Fill stage folder ``d`` (stage ``k``) from the shared store when it holds its key."""
    share = s.share_stages
    if share is None or (d / "train.json").is_file():
        return False
    key = run_stage_key(s, k, mixture)
    src = share / key
    if not (src / "eval.json").is_file():
        return False
    with _store_lock(share, key):
        origin = read_json(src / _SOURCE_FILE)["dir"]
        for item in src.iterdir():
            if item.name in (_SOURCE_FILE, "env.yaml") + _private(k):
                continue
            target = d / item.name
            if item.is_dir():
                shutil.copytree(item, target, dirs_exist_ok=True)
            else:
                shutil.copy2(item, target)
    rewrite_paths(d, origin, str(d))
    write_json(d / _SOURCE_FILE, {"dir": origin, "key": key})
    log(f"stage {k}: shared from {origin} (pipeline.share_stages key {key})")
    return True


def store_shared_stage(s: RunSettings, k: int, d: Path, mixture: Mixture) -> None:
    """Copy a trained and evaluated stage ``k`` (the run's own files excluded) into the shared
    store, atomically (a temporary folder renamed into place) and under the store's own lock."""
    share = s.share_stages
    if share is None or (d / _SOURCE_FILE).is_file():  # a copy from the store: already there
        return
    key = run_stage_key(s, k, mixture)
    dst = share / key
    if dst.is_dir():
        return
    share.mkdir(parents=True, exist_ok=True)
    with _store_lock(share, key):
        if dst.is_dir():  # another run stored the same key while this one waited
            return
        tmp = share / f".{dst.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(d, tmp, ignore=shutil.ignore_patterns(*_private(k), _SOURCE_FILE, "*.tmp", "wandb"))
        write_json(tmp / _SOURCE_FILE, {"dir": str(d)})
        try:
            os.replace(tmp, dst)
        except OSError:  # another run stored the same key first
            shutil.rmtree(tmp, ignore_errors=True)
