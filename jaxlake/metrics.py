"""Metric writers: one interface, three back ends (JSONL, TensorBoard, Weights & Biases).

A *row* is a mapping with a ``phase`` (a string: ``"warmstart"``, ``"grpo"``, ``"stage"``, ...),
an integer ``step`` (counted per phase, from 1) and any values: numbers, booleans, strings,
nested mappings (e.g. ``{"eval": {"success": 0.5}}``) and lists. Every back end gets the same
rows through the same two calls:

* ``truncate(phase, step, drop_later=True)`` -- (re)start ``phase`` after ``step``: whatever
  was logged for ``phase`` beyond ``step`` (and, with ``drop_later``, for the phases that
  come after it) is dropped, because a resumed run logs it again;
* ``append(row)``;

and ``close()`` at the end (writers are context managers).

Back ends (chosen in the Hydra config, ``logger: [jsonl, tensorboard, wandb]``):

``jsonl`` (:class:`JsonlWriter`, the default)
    one JSON row per line, exactly the row given (the file the trainer always wrote,
    ``metrics.jsonl``); ``truncate`` rewrites the file without the dropped rows (atomically).
``tensorboard`` (:class:`TensorBoardWriter`, needs the ``tensorboard`` extra)
    one TensorBoard run per phase, ``<logdir>/<phase>/``, written by ``tensorboardX``:
    numbers and booleans as scalars, strings as text (tensorboardX files them under
    ``<key>/text_summary``), at the row's ``step``. ``truncate(phase, step)`` drops the
    previous attempt's summaries after ``step`` from that phase's event files
    (:func:`purge_event_files`: each file that holds some is rewritten without them, kept
    records copied byte for byte, atomically) and reopens the run with
    ``purge_step=step + 1``, so a resumed run has each step once for every reader: scalars
    and text, TensorBoard's server and the legacy ``EventAccumulator`` (which on its own
    purges a restart's scalars but keeps its text: text summaries are tensors, and it purges
    no tensors). ``drop_later`` needs nothing here: a later phase purges its own events when
    it restarts.
``wandb`` (:class:`WandbWriter`, needs the ``wandb`` extra)
    one W&B run per writer folder, its id derived from the folder (a resumed process
    continues the same run id: ``resume="allow"``); ``mode="offline"`` (the default) writes
    ``<folder>/wandb/offline-run-*`` with no network, uploaded later by ``wandb sync``. Each
    phase has its own x axis ``<phase>/step`` (``define_metric``). W&B cannot delete history:
    after a resume the steps between the last checkpoint and the crash appear twice (the same
    ``<phase>/step`` values, logged again); ``truncate`` only records the restart point.

The same keys everywhere: :func:`flatten` turns a row into ``{"<phase>/<key>": value}`` (nested
mappings joined with ``/``: ``grpo/eval/success``; lists, ``None`` and non-finite numbers
left out): these are the TensorBoard tags and the W&B keys, and a row of ``metrics.jsonl``
flattens to the same dictionary.
"""

from __future__ import annotations

import abc
import hashlib
import json
import math
import numbers
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from jaxlake.config import ConfigError, cfg_get, reject_unknown, to_plain
from jaxlake.io import is_writer, jsonable, write_text

__all__ = [
    "BACKENDS",
    "JsonlWriter",
    "LoggerConfig",
    "MetricsWriter",
    "MissingBackendError",
    "MultiWriter",
    "TensorBoardWriter",
    "WandbWriter",
    "build_writer",
    "flatten",
    "purge_event_files",
    "read_rows",
    "read_tensorboard_scalars",
    "row_scalars",
]

#: Back-end names accepted in ``logger``, with the pip extra each one needs.
BACKENDS = {"jsonl": None, "tensorboard": "tensorboard", "wandb": "wandb"}
WANDB_MODES = ("offline", "online", "disabled")


class MissingBackendError(ImportError):
    """A configured back end's library is not installed."""


def _require(module: str, backend: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        extra = BACKENDS[backend]
        raise MissingBackendError(
            f"logger back end {backend!r} needs the {module!r} package: pip install 'jaxlake[{extra}]' "
            f"(or remove {backend} from logger=[...])"
        ) from err


# ============================================================================ rows
def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def flatten(row: Mapping[str, Any]) -> dict[str, Any]:
    """``{"<phase>/<key>": value}`` of a row: floats for numbers and booleans, strings as is.

    ``phase`` and ``step`` themselves are not keys; lists, ``None`` and non-finite numbers
    are left out (see the module docstring).
    """
    phase = str(row["phase"])
    out: dict[str, Any] = {}

    def visit(prefix: str, value: Any) -> None:
        value = jsonable(value)
        if isinstance(value, Mapping):
            for k, v in value.items():
                visit(f"{prefix}/{k}", v)
        elif isinstance(value, bool):
            out[prefix] = float(value)
        elif _is_number(value):
            if math.isfinite(float(value)):
                out[prefix] = float(value)
        elif isinstance(value, str):
            out[prefix] = value

    for key, value in row.items():
        if key not in ("phase", "step"):
            visit(f"{phase}/{key}", value)
    return out


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of a JSONL metrics file (a torn last line of a killed run is ignored)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line from a killed run
    return out


def _check_row(row: Mapping[str, Any]) -> tuple[str, int]:
    if "phase" not in row or "step" not in row:
        raise ValueError(f"a metrics row needs 'phase' and 'step'; got keys {sorted(row)}")
    return str(row["phase"]), int(row["step"])


# ============================================================================ interface
class MetricsWriter(abc.ABC):
    """The writer interface (see the module docstring)."""

    @abc.abstractmethod
    def truncate(self, phase: str, step: int, drop_later: bool = True) -> None:
        """(Re)start ``phase`` after ``step``."""

    @abc.abstractmethod
    def append(self, row: Mapping[str, Any]) -> None:
        """Log one row (``phase``, ``step`` and values)."""

    def close(self) -> None:
        """Flush and release the back end (a closed writer reopens on the next call)."""

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class JsonlWriter(MetricsWriter):
    """Append-only JSONL of metric rows, truncated on resume to the checkpointed step.

    ``phases`` orders the phases for ``drop_later``: a phase not listed comes after every
    listed one, so ``truncate(phase, step)`` keeps the rows of earlier phases and drops those
    of later or unlisted ones (all kept with ``drop_later=False``).
    """

    def __init__(self, path: str | os.PathLike, phases: Sequence[str] = ()):
        self.path = Path(path)
        self.phases = tuple(phases)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _order(self, phase: Any) -> int:
        return self.phases.index(phase) if phase in self.phases else len(self.phases)

    def rows(self) -> list[dict]:
        """The rows on disk (none when the file does not exist yet)."""
        return read_rows(self.path) if self.path.is_file() else []

    def truncate(self, phase: str, step: int, drop_later: bool = True) -> None:
        """Drop rows of ``phase`` after ``step`` (and of later phases when ``drop_later``).

        Called on (re)start with the checkpointed step, so rows written after the last
        checkpoint of a killed run are dropped and regenerated identically.
        """
        order = self._order(phase)
        keep = []
        for row in self.rows():
            if row.get("phase") == phase:
                if int(row.get("step", 0)) <= step:
                    keep.append(row)
            elif self._order(row.get("phase")) < order or not drop_later:
                keep.append(row)
        write_text(self.path, "".join(json.dumps(row) + "\n" for row in keep))

    def append(self, row: Mapping[str, Any]) -> None:
        _check_row(row)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(jsonable(row)) + "\n")
            f.flush()


class TensorBoardWriter(MetricsWriter):
    """TensorBoard event files through ``tensorboardX``: one run per phase, ``<logdir>/<phase>``."""

    def __init__(self, logdir: str | os.PathLike, phases: Sequence[str] = ()):
        self._tbx = _require("tensorboardX", "tensorboard")
        self.logdir = Path(logdir)
        self.phases = tuple(phases)
        self._writers: dict[str, Any] = {}

    def _open(self, phase: str, purge_step: Optional[int] = None):
        old = self._writers.pop(phase, None)
        if old is not None:
            old.close()
        # event file names hold the time in whole seconds: a suffix keeps a writer reopened within
        # the same second from overwriting the previous file
        suffix = f".{os.getpid()}.{time.time_ns()}"
        w = self._tbx.SummaryWriter(logdir=str(self.logdir / phase), purge_step=purge_step, flush_secs=30,
                                    filename_suffix=suffix)
        self._writers[phase] = w
        return w

    def truncate(self, phase: str, step: int, drop_later: bool = True) -> None:
        # A later phase's events are purged when that phase itself restarts (its own truncate).
        old = self._writers.pop(phase, None)
        if old is not None:
            old.close()  # its file is complete before it is read back
        purge_event_files(self.logdir / phase, int(step))
        self._open(phase, purge_step=int(step) + 1)

    def append(self, row: Mapping[str, Any]) -> None:
        phase, step = _check_row(row)
        w = self._writers.get(phase) or self._open(phase)
        for tag, value in flatten(row).items():
            if isinstance(value, str):
                w.add_text(tag, value, global_step=step)
            else:
                w.add_scalar(tag, value, global_step=step)
        w.flush()

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers.clear()


#: Event files are TFRecords: a little-endian u64 length, its 4-byte CRC, the data, the data's CRC.
_RECORD_HEAD = struct.Struct("<Q")


def _event_records(path: Path) -> list[bytes]:
    """The complete records of one event file, each as its bytes on disk (a torn last record,
    from a killed writer, is left out)."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos + 12 <= len(data):
        (n,) = _RECORD_HEAD.unpack_from(data, pos)
        end = pos + 12 + n + 4
        if end > len(data):
            break
        out.append(data[pos:end])
        pos = end
    return out


def purge_event_files(folder: str | os.PathLike, step: int) -> int:
    """Drop the summaries of steps after ``step`` from the TensorBoard event files of one run
    folder; returns how many were dropped.

    A file that holds some is rewritten without them (its other records copied byte for byte,
    so their checksums stay valid) through a temporary file and an atomic rename; the others
    are not touched. Other events (the file version, a restart's ``session_log``) are kept.
    """
    from tensorboardX.proto.event_pb2 import Event

    folder = Path(folder)
    if not folder.is_dir():
        return 0
    dropped = 0
    for path in sorted(folder.iterdir()):
        if "tfevents" not in path.name or not path.is_file():
            continue
        records = _event_records(path)
        keep = []
        for rec in records:
            event = Event.FromString(rec[12:-4])
            if event.HasField("summary") and event.step > step:
                dropped += 1
            else:
                keep.append(rec)
        if len(keep) < len(records) or sum(map(len, records)) < path.stat().st_size:
            # the temporary name holds no "tfevents": TensorBoard never reads a half-written one
            tmp = path.with_name(f".purge-{os.getpid()}-{path.name.replace('tfevents', 'tfe')}")
            tmp.write_bytes(b"".join(keep))
            os.replace(tmp, path)
    return dropped


def _run_id(folder: Path) -> str:
    return hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:16]


class WandbWriter(MetricsWriter):
    """A Weights & Biases run for one folder (``<folder>/wandb/``), opened at the first call."""

    def __init__(self, folder: str | os.PathLike, *, project: str = "jaxlake", entity: Optional[str] = None,
                 mode: str = "offline", group: Optional[str] = None, name: Optional[str] = None,
                 config: Optional[Mapping[str, Any]] = None, tags: Sequence[str] = ()):
        self._wandb = _require("wandb", "wandb")
        if mode not in WANDB_MODES:
            raise ConfigError(f"wandb.mode={mode!r} not in {WANDB_MODES}")
        self.folder = Path(folder)
        self.run_id = _run_id(self.folder)
        self._init = dict(project=project, entity=entity, mode=mode, group=group, name=name or self.folder.name,
                          config=jsonable(dict(config or {})), tags=list(tags))
        self._run = None
        self._phases: set[str] = set()
        self.restarts: list[tuple[str, int]] = []

    @property
    def run(self):
        """The ``wandb`` run (opened on first use)."""
        if self._run is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            # console="off": the run records metrics only, not the process's stdout/stderr
            self._run = self._wandb.init(dir=str(self.folder), id=self.run_id, resume="allow", reinit="create_new",
                                         settings=self._wandb.Settings(console="off"), **self._init)
            self._phases = set()
        return self._run

    def _phase(self, phase: str) -> None:
        if phase not in self._phases:
            self.run.define_metric(f"{phase}/step")
            self.run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
            self._phases.add(phase)

    def truncate(self, phase: str, step: int, drop_later: bool = True) -> None:
        self.restarts.append((phase, int(step)))  # W&B history cannot be rewritten

    def append(self, row: Mapping[str, Any]) -> None:
        phase, step = _check_row(row)
        self._phase(phase)
        self.run.log({f"{phase}/step": step, **flatten(row)})

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
            # wandb >= 0.31 keeps an offline run's records in its service process until that
            # process ends; tearing it down writes the run file now, so the folder is complete
            # when close() returns (a later writer starts a new service).
            import wandb

            wandb.teardown()


class MultiWriter(MetricsWriter):
    """Several back ends behind one writer (every call goes to each, in order)."""

    def __init__(self, writers: Sequence[MetricsWriter]):
        self.writers = list(writers)

    def _first(self, cls):
        return next((w for w in self.writers if isinstance(w, cls)), None)

    @property
    def jsonl(self) -> Optional[JsonlWriter]:
        """The JSONL back end, if configured."""
        return self._first(JsonlWriter)

    @property
    def path(self) -> Optional[Path]:
        """The JSONL file, if the JSONL back end is configured."""
        return self.jsonl.path if self.jsonl is not None else None

    def rows(self) -> list[dict]:
        """The JSONL rows (empty without the JSONL back end)."""
        return self.jsonl.rows() if self.jsonl is not None else []

    def truncate(self, phase: str, step: int, drop_later: bool = True) -> None:
        for w in self.writers:
            w.truncate(phase, step, drop_later)

    def append(self, row: Mapping[str, Any]) -> None:
        for w in self.writers:
            w.append(row)

    def close(self) -> None:
        for w in self.writers:
            w.close()


# ============================================================================ reading back
def read_tensorboard_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of one TensorBoard run folder (e.g. ``<stage>/tb/grpo``),
    read by TensorBoard's own ``EventAccumulator``, which hides the events a restart purged."""
    _require("tensorboard", "tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(int(e.step), float(e.value)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def row_scalars(rows: Sequence[Mapping[str, Any]], phase: str) -> dict[str, list[tuple[int, float]]]:
    """The same view of metric rows (e.g. ``metrics.jsonl``'s): every numeric key of
    :func:`flatten` of the rows of ``phase``, ``{tag: [(step, value), ...]}``."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        if row.get("phase") == phase:
            for tag, value in flatten(row).items():
                if not isinstance(value, str):
                    out.setdefault(tag, []).append((int(row["step"]), value))
    return out


# ============================================================================ config
@dataclass(frozen=True)
class LoggerConfig:
    """Which back ends to write (``logger`` in the Hydra config) and the W&B settings (``wandb``).

    Attributes:
      backends: non-empty subset of ``jsonl``, ``tensorboard``, ``wandb`` (order kept).
      wandb_project / wandb_entity / wandb_group / wandb_tags: the W&B run's placement.
      wandb_mode: ``offline`` (default: no network; ``wandb sync`` later), ``online`` or
        ``disabled``.
    """

    backends: tuple[str, ...] = ("jsonl",)
    wandb_project: str = "jaxlake"
    wandb_entity: Optional[str] = None
    wandb_mode: str = "offline"
    wandb_group: Optional[str] = None
    wandb_tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.backends:
            raise ConfigError(f"logger must name at least one back end of {sorted(BACKENDS)}; got []")
        for b in self.backends:
            if b not in BACKENDS:
                raise ConfigError(f"logger: unknown back end {b!r}; allowed: {sorted(BACKENDS)}")
        if len(set(self.backends)) != len(self.backends):
            raise ConfigError(f"logger lists a back end twice: {list(self.backends)}")
        if self.wandb_mode not in WANDB_MODES:
            raise ConfigError(f"wandb.mode={self.wandb_mode!r} not in {WANDB_MODES}")

    @classmethod
    def from_cfg(cls, cfg: Any) -> "LoggerConfig":
        """From a config holding ``logger`` (a list, or one name) and optional ``wandb``
        (``project``, ``entity``, ``mode``, ``group``, ``tags``); defaults when absent."""
        raw = to_plain(cfg_get(cfg, "logger", ["jsonl"]))
        backends = (raw,) if isinstance(raw, str) else tuple(str(b) for b in raw)
        wb = to_plain(cfg_get(cfg, "wandb", {})) or {}
        reject_unknown("wandb", wb, ("project", "entity", "mode", "group", "tags"))
        return cls(backends=backends, wandb_project=str(wb.get("project") or "jaxlake"), wandb_entity=wb.get("entity"),
                   wandb_mode=str(wb.get("mode") or "offline"), wandb_group=wb.get("group"),
                   wandb_tags=tuple(wb.get("tags") or ()))


def build_writer(config: LoggerConfig, folder: str | os.PathLike, *, jsonl_name: str = "metrics.jsonl",
                 tb_dir: str = "tb", phases: Sequence[str] = (), name: Optional[str] = None,
                 run_config: Optional[Mapping[str, Any]] = None) -> MultiWriter:
    """The configured writers for one folder: ``<folder>/<jsonl_name>``, ``<folder>/<tb_dir>/<phase>/``
    and ``<folder>/wandb/``. ``phases`` orders the phases (for ``drop_later``); ``name`` and
    ``run_config`` label the W&B run. On a process that is not the run's writer
    (:func:`jaxlake.io.is_writer`: every process but 0 of a multi-process run) there are none:
    the rows are written once, by process 0."""
    folder = Path(folder)
    writers: list[MetricsWriter] = []
    if not is_writer():  # another process of a multi-process run writes the metrics
        return MultiWriter(writers)
    for b in config.backends:
        if b == "jsonl":
            writers.append(JsonlWriter(folder / jsonl_name, phases))
        elif b == "tensorboard":
            writers.append(TensorBoardWriter(folder / tb_dir, phases))
        else:
            writers.append(WandbWriter(folder, project=config.wandb_project, entity=config.wandb_entity,
                                       mode=config.wandb_mode, group=config.wandb_group, name=name,
                                       config=run_config, tags=config.wandb_tags))
    return MultiWriter(writers)

