"""The pipeline on several JAX processes: process 0 leads, the others follow.

``python -m jaxlake.run ... train.distributed.enabled=true`` on every process of a cluster (a
TPU pod slice, SLURM GPU nodes, or ``python -m jaxlake.launch -n N`` on one machine) starts
JAX's multi-controller runtime (:func:`start`, :mod:`llm.model.distributed`); then

* **process 0 leads**: it runs the pipeline as a single process would (:func:`jaxlake.pipeline.
  stages.run_pipeline`): it alone reads and writes the run folder (``run.json``, ``env.yaml``,
  ``train.json``, the metric rows, ``eval.json``, the summaries, ``engineer.json``,
  ``next_env.yaml``, ``report.md``), takes every decision (which stages are complete, which
  step resumes) and asks the engineer, once;
* **the others follow** (:func:`follow`): they wait for process 0's messages and join it in the
  steps that run on the global mesh over every process's devices: a stage's training
  (:func:`llm.training.stage.train_stage`) and its suite evaluation (:func:`evaluate_suite`).
  Each message carries that step's whole input, resolved by process 0: the stage's settings,
  its environment (the engineer's decision of the stage before), the folder and the starting
  policy, so every process computes the same step, and none reads a decision back from a file.
  Inside a step each process feeds its own rows of every batch, and every process writes its
  own shards of the orbax checkpoints; no other file is written by a follower
  (:func:`jaxlake.io.set_writer`).

When process 0 finishes, or stops with an error, it tells the followers, which end with it
(:class:`LeaderStopped` carries its message). A process that dies is caught by the
coordination service's heartbeat (``train.distributed.heartbeat_timeout_s``): the others end
with JAX's ``another task died`` error instead of waiting for ever. Messages go through the
coordination service's key-value store (:func:`llm.model.distributed.broadcast_object`), so a
follower waits for process 0's evaluations and the engineer's call without a device
collective; ``train.distributed.wait_timeout_s`` bounds that wait.

With one process (the default) :func:`start` does nothing and :func:`collective` is a plain
call: the single-process pipeline is unchanged.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from jaxlake.io import set_writer

#: The steps a follower runs when process 0 asks, by ``module:function``. Nothing else is ever
#: called from a message.
COLLECTIVE_STEPS = ("llm.training.stage:train_stage", "jaxlake.pipeline.cluster:evaluate_suite")
_CHANNEL = "pipeline"


def step_name(fn: Callable) -> str:
    """``module:function`` of a step."""
    return f"{fn.__module__}:{fn.__qualname__}"


def _resolve(name: str) -> Callable:
    if name not in COLLECTIVE_STEPS:
        raise RuntimeError(f"{name!r} is not a collective step of the pipeline ({list(COLLECTIVE_STEPS)})")
    module, attr = name.split(":")
    return getattr(importlib.import_module(module), attr)


class LeaderStopped(RuntimeError):
    """Process 0 stopped with an error; a follower ends with its message."""


def _distributed():
    from llm.model import distributed

    return distributed


# ============================================================================ start-up
def start(distributed_node: Optional[Mapping[str, Any]]) -> bool:
    """Join the other processes when ``train.distributed`` says so; return whether this run
    has several processes. Every process but 0 becomes a silent writer."""
    dist = _distributed()
    config = dist.DistributedConfig.from_dict(distributed_node)
    if not dist.initialize(config):
        return False
    set_writer(dist.is_writer())
    return dist.process_count() > 1


def is_leader() -> bool:
    """Process 0 (always, with one process)."""
    import jax

    return jax.process_index() == 0


def _log(msg: str) -> None:
    print(f"[pipeline] {msg}", file=sys.stderr, flush=True)


# ============================================================================ the protocol
def collective(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run the step ``fn`` (one of :data:`COLLECTIVE_STEPS`) on every process: process 0 sends
    its name and arguments to the followers, all meet at a barrier, then each runs it. With one
    process: a plain call (of whatever ``fn`` is)."""
    import jax

    if jax.process_count() > 1:
        name = step_name(fn)
        _resolve(name)  # only the listed steps travel
        if not is_leader():
            raise RuntimeError(f"collective({name!r}) is process 0's call; the followers run follow()")
        dist = _distributed()
        dist.broadcast_object(_CHANNEL, ("call", name, args, kwargs))
        dist.barrier(name)  # start together: XLA's CPU (gloo) collectives wait only 30 s for a peer
    return fn(*args, **kwargs)


def follow() -> int:
    """A follower's whole run: do what process 0 asks until it finishes (returns 0) or stops
    with an error (raises :class:`LeaderStopped` with its message)."""
    import jax

    dist = _distributed()
    me = jax.process_index()
    while True:
        message = dist.broadcast_object(_CHANNEL)
        kind = message[0]
        if kind == "call":
            _, name, args, kwargs = message
            fn = _resolve(name)
            dist.barrier(name)
            fn(*args, **kwargs)
        elif kind == "exit":
            _, error = message
            if error:
                raise LeaderStopped(f"process {me} ends with process 0, which stopped: {error}")
            return 0
        else:
            raise RuntimeError(f"process {me}: unknown message {kind!r} from process 0")


def lead(run: Callable[[], Any]) -> Any:
    """Process 0's whole run: ``run()``, then tell the followers that it finished, or why it
    stopped (any exception, which is raised again)."""
    dist = _distributed()
    try:
        out = run()
    except BaseException as err:  # noqa: BLE001 - the followers must hear of any stop
        text = str(err).strip().splitlines()
        dist.broadcast_object(_CHANNEL, ("exit", f"{type(err).__name__}: {text[0] if text else ''}"))
        raise
    dist.broadcast_object(_CHANNEL, ("exit", None))
    return out


def run(settings: Any, main: Callable[[], Any]) -> Any:
    """``main()`` as this process's part of the run: process 0 leads (:func:`lead`), the
    others :func:`follow`. With one process: ``main()``."""
    if not start(settings.distributed):
        return main()
    if is_leader():
        return lead(main)
    return follow()


# ============================================================================ collective steps
def evaluate_suite(settings: Any, k: int, policy_path: Optional[str | os.PathLike], mixture: Any,
                   checkpoint: Optional[str] = None, suite: Any = None) -> dict:
    """The held-out suite evaluation of stage ``k``'s policy (``eval.json``'s dict); with
    ``policy_path`` ``None``, the starting policy's (``model``: ``model.path`` or the shipped
    planner; ``k`` 0).

    With several processes every process runs it: the policy is loaded onto the global
    ``train.mesh`` and every generation batch is split over all processes' devices (the
    batch size rounded up to a multiple of the device count). With one process it is the
    single-device evaluation of the pipeline. ``checkpoint`` is the name the record gives the
    policy (the run folder's relative path; ``policy_path`` by default); ``suite``: a built
    :class:`jaxlake.suite.Suite` in place of the held-out one (a probe's validation suite).
    """
    import jax

    from llm.training.evaluate import evaluate_policy
    from llm.training.policy import load_policy

    node = dict(settings.eval.node)
    mesh = None
    if jax.process_count() > 1:
        from llm.model import sharding as shd

        mesh = shd.make_mesh(config=settings.train.train.mesh)
        n = mesh.devices.size
        node["batch_size"] = -(-int(node.get("batch_size", 64)) // n) * n
    if policy_path is None:  # the start: stage 1's own load (fresh weights take its seed)
        policy = load_policy(settings.model, None, settings.stage_config(1).train.seed, mesh=mesh)
    else:
        policy = load_policy(settings.model, Path(policy_path), mesh=mesh)
    return evaluate_policy(policy, node, settings.prompt, current=mixture, stage=k,
                           checkpoint=checkpoint or str(policy_path),
                           mesh=mesh, suite=suite)


# ============================================================================ Hydra, per process
_PROCESS_ID = re.compile(r"^\+{0,2}train\.distributed\.process_id=(\d+)$")
_ENABLED = re.compile(r"^\+{0,2}train\.distributed\.enabled=(true|True|1)$")
#: Environment variables that hold a process's index under the launchers JAX auto-detects.
RANK_VARIABLES = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "TPU_WORKER_ID", "CLOUD_TPU_TASK_ID")


def launched_process_id(argv: Sequence[str], environ: Mapping[str, str]) -> Optional[int]:
    """This process's index as the command line (``train.distributed.process_id=I``) or the
    cluster's launcher (SLURM, Open MPI, a TPU pod) gives it, when the distributed start-up is
    on; ``None`` otherwise. Read before Hydra composes the config."""
    enabled = environ.get("JAXLAKE_DISTRIBUTED") == "1" or any(_ENABLED.match(a) for a in argv)
    if not enabled:
        return None
    for a in argv:
        m = _PROCESS_ID.match(a)
        if m:
            return int(m.group(1))
    for var in RANK_VARIABLES:
        value = environ.get(var, "")
        if value.isdigit():
            return int(value)
    return None


def follower_hydra_overrides(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """Hydra overrides that keep a follower from writing into the run folder (Hydra's own
    ``.hydra/`` copy of the config and its log file are process 0's): ``hydra.output_subdir=
    null`` and ``hydra/job_logging=none``, unless the command line sets them."""
    pid = launched_process_id(argv, environ)
    if not pid:
        return []
    out = []
    if not any(a.lstrip("+").startswith("hydra.output_subdir=") for a in argv):
        out.append("hydra.output_subdir=null")
    if not any(a.lstrip("+").startswith("hydra/job_logging=") for a in argv):
        out.append("hydra/job_logging=none")
    return out
