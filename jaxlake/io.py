"""Atomic file writes and JSON conversion: the one place the package writes result files.

Every writer puts the data into a temporary file beside the target (``.<name>.tmp``, same
folder, so the rename stays on one file system) and renames it into place with
:func:`os.replace`: a reader (or a resumed run) sees the old file or the new one, never a
torn one. A run killed mid-write leaves at most a stale ``.<name>.tmp``, overwritten by the
next write.

* :func:`write_bytes`, :func:`write_text` -- atomic writes;
* :func:`write_json` -- atomic JSON (arrays and numpy scalars converted by :func:`jsonable`);
* :func:`read_json`;
* :func:`jsonable` -- numpy / JAX values as plain Python, non-finite floats as ``None``
  (strict JSON has no NaN).

One writer per run: a run on several JAX processes (:mod:`jaxlake.pipeline.cluster`) calls
:func:`set_writer` ``(False)`` on every process but 0, whose writes through this module (and
the metric back ends of :func:`jaxlake.metrics.build_writer`) then do nothing, so each file
is written once, by one process. :func:`is_writer` says which this process is (``True`` in a
single-process run).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Optional

import jax
import numpy as np

__all__ = ["is_writer", "jsonable", "read_json", "set_writer", "write_bytes", "write_json", "write_text"]

_WRITER = True


def set_writer(flag: bool) -> None:
    """Make this process the run's writer (``True``, the default) or a silent one."""
    global _WRITER
    _WRITER = bool(flag)


def is_writer() -> bool:
    """Whether this process writes the run's files (:func:`set_writer`)."""
    return _WRITER


def _tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file renamed into place); nothing on a
    process that is not the run's writer (:func:`set_writer`)."""
    path = Path(path)
    if not _WRITER:
        return path
    tmp = _tmp_path(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return write_bytes(path, text.encode("utf-8"))


def jsonable(x: Any) -> Any:
    """``x`` with numpy / JAX arrays and scalars as Python values, mappings and sequences
    converted recursively, non-finite floats as ``None``; other objects unchanged."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.generic, np.ndarray, jax.Array)):
        arr = np.asarray(x)
        return jsonable(arr.item() if arr.ndim == 0 else arr.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json(path: str | os.PathLike, obj: Any, *, indent: Optional[int] = 1) -> Path:
    """Write ``obj`` as JSON atomically (through :func:`jsonable`; anything else JSON cannot
    hold, e.g. a ``Path``, is written as its ``str``)."""
    return write_text(path, json.dumps(jsonable(obj), indent=indent, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """The JSON value in ``path``."""
    return json.loads(Path(path).read_text(encoding="utf-8"))
