"""``python -m jaxlake.run`` with a record of every file this process writes (a test helper).

``python -m jaxlake.launch --module tests.jaxlake.pipeline.audited_run ...`` runs it on every
process of a multi-process run (tests/jaxlake/pipeline/test_multihost.py). With
``JAXLAKE_AUDIT_DIR`` set, a Python audit hook (``sys.addaudithook``) notes each file opened
for writing, renamed, replaced or removed under ``JAXLAKE_AUDIT_ROOT``, one line
``<process id>\t<event>\t<path>`` per event in ``<JAXLAKE_AUDIT_DIR>/<os pid>.tsv``; the
process id is ``train.distributed.process_id`` of the command line (0 without one). Files
that C++ writes (orbax's tensorstore array data) are not seen, which is fine: every process
writes its own shards of a checkpoint by design.
"""

from __future__ import annotations

import os
import re
import runpy
import sys


def _install() -> None:
    out, root = os.environ.get("JAXLAKE_AUDIT_DIR"), os.environ.get("JAXLAKE_AUDIT_ROOT")
    if not out or not root:
        return
    root = os.path.realpath(root)
    pid = next((int(m.group(1)) for a in sys.argv for m in [re.match(r"^train\.distributed\.process_id=(\d+)$", a)]
                if m), 0)
    fd = os.open(os.path.join(out, f"{os.getpid()}.tsv"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def note(event: str, path) -> None:
        if not isinstance(path, (str, bytes, os.PathLike)):
            return
        full = os.path.realpath(os.fsdecode(path))
        if full.startswith(root + os.sep):
            os.write(fd, f"{pid}\t{event}\t{full}\n".encode())

    def hook(event: str, args) -> None:
        if event == "open":
            path, mode, flags = args
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (mode is None and flags & writing):
                note("open", path)
        elif event in ("os.rename", "os.replace"):
            note(event, args[1])
        elif event in ("os.remove", "os.unlink"):
            note(event, args[0])

    sys.addaudithook(hook)


if __name__ == "__main__":
    _install()
    runpy.run_module("jaxlake.run", run_name="__main__", alter_sys=True)
