"""The run folder's guard: its lock, the checks made before anything is written, and the
paths its stage files record.

* :func:`run_lock` -- one process at a time in a run folder (``run.lock``, :class:`jaxlake.io.FolderLock`);
* :func:`check_model`, :func:`check_run_info`, :func:`check_folder` -- refuse a bad ``model.path``,
  a folder made with other settings, or a hand-edited env file, before any write;
* :func:`write_run_info` -- ``run.json`` and ``.hydra/``, once the checks passed;
* :func:`stage_path` / :func:`relative` -- stage files hold paths relative to their stage folder, so a
  moved or copied run folder uses its own files (:func:`rewrite_paths` mends absolute ones).

Used by :mod:`jaxlake.pipeline.stages` (which runs the stages) and :mod:`jaxlake.pipeline.share`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

from jaxlake.io import FolderLock, read_json, write_json, write_text
from jaxlake.mixture import load_mixture
from jaxlake.pipeline.settings import PipelineError, RunSettings, user_error

#: The run folder's lock (jaxlake.io.FolderLock): one process at a time in a run folder.
LOCK_FILE = "run.lock"


def log(msg: str) -> None:
    print(f"[pipeline] {msg}", file=sys.stderr, flush=True)


def stage_path(s: RunSettings, d: Path, value: str) -> Path:
    """A path that a stage file (``train.json``) of stage folder ``d`` records: relative paths are
    resolved against ``d`` (what the pipeline writes, so a moved or copied run folder uses its
    own files); an absolute one (run folders written before) inside the folder that ``run.json``
    says the run was made in is mapped into this run folder."""
    path = Path(value)
    if not path.is_absolute():
        return d / path
    origin = made_in(s)
    if origin is not None and origin != s.run_dir.resolve():
        try:
            return s.run_dir / path.relative_to(origin)
        except ValueError:
            pass
    return path


def made_in(s: RunSettings) -> Optional[Path]:
    """The folder ``run.json`` says the run was made in (None without one)."""
    info = s.run_dir / "run.json"
    try:
        made = read_json(info).get("run_dir") if info.is_file() else None
    except (OSError, ValueError):
        return None
    return Path(made) if made else None


def relative(path: Optional[Path], d: Path) -> Optional[str]:
    """``path`` relative to stage folder ``d`` when it lies in the same run folder, else as given."""
    if path is None:
        return None
    try:
        Path(path).resolve().relative_to(d.resolve().parent)
    except ValueError:
        return str(path)
    return os.path.relpath(Path(path).resolve(), d.resolve())


def require_eval(s: RunSettings):
    if s.eval is None:
        raise PipelineError("the config has no `eval` (the held-out suite); select one with eval=<name>")
    return s.eval


def rewrite_paths(d: Path, old: str, new: str) -> None:
    """Point the JSON files of folder ``d`` at ``new`` instead of ``old`` (absolute paths that run
    folders of earlier versions recorded; the pipeline now records paths relative to the stage
    folder, which need no rewriting)."""
    if old == new:
        return
    pairs = [('"' + json.dumps(old)[1:-1] + sep, '"' + json.dumps(new)[1:-1] + sep) for sep in ("/", '"')]
    for f in d.glob("*.json"):
        text = f.read_text(encoding="utf-8")
        fixed = text
        for a, b in pairs:  # the folder itself ("old") or a path inside it ("old/...")
            fixed = fixed.replace(a, b)
        if fixed != text:
            write_text(f, fixed)


#: Run folders this process holds the lock of (run_pipeline -> run_stage take it once).
_LOCKED: dict[Path, FolderLock] = {}


@contextlib.contextmanager
def run_lock(cfg: Any) -> Iterator[None]:
    """Hold the run folder's lock (``<run dir>/run.lock``, :class:`jaxlake.io.FolderLock`) for
    the block: a second process refuses at once, naming the holder's PID and host; a stale lock
    (its process gone) is taken over with a message. Re-entrant within the pipeline
    (:func:`run_pipeline` holds it over its :func:`run_stage` calls); released on exit,
    exceptions included. ``cfg``: the :class:`RunSettings` or a raw config."""
    s = RunSettings.of(cfg)
    key = s.run_dir.resolve()
    if key in _LOCKED:
        yield
        return
    s.run_dir.mkdir(parents=True, exist_ok=True)
    lock = FolderLock(s.run_dir / LOCK_FILE, what="run folder",
                      on_stale=lambda r: log(f"took over the stale lock of {s.run_dir}: process {r.get('pid')} "
                                              f"on host {r.get('host')} (since {r.get('since', '?')}) is gone"))
    with lock:
        _LOCKED[key] = lock
        try:
            yield
        finally:
            _LOCKED.pop(key, None)


def check_model(s: RunSettings) -> None:
    """``model.path``, when set, is a Hugging Face Qwen3 folder that loads: ``config.json``, every
    weights shard (headers parsed, lengths checked) and the tokenizer files
    (:func:`llm.model.hf_io.check_pretrained`); raises :class:`PipelineError` naming the file.
    Without it, a run that starts from the shipped planner with another prompt than the one
    the planner was trained on gets a one-line warning (:func:`planner_prompt_warning`)."""
    if not s.model.path:
        warning = planner_prompt_warning(s)
        if warning:
            log(f"warning: {warning}")
        return
    from llm.model.hf_io import CheckpointError, check_pretrained

    try:
        check_pretrained(s.model.path)
    except (OSError, CheckpointError, ValueError) as err:
        raise PipelineError(f"model.path={s.model.path}: {user_error(err) or err}") from None


def planner_prompt_warning(s: RunSettings) -> Optional[str]:
    """A line when the run starts from a shipped policy (``model.pretrained`` and no
    ``model.path``) with a prompt other than the one its ``pretrain.json`` records, else None."""
    from llm.game.default import SHIPPED_DIRS, shipped_dir
    from llm.game.prompts import PromptConfig

    if s.model.path is not None or not s.model.pretrained or shipped_dir(s.model.shipped) is None:
        return None
    folder = SHIPPED_DIRS[s.model.shipped]
    if not (folder / "pretrain.json").is_file():
        return None
    record = read_json(folder / "pretrain.json")
    trained = (record.get("settings") or {}).get("prompt")
    trained = None if trained is None else PromptConfig.from_dict(trained)
    if trained is None or trained == s.prompt:
        return None
    fields = [f.name for f in dataclasses.fields(PromptConfig) if getattr(trained, f.name) != getattr(s.prompt, f.name)]
    return (f"the shipped {s.model.shipped} was trained on another prompt (it differs in prompt."
            f"{', prompt.'.join(fields)}); its prompt is settings.prompt of {folder / 'pretrain.json'}")


def check_run_info(cfg: Any, engineer: Any) -> dict:
    """The ``run.json`` record of this run, checked against the folder's: refuse a run folder
    made with another engineer, seed or settings. Writes nothing."""
    s = RunSettings.of(cfg)
    d = s.run_dir
    info = {
        "experiment": s.experiment,
        "engineer": engineer.name,
        "seed": s.seed,
        "stages": s.stages,
        "eval": require_eval(s).name,
        "run_dir": str(d.resolve()),
    }
    info["settings"] = s.record()
    path = d / "run.json"
    if path.is_file():
        try:
            old = read_json(path)
        except ValueError as err:
            raise PipelineError(f"{path} is not valid JSON ({err}); restore it, or delete the folder: "
                                f"rm -r {shlex.quote(str(d))}") from None
        for key in ("engineer", "seed"):
            if old.get(key) not in (None, info[key]):
                raise PipelineError(
                    f"{d} belongs to a run with {key}={old[key]}, not {info[key]}; choose another "
                    f"experiment=<name> (or delete the folder: rm -r {shlex.quote(str(d))})"
                )
        changed = _diff(inert(old.get("settings")), inert(info["settings"]),
                        defaults=inert(setting_defaults())) if "settings" in old else []
        if changed:
            shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed[:6])
            more = f" (+{len(changed) - 6} more)" if len(changed) > 6 else ""
            raise PipelineError(
                f"{d} was made with other settings ({shown}{more}); resuming would mix them. Choose "
                f"another experiment=<name>, restore the settings, or delete the folder: rm -r {shlex.quote(str(d))}"
            )
    return info


def write_run_info(cfg: Any, engineer: Any) -> None:
    """Write ``run.json`` (after :func:`check_run_info`) and, under Hydra, ``.hydra/``. A run
    folder that ``run.json`` says was made elsewhere (moved or copied) has the absolute paths
    its stage files hold from earlier versions pointed into it first. ``cfg``: the
    :class:`RunSettings` or a raw config."""
    s = RunSettings.of(cfg)
    info = check_run_info(s, engineer)
    d = s.run_dir
    d.mkdir(parents=True, exist_ok=True)
    origin = made_in(s)
    if origin is not None and origin != d.resolve():
        for sd in sorted(d.glob("stage_*")):
            if sd.is_dir():
                rewrite_paths(sd, str(origin), str(d.resolve()))
        log(f"{d} was made in {origin}: its stage files now point into {d}")
    for name, text in s.hydra_files.items():
        (d / ".hydra").mkdir(exist_ok=True)
        write_text(d / ".hydra" / name, text)
    write_json(d / "run.json", info)


def check_folder(s: RunSettings) -> None:
    """Every environment file already in the run folder parses (a hand-edited ``env.yaml`` /
    ``next_env.yaml`` with a bad value fails now, naming the file, not stages later)."""
    for sd in sorted(s.run_dir.glob("stage_*")):
        for name in ("env.yaml", "next_env.yaml"):
            if (sd / name).is_file():
                load_mixture(sd / name)


def run_settings(cfg: Any) -> dict:
    """The settings that fix a run's results (``SETTINGS`` groups and the warm-start policy):
    :attr:`RunSettings.settings`, a fresh copy."""
    return RunSettings.of(cfg).record()


#: Blocks of settings that do nothing while switched off: ``{(group, block): switch}``.
SWITCHED = {("train", "engineer_selfplay"): "enabled"}


def inert(settings: Any) -> Any:
    """``settings`` with each switched-off block of :data:`SWITCHED` reduced to its switch: a
    run made with self-play off resumes whatever self-play's other settings (they never ran)."""
    if not isinstance(settings, dict):
        return settings
    out = dict(settings)
    for (group, block), switch in SWITCHED.items():
        node = out.get(group)
        if isinstance(node, dict) and isinstance(node.get(block), dict) and not node[block].get(switch):
            out[group] = {**node, block: {switch: node[block].get(switch, False)}}
    return out


def setting_defaults() -> dict:
    """The typed defaults of the settings groups that have them (``train``, ``reward``,
    ``prompt``: :class:`llm.training.config.TrainConfig`), as ``run.json`` writes settings.

    A setting added to the project after a run folder was made is absent from that folder's
    record; the folder ran with the behaviour the setting's default keeps, so a resumed run
    that leaves the setting at this default is the same run (:func:`_diff`)."""
    from llm.training.config import TrainConfig

    train = json.loads(json.dumps(dataclasses.asdict(TrainConfig()), default=str))
    return {"train": train, "reward": train.pop("reward"), "prompt": train.pop("prompt")}


#: A key absent from a defaults tree (``None`` is a default value of its own).
_MISSING = object()


def _is_default(value: Any, default: Any) -> bool:
    """Whether ``value`` (a JSON tree) holds only ``default``'s values: every key of a mapping
    is a key of the default with an equal value, recursively."""
    if isinstance(value, dict):
        return isinstance(default, dict) and all(k in default and _is_default(v, default[k]) for k, v in value.items())
    return value == default


def _diff(old: Any, new: Any, prefix: str = "", defaults: Any = None) -> list:
    """``[(dotted key, old, new)]`` where two JSON trees differ. A key that ``new`` has and
    ``old`` lacks is no difference when ``new``'s value is the key's entry in ``defaults`` (a
    setting added since ``old`` was written, left at the default that keeps the old behaviour)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            default = defaults.get(k, _MISSING) if isinstance(defaults, dict) else _MISSING
            if k not in old and default is not _MISSING and _is_default(new[k], default):
                continue
            out += _diff(old.get(k), new.get(k), f"{prefix}{k}.", None if default is _MISSING else default)
        return out
    return [] if old == new else [(prefix.rstrip("."), old, new)]

