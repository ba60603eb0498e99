"""The trainer's checkpoint: the whole loop state in one ``.npz``, written atomically.

:func:`save` writes every leaf of a pytree (parameters, optimiser state, the lakes in play,
the PRNG key: a resumed run continues exactly where the saved one would have) plus a JSON
``meta`` record, through :func:`jaxlake.io.write_bytes` (a temporary file renamed into place:
a kill leaves the previous checkpoint whole). :func:`load` fills a template of the same
structure (e.g. ``jax.eval_shape`` of the trainer's ``init``) and refuses, naming the file, a
checkpoint whose leaves do not match it.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxlake.io import write_bytes
from jaxlake.students.config import StudentConfigError

__all__ = ["load", "save"]


def save(path: str | os.PathLike, tree: Any, meta: dict) -> Path:
    """Write ``tree``'s leaves and ``meta`` (JSON-ready) to ``path`` atomically."""
    leaves = jax.tree_util.tree_leaves(jax.device_get(tree))
    buf = io.BytesIO()
    arrays = {f"leaf_{i:05d}": np.asarray(x) for i, x in enumerate(leaves)}
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8), **arrays)
    return write_bytes(path, buf.getvalue())


def load(path: str | os.PathLike, template: Any) -> tuple[Any, dict]:
    """``(tree, meta)`` from ``path``, the tree shaped like ``template`` (arrays or
    ``jax.ShapeDtypeStruct``); raises :class:`StudentConfigError` naming the file when the
    checkpoint is unreadable or was written with other settings."""
    leaves, treedef = jax.tree_util.tree_flatten(template)
    try:
        with np.load(path) as data:
            meta = json.loads(bytes(data["meta"]).decode("utf-8"))
            stored = [data[f"leaf_{i:05d}"] for i in range(len(leaves))] if len(data.files) == len(leaves) + 1 else None
    except (OSError, ValueError, KeyError) as err:
        raise StudentConfigError(f"{path}: not a readable checkpoint ({err}); delete it to start over") from None
    if stored is None or any(s.shape != tuple(t.shape) or s.dtype != t.dtype for s, t in zip(stored, leaves)):
        raise StudentConfigError(f"{path} holds a checkpoint of other settings; choose another experiment=<name> "
                                 "or delete the run folder")
    return jax.tree_util.tree_unflatten(treedef, [jax.numpy.asarray(s) for s in stored]), meta
