"""Data parallelism with ``jax.sharding``: one mesh axis over every device.

* :func:`make_mesh` builds a 1-D :class:`jax.sharding.Mesh` (axis ``"data"``) over all
  devices (all hosts' devices after :func:`initialize_distributed`).
* Batches are sharded on their leading axis (:func:`batch_sharding`, :func:`shard_batch`);
  parameters and optimizer state are replicated (:func:`replicate`).
* Inside ``jit`` XLA partitions the computation from those input shardings: each device runs
  its slice of the batch, and the gradient (a sum over the batch) is all-reduced.

Multi-host: every process builds the same global host batch from shared seeds and
:func:`shard_batch` hands each process's rows to ``jax.make_array_from_process_local_data``;
with one process that is a plain ``device_put``. (The multi-host path is written for
``jax.distributed`` but only the single-process path is tested here.)
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


def initialize_distributed(config: Optional[Mapping[str, Any]] = None) -> bool:
    """Call ``jax.distributed.initialize`` when configured; return whether it ran.

    ``config`` keys (all optional; unset ones are left to JAX's cluster auto-detection):
    ``enabled`` (bool), ``coordinator_address``, ``num_processes``, ``process_id``,
    ``local_device_ids``. It also runs when the environment variable
    ``JAXLAKE_DISTRIBUTED=1`` is set. Must be called before any other JAX computation.
    """
    config = dict(config or {})
    enabled = bool(config.pop("enabled", False)) or os.environ.get("JAXLAKE_DISTRIBUTED") == "1"
    if not enabled:
        return False
    kwargs = {k: v for k, v in config.items() if v is not None}
    jax.distributed.initialize(**kwargs)
    return True


def make_mesh(devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """A 1-D data-parallel mesh over ``devices`` (default: every device of every process)."""
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("make_mesh needs at least one device")
    return Mesh(np.asarray(devices), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading axis split over the ``data`` axis; other axes whole."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def check_divisible(rows: int, mesh: Mesh, what: str = "batch rows") -> None:
    """Raise ``ValueError`` unless ``rows`` splits evenly over the mesh's devices."""
    n = mesh.devices.size
    if rows % n:
        raise ValueError(f"{what}={rows} must be divisible by the number of devices ({n}) for data parallelism")


def shard_batch(tree: Any, mesh: Mesh) -> Any:
    """Place a pytree of per-row host arrays (leading axis = rows) split over the mesh.

    Every process passes the same *global* host batch (the trainer derives it from shared
    seeds); with several processes each one contributes only its own rows
    (:func:`process_slice`) and gets the global array back.
    """
    sharding = batch_sharding(mesh)
    if jax.process_count() == 1:
        return jax.tree_util.tree_map(lambda x: jax.device_put(np.asarray(x), sharding), tree)

    def place(x):
        x = np.asarray(x)
        return jax.make_array_from_process_local_data(sharding, x[process_slice(x.shape[0])], x.shape)

    return jax.tree_util.tree_map(place, tree)


def to_host(x: Any) -> np.ndarray:
    """A (possibly sharded, possibly multi-host) array as a full numpy array on this host.

    One process: ``jax.device_get``. Several: a replicated array is read from a local shard;
    a batch-sharded one is gathered from every process (``process_allgather``: every process
    must call it).
    """
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    if x.sharding.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Place a pytree (parameters, optimizer state) replicated on every device of the mesh."""
    return jax.device_put(tree, replicated(mesh))


def process_slice(n: int) -> slice:
    """The rows ``[start, stop)`` of ``n`` global items that this process owns (even split)."""
    count, index = jax.process_count(), jax.process_index()
    if n % count:
        raise ValueError(f"{n} items cannot be split evenly over {count} processes")
    per = n // count
    return slice(index * per, (index + 1) * per)
