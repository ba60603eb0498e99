"""Sharding with ``jax.sharding``: a 2-D ``(data, fsdp)`` mesh, FSDP (ZeRO-3) parameter layout.

The mesh
    :func:`make_mesh` builds a :class:`jax.sharding.Mesh` with axes ``("data", "fsdp")`` from a
    :class:`MeshConfig` (Hydra node ``train.mesh``: ``{data: -1, fsdp: 1}``, ``-1`` = the devices
    the other axis leaves). ``fsdp: 1`` is plain data parallelism.

Batches
    are split on their leading axis over both mesh axes jointly (:func:`batch_sharding`,
    :func:`shard_batch`): every device gets ``rows / devices`` rows, whatever the split of the
    devices between ``data`` and ``fsdp``.

Parameters, gradients and optimizer state (ZeRO-3)
    Each parameter's dimensions carry *logical* names (:data:`PARAM_AXES`: ``vocab``, ``embed``,
    ``heads``, ``kv_heads``, ``mlp``, ``norm``, ``head_dim``, ``layers``) and :data:`LOGICAL_RULES`
    says which logical names may be split over the ``fsdp`` axis. A parameter is split on its
    *largest* such dimension whose size divides by the ``fsdp`` size; a parameter with no such
    dimension stays whole on every device (:func:`sharding_report` lists them and why). The
    stacked ``layers`` axis is never split: the layer scan reads one layer at a time and a split
    there would gather the whole stack. Over ``data`` everything is replicated.
    The optimizer state follows the parameters it mirrors (:func:`opt_state_shardings`: a leaf
    whose path ends with a parameter's path and has its shape gets that parameter's sharding;
    counters and other leaves are replicated). The gradients are constrained to the parameters'
    sharding inside the update (:func:`constrain`), so XLA reduce-scatters them; the forward and
    backward passes all-gather each layer's weights when they need them (XLA inserts the
    collectives from these annotations: no ``shard_map``).

    Bytes per device for parameters + optimizer state are then about ``total / fsdp`` (plus the
    replicated leftovers; :func:`bytes_per_device` counts them from ``addressable_shards``).

Multi-host (several JAX processes, :mod:`llm.model.distributed`): the mesh spans every process's
devices. :func:`shard_batch` takes a global host batch (the same on every process, from shared
seeds) and hands each process's own rows to ``jax.make_array_from_process_local_data``;
:func:`llm.model.distributed.global_batch` takes only the process's rows (built on that
process alone); with one process both are a plain ``device_put``. The mesh is the device list
reshaped to ``[data, fsdp]`` in ``jax.devices()`` order (process by process), so an ``fsdp``
group is a run of consecutive devices (the devices of one host when ``fsdp`` divides the
per-host count) and each process holds one contiguous block of a batch's rows. Tested with 2
processes x 2 CPU devices (tests/jaxlake/pipeline/test_multihost.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from llm.model.errors import ModelConfigError, reject_unknown

DATA_AXIS = "data"
FSDP_AXIS = "fsdp"
#: The mesh's axes, in order.
MESH_AXES = (DATA_AXIS, FSDP_AXIS)

#: Logical names of every Qwen3 parameter's dimensions, by its path in the model state
#: (``llm.model.qwen3.Qwen3ForCausalLM``; the decoder layers are stacked, hence the leading ``layers``).
PARAM_AXES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("embed_tokens", "embedding"): ("vocab", "embed"),
    ("norm", "weight"): ("norm",),
    ("lm_head", "kernel"): ("embed", "vocab"),
    ("layers", "input_layernorm", "weight"): ("layers", "norm"),
    ("layers", "post_attention_layernorm", "weight"): ("layers", "norm"),
    ("layers", "self_attn", "q_proj", "kernel"): ("layers", "embed", "heads"),
    ("layers", "self_attn", "k_proj", "kernel"): ("layers", "embed", "kv_heads"),
    ("layers", "self_attn", "v_proj", "kernel"): ("layers", "embed", "kv_heads"),
    ("layers", "self_attn", "o_proj", "kernel"): ("layers", "heads", "embed"),
    ("layers", "self_attn", "q_norm", "weight"): ("layers", "head_dim"),
    ("layers", "self_attn", "k_norm", "weight"): ("layers", "head_dim"),
    ("layers", "mlp", "gate_proj", "kernel"): ("layers", "embed", "mlp"),
    ("layers", "mlp", "up_proj", "kernel"): ("layers", "embed", "mlp"),
    ("layers", "mlp", "down_proj", "kernel"): ("layers", "mlp", "embed"),
}

#: Logical axis -> the mesh axis it may be split over (``None``: never split).
LOGICAL_RULES: dict[str, Optional[str]] = {
    "layers": None,
    "vocab": FSDP_AXIS,
    "embed": FSDP_AXIS,
    "heads": FSDP_AXIS,
    "kv_heads": FSDP_AXIS,
    "mlp": FSDP_AXIS,
    "norm": FSDP_AXIS,
    "head_dim": FSDP_AXIS,
}


# ============================================================================ configuration
def initialize_distributed(config: Optional[Mapping[str, Any]] = None) -> bool:
    """Call ``jax.distributed.initialize`` when configured; return whether it ran.

    ``config``: the ``train.distributed`` mapping (:class:`llm.model.distributed.DistributedConfig`:
    ``enabled``, ``coordinator_address``, ``num_processes``, ``process_id``,
    ``local_device_ids``, timeouts, CPU collectives); see :func:`llm.model.distributed.initialize`.
    It also runs when the environment variable ``JAXLAKE_DISTRIBUTED=1`` is set. Must be called
    before any other JAX computation.
    """
    from llm.model import distributed

    return distributed.initialize(config)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the ``(data, fsdp)`` mesh axes (Hydra node ``train.mesh``).

    Each is an integer >= 1 or ``-1`` ("the devices the other axis leaves"; at most one axis may
    be ``-1``). The product must equal the number of devices (checked by :meth:`resolve`).
    """

    data: int = -1
    fsdp: int = 1

    def __post_init__(self) -> None:
        for name in MESH_AXES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
                raise ModelConfigError(f"mesh.{name}={value!r} must be an integer >= 1 or -1 (the remaining devices)")
        if self.data == -1 and self.fsdp == -1:
            raise ModelConfigError("mesh.data and mesh.fsdp cannot both be -1: give one of them a size")

    @classmethod
    def from_dict(cls, d: Optional[Mapping[str, Any]]) -> "MeshConfig":
        """From a mapping with keys ``data`` / ``fsdp`` (``None`` or missing: the defaults)."""
        d = {} if d is None else dict(d)
        reject_unknown("mesh", d, MESH_AXES)
        return cls(**d)

    def resolve(self, num_devices: int) -> tuple[int, int]:
        """``(data, fsdp)`` sizes for ``num_devices`` devices; ``ModelConfigError`` if they do not fit."""
        data, fsdp = self.data, self.fsdp
        if data == -1:
            if num_devices % fsdp:
                raise ModelConfigError(f"mesh.fsdp={fsdp} does not divide the {num_devices} devices")
            data = num_devices // fsdp
        elif fsdp == -1:
            if num_devices % data:
                raise ModelConfigError(f"mesh.data={data} does not divide the {num_devices} devices")
            fsdp = num_devices // data
        if data * fsdp != num_devices:
            raise ModelConfigError(
                f"mesh data={data} x fsdp={fsdp} = {data * fsdp} devices, but there are {num_devices}; "
                "set one axis to -1 to use the rest"
            )
        return data, fsdp


# ============================================================================ mesh
def make_mesh(devices: Optional[Sequence[jax.Device]] = None, config: Any = None) -> Mesh:
    """The ``(data, fsdp)`` mesh over ``devices`` (default: every device of every process).

    ``config``: a :class:`MeshConfig`, a mapping of its fields, or ``None`` (all devices on
    ``data``: plain data parallelism).
    """
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("make_mesh needs at least one device")
    if not isinstance(config, MeshConfig):
        config = MeshConfig.from_dict(config)
    data, fsdp = config.resolve(len(devices))
    return Mesh(np.asarray(devices, dtype=object).reshape(data, fsdp), MESH_AXES)


def axis_size(mesh: Mesh, axis: str) -> int:
    """Size of ``axis`` in ``mesh`` (1 when the mesh has no such axis)."""
    return int(dict(mesh.shape).get(axis, 1))


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes a batch's leading dimension is split over (``data`` and ``fsdp`` jointly)."""
    return tuple(a for a in MESH_AXES if a in mesh.axis_names)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading axis split over every device (``data`` x ``fsdp``); other axes whole."""
    return NamedSharding(mesh, PartitionSpec(batch_axes(mesh)))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def check_divisible(rows: int, mesh: Mesh, what: str = "batch rows") -> None:
    """Raise ``ValueError`` unless ``rows`` splits evenly over the mesh's devices."""
    n = mesh.devices.size
    if rows % n:
        raise ValueError(f"{what}={rows} must be divisible by the number of devices ({n}) for data parallelism")


# ============================================================================ parameter layout
def _names(path: Sequence[Any]) -> tuple[str, ...]:
    """The dict keys of a pytree key path (``.value`` of ``nnx.Variable`` and list indices dropped)."""
    out = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            out.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey) and k.name != "value":
            out.append(k.name)
    return tuple(out)


def logical_axes(path: tuple[str, ...], ndim: int) -> Optional[tuple[str, ...]]:
    """The logical axis names of the parameter at ``path`` (``None`` when it is not in the table)."""
    for n in range(len(path)):
        axes = PARAM_AXES.get(path[n:])
        if axes is not None and len(axes) == ndim:
            return axes
    return None


def param_spec(path: tuple[str, ...], shape: Sequence[int], fsdp: int,
               rules: Mapping[str, Optional[str]] = LOGICAL_RULES) -> tuple[PartitionSpec, str]:
    """``(spec, reason)`` for one parameter on an ``fsdp``-way axis.

    Splits the largest dimension whose logical axis maps to ``fsdp`` in ``rules`` and whose size
    divides by ``fsdp``; ``reason`` says which, or why the parameter stays whole. A path missing
    from :data:`PARAM_AXES` is treated with every dimension eligible except a leading stacked
    ``layers`` axis.
    """
    shape = tuple(int(s) for s in shape)
    if fsdp == 1 or not shape:
        return PartitionSpec(), "whole (fsdp=1)" if shape else "whole (scalar)"
    axes = logical_axes(path, len(shape))
    if axes is None:
        axes = tuple("layers" if (i == 0 and path[:1] == ("layers",)) else "embed" for i in range(len(shape)))
    eligible = [i for i, a in enumerate(axes) if rules.get(a) == FSDP_AXIS]
    fits = [i for i in eligible if shape[i] % fsdp == 0]
    if not fits:
        sizes = ", ".join(f"{axes[i]}={shape[i]}" for i in eligible) or "none"
        return PartitionSpec(), f"whole: no splittable dimension divides by fsdp={fsdp} ({sizes})"
    best = max(fits, key=lambda i: (shape[i], -i))
    spec = [None] * len(shape)
    spec[best] = FSDP_AXIS
    return PartitionSpec(*spec), f"split on {axes[best]} ({shape[best]} / {fsdp})"


def _shape(leaf: Any) -> tuple[int, ...]:
    return tuple(np.shape(leaf)) if not hasattr(leaf, "shape") else tuple(leaf.shape)


def param_specs(state: Any, mesh: Mesh) -> Any:
    """``PartitionSpec`` of every leaf of a model state (arrays or ``ShapeDtypeStruct``), same tree."""
    fsdp = axis_size(mesh, FSDP_AXIS)
    return jax.tree_util.tree_map_with_path(lambda p, x: param_spec(_names(p), _shape(x), fsdp)[0], state)


def state_shardings(state: Any, mesh: Mesh) -> Any:
    """``NamedSharding`` of every leaf of a model state (same tree): the FSDP layout."""
    return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), param_specs(state, mesh),
                                  is_leaf=lambda x: isinstance(x, PartitionSpec))


def sharding_report(state: Any, mesh: Mesh) -> list[str]:
    """One line per parameter: its path, shape and how it is laid out (split or whole, and why)."""
    fsdp = axis_size(mesh, FSDP_AXIS)
    lines = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        names = _names(path)
        _, reason = param_spec(names, _shape(leaf), fsdp)
        lines.append(f"{'.'.join(names)} {list(_shape(leaf))}: {reason}")
    return lines


def opt_state_shardings(opt_state: Any, state: Any, mesh: Mesh) -> Any:
    """``NamedSharding`` of every leaf of an optimizer state (or any tree holding parameter copies).

    A leaf whose key path ends with a parameter's path (e.g. Adam's ``mu`` / ``nu`` trees, a
    float32 master copy) and has that parameter's shape gets the parameter's sharding; every
    other leaf (step counters, scalars) is replicated. Works on arrays and on
    ``ShapeDtypeStruct`` trees (abstract states, e.g. for checkpoint restore).
    """
    fsdp = axis_size(mesh, FSDP_AXIS)
    by_path: dict[tuple[str, ...], tuple[tuple[int, ...], PartitionSpec]] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        names = _names(path)
        by_path[names] = (_shape(leaf), param_spec(names, _shape(leaf), fsdp)[0])

    def pick(path, leaf):
        names, shape = _names(path), _shape(leaf)
        for n in range(len(names)):
            hit = by_path.get(names[n:])
            if hit is not None and hit[0] == shape:
                return NamedSharding(mesh, hit[1])
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(pick, opt_state)


# ============================================================================ placement
def _put(x: Any, sharding: Any) -> Any:
    """One leaf onto ``sharding``. With several processes a host or process-local value (the
    same on every process: shared seeds) becomes a global array through
    ``make_array_from_callback``, each process filling only its own devices' blocks;
    ``device_put`` would all-gather every leaf once to check that the processes agree. A
    global array is resharded with ``device_put``."""
    if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
        return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place(tree: Any, shardings: Any) -> Any:
    """``tree`` placed onto ``shardings`` (a matching tree of shardings): ``jax.device_put``
    (several processes: :func:`_put` per leaf)."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    return jax.tree_util.tree_map(_put, tree, shardings)


def place_state(state: Any, mesh: Mesh) -> Any:
    """A model state laid out FSDP-style on ``mesh`` (:func:`state_shardings`)."""
    return place(state, state_shardings(state, mesh))


def place_opt_state(opt_state: Any, state: Any, mesh: Mesh) -> Any:
    """An optimizer state laid out like the parameters it mirrors (:func:`opt_state_shardings`)."""
    return place(opt_state, opt_state_shardings(opt_state, state, mesh))


def constrain(tree: Any, shardings: Any) -> Any:
    """``with_sharding_constraint`` of every leaf inside ``jit`` (shardings: a matching tree)."""
    return jax.tree_util.tree_map(jax.lax.with_sharding_constraint, tree, shardings)


def constrain_state(tree: Any, mesh: Optional[Mesh]) -> Any:
    """Inside ``jit``: pin a parameter-shaped tree (state, gradients) to the FSDP layout.

    No-op without a mesh. Pinning the gradients makes XLA reduce-scatter them rather than
    all-reduce them whole.
    """
    if mesh is None:
        return tree
    return constrain(tree, state_shardings(tree, mesh))


def constrain_opt_state(opt_state: Any, state: Any, mesh: Optional[Mesh]) -> Any:
    """Inside ``jit``: pin an optimizer state to :func:`opt_state_shardings` (no-op without a mesh)."""
    if mesh is None:
        return opt_state
    return constrain(opt_state, opt_state_shardings(opt_state, state, mesh))


def bytes_per_device(tree: Any) -> dict[Any, int]:
    """Bytes of ``tree``'s arrays held by each (addressable) device, from ``addressable_shards``."""
    out: dict[Any, int] = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        if not isinstance(leaf, jax.Array):
            continue
        for shard in leaf.addressable_shards:
            out[shard.device] = out.get(shard.device, 0) + int(shard.data.nbytes)
    return out


def total_bytes(tree: Any) -> int:
    """Bytes of ``tree``'s arrays counted once (their global shapes)."""
    return sum(math.prod(_shape(x)) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)
               if hasattr(x, "dtype"))


# ============================================================================ batches / host
def shard_batch(tree: Any, mesh: Mesh) -> Any:
    """Place a pytree of per-row host arrays (leading axis = rows) split over the mesh.

    Every process passes the same *global* host batch (the trainer derives it from shared
    seeds); with several processes each one contributes only its own rows
    (:func:`llm.model.distributed.process_rows`) and gets the global array back.
    """
    sharding = batch_sharding(mesh)
    if jax.process_count() == 1:
        return jax.tree_util.tree_map(lambda x: jax.device_put(np.asarray(x), sharding), tree)
    from llm.model import distributed

    def put(x):
        x = np.asarray(x)
        rows = distributed.process_rows(x.shape[0], sharding)
        return jax.make_array_from_process_local_data(sharding, x[rows], x.shape)

    return jax.tree_util.tree_map(put, tree)


def to_host(x: Any) -> np.ndarray:
    """A (possibly sharded, possibly multi-host) array as a full numpy array on this host.

    One process: ``jax.device_get``. Several: a replicated array is read from a local shard;
    a sharded one is gathered from every process (``process_allgather``: every process
    must call it).
    """
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    if x.sharding.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def host_tree(tree: Any) -> Any:
    """Every array of ``tree`` whole on this host (numpy, :func:`to_host`). With several
    processes an array that spans other processes' devices is all-gathered, so every process
    must call this at the same point (e.g. before process 0 exports the policy)."""
    return jax.tree_util.tree_map(to_host, tree)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Place a pytree replicated on every device of the mesh (e.g. a frozen reference model
    small enough to keep whole)."""
    whole = replicated(mesh)
    if jax.process_count() == 1:
        return jax.device_put(tree, whole)
    return jax.tree_util.tree_map(lambda x: _put(x, whole), tree)


def process_slice(n: int) -> slice:
    """The rows ``[start, stop)`` of ``n`` global items that this process owns (even split by
    process index; :func:`llm.model.distributed.process_rows` reads them off a mesh)."""
    from llm.model import distributed

    return distributed.process_rows(n)
