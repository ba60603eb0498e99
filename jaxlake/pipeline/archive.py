"""Finished runs kept as their small record files (``pipeline.archive``), so that a sweep longer
than one machine's life resumes on another.

A run folder holds checkpoints (megabytes to gigabytes); what a results page reads of a
*finished* run is a few kilobytes per stage: its environments, training and evaluation records,
summary and engineer decision. :func:`archive_run` copies those (:data:`RUN_FILES`,
:data:`STAGE_FILES`; ``eval.json`` without its grids and with each episode's outcome only,
:func:`slim_eval`) into ``<archive>/<run folder name>/`` once every stage is complete, atomically,
keeping the files' modification times and no path of the machine that made them
(:func:`portable_record`). :func:`restore_runs` copies archived runs back into a
sweep's folder where a run is missing; the pipeline then finds every stage complete and skips
the run (nothing after a finished stage needs its checkpoint), so a resumed sweep trains only
what no archive holds. ``python -m jaxlake.study`` archives beside its results page
(``docs/results/runs/`` for the committed page) and restores from there before it sweeps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from jaxlake.io import read_json, write_json

#: The sweep's own record (its invocations and wall times), kept beside the runs.
STUDY_FILE = "study.json"

#: Run-level files archived (``start_eval.json``: the starting policy's suite evaluation, slimmed
#: like a stage's ``eval.json``).
RUN_FILES = ("run.json", "start_eval.json")
#: Stage-level files archived (everything a results page and the pipeline's completeness check read).
STAGE_FILES = ("env.yaml", "next_env.yaml", "train.json", "eval.json", "summary.json", "summary.txt",
               "engineer.json", "shared_from.json")
#: What an archived ``eval.json`` keeps of each episode record: which lake, and how it ended
#: (a paired comparison of two runs lake by lake needs no more; the completions, plans and
#: event details stay in the run folder).
EPISODE_KEYS = ("lake", "cell", "mode", "sample", "num_agents", "success", "fell", "timed_out", "conflicts",
                "malformed", "failure_types")


def slim_eval(ev: dict) -> dict:
    """``eval.json`` as archived: without the lakes' grids, and each episode's outcome only
    (:data:`EPISODE_KEYS`) stored by column (``episodes: {"columns": {key: [value per
    episode]}}``, a fifth of the rows' size), in the suite and the stage's own environment
    alike. :func:`episode_rows` reads either form; :func:`restore_runs` writes rows back."""
    def slim(node: dict) -> dict:
        out = {k: v for k, v in node.items() if k != "grids"}
        rows = out.get("episodes")
        if isinstance(rows, list):
            keys = [k for k in EPISODE_KEYS if any(k in r for r in rows)]
            out["episodes"] = {"columns": {k: [r.get(k) for r in rows] for k in keys}}
        return out

    out = slim(ev)
    if isinstance(out.get("current_env"), dict):
        out["current_env"] = slim(out["current_env"])
    out["archived"] = True
    return out


def episode_rows(node: dict) -> list[dict]:
    """The episode records of an ``eval.json`` node (the suite, or its ``current_env``), one dict
    per episode, from a run's file or an archived one (:func:`slim_eval`'s columns; a key an
    episode lacked is left out of its row)."""
    eps = node.get("episodes")
    if isinstance(eps, dict) and isinstance(eps.get("columns"), dict):
        cols = eps["columns"]
        n = len(next(iter(cols.values()), []))
        return [{k: v[i] for k, v in cols.items() if v[i] is not None} for i in range(n)]
    return list(eps or [])


def _unslim_eval(ev: dict) -> dict:
    """An archived ``eval.json`` with its episodes as rows again (what a run folder holds)."""
    out = dict(ev)
    out["episodes"] = episode_rows(ev)
    if isinstance(out.get("current_env"), dict):
        out["current_env"] = {**out["current_env"], "episodes": episode_rows(out["current_env"])}
    return out


def portable_record(name: str, record: dict, stage_dir: Path | None = None) -> dict:
    """``record`` (the JSON file ``name`` of a run or of its stage folder ``stage_dir``) as
    archived: with no path of the machine that made it. ``run.json`` loses ``run_dir`` (a
    restored run records its new folder on its next start); ``shared_from.json``'s ``dir``
    (the stage it was copied from, for provenance) becomes relative to ``stage_dir`` when both
    lie in one sweep folder. Other files are returned as they are."""
    out = dict(record)
    if name == "run.json":
        out.pop("run_dir", None)
    elif name == "shared_from.json" and stage_dir is not None and isinstance(out.get("dir"), str):
        origin = Path(out["dir"])
        root = Path(stage_dir).resolve().parent.parent
        if origin.is_absolute() and origin.resolve().is_relative_to(root):
            out["dir"] = os.path.relpath(origin.resolve(), Path(stage_dir).resolve())
    return out


def _copy_json(src_file: Path, dst_file: Path, name: str, stage_dir: Path | None) -> None:
    write_json(dst_file, portable_record(name, read_json(src_file), stage_dir))
    shutil.copystat(src_file, dst_file)


def _copy_eval(src_file: Path, dst_file: Path, slim: bool) -> bool:
    """Copy a suite evaluation slimmed (``slim``: archiving) or with its episodes as rows again
    (restoring an archived one); False when it is neither, to be copied as it is."""
    ev = read_json(src_file)
    if not (slim or isinstance(ev.get("episodes"), dict)):
        return False
    write_json(dst_file, slim_eval(ev) if slim else _unslim_eval(ev), indent=None)
    shutil.copystat(src_file, dst_file)
    return True


def _copy_record(src: Path, dst: Path, slim: bool = False) -> None:
    dst.mkdir(parents=True)
    for name in RUN_FILES:
        if (src / name).is_file():
            if name == "start_eval.json" and _copy_eval(src / name, dst / name, slim):
                continue
            if slim:
                _copy_json(src / name, dst / name, name, None)
            else:
                shutil.copy2(src / name, dst / name)
    for sd in sorted(src.glob("stage_*")):
        if not sd.is_dir():
            continue
        (dst / sd.name).mkdir()
        for name in STAGE_FILES:
            src_file, dst_file = sd / name, dst / sd.name / name
            if not src_file.is_file():
                continue
            if name == "eval.json" and _copy_eval(src_file, dst_file, slim):
                continue
            if slim and name == "shared_from.json":
                _copy_json(src_file, dst_file, name, sd)
                continue
            shutil.copy2(src_file, dst_file)


def archive_run(run_dir: Path, archive: Path) -> Path | None:
    """Copy the record files of the finished run ``run_dir`` into ``archive/<run_dir.name>/``
    (a temporary folder renamed into place). An archived copy already there is kept (a restored
    run is not archived again). Returns the archived folder, or None when it was there."""
    run_dir, archive = Path(run_dir), Path(archive)
    dst = archive / run_dir.name
    if (dst / "run.json").is_file():
        return None
    archive.mkdir(parents=True, exist_ok=True)
    tmp = archive / f".{run_dir.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _copy_record(run_dir, tmp, slim=True)
    shutil.rmtree(dst, ignore_errors=True)  # a half-copied folder of an older version
    os.replace(tmp, dst)
    return dst


def restore_runs(archive: Path, root: Path) -> list[str]:
    """Copy every archived run whose folder ``root`` lacks (no ``run.json``) into ``root``.
    Returns the restored folder names. A folder in ``root`` is never overwritten: a run that is
    there is the record."""
    archive, root = Path(archive), Path(root)
    if not archive.is_dir():
        return []
    restored = []
    for src in sorted(p for p in archive.iterdir() if p.is_dir() and (p / "run.json").is_file()):
        dst = root / src.name
        if (dst / "run.json").is_file() or any(dst.glob("stage_*")):
            continue  # the run's own folder (with no run.json yet, something else started it: left alone)
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{src.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        _copy_record(src, tmp)
        if dst.exists():  # a folder with no run.json and no stage: an interrupted start (Hydra's log only)
            shutil.rmtree(dst)
        os.replace(tmp, dst)
        restored.append(src.name)
    return restored


def default_archive(page: Path) -> Path:
    """Where ``python -m jaxlake.study`` keeps a page's finished runs: ``<page stem>/runs/``
    (``docs/results/runs/`` for ``docs/results.md``), committed with the page."""
    return Path(page).with_suffix("") / "runs"


def _copy_study_record(src_dir: Path, dst_dir: Path, overwrite: bool) -> bool:
    src, dst = Path(src_dir) / STUDY_FILE, Path(dst_dir) / STUDY_FILE
    if not src.is_file() or (dst.is_file() and not overwrite):
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_json(dst, read_json(src))
    return True


def restore_study_record(archive: Path, root: Path) -> bool:
    """Copy the archived ``study.json`` (earlier sessions' sweep invocations) into a sweep folder
    that has none. Returns whether it copied."""
    return _copy_study_record(archive, root, overwrite=False)


def archive_study_record(root: Path, archive: Path) -> bool:
    """Copy the sweep folder's ``study.json`` into the archive (after every sweep invocation, cut
    short or not). Returns whether there was one."""
    return _copy_study_record(root, archive, overwrite=True)


def git_ignores(path: Path) -> str | None:
    """The ``.gitignore`` rule (``file:line:pattern``) that keeps files under ``path`` out of the
    git work tree ``path`` is in, or None: not ignored, not in a work tree, or no ``git``. An
    archive that git ignores is never committed, so a sweep cut short cannot resume elsewhere."""
    path = Path(path).resolve()
    probe = path / "run.json"
    where = next((p for p in (path, *path.parents) if p.is_dir()), None)
    if where is None or shutil.which("git") is None:
        return None
    try:
        r = subprocess.run(["git", "-C", str(where), "check-ignore", "-v", "--no-index", str(probe)],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    rule = r.stdout.split("\t")[0].strip() if r.returncode == 0 else ""
    if not rule or rule.split(":", 2)[-1].startswith("!"):  # no rule, or a negation that keeps it
        return None
    return rule
