"""The measurements of ``python -m jaxlake.bench``: generator and rollout throughput on every
device JAX sees.

Hydra entry point :func:`jaxlake.bench.main` (``jaxlake/bench/__main__.py``; primary config
``conf/bench.yaml``, settings in the ``bench`` group: ``conf/bench/default.yaml``, ``tiny.yaml``
for CI, ``gpu.yaml`` up to a million lakes), which calls :func:`run_bench`::

    python -m jaxlake.bench                                   # CPU default, a few minutes
    python -m jaxlake.bench bench=tiny                        # ~30 s smoke run (CI)
    python -m jaxlake.bench bench=tiny bench.observations=true  # observations built every step
    python -m jaxlake.bench bench=like_for_like               # every observation kind against Connector
    python -m jaxlake.bench bench.peers=[gymnasium,gymnasium_vector,pogema,jumanji_connector]
    JAX_PLATFORMS=cuda python -m jaxlake.bench bench=gpu      # one GPU or all GPUs of a host
    python -m jaxlake.bench bench=tpu                         # a TPU host / slice

What is measured, for every ``bench.envs`` entry (a :class:`~jaxlake.config.LakeConfig`) and
every batch size ``B`` (capped by device memory):

* ``generator``: ``jit(vmap(generate))(keys, configs)`` with every guarantee on
  (reachability, distance bounds, conflict targeting); lakes/s, plus the achieved statistics
  of the generated lakes (so a fast but failing generator shows).
* ``rollout``: ``lax.scan`` over ``bench.steps`` steps of the vmapped step with uniformly
  random actions drawn inside the scan (``[B, max_agents]`` per step); env-steps/s and
  agent-steps/s (``num_agents`` agents per env-step). ``bench.rng="bits"`` (default) draws
  actions and slip noise from one ``random.bits`` word per agent slot and steps with
  ``env.step_from_uniforms`` (:func:`jaxlake.bench.rollouts.random_actions`);
  ``bench.rng="keys"`` uses ``randint`` and one split key per instance with the keyed
  ``env.step`` (threefry then costs about as much as the step itself on CPU).
  Episodes that end keep being stepped (a done episode does not change), as in a raw step
  benchmark.
* ``rollout_autoreset``: the same with :mod:`jaxlake.autoreset` over a pool of
  ``bench.autoreset.pool_size`` pre-generated lakes, so every env-step is a live one; the
  overhead against ``rollout`` is reported in ``autoreset_overhead``.
* ``bench.observations=true`` (default false, so the default numbers stay comparable with
  earlier runs) also builds every agent's array observation
  (:func:`jaxlake.observations.observe`: the ``[A, H, W, 6]`` grids in
  ``bench.observation_dtype``, uint8 by default, the ``[A, 2]``
  scalars and the ``[A, 5]`` action masks) of the state each step starts from, inside the
  timed loop, and keeps it in the scan's carry, so it is written out every step as an
  environment that returns observations does (Jumanji, POGEMA and gymnasium do): the
  like-for-like figure for the peer ratios (``ratios`` then compare these rows; the JAX peer
  Jumanji Connector then keeps its observations in its carry too, else XLA drops them).

* ``observe`` (``bench.like_for_like``, :mod:`jaxlake.bench.kinds`): the rollout with one kind
  of observation built every step and kept (``observation_kind``: ``none``, ``global``,
  ``packed``, ``grids``, or ``jaxmarl``, the JaxMARL adapter's default observation stepped with
  ``jax.vmap(env.step)`` and its auto-reset), at ``bench.like_for_like.batch_size``, with the
  observation's bytes per lake-step; ``like_for_like`` sets each against the Jumanji Connector
  peer's matching mode (its returned observation, plus its per-agent relabel, plus its
  ``AutoResetWrapper``) and POGEMA, with the project's targets.

Compile time is excluded from the rates and reported apart (``compile_s``); every rate is
``work / median(times_s)`` over ``bench.repeats`` timed calls after one warm-up, each ended by
``jax.block_until_ready``. The batch is sharded over the local devices
(:mod:`jaxlake.sharding`; ``devices`` says how many split it). XLA's cost analysis of the
compiled *single* batched step (``jit(...).lower(...).compile().cost_analysis()``; a
``scan`` body would be counted once, so the step is analysed alone) gives flops and bytes per
instance-step, shown next to the achieved rate as achieved GFLOP/s and GB/s.

Peers (``bench.peers``, see :mod:`jaxlake.peers`; :mod:`jaxlake.bench.peers` runs them) run in
subprocesses on the same map size, agent count and hole density (``bench.peer.envs``); ``ratios``
holds ours / theirs in agent-steps/s.

The rollout programs (``bench.rng``, ``bench.observations``) are in :mod:`jaxlake.bench.rollouts`,
the peers' plumbing in :mod:`jaxlake.bench.peers` and the report (ratios, tables, files) in
:mod:`jaxlake.bench.report`; the package :mod:`jaxlake.bench` re-exports the public functions
of all four (``jaxlake.bench.run_bench``, ``jaxlake.bench.make_rollout``,
``jaxlake.bench.measure_peers``, ...).

Outputs, in ``bench.out_dir`` or else the Hydra run dir: ``bench.json``, ``bench.csv`` (all
measurement rows, peers included), ``bench.png`` (throughput against batch size per env), and
the table printed to stdout. Files are written atomically (temp file + rename).

JSON fields (``schema == "jaxlake.bench/1"``):

``schema``
    format tag.
``meta``
    ``device_kind``, ``platform``, ``device_count`` (all devices), ``local_device_count``,
    ``process_count``, ``versions`` (``jax``, ``jaxlib``, ``python``, ``numpy``, ``flax``),
    ``git_commit`` (or null), ``git_dirty``, ``hostname``, ``cpu_count``, ``time_utc``,
    ``memory_limit_bytes`` (per device, as used for the cap), ``xla_flags``.
``config``
    the resolved ``bench`` settings.
``results``
    list of measurement rows. Every row: ``kind`` (``generator`` | ``rollout`` |
    ``rollout_autoreset`` | ``observe``), ``env`` (name), ``height``, ``width``, ``num_agents``,
    ``max_agents``, ``hole_density``, ``conflict_density``, ``slip_prob``, ``max_steps``,
    ``batch_size``, ``devices``, ``status`` (``ok`` | ``skipped``), ``note``. When ``ok``:
    ``compile_s``, ``times_s`` (list, wall), ``cpu_times_s`` (process CPU seconds of the same
    calls, all threads), ``median_s``, ``memory_bytes`` (XLA's argument + output +
    temp bytes per device, or null). Generator rows: ``lakes_per_s``, ``flops_per_lake``,
    ``bytes_per_lake``, ``achieved_gflops``, ``achieved_gbytes_per_s``, ``stats`` (means over
    the batch of ``hole_density``, ``conflict_density``, ``dist_ok``, ``attempts``),
    ``lakes_per_cpu_s`` (per process-CPU second).
    Rollout rows: ``steps``, ``rng``, ``observations`` (bool, ``bench.observations``),
    ``env_steps_per_s``, ``agent_steps_per_s``, ``agent_steps_per_cpu_s``, ``flops_per_instance_step``,
    ``bytes_per_instance_step``, ``achieved_gflops``, ``achieved_gbytes_per_s``; autoreset rows add ``pool_size`` and ``episodes_per_s``;
    observe rows add ``observation_kind`` and ``obs_bytes_per_lake_step`` (null for ``none``).
``peers``
    rows from :mod:`jaxlake.peers`: ``peer``, ``status``, ``note``, and when ``ok``
    ``system``, ``version``, ``env`` (our env it was matched to), ``height``, ``width``,
    ``num_agents``, ``hole_density``, ``num_envs``, ``agent_steps_per_s``,
    ``env_steps_per_s``, ``agent_steps_per_cpu_s`` (+ peer-specific extras such as
    ``resets_per_s``).
``ratios``
    one row per measured peer row: ``peer``, ``system``, ``env``, ``batch_size``,
    ``peer_agent_steps_per_s``, ``ours_agent_steps_per_s`` (plain rollout),
    ``ours_autoreset_agent_steps_per_s``, ``ratio`` (plain / peer), ``ratio_autoreset``,
    ``ratio_cpu`` (agent-steps per process-CPU second, ours / theirs: robust to a loaded
    machine; null when the peer does not report CPU time).
``like_for_like``
    one row per ``observe`` row and matching peer row (the Connector's mode for that kind, and
    POGEMA for ``none``): ``env``, ``kind``, ``batch_size``, ``peer``, ``peer_mode``,
    ``peer_num_envs``, ``ours_agent_steps_per_s``, ``peer_agent_steps_per_s``,
    ``ours_obs_bytes_per_lake_step``, ``peer_obs_bytes_per_lake_step``, ``ratio`` (wall),
    ``ratio_cpu`` (per process-CPU second), ``target`` and ``met`` (null where the project sets
    no target).
``autoreset_overhead``
    per env and batch size: ``plain_agent_steps_per_s``, ``autoreset_agent_steps_per_s``,
    ``overhead_pct`` (``100 * (plain / autoreset - 1)``).
``files``
    names of the files written.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlake import autoreset, env, observations
from jaxlake.bench.kinds import (PEER_MODE, kinds_settings, like_for_like, make_jaxmarl_rollout, make_kind_rollout,
                                 observation_bytes)
from jaxlake.bench.peers import measure_peers
from jaxlake.bench.report import autoreset_overheads, format_report, peer_ratios, write_outputs
from jaxlake.bench.rollouts import (OBSERVATION_DTYPES, make_autoreset_rollout, make_rollout, observation_dtype,
                                    rng_mode)
from jaxlake.config import LakeConfig, repeat_config
from jaxlake.sharding import mesh_for_batch, replicated, shard_batch
from jaxlake.types import Lake

SCHEMA = "jaxlake.bench/1"
RESULT_FILES = ("bench.json", "bench.csv", "bench.png")

#: ``LakeConfig`` fields copied into every row.
_ENV_FIELDS = ("height", "width", "num_agents", "max_agents", "hole_density", "conflict_density",
               "slip_prob", "max_steps")

# Documented JSON fields (module docstring); tests/jaxlake/test_bench.py checks a real run has them.
TOP_FIELDS = ("schema", "meta", "config", "results", "peers", "ratios", "autoreset_overhead", "like_for_like",
              "files")
META_FIELDS = ("device_kind", "platform", "device_count", "local_device_count", "process_count",
               "versions", "git_commit", "git_dirty", "hostname", "cpu_count", "time_utc",
               "memory_limit_bytes", "xla_flags")
VERSION_FIELDS = ("jax", "jaxlib", "python", "numpy", "flax")
ROW_FIELDS = ("kind", "env") + _ENV_FIELDS + ("batch_size", "devices", "status", "note")
OK_ROW_FIELDS = ("compile_s", "times_s", "cpu_times_s", "median_s", "memory_bytes")
GENERATOR_FIELDS = ("lakes_per_s", "lakes_per_cpu_s", "flops_per_lake", "bytes_per_lake", "achieved_gflops",
                    "achieved_gbytes_per_s", "stats")
GENERATOR_STATS_FIELDS = ("hole_density", "conflict_density", "dist_ok", "attempts")
ROLLOUT_FIELDS = ("steps", "rng", "observations", "observation_dtype", "env_steps_per_s", "agent_steps_per_s", "agent_steps_per_cpu_s",
                  "flops_per_instance_step", "bytes_per_instance_step", "achieved_gflops", "achieved_gbytes_per_s")
AUTORESET_FIELDS = ROLLOUT_FIELDS + ("pool_size", "episodes_per_s")
OBSERVE_FIELDS = ROLLOUT_FIELDS + ("observation_kind", "obs_bytes_per_lake_step")
LIKE_FOR_LIKE_FIELDS = ("env", "kind", "batch_size", "peer", "peer_mode", "peer_num_envs", "ours_agent_steps_per_s",
                        "peer_agent_steps_per_s", "ours_obs_bytes_per_lake_step", "peer_obs_bytes_per_lake_step",
                        "ratio", "ratio_cpu", "target", "met")
RATIO_FIELDS = ("peer", "system", "env", "batch_size", "peer_agent_steps_per_s", "ours_agent_steps_per_s",
                "ours_autoreset_agent_steps_per_s", "ratio", "ratio_autoreset", "ratio_cpu")
OVERHEAD_FIELDS = ("env", "batch_size", "plain_agent_steps_per_s", "autoreset_agent_steps_per_s",
                   "overhead_pct")


# ============================================================================ environment
def _git(*args: str) -> Optional[str]:
    """``git <args>`` in the checkout this module runs from; None for an installed wheel.

    The commit describes the benchmarked code, so it is read only where the package sits at
    the top of a git work tree (an editable install or a clone), never from the current
    folder nor from a repository that merely contains a site-packages folder.
    """
    root = Path(__file__).resolve().parents[2]  # jaxlake/bench/throughput.py -> the checkout
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def device_memory_limit(device: Optional[Any] = None) -> Optional[int]:
    """Bytes one device may hold: the accelerator's limit, or the host's RAM for CPU."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory stats
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    # Host devices forced by XLA_FLAGS share the RAM.
    return int(ram // max(1, jax.local_device_count())) if device.platform == "cpu" else int(ram)


def environment_info() -> dict:
    """Devices, versions, git commit and host of this run (the JSON ``meta``)."""
    import flax
    import jaxlib

    dev = jax.devices()[0]
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "device_kind": dev.device_kind,
        "platform": dev.platform,
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "process_count": jax.process_count(),
        "versions": {
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "flax": flax.__version__,
        },
        "git_commit": commit,
        "git_dirty": bool(status) if status is not None else None,
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "memory_limit_bytes": device_memory_limit(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


# ============================================================================ XLA helpers
def cost_of(compiled: Any) -> dict:
    """``{"flops", "bytes"}`` from XLA's cost analysis of a compiled function (None if absent)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        cost = None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    cost = cost or {}
    flops, nbytes = cost.get("flops"), cost.get("bytes accessed")
    return {"flops": float(flops) if flops is not None else None,
            "bytes": float(nbytes) if nbytes is not None else None}


def memory_of(compiled: Any) -> Optional[int]:
    """Argument + output + temp bytes per device of a compiled function (None if unknown)."""
    try:
        mem = compiled.memory_analysis()
    except Exception:  # noqa: BLE001
        return None
    if mem is None:
        return None
    parts = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
    return int(sum(getattr(mem, p, 0) or 0 for p in parts))


def time_calls(fn: Callable[..., Any], arg_sets: Sequence[tuple], warmup: int = 1) -> tuple[list[float], list[float]]:
    """Wall and process-CPU seconds of ``fn(*args)`` for each of ``arg_sets``.

    ``warmup`` untimed calls first; each timed call ends with ``jax.block_until_ready``.
    CPU time counts every thread of this process (XLA's too): on a shared machine, wall time
    well above CPU time means the benchmark was waiting for the cores.
    """
    for _ in range(warmup):
        jax.block_until_ready(fn(*arg_sets[0]))
    wall, cpu = [], []
    for args in arg_sets:
        start, start_cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(*args))
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def _per(value: Optional[float], n: float) -> Optional[float]:
    return None if value is None else value / n


# ============================================================================ jitted programs
# The rollouts (bench.rng, bench.observations) are in jaxlake.bench.rollouts.
def make_generator(generate_fn: Callable) -> Callable:
    """``jit(vmap(generate))`` over keys ``[B]`` and a stacked config ``[B]``."""
    return jax.jit(jax.vmap(generate_fn))


# ============================================================================ measurements
class _Cap:
    """Skips batch sizes whose memory would exceed the device budget.

    Before compiling a batch size, XLA's memory figures of the batch sizes already compiled
    (per kind) are extrapolated linearly (fixed part + per-instance part, from the two
    largest); after compiling, XLA's own figure decides.
    """

    def __init__(self, limit: Optional[int], fraction: float, max_batch: Optional[int]):
        self.budget = None if limit is None else limit * fraction
        self.max_batch = max_batch
        self.points: dict[str, dict[int, float]] = {}

    def estimate(self, kind: str, per_device_batch: float) -> Optional[float]:
        pts = sorted(self.points.get(kind, {}).items())
        if len(pts) < 2:
            return None
        (b1, m1), (b2, m2) = pts[-2], pts[-1]
        slope = max(0.0, (m2 - m1) / (b2 - b1))
        return m2 + slope * (per_device_batch - b2)

    def reason(self, kind: str, batch: int, devices: int) -> Optional[str]:
        if self.max_batch is not None and batch > self.max_batch:
            return f"batch {batch} > bench.max_batch={self.max_batch}"
        est = self.estimate(kind, batch / devices)
        if self.budget is not None and est is not None and est > self.budget:
            return (f"capped by device memory: ~{est / 2**30:.2f} GiB per device estimated > "
                    f"budget {self.budget / 2**30:.2f} GiB")
        return None

    def check_compiled(self, kind: str, batch: int, devices: int, mem: Optional[int]) -> Optional[str]:
        if mem is None:
            return None
        self.points.setdefault(kind, {})[batch // devices] = float(mem)
        if self.budget is not None and mem > self.budget:
            return f"capped by device memory: XLA needs {mem / 2**30:.2f} GiB per device > budget {self.budget / 2**30:.2f} GiB"
        return None


def _env_row(kind: str, name: str, config: LakeConfig, batch: int, devices: int) -> dict:
    row = {"kind": kind, "env": name}
    row.update({f: getattr(config, f) for f in _ENV_FIELDS})
    row.update(batch_size=batch, devices=devices, status="ok", note="")
    return row


def _skip(row: dict, note: str) -> dict:
    row.update(status="skipped", note=note)
    return row


def _achieved(row: dict, flops: Optional[float], nbytes: Optional[float], rate: float) -> None:
    row["achieved_gflops"] = None if flops is None else flops * rate / 1e9
    row["achieved_gbytes_per_s"] = None if nbytes is None else nbytes * rate / 1e9


def measure_generator(gen, name: str, config: LakeConfig, batch: int, key: jax.Array,
                      repeats: int, cap: _Cap) -> tuple[dict, Optional[Lake]]:
    """Generator row for one batch size, and the generated lakes (sharded) for the rollouts."""
    mesh = mesh_for_batch(batch)
    row = _env_row("generator", name, config, batch, mesh.size)
    why = cap.reason("generator", batch, mesh.size)
    if why:
        return _skip(row, why), None
    configs = shard_batch(repeat_config(config, batch), mesh)
    key_sets = [(shard_batch(jax.random.split(k, batch), mesh), configs)
                for k in jax.random.split(key, repeats + 1)]
    start = time.perf_counter()
    compiled = gen.lower(*key_sets[0]).compile()
    row["compile_s"] = time.perf_counter() - start
    row["memory_bytes"] = memory_of(compiled)
    why = cap.check_compiled("generator", batch, mesh.size, row["memory_bytes"])
    if why:
        return _skip(row, why), None
    lakes = jax.block_until_ready(compiled(*key_sets[0]))
    times, cpu = time_calls(compiled, key_sets[1:], warmup=0)
    cost = cost_of(compiled)
    rate = batch / float(np.median(times))
    row.update(times_s=times, cpu_times_s=cpu, median_s=float(np.median(times)), lakes_per_s=rate,
               lakes_per_cpu_s=batch / max(float(np.median(cpu)), 1e-12),
               flops_per_lake=_per(cost["flops"], batch / mesh.size),
               bytes_per_lake=_per(cost["bytes"], batch / mesh.size))
    _achieved(row, row["flops_per_lake"], row["bytes_per_lake"], rate)
    stats = lakes.stats
    row["stats"] = {
        "hole_density": float(jnp.mean(stats.hole_density)),
        "conflict_density": float(jnp.mean(stats.conflict_density)),
        "dist_ok": float(jnp.mean(stats.dist_ok.astype(jnp.float32))),
        "attempts": float(jnp.mean(stats.attempts.astype(jnp.float32))),
    }
    return row, lakes


def _rollout_row(kind: str, name: str, config: LakeConfig, batch: int, mesh, steps: int, rng: str,
                 observe: bool | str) -> dict:
    row = _env_row(kind, name, config, batch, mesh.size)
    row.update(steps=steps, rng=rng, observations=bool(observe),
               observation_dtype=observation_dtype(observe) if observe else None)
    return row


def _time_rollout(row: dict, make_program: Callable[[], Callable], args: tuple, key: jax.Array, repeats: int,
                  cap: _Cap, mesh, config: LakeConfig, extra: Optional[Callable[[Any, float], dict]] = None) -> dict:
    """Compile the rollout ``make_program()`` on ``args`` and a key, then time it (``repeats``
    calls after one warm-up) into ``row``; ``extra(final output, median seconds)``: more fields,
    from one more call."""
    kind, batch, steps = row["kind"], row["batch_size"], row["steps"]
    keys = list(jax.random.split(key, repeats + 1))
    start = time.perf_counter()
    compiled = make_program().lower(*args, keys[0]).compile()
    row["compile_s"] = time.perf_counter() - start
    row["memory_bytes"] = memory_of(compiled)
    why = cap.check_compiled(kind, batch, mesh.size, row["memory_bytes"])
    if why:
        return _skip(row, why)
    cost = cost_of(compiled)
    times, cpu = time_calls(compiled, [(*args, k) for k in keys[1:]], warmup=1)
    median = float(np.median(times))
    more = {} if extra is None else extra(compiled(*args, keys[-1]), median)
    env_rate = batch * steps / median
    row.update(times_s=times, cpu_times_s=cpu, median_s=median, env_steps_per_s=env_rate,
               agent_steps_per_s=env_rate * config.num_agents,
               agent_steps_per_cpu_s=batch * steps * config.num_agents / max(float(np.median(cpu)), 1e-12),
               **more,
               flops_per_instance_step=_per(cost["flops"], batch / mesh.size),
               bytes_per_instance_step=_per(cost["bytes"], batch / mesh.size))
    _achieved(row, row["flops_per_instance_step"], row["bytes_per_instance_step"], env_rate)
    return row


def measure_rollout(name: str, config: LakeConfig, lakes: Lake, steps: int, key: jax.Array,
                    repeats: int, cap: _Cap, rng: str = "bits", observe: bool | str = False) -> dict:
    """Plain rollout row: ``steps`` random-action steps of ``vmap(env.step)`` per call
    (``observe``: building the observations every step, ``bench.observations``)."""
    batch = int(lakes.num_agents.shape[0])
    mesh = mesh_for_batch(batch)
    row = _rollout_row("rollout", name, config, batch, mesh, steps, rng, observe)
    why = cap.reason("rollout", batch, mesh.size)
    if why:
        return _skip(row, why)
    lakes = shard_batch(lakes, mesh)
    state = shard_batch(env.reset(lakes), mesh)
    return _time_rollout(row, lambda: make_rollout(steps, mesh, rng, observe), (lakes, state), key, repeats, cap,
                         mesh, config)


def measure_autoreset(name: str, config: LakeConfig, pool: Lake, batch: int, steps: int,
                      key: jax.Array, repeats: int, cap: _Cap, rng: str = "bits", observe: bool | str = False) -> dict:
    """Auto-reset rollout row over a replicated pool of pre-generated lakes."""
    mesh = mesh_for_batch(batch)
    row = _rollout_row("rollout_autoreset", name, config, batch, mesh, steps, rng, observe)
    row["pool_size"] = int(pool.num_agents.shape[0])
    why = cap.reason("rollout_autoreset", batch, mesh.size)
    if why:
        return _skip(row, why)
    pool = jax.device_put(pool, replicated(mesh))
    ar = shard_batch(autoreset.init(pool, batch), mesh)

    def episodes_per_s(out, median: float) -> dict:
        final, _ = out
        return {"episodes_per_s": float(jnp.sum(final.episodes)) / median}

    return _time_rollout(row, lambda: make_autoreset_rollout(steps, mesh, rng, observe), (pool, ar), key, repeats,
                         cap, mesh, config, episodes_per_s)


def measure_kind(name: str, config: LakeConfig, lakes: Lake, kind: str, steps: int, key: jax.Array,
                 repeats: int, cap: _Cap, dtype: str = "uint8") -> dict:
    """``observe`` row: the rollout of :func:`jaxlake.bench.kinds.make_kind_rollout` building the
    ``kind`` observation every step (``bench.like_for_like``)."""
    batch = int(lakes.num_agents.shape[0])
    mesh = mesh_for_batch(batch)
    row = _rollout_row("observe", name, config, batch, mesh, steps, "bits", kind != "none")
    row.update(observation_kind=kind, observation_dtype=dtype if kind in ("grids", "crop") else None,
               obs_bytes_per_lake_step=None)
    why = cap.reason(f"observe_{kind}", batch, mesh.size)
    if why:
        return _skip(row, why)
    lakes = shard_batch(lakes, mesh)
    caches = shard_batch(jax.jit(jax.vmap(observations.make_cache))(lakes), mesh)  # once per lake
    state = shard_batch(env.reset(lakes), mesh)
    if kind != "none":
        dt = OBSERVATION_DTYPES[dtype]
        one = jax.vmap(lambda lake, cache, st: observations.observe(lake, st, kind=kind, dtype=dt, cache=cache))
        row["obs_bytes_per_lake_step"] = observation_bytes(one, lakes, caches, state, batch=batch)
    row["kind"] = f"observe_{kind}"  # the memory cap's key; the row's kind is "observe"
    row = _time_rollout(row, lambda: make_kind_rollout(kind, steps, mesh, dtype), (lakes, caches, state), key,
                        repeats, cap, mesh, config)
    row["kind"] = "observe"
    return row


def measure_jaxmarl(name: str, config: LakeConfig, pool: Lake, batch: int, steps: int, key: jax.Array,
                    repeats: int, cap: _Cap) -> dict:
    """``observe`` row of kind ``jaxmarl``: the JaxMARL adapter's default observation, stepped as a
    JaxMARL user steps it (:func:`jaxlake.bench.kinds.make_jaxmarl_rollout`) over ``pool``."""
    mesh = mesh_for_batch(batch)
    row = _rollout_row("observe", name, config, batch, mesh, steps, "bits", True)
    row.update(observation_kind="jaxmarl", observation_dtype="uint8", obs_bytes_per_lake_step=None)
    try:
        from jaxlake.adapters.jaxmarl import MAPFFrozenLake
    except ImportError as err:  # the ecosystem extra is missing
        return _skip(row, f"the JaxMARL adapter needs the ecosystem extra: {err}")
    marl = MAPFFrozenLake(pool)
    keys = shard_batch(jax.random.split(jax.random.fold_in(key, 1), batch), mesh)
    obs, state = jax.jit(jax.vmap(marl.reset))(keys)
    obs, state = shard_batch(obs, mesh), shard_batch(state, mesh)
    row["obs_bytes_per_lake_step"] = observation_bytes(lambda o: o, obs, batch=batch)
    row["kind"] = "observe_jaxmarl"
    row = _time_rollout(row, lambda: make_jaxmarl_rollout(marl, steps, mesh), (state, obs), key, repeats, cap, mesh,
                        config)
    row["kind"] = "observe"
    return row


# ============================================================================ driver
def parse_envs(entries: Sequence[Mapping[str, Any]]) -> dict[str, tuple[LakeConfig, Optional[list[int]]]]:
    """``bench.envs`` -> ``{name: (LakeConfig, batch_sizes or None)}`` (validated)."""
    envs = {}
    for i, entry in enumerate(entries):
        entry = dict(entry)
        name = entry.pop("name", None) or f"env{i}"
        sizes = entry.pop("batch_sizes", None)
        if name in envs:
            raise ValueError(f"bench.envs[{i}].name={name!r} is repeated")
        envs[name] = (LakeConfig.from_dict(entry), None if sizes is None else [int(b) for b in sizes])
    return envs


def run_bench(settings: Mapping[str, Any], out_dir: Optional[Path] = None, *,
              generate_fn: Optional[Callable] = None) -> dict:
    """Run every measurement of ``settings`` (the ``bench`` config), print and write results."""
    if generate_fn is None:
        from jaxlake.generator import generate as generate_fn
    settings = dict(settings)
    envs = parse_envs(settings["envs"])
    repeats, steps = int(settings.get("repeats", 5)), int(settings.get("steps", 64))
    rng = str(settings.get("rng", "bits"))
    rng_mode(rng)  # fail before any work on an unknown mode
    observe = settings.get("observations", False)
    if not isinstance(observe, bool):
        raise ValueError(f"bench.observations={observe!r} must be true or false")
    obs_dtype = str(settings.get("observation_dtype", "uint8"))
    if obs_dtype not in OBSERVATION_DTYPES:
        raise ValueError(f"bench.observation_dtype={obs_dtype!r} not in {list(OBSERVATION_DTYPES)}")
    observe = obs_dtype if observe else False
    gen_repeats = int((settings.get("generator") or {}).get("repeats", repeats))
    default_sizes = [int(b) for b in settings.get("batch_sizes", [1, 1024])]
    auto = dict(settings.get("autoreset") or {})
    meta = environment_info()
    cap = _Cap(meta["memory_limit_bytes"], float(settings.get("memory_fraction", 0.5)), settings.get("max_batch"))
    key = jax.random.key(int(settings.get("seed", 0)))
    gen = make_generator(generate_fn)
    results: list[dict] = []
    print(f"[bench] {meta['local_device_count']} x {meta['device_kind']}; envs {list(envs)}", flush=True)
    for e, (name, (config, sizes)) in enumerate(envs.items()):
        k_env = jax.random.fold_in(key, e)
        generated: dict[int, Lake] = {}
        for batch in sorted(sizes or default_sizes):
            print(f"[bench] {name} B={batch}: generator", flush=True)
            row, lakes = measure_generator(gen, name, config, batch, jax.random.fold_in(k_env, batch),
                                           gen_repeats, cap)
            results.append(row)
            if lakes is not None:
                generated[batch] = lakes
        pool = None
        if auto.get("enabled", True):
            pool_n = int(auto.get("pool_size", 1024))
            big = [b for b in sorted(generated) if b >= pool_n]
            if big:  # the pool: the first lakes of a batch already generated
                pool = jax.tree_util.tree_map(lambda x: x[:pool_n], generated[big[0]])
            else:
                pool = gen(jax.random.split(jax.random.fold_in(k_env, 2**31 - 1), pool_n), repeat_config(config, pool_n))
        for batch in sorted(generated):
            k_roll, k_auto = jax.random.split(jax.random.fold_in(k_env, batch + 1))
            print(f"[bench] {name} B={batch}: rollout", flush=True)
            results.append(measure_rollout(name, config, generated.pop(batch), steps, k_roll, repeats, cap, rng,
                                           observe))
            if pool is not None:
                print(f"[bench] {name} B={batch}: rollout with auto-reset", flush=True)
                results.append(measure_autoreset(name, config, pool, batch, steps, k_auto, repeats, cap, rng,
                                                 observe))
    like = kinds_settings(settings.get("like_for_like") or {})
    if like["enabled"]:
        for e, name in enumerate(like["envs"] or list(envs)):
            if name not in envs:
                raise ValueError(f"bench.like_for_like.envs names {name!r}, not in bench.envs {sorted(envs)}")
            config = envs[name][0]
            k_env = jax.random.fold_in(key, 1000 + e)
            lakes = gen(jax.random.split(jax.random.fold_in(k_env, 0), like["batch_size"]),
                        repeat_config(config, like["batch_size"]))
            for kind in like["kinds"]:
                print(f"[bench] {name} B={like['batch_size']}: like for like, {kind}", flush=True)
                k_kind = jax.random.fold_in(k_env, 1 + like["kinds"].index(kind))
                if kind == "jaxmarl":
                    pool_n = int(auto.get("pool_size", 1024))
                    pool = jax.tree_util.tree_map(lambda x: x[:pool_n], lakes)
                    results.append(measure_jaxmarl(name, config, pool, like["batch_size"], steps, k_kind, repeats, cap))
                else:
                    results.append(measure_kind(name, config, lakes, kind, steps, k_kind, repeats, cap, like["dtype"]))
    peer_settings = {**dict(settings.get("peer") or {}), "observations": bool(observe)}
    if like["enabled"]:  # the Connector's rows for every kind measured
        peer_settings["modes"] = sorted({PEER_MODE[k] for k in like["kinds"]}, key=list(PEER_MODE.values()).index)
    configs = {n: c for n, (c, _) in envs.items()}
    peers = measure_peers(list(settings.get("peers") or []), configs, peer_settings, steps,
                          int(settings.get("seed", 0))) if settings.get("peers") else []
    result = {
        "schema": SCHEMA,
        "meta": meta,
        "config": settings,
        "results": results,
        "peers": peers,
        "ratios": peer_ratios(results, peers, configs, int(peer_settings.get("batch_size", 16384))),
        "autoreset_overhead": autoreset_overheads(results),
    }
    result["like_for_like"] = like_for_like(results, peers)
    print(format_report(result), flush=True)
    if out_dir is not None:
        files = write_outputs(result, Path(out_dir), plot=bool(settings.get("plot", True)))
        print(f"[bench] wrote {', '.join(files)} to {out_dir}", flush=True)
    return result

