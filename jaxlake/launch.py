"""Start N processes of one run from one command: ``python -m jaxlake.launch -n N -- <run args>``.

::

    python -m jaxlake.launch -n 2 --cpu-devices 2 -- experiment=mh train.mesh.data=2 train.mesh.fsdp=2
    python -m jaxlake.launch -n 4 --gpus-per-process 2 -- experiment=mh model=qwen3_0_6b ...

Each process is ``python -m jaxlake.run <run args>`` plus ``train.distributed.enabled=true``,
``train.distributed.coordinator_address=<host>:<port>``, ``train.distributed.num_processes=N``
and ``train.distributed.process_id=I`` (:mod:`jaxlake.pipeline.cluster`: process 0 leads and
writes the run folder, the others follow). ``--cpu-devices K`` runs every process on the CPU
with ``K`` devices each (``JAX_PLATFORMS=cpu``, ``XLA_FLAGS=--xla_force_host_platform_device_count=K``):
a multi-host run on one machine, as the tests do. ``--gpus-per-process K`` gives process ``I``
the local GPUs ``I*K .. I*K+K-1`` (``train.distributed.local_device_ids``). On a real cluster
use its own launcher instead (``srun`` on SLURM, ``gcloud ... tpu-vm ssh --worker=all`` on a
TPU pod; README, GPU, TPU and clusters), which starts one process per host.

Process 0's output passes through unchanged; every other process's lines are prefixed with
``[process I]``. When a process exits with an error the others get ``--grace-s`` seconds to end
by themselves (a follower ends with its leader), then are terminated; the launcher's exit code
is the first non-zero one (0 when all succeed).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def process_command(module: str, args: Sequence[str], address: str, n: int, i: int,
                    local_device_ids: Optional[Sequence[int]] = None) -> list[str]:
    """The command line of process ``i`` of ``n``."""
    cmd = [sys.executable, "-m", module, *args, "train.distributed.enabled=true",
           f"train.distributed.coordinator_address={address}", f"train.distributed.num_processes={n}",
           f"train.distributed.process_id={i}"]
    if local_device_ids is not None:
        cmd.append("train.distributed.local_device_ids=[" + ",".join(str(d) for d in local_device_ids) + "]")
    return cmd


def process_env(base: dict, cpu_devices: Optional[int]) -> dict:
    """The environment of each process: ``base``, on the CPU with ``cpu_devices`` devices when given."""
    env = dict(base)
    if cpu_devices:
        env["JAX_PLATFORMS"] = "cpu"
        flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", "")).strip()
        env["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={int(cpu_devices)}").strip()
    return env


def _pump(stream, out, prefix: str) -> None:
    for line in iter(stream.readline, ""):
        out.write(prefix + line)
        out.flush()
    stream.close()


def launch(n: int, args: Sequence[str], *, module: str = "jaxlake.run", host: str = "127.0.0.1",
           port: int = 0, cpu_devices: Optional[int] = None, gpus_per_process: Optional[int] = None,
           grace_s: float = 30.0, env: Optional[dict] = None) -> int:
    """Run the ``n`` processes to the end; returns the launcher's exit code."""
    if n < 1:
        raise SystemExit(f"launch: -n {n} must be >= 1")
    address = f"{host}:{port or free_port(host)}"
    base = process_env(dict(os.environ if env is None else env), cpu_devices)
    base.setdefault("PYTHONUNBUFFERED", "1")
    procs, pumps = [], []
    for i in range(n):
        ids = None if not gpus_per_process else list(range(i * gpus_per_process, (i + 1) * gpus_per_process))
        p = subprocess.Popen(process_command(module, args, address, n, i, ids), env=base, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, bufsize=1)
        prefix = "" if i == 0 else f"[process {i}] "
        for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
            t = threading.Thread(target=_pump, args=(stream, out, prefix), daemon=True)
            t.start()
            pumps.append(t)
        procs.append(p)
    code, failed_at = 0, None
    try:
        while any(p.poll() is None for p in procs):
            for i, p in enumerate(procs):
                rc = p.poll()
                if rc not in (None, 0) and code == 0:
                    code, failed_at = rc, time.monotonic()
                    print(f"[launch] process {i} exited with code {rc}; the others get {grace_s:g} s to end",
                          file=sys.stderr, flush=True)
            if failed_at is not None and time.monotonic() - failed_at > grace_s:
                _stop(procs)
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        _stop(procs)
        code = code or 130
    for p in procs:
        rc = p.wait()
        if code == 0 and rc != 0:
            code = rc
    for t in pumps:
        t.join(timeout=5)
    return code


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        cut = argv.index("--")
        own, rest = argv[:cut], argv[cut + 1:]
    else:
        own, rest = argv, []
    ap = argparse.ArgumentParser(prog="python -m jaxlake.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--num-processes", type=int, required=True, help="processes to start")
    ap.add_argument("--cpu-devices", type=int, default=None, help="run on the CPU with this many devices per process")
    ap.add_argument("--gpus-per-process", type=int, default=None, help="local GPUs per process (one node)")
    ap.add_argument("--host", default="127.0.0.1", help="the coordinator's address (process 0's host)")
    ap.add_argument("--port", type=int, default=0, help="the coordinator's port (0: a free one)")
    ap.add_argument("--module", default="jaxlake.run", help="the module every process runs")
    ap.add_argument("--grace-s", type=float, default=30.0, help="seconds the others get after one fails")
    ns = ap.parse_args(own)
    return launch(ns.num_processes, rest, module=ns.module, host=ns.host, port=ns.port, cpu_devices=ns.cpu_devices,
                  gpus_per_process=ns.gpus_per_process, grace_s=ns.grace_s)


if __name__ == "__main__":
    sys.exit(main())
