"""Atomic file writes and JSON conversion: the one place the package writes result files.

Every writer puts the data into a temporary file beside the target (``.<name>.tmp``, same
folder, so the rename stays on one file system) and renames it into place with
:func:`os.replace`: a reader (or a resumed run) sees the old file or the new one, never a
torn one. A run killed mid-write leaves at most a stale ``.<name>.tmp``, overwritten by the
next write.

* :func:`write_bytes`, :func:`write_text` -- atomic writes;
* :func:`write_json` -- atomic JSON (arrays and numpy scalars converted by :func:`jsonable`);
* :func:`read_json`;
* :func:`write_marked` -- a page's generated block, between two marker lines, rewritten in
  place (the text around it kept);
* :func:`jsonable` -- numpy / JAX values as plain Python, non-finite floats as ``None``
  (strict JSON has no NaN);
* :class:`FolderLock` -- one process at a time in a folder (a run folder, the shared stage-1
  store, a study's root).

**Folder locks.** A lock is a small JSON file (``run.lock`` in a run folder) naming its
holder: ``pid``, ``host``, the process's start time and boot id (Linux ``/proc``), a random
``token`` and the time it was taken. It is created atomically: the record
is written to a temporary file that is hard-linked to the lock's name (``os.link`` fails when
the name exists), or, where the file system has no hard links, created with
``O_CREAT | O_EXCL``; so two processes can never both hold it, and a reader never sees half a
record. A second process refuses at once (:class:`FolderLockError`, naming the holder's PID
and host), or with ``wait_s`` polls until the holder lets go. A lock whose holder is gone
(a dead PID on this host, a PID reused by another process, or a holder of an earlier boot) is
**stale**: it is taken over and :meth:`FolderLock.acquire` returns the old record, so the
caller can say so. A lock of another host cannot be checked and is never taken over; its error
says which file to delete once that run is known to have ended. The holder releases it on
exit from the ``with`` block (exceptions included), removing the file only while it still
holds its token (:func:`release_all` for a signal handler about to end the process); a
``kill -9`` leaves a stale lock, which the next run takes over.

One writer per run: a run on several JAX processes (:mod:`jaxlake.pipeline.cluster`) calls
:func:`set_writer` ``(False)`` on every process but 0, whose writes through this module (and
the metric back ends of :func:`jaxlake.metrics.build_writer`) then do nothing, so each file
is written once, by one process. :func:`is_writer` says which this process is (``True`` in a
single-process run).
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import jax
import numpy as np

__all__ = [
    "FolderLock", "FolderLockError", "is_writer", "jsonable", "read_json", "set_writer", "write_bytes", "write_json",
    "write_marked", "write_text",
]

_WRITER = True


def set_writer(flag: bool) -> None:
    """Make this process the run's writer (``True``, the default) or a silent one."""
    global _WRITER
    _WRITER = bool(flag)


def is_writer() -> bool:
    """Whether this process writes the run's files (:func:`set_writer`)."""
    return _WRITER


def _tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file renamed into place); nothing on a
    process that is not the run's writer (:func:`set_writer`)."""
    path = Path(path)
    if not _WRITER:
        return path
    tmp = _tmp_path(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return write_bytes(path, text.encode("utf-8"))


def jsonable(x: Any) -> Any:
    """``x`` with numpy / JAX arrays and scalars as Python values, mappings and sequences
    converted recursively, non-finite floats as ``None``; other objects unchanged."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.generic, np.ndarray, jax.Array)):
        arr = np.asarray(x)
        return jsonable(arr.item() if arr.ndim == 0 else arr.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json(path: str | os.PathLike, obj: Any, *, indent: Optional[int] = 1) -> Path:
    """Write ``obj`` as JSON atomically (through :func:`jsonable`; anything else JSON cannot
    hold, e.g. a ``Path``, is written as its ``str``)."""
    return write_text(path, json.dumps(jsonable(obj), indent=indent, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """The JSON value in ``path``."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_marked(page: str | os.PathLike, content: str, *, begin: str, end: str, title: str) -> str:
    """(Re)write the generated block of the page ``page`` atomically and return it: ``content``
    between the marker lines ``begin`` and ``end``.

    The block replaces the one already between the markers, the text around it kept (what a
    person wrote on the page); a page without the markers gets the block appended, and a
    missing page (its folder made too) is ``# <title>`` and the block.
    """
    page = Path(page)
    block = f"{begin}\n{content}\n{end}"
    if page.is_file():
        text = page.read_text(encoding="utf-8")
        if begin in text and end in text:
            text = text[: text.index(begin)] + block + text[text.index(end) + len(end):]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
    else:
        text = f"# {title}\n\n{block}\n"
    page.parent.mkdir(parents=True, exist_ok=True)
    write_text(page, text)
    return block


# ============================================================================ folder locks
class FolderLockError(RuntimeError):
    """A folder is locked by another process, or its lock cannot be written; the message names
    the holder (PID and host) or the folder, and what to do."""


def _proc_start(pid: int) -> Optional[int]:
    """The start time of process ``pid`` in clock ticks since boot (Linux), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    try:
        return None if fields[0] == "Z" else int(fields[19])  # a zombie has ended
    except (IndexError, ValueError):
        return None


def _boot_id() -> Optional[str]:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def lock_record(pid: Optional[int] = None, host: Optional[str] = None) -> dict:
    """The record a lock holds for process ``pid`` (default: this one) on ``host`` (default:
    this host): ``pid host start boot token since`` (no command line: nothing secret lands on
    disk)."""
    pid = os.getpid() if pid is None else int(pid)
    return {
        "pid": pid,
        "host": socket.gethostname() if host is None else str(host),
        "start": _proc_start(pid),
        "boot": _boot_id(),
        "token": secrets.token_hex(8),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


#: Tokens of the locks this process holds, by lock path (a second FolderLock on a held path
#: in the same process is refused like any other process).
_HELD: dict[str, str] = {}


def holder_alive(record: Mapping[str, Any]) -> bool:
    """Whether the holder of a lock record may still run: True for another host (it cannot be
    checked), else whether its PID is a live process that started when the record says."""
    if record.get("host") != socket.gethostname():
        return True
    boot = _boot_id()
    if record.get("boot") and boot and record["boot"] != boot:
        return False  # taken before this host's last reboot
    try:
        pid = int(record["pid"])
    except (KeyError, TypeError, ValueError):
        return True
    if pid == os.getpid():
        return record.get("token") in _HELD.values()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    except OSError:
        return True
    start = _proc_start(pid)
    if Path(f"/proc/{pid}").exists() and start is None:
        return False  # a zombie
    return record.get("start") is None or start is None or int(record["start"]) == start


class FolderLock:
    """An exclusive lock on a folder, held by one process: the JSON file ``path``.

    ``with FolderLock(run_dir / "run.lock", what="run folder"):`` -- see the module docstring.
    ``wait_s``: how long :meth:`acquire` polls a live holder before it refuses (0: at once).
    ``on_stale(record)`` is called when a stale lock is taken over (default: a line on stderr).
    """

    def __init__(self, path: str | os.PathLike, *, what: str = "folder", wait_s: float = 0.0,
                 on_stale: Optional[Callable[[dict], None]] = None):
        self.path = Path(path)
        self.what = what
        self.wait_s = float(wait_s)
        self.on_stale = on_stale
        self.record: Optional[dict] = None

    # ------------------------------------------------------------------ file operations
    def _read(self, path: Optional[Path] = None) -> Optional[dict]:
        """The record in the lock file (None when it is gone); ``{}`` when it is unreadable."""
        path = self.path if path is None else path
        for attempt in range(5):  # an O_EXCL lock is empty for an instant before its record lands
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                return None
            except OSError:
                return {}
            try:
                record = json.loads(text)
                return record if isinstance(record, dict) else {}
            except ValueError:
                time.sleep(0.02)
        return {}

    def _create(self, record: dict) -> bool:
        """Create the lock file holding ``record`` atomically; False when it exists."""
        data = (json.dumps(record) + "\n").encode("utf-8")
        tmp = self.path.with_name(f".{self.path.name}.{record['pid']}.{record['token']}.tmp")
        try:
            tmp.write_bytes(data)
            try:
                os.link(tmp, self.path)
                return True
            except FileExistsError:
                return False
            except OSError as err:
                if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
                    raise
            try:  # no hard links here: exclusive creation, then the record
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            return True
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass

    def _remove_stale(self, stale: dict) -> None:
        """Move the stale lock aside, checking that it is still the stale one (another process
        may have taken it over meanwhile); a live lock moved by mistake is put back."""
        grave = self.path.with_name(f".{self.path.name}.stale.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            os.rename(self.path, grave)
        except FileNotFoundError:
            return
        moved = self._read(grave)
        if moved is not None and moved != stale:
            try:
                os.link(grave, self.path)
            except OSError:
                pass
        try:
            grave.unlink()
        except OSError:
            pass

    def _refusal(self, holder: dict) -> FolderLockError:
        folder = self.path.parent
        if not holder:
            return FolderLockError(f"the {self.what} {folder} is locked ({self.path} is unreadable); if no other "
                                   f"process uses it, delete the lock: rm {self.path}")
        pid, host = holder.get("pid"), holder.get("host")
        mine = holder.get("token") in _HELD.values() and pid == os.getpid()
        here = host == socket.gethostname()
        since = f" since {holder['since']}" if holder.get("since") else ""
        who = f"this process (PID {pid})" if mine else f"process {pid} on host {host}{since}"
        advice = (f"wait for it to finish, or stop it first (kill {pid})" if here and not mine else
                  "use one lock per process" if mine else
                  f"wait for it to finish; once that run has ended, delete the lock: rm {self.path}")
        return FolderLockError(f"the {self.what} {folder} is in use by {who}; {advice}")

    # ------------------------------------------------------------------ public
    def acquire(self) -> Optional[dict]:
        """Take the lock; returns the stale record taken over, or None. Raises
        :class:`FolderLockError` when another process holds it (after ``wait_s``) or when the
        folder cannot hold a lock file (unwritable)."""
        if self.record is not None:
            raise FolderLockError(f"{self.path} is already held by this FolderLock")
        record = lock_record()
        deadline = time.monotonic() + self.wait_s
        taken_over, stale_tries = None, 0
        while True:
            try:
                created = self._create(record)
            except OSError as err:
                reason = err.strerror or str(err)
                raise FolderLockError(f"cannot write in the {self.what} {self.path.parent} ({reason}): a run "
                                      f"writes its lock and results there; make it writable, or choose another "
                                      f"folder") from err
            if created:
                self.record = record
                _HELD[str(self.path)] = record["token"]
                return taken_over
            holder = self._read()
            if holder is None:
                continue  # released meanwhile
            if holder and not holder_alive(holder) and stale_tries < 3:
                stale_tries += 1
                self._remove_stale(holder)
                taken_over = holder
                (self.on_stale or _say_stale)(holder)
                continue
            if time.monotonic() >= deadline:
                raise self._refusal(holder)
            time.sleep(min(0.1, max(0.01, deadline - time.monotonic())))

    def release(self) -> None:
        """Remove the lock file if it still holds this lock's token."""
        if self.record is None:
            return
        token, self.record = self.record["token"], None
        _HELD.pop(str(self.path), None)
        current = self._read()
        if current is not None and current.get("token") == token:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    @property
    def held(self) -> bool:
        return self.record is not None

    def __enter__(self) -> "FolderLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def release_all() -> None:
    """Remove every lock file this process holds (those that still hold its tokens): for a
    signal handler that ends the process at once (``python -m jaxlake.run`` on SIGTERM), so the
    next run finds no lock, without raising into whatever code the signal interrupted."""
    for path, token in list(_HELD.items()):
        try:
            record = json.loads(Path(path).read_text(encoding="utf-8"))
            if isinstance(record, dict) and record.get("token") == token:
                os.unlink(path)
        except (OSError, ValueError):
            pass
        _HELD.pop(path, None)


def _say_stale(record: dict) -> None:
    print(f"[lock] took over a stale lock of process {record.get('pid')} on host {record.get('host')} "
          f"(since {record.get('since', '?')}; that process is gone)", file=sys.stderr, flush=True)
