"""jaxlake.io's folder lock: one holder at a time, refusals naming the holder's PID and host,
stale locks taken over, released on exceptions, an unwritable folder named. (The pipeline's
use of it, two real ``python -m jaxlake.run`` processes on one run folder, is in
tests/jaxlake/pipeline/test_stages.py.)"""

import json
import os
import shlex
import socket
import subprocess
import threading

import pytest

from jaxlake.io import FolderLock, FolderLockError, holder_alive, lock_record
from tests.support import unwritable


def _dead_pid():
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_one_holder_and_the_refusal_names_it(tmp_path):
    path = tmp_path / "run.lock"
    with FolderLock(path, what="run folder") as lock:
        record = json.loads(path.read_text())
        assert record == lock.record and record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert holder_alive(record)
        refusal = f"run folder {tmp_path} is in use by this process \\(PID {os.getpid()}\\)"
        with pytest.raises(FolderLockError, match=refusal):
            FolderLock(path, what="run folder").acquire()
        assert json.loads(path.read_text()) == record  # the refused one changed nothing
    assert list(tmp_path.iterdir()) == []


def test_released_on_an_exception(tmp_path):
    path = tmp_path / "run.lock"
    with pytest.raises(KeyError):
        with FolderLock(path):
            raise KeyError("boom")
    assert not path.exists()
    FolderLock(path).acquire()  # free again


def test_a_stale_lock_is_taken_over_with_a_message(tmp_path):
    path = tmp_path / "run.lock"
    stale = lock_record(pid=_dead_pid())
    path.write_text(json.dumps(stale))
    assert not holder_alive(stale)
    seen = []
    lock = FolderLock(path, on_stale=seen.append)
    assert lock.acquire() == stale and seen == [stale]
    assert json.loads(path.read_text())["token"] == lock.record["token"]
    lock.release()
    # a live PID whose process started at another time (the PID was reused) is stale too
    reused = dict(lock_record(), pid=os.getppid(), start=-1, token="x")
    assert not holder_alive(reused)


def test_another_host_is_refused_and_its_advice_works(tmp_path):
    path = tmp_path / "run.lock"
    path.write_text(json.dumps(lock_record(host="node-7")))
    with pytest.raises(FolderLockError) as err:
        FolderLock(path, what="run folder").acquire()
    msg = str(err.value)
    assert f"in use by process {os.getpid()} on host node-7 since " in msg
    advice = msg.split("delete the lock: ", 1)[1]
    assert subprocess.run(shlex.split(advice)).returncode == 0  # the command the error gives
    with FolderLock(path):
        pass


def test_wait_s_polls_until_the_holder_lets_go(tmp_path):
    path = tmp_path / "store.lock"
    holder = FolderLock(path)
    holder.acquire()
    threading.Timer(0.2, holder.release).start()
    with FolderLock(path, wait_s=10) as waiter:
        assert json.loads(path.read_text())["token"] == waiter.record["token"]


def test_an_unwritable_folder_is_named(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with unwritable(folder):
        with pytest.raises(FolderLockError, match=f"cannot write in the run folder {folder} \\("):
            FolderLock(folder / "run.lock", what="run folder").acquire()


def test_release_all_drops_this_process_s_locks_only(tmp_path):
    """What ``python -m jaxlake.run`` does on SIGTERM before it ends: its locks go, others stay."""
    from jaxlake.io import release_all

    mine, theirs = tmp_path / "a.lock", tmp_path / "b.lock"
    lock = FolderLock(mine)
    lock.acquire()
    theirs.write_text(json.dumps(lock_record(host="node-7")))
    release_all()
    assert not mine.exists() and theirs.exists()
    lock.release()  # nothing left to remove
    FolderLock(mine).acquire()
