"""Shard a batch of lakes / states / keys over the local devices (``jax.sharding``).

Simulation batches are embarrassingly parallel along their leading axis, so one 1-D
:class:`jax.sharding.Mesh` over ``jax.local_devices()`` with the batch axis split
(``PartitionSpec("batch")``) uses a TPU slice or a multi-GPU host whole: put the inputs with
:func:`shard_batch` and ``jax.jit`` partitions the vmapped computation along them (no
``shard_map`` needed; keep outputs sharded with :func:`constrain_batch`). Random numbers drawn
inside the jitted function for a ``[B, ...]`` shape are the same sharded or not (JAX's
partitionable threefry, the default), so a sharded rollout ends in the same states as the
unsharded one (``tests/jaxlake/test_sharding.py`` checks it on 4 forced host devices).

Used by ``jaxlake.bench`` and reusable by GRPO.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

#: Name of the mesh axis that splits the batch.
BATCH_AXIS = "batch"


def local_mesh(num_devices: Optional[int] = None, *, devices: Optional[Sequence[Any]] = None,
               axis_name: str = BATCH_AXIS) -> Mesh:
    """A 1-D mesh over the first ``num_devices`` local devices (all of them by default)."""
    devices = list(devices) if devices is not None else list(jax.local_devices())
    if num_devices is None:
        num_devices = len(devices)
    if not 1 <= num_devices <= len(devices):
        raise ValueError(f"num_devices={num_devices} not in [1, {len(devices)}] (local devices)")
    return Mesh(np.asarray(devices[:num_devices]), (axis_name,))


def devices_for_batch(batch_size: int, num_devices: Optional[int] = None) -> int:
    """The most local devices (at most ``num_devices``) that split ``batch_size`` evenly."""
    available = len(jax.local_devices()) if num_devices is None else num_devices
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    return max(d for d in range(1, available + 1) if batch_size % d == 0)


def mesh_for_batch(batch_size: int, *, axis_name: str = BATCH_AXIS) -> Mesh:
    """A mesh over as many local devices as divide ``batch_size`` (all for a multiple)."""
    return local_mesh(devices_for_batch(batch_size), axis_name=axis_name)


def round_up(batch_size: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is ``>= batch_size``."""
    return int(math.ceil(batch_size / multiple) * multiple)


def batch_sharding(mesh: Mesh, *, axis_name: str = BATCH_AXIS) -> NamedSharding:
    """Sharding of an array whose leading axis is the batch."""
    return NamedSharding(mesh, PartitionSpec(axis_name))


def replicated(mesh: Mesh) -> NamedSharding:
    """Sharding of an array copied whole to every device of ``mesh``."""
    return NamedSharding(mesh, PartitionSpec())


def batch_size_of(tree: Any) -> int:
    """The common leading dimension of every non-scalar leaf of ``tree``.

    Raises ``ValueError`` naming the leaf path when leading dimensions disagree.
    """
    sizes = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = np.shape(leaf)
        if shape:
            sizes.setdefault(shape[0], jax.tree_util.keystr(path))
    if not sizes:
        raise ValueError("tree has no leaf with a batch axis")
    if len(sizes) > 1:
        listed = ", ".join(f"{where or '<root>'}: {n}" for n, where in sizes.items())
        raise ValueError(f"leaves disagree on the batch size ({listed})")
    return next(iter(sizes))


def shard_batch(tree: Any, mesh: Optional[Mesh] = None, *, axis_name: str = BATCH_AXIS) -> Any:
    """Place ``tree`` on ``mesh`` with the leading axis of every array split over devices.

    Scalars (rank 0) are replicated. ``mesh`` defaults to :func:`mesh_for_batch` of the
    tree's batch size. Raises ``ValueError`` when the batch does not split evenly.
    """
    batch = batch_size_of(tree)
    mesh = mesh_for_batch(batch, axis_name=axis_name) if mesh is None else mesh
    n = mesh.shape[axis_name]
    if batch % n:
        raise ValueError(
            f"batch size {batch} is not a multiple of the {n} devices on mesh axis {axis_name!r}; "
            f"use round_up({batch}, {n}) instances or mesh_for_batch({batch})"
        )
    split, whole = batch_sharding(mesh, axis_name=axis_name), replicated(mesh)
    return jax.tree_util.tree_map(lambda x: jax.device_put(x, split if np.ndim(x) else whole), tree)


def constrain_batch(tree: Any, mesh: Optional[Mesh], *, axis_name: str = BATCH_AXIS) -> Any:
    """Inside ``jit``: keep every non-scalar array of ``tree`` split along its leading axis.

    A no-op when ``mesh`` is ``None`` or has one device.
    """
    if mesh is None or mesh.size == 1:
        return tree
    split = batch_sharding(mesh, axis_name=axis_name)
    return jax.tree_util.tree_map(
        lambda x: jax.lax.with_sharding_constraint(x, split) if np.ndim(x) else x, tree
    )
