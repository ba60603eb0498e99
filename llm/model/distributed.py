"""Several JAX processes as one run: start-up, who writes, agreement, and process-local rows.

A run on several hosts (a TPU pod slice, SLURM GPU nodes, or several processes on one CPU
machine) is JAX's multi-controller runtime: every process runs the same program over a mesh
of *all* processes' devices (:func:`llm.model.sharding.make_mesh`), each holding only its own
devices' shards. This module holds what that needs beyond the mesh:

Start-up (:func:`initialize`, settings :class:`DistributedConfig`, Hydra node
``train.distributed``)
    ``jax.distributed.initialize`` with the coordinator address, process count and index (or
    the cluster's auto-detection: SLURM, TPU pods, Open MPI), a start-up timeout and a
    heartbeat timeout: a process whose peer died (no heartbeat for ``heartbeat_timeout_s``)
    is ended by JAX's coordination service with ``Terminating process because the JAX
    distributed service detected fatal errors ... another task died`` rather than waiting
    for ever in a collective. On the CPU the collectives are set to ``gloo`` first (the
    default CPU client has none across processes), so nobody passes an extra flag.

Who writes (:func:`is_writer`)
    Process 0. Every other process writes no file (orbax's checkpoints excepted: every
    process writes its own shards, as orbax is built to); ``jaxlake.io.set_writer`` makes the
    package's writers honour it.

Working alone (:func:`solo`)
    process 0's own checkpoint reads while the others wait (orbax otherwise waits for every
    process at each read).

Agreement (:func:`barrier`, :func:`broadcast_bytes`, :func:`broadcast_object`)
    through the coordination service's key-value store, with a timeout, without touching the
    devices: process 0 publishes, the others wait for it. With one process they return at
    once. (XLA's CPU collectives wait only 30 s for a peer when a device group first meets,
    a fixed limit: steps that run collectives should start at a :func:`barrier`.)

Process-local rows (:func:`process_rows`, :func:`take_rows`, :func:`gather_rows`,
:func:`global_batch`; :func:`llm.model.sharding.host_tree` brings arrays back whole)
    A batch's leading axis is split over every device of the mesh
    (:func:`llm.model.sharding.batch_sharding`), so each process holds a contiguous block of
    global rows; :func:`process_rows` says which, from the sharding itself. A process builds
    only those rows (:func:`take_rows` of the globally drawn lakes) and hands them to
    ``jax.make_array_from_process_local_data`` (:func:`global_batch`); the few per-row
    numbers that every process needs (e.g. token counts for the loss weights, the metrics)
    travel with :func:`gather_rows`. With one process each of these is the identity.

Imports nothing of ``jaxlake`` (model layer), nor :mod:`llm.model.sharding` (which builds on it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
import os
import pickle
from typing import Any, Mapping, Optional

import jax
import numpy as np

from llm.model.errors import ModelConfigError, reject_unknown

#: ``train.distributed.cpu_collectives`` values (``jax_cpu_collectives_implementation``).
CPU_COLLECTIVES = ("gloo", "mpi", "none")
#: Environment variable that turns the distributed start-up on without a config change.
ENV_SWITCH = "JAXLAKE_DISTRIBUTED"


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """``train.distributed``: how this process joins the others (``jax.distributed``).

    Attributes:
      enabled: call ``jax.distributed.initialize`` (also when ``JAXLAKE_DISTRIBUTED=1``).
      coordinator_address: ``host:port`` of process 0's coordination service; ``None``: the
        cluster's auto-detection (SLURM, TPU pod, Open MPI) or ``JAX_COORDINATOR_ADDRESS``.
      num_processes / process_id: the number of processes and this one's index in
        ``[0, num_processes)``; ``None``: auto-detected.
      local_device_ids: the local devices this process uses (e.g. one GPU per process on a
        multi-GPU node); ``None``: all.
      initialization_timeout_s: how long a process waits for all the others to join.
      heartbeat_timeout_s: a process that sent no heartbeat for this long is dead, and the
        others end with JAX's ``another task died`` error (a bounded wait, not a hang).
      wait_timeout_s: how long a process waits at a :func:`barrier` or for a
        :func:`broadcast_bytes` of process 0 (which may evaluate, summarize and ask the
        engineer in between: hours on a big model); a dead process 0 is caught sooner by the
        heartbeat.
      cpu_collectives: the CPU client's cross-process collectives (``gloo``: works
        everywhere; ``mpi`` needs an MPI build; ``none``: JAX's default, no multi-process CPU
        collectives). Set before the backend starts; it does not touch GPU or TPU backends.
    """

    enabled: bool = False
    coordinator_address: Optional[str] = None
    num_processes: Optional[int] = None
    process_id: Optional[int] = None
    local_device_ids: Optional[tuple[int, ...]] = None
    initialization_timeout_s: int = 300
    heartbeat_timeout_s: int = 100
    wait_timeout_s: int = 86_400
    cpu_collectives: str = "gloo"

    def __post_init__(self) -> None:
        def positive(name: str, value: Any, low: int = 1) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ModelConfigError(f"train.distributed.{name}={value!r} must be an integer >= {low}")

        if not isinstance(self.enabled, bool):
            raise ModelConfigError(f"train.distributed.enabled={self.enabled!r} must be true or false")
        if self.num_processes is not None:
            positive("num_processes", self.num_processes)
        if self.process_id is not None:
            positive("process_id", self.process_id, 0)
            if self.num_processes is not None and self.process_id >= self.num_processes:
                raise ModelConfigError(f"train.distributed.process_id={self.process_id} must be in "
                                       f"[0, num_processes={self.num_processes})")
        if self.coordinator_address is not None:
            host, sep, port = str(self.coordinator_address).rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ModelConfigError(f"train.distributed.coordinator_address={self.coordinator_address!r} must be "
                                       "host:port (port in [1, 65535])")
        for name in ("initialization_timeout_s", "heartbeat_timeout_s", "wait_timeout_s"):
            positive(name, getattr(self, name))
        if self.cpu_collectives not in CPU_COLLECTIVES:
            raise ModelConfigError(f"train.distributed.cpu_collectives={self.cpu_collectives!r} not in "
                                   f"{list(CPU_COLLECTIVES)}")
        if self.local_device_ids is not None:
            for i in self.local_device_ids:
                positive("local_device_ids[]", i, 0)

    @classmethod
    def from_dict(cls, d: Optional[Mapping[str, Any]]) -> "DistributedConfig":
        """From the ``train.distributed`` mapping (``None`` values: the defaults; unknown keys
        raise naming them)."""
        d = {k: v for k, v in dict(d or {}).items() if v is not None}
        reject_unknown("train.distributed", d, (f.name for f in dataclasses.fields(cls)))
        ids = d.get("local_device_ids")
        if ids is not None:
            d["local_device_ids"] = (ids,) if isinstance(ids, int) else tuple(ids)
        return cls(**d)

    @property
    def active(self) -> bool:
        """Whether :func:`initialize` starts the distributed runtime (``enabled`` or
        ``JAXLAKE_DISTRIBUTED=1``)."""
        return self.enabled or os.environ.get(ENV_SWITCH) == "1"

    def initialize_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``jax.distributed.initialize`` (unset ones left to JAX's
        auto-detection)."""
        out: dict[str, Any] = {
            "initialization_timeout": self.initialization_timeout_s,
            "heartbeat_timeout_seconds": self.heartbeat_timeout_s,
        }
        for name in ("coordinator_address", "num_processes", "process_id"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.local_device_ids is not None:
            out["local_device_ids"] = list(self.local_device_ids)
        return out


_WAIT_TIMEOUT_S: int = DistributedConfig.wait_timeout_s


def initialize(config: DistributedConfig | Mapping[str, Any] | None = None) -> bool:
    """Join the other processes (``jax.distributed.initialize``) when configured; return
    whether it ran. Must run before anything else touches JAX's devices.

    Sets ``jax_cpu_collectives_implementation`` to ``config.cpu_collectives`` first (unless
    the user set another value), so that CPU processes on one or several machines can run
    collectives together (gloo over TCP).
    """
    global _WAIT_TIMEOUT_S
    if not isinstance(config, DistributedConfig):
        config = DistributedConfig.from_dict(config)
    if not config.active:
        return False
    _WAIT_TIMEOUT_S = config.wait_timeout_s
    current = jax.config.jax_cpu_collectives_implementation
    if config.cpu_collectives != "none" and current in (None, "", "none"):
        jax.config.update("jax_cpu_collectives_implementation", config.cpu_collectives)
    kwargs = config.initialize_kwargs()
    accepted = inspect.signature(jax.distributed.initialize).parameters
    jax.distributed.initialize(**{k: v for k, v in kwargs.items() if k in accepted})  # older JAX: fewer knobs
    return True


# ============================================================================ who is who
def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def is_writer() -> bool:
    """Whether this process writes the run's files (process 0)."""
    return jax.process_index() == 0


def _client():
    """The coordination service client of ``jax.distributed`` (``None`` with one process).
    JAX keeps it in a private module; ``jax.experimental.multihost_utils`` reads it there too."""
    from jax._src import distributed as _distributed

    return _distributed.global_state.client


_SOLO = False


@contextlib.contextmanager
def solo():
    """Inside, this process works alone: its checkpoint reads (:mod:`llm.model.checkpoint`)
    wait for no other process (orbax's ``active_processes``). For process 0's own work while
    the others wait (e.g. an engineer that loads the trained policy). A no-op with one
    process. (Checkpoint *writes* are always every process's: orbax 0.12's multi-process save
    does not finish with one active process.)"""
    global _SOLO
    before, _SOLO = _SOLO, True
    try:
        yield
    finally:
        _SOLO = before


def alone() -> bool:
    """Whether this process is inside :func:`solo` in a multi-process run."""
    return _SOLO and jax.process_count() > 1


# ============================================================================ agreement
_counter = itertools.count()


def _key(name: str) -> str:
    # every process calls the agreement functions in the same order, so the counter names the
    # same event on all of them (and a name reused in a loop stays unique)
    return f"jaxlake/{next(_counter)}/{name}"


def barrier(name: str, timeout_s: Optional[float] = None) -> None:
    """Wait until every process reaches the barrier ``name`` (no-op with one process).

    Raises the coordination service's error after ``timeout_s`` (default
    ``train.distributed.wait_timeout_s``).
    """
    if jax.process_count() == 1:
        return
    timeout_ms = int(1000 * (_WAIT_TIMEOUT_S if timeout_s is None else timeout_s))
    _client().wait_at_barrier(_key(name), timeout_ms)


def broadcast_bytes(name: str, data: Optional[bytes], timeout_s: Optional[float] = None) -> bytes:
    """Process 0's ``data`` on every process (the others pass anything, e.g. ``None``).

    Through the coordination service's key-value store: no device collective, so the others
    may wait for process 0 while it works on its own (an evaluation, an engineer's call).
    A process that waits longer than ``timeout_s`` (default ``train.distributed.
    wait_timeout_s``) raises.
    """
    if jax.process_count() == 1:
        if data is None:
            raise ValueError(f"broadcast_bytes({name!r}): process 0 must pass the data")
        return bytes(data)
    key = _key(name)
    client = _client()
    if jax.process_index() == 0:
        if data is None:
            raise ValueError(f"broadcast_bytes({name!r}): process 0 must pass the data")
        client.key_value_set_bytes(key, bytes(data))
        return bytes(data)
    timeout_ms = int(1000 * (_WAIT_TIMEOUT_S if timeout_s is None else timeout_s))
    return bytes(client.blocking_key_value_get_bytes(key, timeout_ms))


def broadcast_object(name: str, obj: Any = None, timeout_s: Optional[float] = None) -> Any:
    """Process 0's ``obj`` (any picklable value) on every process; see :func:`broadcast_bytes`."""
    data = pickle.dumps(obj) if jax.process_index() == 0 else None
    return pickle.loads(broadcast_bytes(name, data, timeout_s))


# ============================================================================ process-local rows
def process_rows(n: int, sharding: Any = None) -> slice:
    """The global rows ``[start, stop)`` of an ``n``-row batch that this process's devices hold.

    From ``sharding``, the batch's (leading axis split over the mesh's devices:
    :func:`llm.model.sharding.batch_sharding`; rows of one process are contiguous when the mesh
    is built in ``jax.devices()`` order, as :func:`llm.model.sharding.make_mesh` does).
    ``sharding=None``: all rows (one process) or an even split by process index. Raises
    ``ValueError`` when this process's rows are not one contiguous block.
    """
    n = int(n)
    if jax.process_count() == 1:
        return slice(0, n)
    if sharding is None:
        count, index = jax.process_count(), jax.process_index()
        if n % count:
            raise ValueError(f"{n} rows cannot be split evenly over {count} processes")
        per = n // count
        return slice(index * per, (index + 1) * per)
    index_map = sharding.addressable_devices_indices_map((n,))
    spans = sorted({(s[0].start or 0, n if s[0].stop is None else s[0].stop) for s in index_map.values()})
    start, stop = spans[0][0], spans[0][0]
    for a, b in spans:
        if a != stop:
            raise ValueError(f"process {jax.process_index()} holds rows {spans} of the batch: not one block; build "
                             "the mesh in jax.devices() order (llm.model.sharding.make_mesh)")
        stop = b
    return slice(start, stop)


def take_rows(tree: Any, rows: slice) -> Any:
    """``tree`` (arrays with a leading row axis) cut to ``rows`` (host numpy arrays)."""
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[rows], tree)


def gather_rows(tree: Any) -> Any:
    """Every process's rows of small host arrays, concatenated in process order (= global row
    order for :func:`process_rows` of a mesh): each leaf's leading axis must be the same
    length on every process. With one process: ``tree`` as numpy arrays."""
    if jax.process_count() == 1:
        return jax.tree_util.tree_map(np.asarray, tree)
    from jax.experimental import multihost_utils

    return jax.tree_util.tree_map(lambda x: np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=True)),
                                  tree)


def global_batch(tree: Any, sharding: Any, rows: int) -> Any:
    """One global array per leaf of ``tree`` on ``sharding`` (a batch sharding: the leading
    axis split over the mesh), from this process's rows only (:func:`process_rows`):
    ``jax.make_array_from_process_local_data``. ``rows`` is the global row count."""

    def put(x):
        x = np.asarray(x)
        return jax.make_array_from_process_local_data(sharding, x, (int(rows),) + x.shape[1:])

    return jax.tree_util.tree_map(put, tree)
