"""What the two training phases (warm start, GRPO) share: resumable state and their result.

:class:`Checkpoints` saves a phase's whole training state (parameters, optimizer state, step,
RNG, data position) in the :mod:`llm.model.checkpoint` format and starts a phase fresh or from its
latest checkpoint; :class:`PhaseResult` is what a phase returns; :func:`progress_bar` its
progress bar on stderr.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from llm.training.policy import Policy, copy_state
from llm.model import sharding as shd
from llm.model.sharding import to_host


@dataclasses.dataclass
class PhaseResult:
    """Where a phase stopped: its policy, the steps done, and the step it resumed from (or None)."""

    policy: Policy
    step: int
    resumed_from: Optional[int]


def progress_bar(total: int, initial: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True, file=sys.stderr)



class Checkpoints:
    """Orbax checkpoints in the ``llm.model.checkpoint`` format with the training state in ``extra``.

    ``extra`` = ``{"opt_state": [leaves], "rng": uint32[2], "step": int64, "data_position":
    int64}``; the optimizer state is stored as its flat leaf list and rebuilt with the
    template's tree structure.

    Arrays are saved as they lie (sharded ones shard by shard, nothing gathered to a host).
    With a ``mesh`` a restore puts parameters and optimizer state straight into the FSDP layout
    on it (:mod:`llm.model.sharding`), whatever mesh they were saved from; without one, where the
    policy's current arrays and the optimizer template's arrays are.
    """

    def __init__(self, directory: str | os.PathLike, keep: int, mesh: Any = None):
        self.directory = Path(directory)
        self.keep = keep
        self.mesh = mesh

    def latest(self) -> Optional[int]:
        from llm.model.checkpoint import latest_step

        return latest_step(self.directory)

    def save(self, policy: Policy, opt_state: Any, step: int, rng: jax.Array, data_position: int) -> None:
        from llm.model.checkpoint import save_checkpoint

        extra = {
            "opt_state": list(jax.tree_util.tree_leaves(opt_state)),
            "rng": to_host(rng),
            "step": np.asarray(step, np.int64),
            "data_position": np.asarray(data_position, np.int64),
        }
        model = nnx.merge(policy.graphdef, policy.state)
        save_checkpoint(self.directory, model, int(step), extra=extra, max_to_keep=self.keep)

    def start(self, policy: Policy, optimizer: optax.GradientTransformation, seed: int):
        """A phase's starting point: ``(state, opt_state, step, rng, resumed)``, fresh (step 0,
        ``rng = PRNGKey(seed)``, ``resumed`` None) or from the latest checkpoint (``resumed``
        = its step). The updates donate their inputs, so ``state`` is a copy, unless
        ``policy.owned`` (nobody else holds its arrays: they become the phase's state, no
        second copy of the weights). ``policy.state`` may be abstract
        (``jax.ShapeDtypeStruct`` leaves) when a checkpoint exists: only its shapes are read."""
        state = policy.state if policy.owned else copy_state(policy.state)
        opt_state = optimizer.init(state)
        if self.latest() is None:
            return state, opt_state, 0, jax.random.PRNGKey(seed), None
        state, opt_state, step, rng, _ = self.restore(policy, opt_state)
        return state, opt_state, step, rng, step

    def restore(self, policy: Policy, opt_template: Any, step: Optional[int] = None):
        """``(state, opt_state, step, rng, data_position)`` of ``step`` (default latest)."""
        from llm.model.checkpoint import restore_checkpoint

        def abstract(x):
            return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=getattr(x, "sharding", None))

        leaves, treedef = jax.tree_util.tree_flatten(opt_template)
        template = {
            "opt_state": [abstract(x) for x in leaves],
            "rng": np.zeros((2,), np.uint32),
            "step": np.zeros((), np.int64),
            "data_position": np.zeros((), np.int64),
        }
        shardings = None
        if self.mesh is not None:
            whole = shd.replicated(self.mesh)
            shardings = {"opt_state": jax.tree_util.tree_leaves(shd.opt_state_shardings(opt_template, policy.state, self.mesh)),
                         "rng": whole, "step": whole, "data_position": whole}
        target = nnx.merge(policy.graphdef, jax.tree_util.tree_map(abstract, policy.state))
        restored = restore_checkpoint(self.directory, target, step=step, extra=template, mesh=self.mesh,
                                      extra_shardings=shardings)
        extra = restored.extra
        opt_state = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(x) for x in extra["opt_state"]])
        _, state = nnx.split(restored.model)
        return state, opt_state, int(extra["step"]), jnp.asarray(extra["rng"], jnp.uint32), int(extra["data_position"])

