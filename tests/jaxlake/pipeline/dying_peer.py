"""Two processes join (``jax.distributed``); process 0 restores a checkpoint (``PEER_CHECKPOINT_DIR``)
on its own (``llm.model.distributed.solo``) while process 1 waits; both all-gather once; then process
1 is killed (a test helper of tests/jaxlake/pipeline/test_multihost.py).

Started by ``python -m jaxlake.launch -n 2 --module tests.jaxlake.pipeline.dying_peer``, which
appends the ``train.distributed.*`` overrides; ``train.distributed.heartbeat_timeout_s`` comes
from ``PEER_HEARTBEAT_S``. Process 0 then waits at a barrier for a peer that is gone: JAX's
coordination service must end it with an error once the heartbeat times out.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def main(argv) -> None:
    node = {}
    for a in argv:
        key, _, value = a.partition("=")
        if key.startswith("train.distributed."):
            node[key.split(".")[-1]] = value == "true" if value in ("true", "false") else (
                int(value) if value.isdigit() else value)
    node["heartbeat_timeout_s"] = int(os.environ.get("PEER_HEARTBEAT_S", "3"))
    from llm.model import distributed

    distributed.initialize(node)
    import jax
    import numpy as np

    if jax.process_index() == 0:
        from llm.model.checkpoint import restore_checkpoint

        with distributed.solo():  # without it orbax would wait for process 1 in the read
            back = restore_checkpoint(os.environ["PEER_CHECKPOINT_DIR"])
        print(f"process 0: restored step {back.step} alone", flush=True)
    distributed.barrier("after-the-solo-checkpoint", timeout_s=120)

    both = distributed.gather_rows(np.asarray([jax.process_index()]))
    print(f"process {jax.process_index()}: gathered {both.tolist()}", flush=True)
    if jax.process_index() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    distributed.barrier("after-the-peer-died", timeout_s=600)
    print(f"process 0: barrier passed after {time.monotonic() - t0:.1f} s (it should not)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
