"""Stage 1 shared between runs (``pipeline.share_stage1``): a sweep over engineers trains
stage 1 once per seed.

Stage 1's training, evaluation and summaries depend only on the settings :func:`stage1_key` hashes
(not on the engineer, whose first decision comes after them). The first run stores its finished
stage 1 (without the engineer's files) under that key (:func:`store_shared_stage1`, atomically);
later runs with the same key copy it (:func:`restore_shared_stage1`) and run their own engineer.
The store has its own lock per key (``<store>/<key>.lock``), independent of the run folders' locks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from jaxlake.io import FolderLock, read_json, write_json
from jaxlake.mixture import Mixture, mixture_to_obj
from jaxlake.pipeline.folder import log, rewrite_paths
from jaxlake.pipeline.settings import RunSettings

#: How long a run waits for another one's copy into or out of the shared stage-1 store.
STORE_WAIT_S = 600.0
#: Stage-1 files that belong to the engineer (never shared).
_ENGINEER_FILES = ("engineer.json", "next_env.yaml")
_SOURCE_FILE = "shared_from.json"


def stage1_key(cfg: Any, mixture: Mixture) -> str:
    """Hash of everything stage 1's training, evaluation and summaries depend on: the run's
    settings (:func:`run_settings`, less the warm-start policy of later stages), its seed and
    stage 1's environment (the engineer's initial mixture, which may replace ``env``).
    ``cfg``: the :class:`RunSettings` or a raw config."""
    s = RunSettings.of(cfg)
    settings = s.record()
    for later in ("env", "pipeline.warmstart"):
        settings.pop(later)
    payload = {"settings": settings, "seed": s.seed, "env": mixture_to_obj(mixture)}
    blob = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _store_lock(share: Path, key: str) -> FolderLock:
    """The shared stage-1 store's own lock for ``key`` (``<store>/<key>.lock``): runs of a sweep
    copy into and out of the store one at a time; a run waits for another's copy (up to
    :data:`STORE_WAIT_S`) instead of refusing."""
    return FolderLock(share / f"{key}.lock", what="shared stage-1 store", wait_s=STORE_WAIT_S,
                      on_stale=lambda r: log(f"took over a stale lock of the shared stage-1 store {share} "
                                              f"(process {r.get('pid')} on {r.get('host')} is gone)"))


def restore_shared_stage1(s: RunSettings, d: Path, mixture: Mixture) -> bool:
    """Fill stage folder ``d`` from the shared stage-1 store when it holds this run's key."""
    share = s.share_stage1
    if share is None or (d / "train.json").is_file():
        return False
    key = stage1_key(s, mixture)
    src = share / key
    if not (src / "summary.json").is_file():
        return False
    with _store_lock(share, key):
        origin = read_json(src / _SOURCE_FILE)["dir"]
        for item in src.iterdir():
            if item.name in (_SOURCE_FILE, "env.yaml") + _ENGINEER_FILES:
                continue
            target = d / item.name
            if item.is_dir():
                shutil.copytree(item, target, dirs_exist_ok=True)
            else:
                shutil.copy2(item, target)
    rewrite_paths(d, origin, str(d))
    write_json(d / _SOURCE_FILE, {"dir": origin, "key": key})
    log(f"stage 1: shared from {origin} (pipeline.share_stage1 key {key})")
    return True


def store_shared_stage1(s: RunSettings, d: Path, mixture: Mixture) -> None:
    """Copy a finished stage 1 (engineer files excluded) into the shared store, atomically
    (a temporary folder renamed into place) and under the store's own lock."""
    share = s.share_stage1
    if share is None:
        return
    key = stage1_key(s, mixture)
    dst = share / key
    if dst.is_dir():
        return
    share.mkdir(parents=True, exist_ok=True)
    with _store_lock(share, key):
        if dst.is_dir():  # another run stored the same key while this one waited
            return
        tmp = share / f".{dst.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(d, tmp, ignore=shutil.ignore_patterns(*_ENGINEER_FILES, _SOURCE_FILE, "*.tmp", "wandb"))
        write_json(tmp / _SOURCE_FILE, {"dir": str(d)})
        try:
            os.replace(tmp, dst)
        except OSError:  # another run stored the same key first
            shutil.rmtree(tmp, ignore_errors=True)
