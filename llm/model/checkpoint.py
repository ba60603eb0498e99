"""Orbax checkpoints of a :class:`Qwen3ForCausalLM` plus any pytree of extra state.

A checkpoint directory holds numbered steps (``<directory>/<step>/``), each with three items:

* ``model``: the model's ``nnx`` state as a nested dict of arrays;
* ``config``: the :class:`Qwen3Config` as JSON, so a checkpoint restores without the caller
  knowing the architecture;
* ``extra``: an optional pytree (optimizer state, RNG keys, counters, ...) saved as given.

Orbax writes each step to a temporary folder and renames it when complete, so an interrupted
save leaves no half-written step behind. Saving is synchronous (the call returns when the
step is on disk).

Sharded state: arrays laid out over a mesh (:mod:`llm.model.sharding`) are saved shard by shard (no
device or host gathers a whole parameter). Restoring places every array straight into a
target sharding given in the abstract tree: the model's current arrays' shardings (restore in
place), the FSDP layout on ``mesh`` (:func:`llm.model.sharding.state_shardings`), or one device; so a
checkpoint saved on one mesh restores onto another mesh or onto a single device (resharding).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from llm.model import distributed
from llm.model import sharding as shd
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM


@dataclasses.dataclass
class Restored:
    """Result of :func:`restore_checkpoint`."""

    model: Qwen3ForCausalLM
    extra: Any
    step: int
    config: Qwen3Config


def _manager(directory: str | os.PathLike, max_to_keep: int | None = None, create: bool = True) -> ocp.CheckpointManager:
    extra = {}
    if distributed.alone():  # this process reads or writes on its own (llm.model.distributed.solo)
        me = jax.process_index()
        extra["multiprocessing_options"] = ocp.options.MultiprocessingOptions(
            primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"solo{me}")
        if create:  # orbax creates the root only with every process active
            Path(directory).mkdir(parents=True, exist_ok=True)
            create = False
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        create=create,
        enable_async_checkpointing=False,
        **extra,
    )
    return ocp.CheckpointManager(Path(directory).absolute(), options=options)


def all_steps(directory: str | os.PathLike) -> list[int]:
    """Sorted steps saved under ``directory`` (empty when it does not exist)."""
    if not Path(directory).is_dir():
        return []
    with _manager(directory, create=False) as mngr:
        return sorted(mngr.all_steps())


def latest_step(directory: str | os.PathLike) -> int | None:
    """The newest step saved under ``directory``, or ``None``."""
    steps = all_steps(directory)
    return steps[-1] if steps else None


def save_checkpoint(
    directory: str | os.PathLike,
    model: Qwen3ForCausalLM,
    step: int,
    *,
    extra: Any = None,
    max_to_keep: int | None = None,
) -> Path:
    """Save ``model`` (and the ``extra`` pytree, if given) as ``step`` under ``directory``.

    ``max_to_keep`` deletes the oldest steps beyond that many. Saving a step that already
    exists raises ``ValueError``. Returns the step's folder.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step={step!r} must be an integer >= 0")
    state = nnx.to_pure_dict(nnx.state(model))
    items = {
        "model": ocp.args.StandardSave(state),
        "config": ocp.args.JsonSave(model.config.to_dict()),
    }
    if extra is not None:
        items["extra"] = ocp.args.StandardSave(extra)
    with _manager(directory, max_to_keep=max_to_keep) as mngr:
        if step in mngr.all_steps():
            raise ValueError(f"step {step} already exists in checkpoint directory {str(directory)!r}")
        mngr.save(step, args=ocp.args.Composite(**items))
        mngr.wait_until_finished()
        return Path(mngr.directory) / str(step)


def default_device_sharding() -> jax.sharding.Sharding:
    """This process's first local device (where a restore puts arrays it has no target for)."""
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _saved_tree(item_dir: Path) -> Any:
    """``ShapeDtypeStruct`` tree of a saved ``StandardSave`` item, from its metadata (a restore
    without a template then does not depend on the devices or processes that saved it)."""
    meta = ocp.StandardCheckpointHandler().metadata(item_dir.absolute())
    tree = getattr(meta, "tree", meta)
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), tree,
                        is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"))


def _abstract(tree: Any, shardings: Any = None) -> Any:
    """``ShapeDtypeStruct`` tree of ``tree`` whose leaves carry the sharding to restore into.

    ``shardings`` (a matching tree, or ``None``) wins; otherwise a ``jax.Array`` leaf keeps its
    own sharding and any other leaf goes to the first local device.
    """
    default = default_device_sharding()

    def one(x, sharding=None):
        s = ocp.utils.to_shape_dtype_struct(x)
        if sharding is None:
            sharding = getattr(x, "sharding", None) if isinstance(x, jax.Array) else getattr(s, "sharding", None)
        return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding or default)

    if shardings is None:
        return jax.tree.map(one, tree)
    return jax.tree.map(one, tree, shardings)


def restore_checkpoint(
    directory: str | os.PathLike,
    model: Qwen3ForCausalLM | None = None,
    *,
    step: int | None = None,
    extra: Any = None,
    mesh: Any = None,
    extra_shardings: Any = None,
) -> Restored:
    """Restore ``step`` (default: the latest) from ``directory``.

    With ``model`` given, its state is replaced in place (shapes and dtypes must match; the
    model's config must equal the saved one) and that same object is returned; without, a
    model is built from the saved config. ``extra`` is a template pytree (e.g. a freshly
    initialised optimizer state) that gives the restored extra state its structure and
    dtypes; without one the extra state comes back as saved (nested dicts/lists of arrays,
    read from the step's metadata, whole on the first local device or replicated on ``mesh``:
    a checkpoint written by several processes restores in one), and ``None`` if the step has
    none.

    Where the arrays land (whatever mesh they were saved from):

    * ``mesh`` given: the parameters in the FSDP layout on it
      (:func:`llm.model.sharding.state_shardings`); the ``extra`` leaves in ``extra_shardings`` (a
      tree matching ``extra``) when given, else as :func:`llm.model.sharding.opt_state_shardings`
      places parameter-shaped leaves (paths ending with a parameter's path), the rest
      replicated;
    * no ``mesh``: the shardings of ``model``'s arrays (in place) and of ``extra``'s
      ``jax.Array`` leaves (or ``extra_shardings``); everything else on the first local device.
    """
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint directory {str(root)!r} does not exist")
    with _manager(root, create=False) as mngr:
        steps = sorted(mngr.all_steps())
        if not steps:
            raise FileNotFoundError(f"no checkpoint steps in {str(root)!r}")
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise FileNotFoundError(f"step {step} not in checkpoint directory {str(root)!r} (steps: {steps})")
        saved = mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
        config = Qwen3Config.from_dict(saved["config"])
        if model is None:
            target = nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)))
        else:
            if model.config != config:
                raise ValueError(f"model config {model.config} differs from the saved config {config}")
            target = model
        graphdef, abstract_state = nnx.split(target)
        pure = nnx.to_pure_dict(abstract_state)
        model_shardings = None if mesh is None else shd.state_shardings(pure, mesh)
        items = {"model": ocp.args.StandardRestore(_abstract(pure, model_shardings))}
        extra_dir = Path(mngr.directory) / str(step) / "extra"
        has_extra = extra_dir.exists()
        if has_extra:
            if extra is None:  # no template: the saved tree, its leaves whole on one device (or the mesh)
                extra = _saved_tree(extra_dir)
                if extra_shardings is None:
                    whole = default_device_sharding() if mesh is None else shd.replicated(mesh)
                    extra_shardings = jax.tree.map(lambda _: whole, extra)
            elif extra_shardings is None and mesh is not None:
                extra_shardings = shd.opt_state_shardings(extra, pure, mesh)
            items["extra"] = ocp.args.StandardRestore(_abstract(extra, extra_shardings))
        out = mngr.restore(step, args=ocp.args.Composite(**items))
    nnx.replace_by_pure_dict(abstract_state, out["model"])
    if model is None:
        model = nnx.merge(graphdef, abstract_state)
    else:
        nnx.update(model, abstract_state)
    return Restored(model=model, extra=out["extra"] if has_extra else None, step=step, config=config)
