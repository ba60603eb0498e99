"""The staged pipeline: train -> evaluate -> summarize -> engineer, for N stages.

One run lives in one directory, ``<run dir> = runs/<experiment>`` (Hydra's output folder;
a multirun job's is ``runs/<experiment>/multirun/<job>``)::

    run.lock                    held while a process works in the folder (run_lock)
    run.json                    experiment, engineer, seed, stages, suite, settings (the run
                                resumes only under the same settings: SETTINGS groups)
    .hydra/                     the command's config, Hydra config and overrides (under Hydra)
    report.md, *.png            per-stage table and plots (jaxlake.pipeline.report), rewritten at the end
    stages.jsonl                one metrics row per finished stage (phase "stage", step k): suite
                                scores, own-environment scores, the engineer's decision
                                (:func:`log_stage`; with ``logger`` also ``tb/stage/``, ``wandb/``)
    stage_<k>/env.yaml          the environment stage k trains on (a weighted mixture)
    stage_<k>/checkpoint/       orbax checkpoints of the stage's policy   } llm.training.stage.train_stage
    stage_<k>/metrics.jsonl     training metrics                          } (also warmstart/,
    stage_<k>/train.json        training finished: checkpoint, steps, ... } policy/, curves.png)
    stage_<k>/train_eval.json   the trainer's own held-out check (before / after GRPO)
    stage_<k>/eval.json         the held-out suite evaluation (llm.training.evaluate)
    stage_<k>/summary.json/.txt the summaries (jaxlake.summaries)
    stage_<k>/engineer.json     prompt, raw output, parsed config, errors, decision
    stage_<k>/next_env.yaml     the environment of stage k + 1 (written last)

:func:`run_pipeline` runs stages ``1..stages``, skipping complete ones (all files above
present), so a killed pipeline restarted with the same command resumes where it stopped; a
stage that was cut short resumes at its first missing step, and training resumes from its
orbax checkpoint. :func:`run_stage` runs one stage; stage ``k > 1`` reads stage ``k - 1``'s
``next_env.yaml`` and trained policy and, without them, fails with a message naming the
missing file and the command that makes it. Every file is written atomically.

**One process per run folder, checks before writes.** :func:`run_pipeline` and
:func:`run_stage` hold the folder's lock (:func:`run_lock`, ``run.lock``): a second process
refuses at once naming the holder's PID and host, a stale lock is taken over with a message.
Before they write anything (``run.json`` included) they check the engineer, ``model.path`` and
its files (:func:`check_model`), the folder's ``run.json`` (:func:`check_run_info`), every env
file already there (:func:`check_folder`) and the stage's inputs; the settings themselves are
checked when :func:`resolve` builds them. ``train.json`` records paths relative to its stage
folder (:func:`stage_path` resolves them), so a moved or copied run folder uses its own files.

The config is read once, at :func:`main`, into :class:`jaxlake.pipeline.settings.RunSettings`;
every step below takes those typed settings, not the raw config. Config keys used
(``conf/config.yaml``): ``env`` (stage 1's environment), ``engineer``
(``conf/engineer/<name>.yaml``), ``eval`` (``conf/eval/<name>.yaml``), ``stages``,
``experiment``, ``runs_dir``, ``seed`` (run seed: training, engineer and environment
statistics randomness; the suite's seeds are fixed by ``eval``), ``model``, ``train``,
``reward``, ``prompt``, optional ``stage`` (run that stage alone), ``pipeline.warmstart``
(``first``: the supervised warm start only in stage 1, the default; ``all``: every stage) and
``logger`` / ``wandb`` (the metric back ends, :mod:`jaxlake.metrics`; the trainer's go to
``stage_<k>/metrics.jsonl``, ``stage_<k>/tb/<phase>/``, ``stage_<k>/wandb/``).

``pipeline.share_stage1`` (a folder, or null) shares stage 1 between runs: stage 1's
training, evaluation and summaries depend only on the run's seed, stage-1 environment,
model, training, reward, prompt and suite settings -- not on the engineer, whose first
decision comes after them. With a shared folder the first run stores its finished stage 1
(without the engineer's files) under a key hashed from exactly those settings, and every
later run with the same key copies it instead of retraining, then runs its own engineer. The
results equal independent runs'; a sweep over engineers trains stage 1 once per seed. The
store has its own lock per key (``<store>/<key>.lock``): copies into and out of it take turns
(a run waits for another's copy), independent of the run folders' locks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from jaxlake.engineers import EngineerContext, build_engineer
from jaxlake.io import FolderLock, read_json, write_json, write_text
from jaxlake.metrics import build_writer
from jaxlake.mixture import Mixture, load_mixture, mixture_to_obj, mixture_to_yaml, same_mixture
from jaxlake.pipeline.settings import SETTINGS, PipelineError, RunSettings, user_error  # noqa: F401 (re-exported)

#: Files that make a stage complete (the checkpoint is named by train.json).
STAGE_FILES = ("env.yaml", "train.json", "eval.json", "summary.json", "engineer.json", "next_env.yaml")
#: The run folder's lock (jaxlake.io.FolderLock): one process at a time in a run folder.
LOCK_FILE = "run.lock"
#: How long a run waits for another one's copy into or out of the shared stage-1 store.
STORE_WAIT_S = 600.0


# ============================================================================ helpers
def run_dir(cfg: Any) -> Path:
    """The run folder: Hydra's output folder, or ``runs_dir/experiment`` outside Hydra."""
    return RunSettings.of(cfg).run_dir


def stage_dir(cfg: Any, k: int) -> Path:
    return RunSettings.of(cfg).stage_dir(k)


def num_stages(cfg: Any) -> int:
    return RunSettings.of(cfg).stages


def command_for_stage(cfg: Any, k: int) -> str:
    """The command line that runs stage ``k`` of this run (the current overrides kept)."""
    return RunSettings.of(cfg).command_for_stage(k)


def stage_complete(d: Path) -> bool:
    from llm.training.evaluate import is_suite_eval

    return all((d / f).is_file() for f in STAGE_FILES) and is_suite_eval(d / "eval.json")


def _log(msg: str) -> None:
    print(f"[pipeline] {msg}", file=sys.stderr, flush=True)


# ============================================================================ stage inputs
def initial_mixture(s: RunSettings, engineer: Any) -> Mixture:
    if s.env is None:
        raise PipelineError("the config has no `env` (stage 1's environment); select one with env=<name>")
    return Mixture.of(engineer.initial_mixture(s.env))


def stage_mixture(s: RunSettings, k: int, engineer: Any) -> Mixture:
    """Stage ``k``'s environment: ``env`` (via the engineer) for k = 1, else stage k-1's
    ``next_env.yaml``."""
    if k == 1:
        return initial_mixture(s, engineer)
    prev = s.stage_dir(k - 1) / "next_env.yaml"
    if not prev.is_file():
        raise PipelineError(
            f"stage {k} needs {prev}, written at the end of stage {k - 1}; it is missing. "
            f"Run stage {k - 1} first: {s.command_for_stage(k - 1)}"
        )
    return load_mixture(prev)


def previous_policy(s: RunSettings, k: int) -> Optional[Path]:
    """Where stage ``k`` starts from: stage k-1's trained policy (None for k = 1)."""
    if k == 1:
        return None
    info = s.stage_dir(k - 1) / "train.json"
    if not info.is_file():
        raise PipelineError(
            f"stage {k} needs the trained policy of stage {k - 1} ({info} is missing). "
            f"Run stage {k - 1} first: {s.command_for_stage(k - 1)}"
        )
    t = read_json(info)
    prev = s.stage_dir(k - 1)
    for key in ("policy_dir", "checkpoint_dir"):
        if t.get(key) and stage_path(s, prev, t[key]).exists():
            return stage_path(s, prev, t[key])
    raise PipelineError(
        f"{info} names no existing policy folder (its policy/ and checkpoint/ are gone); train stage {k - 1} "
        f"again: rm -r {shlex.quote(str(prev))} && {s.command_for_stage(k - 1)}"
    )


def stage_path(s: RunSettings, d: Path, value: str) -> Path:
    """A path that a stage file (``train.json``) of stage folder ``d`` records: relative paths are
    resolved against ``d`` (what the pipeline writes, so a moved or copied run folder uses its
    own files); an absolute one (run folders written before) inside the folder that ``run.json``
    says the run was made in is mapped into this run folder."""
    path = Path(value)
    if not path.is_absolute():
        return d / path
    made_in = _made_in(s)
    if made_in is not None and made_in != s.run_dir.resolve():
        try:
            return s.run_dir / path.relative_to(made_in)
        except ValueError:
            pass
    return path


def _made_in(s: RunSettings) -> Optional[Path]:
    """The folder ``run.json`` says the run was made in (None without one)."""
    info = s.run_dir / "run.json"
    try:
        made = read_json(info).get("run_dir") if info.is_file() else None
    except (OSError, ValueError):
        return None
    return Path(made) if made else None


def _relative(path: Optional[Path], d: Path) -> Optional[str]:
    """``path`` relative to stage folder ``d`` when it lies in the same run folder, else as given."""
    if path is None:
        return None
    try:
        Path(path).resolve().relative_to(d.resolve().parent)
    except ValueError:
        return str(path)
    return os.path.relpath(Path(path).resolve(), d.resolve())


def _require_eval(s: RunSettings):
    if s.eval is None:
        raise PipelineError("the config has no `eval` (the held-out suite); select one with eval=<name>")
    return s.eval


# ============================================================================ stage-1 sharing
#: Stage-1 files that belong to the engineer (never shared).
_ENGINEER_FILES = ("engineer.json", "next_env.yaml")
_SOURCE_FILE = "shared_from.json"


def stage1_key(cfg: Any, mixture: Mixture) -> str:
    """Hash of everything stage 1's training, evaluation and summaries depend on: the run's
    settings (:func:`run_settings`, less the warm-start policy of later stages), its seed and
    stage 1's environment (the engineer's initial mixture, which may replace ``env``).
    ``cfg``: the :class:`RunSettings` or a raw config."""
    s = RunSettings.of(cfg)
    settings = s.record()
    for later in ("env", "pipeline.warmstart"):
        settings.pop(later)
    payload = {"settings": settings, "seed": s.seed, "env": mixture_to_obj(mixture)}
    blob = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _rewrite_paths(d: Path, old: str, new: str) -> None:
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


def _store_lock(share: Path, key: str) -> FolderLock:
    """The shared stage-1 store's own lock for ``key`` (``<store>/<key>.lock``): runs of a sweep
    copy into and out of the store one at a time; a run waits for another's copy (up to
    :data:`STORE_WAIT_S`) instead of refusing."""
    return FolderLock(share / f"{key}.lock", what="shared stage-1 store", wait_s=STORE_WAIT_S,
                      on_stale=lambda r: _log(f"took over a stale lock of the shared stage-1 store {share} "
                                              f"(process {r.get('pid')} on {r.get('host')} is gone)"))


def restore_shared_stage1(s: RunSettings, d: Path, mixture: Mixture) -> bool:
    """Fill stage folder ``d`` from the shared stage-1 store when it holds this run's key."""
    share = s.share_stage1
    if share is None or (d / "train.json").is_file():
        return False
    key = stage1_key(s, mixture)
    src = share / key
    if not (src / "summary.json").is_file():
        return False
    with _store_lock(share, key):
        origin = read_json(src / _SOURCE_FILE)["dir"]
        for item in src.iterdir():
            if item.name in (_SOURCE_FILE, "env.yaml") + _ENGINEER_FILES:
                continue
            target = d / item.name
            if item.is_dir():
                shutil.copytree(item, target, dirs_exist_ok=True)
            else:
                shutil.copy2(item, target)
    _rewrite_paths(d, origin, str(d))
    write_json(d / _SOURCE_FILE, {"dir": origin, "key": key})
    _log(f"stage 1: shared from {origin} (pipeline.share_stage1 key {key})")
    return True


def store_shared_stage1(s: RunSettings, d: Path, mixture: Mixture) -> None:
    """Copy a finished stage 1 (engineer files excluded) into the shared store, atomically
    (a temporary folder renamed into place) and under the store's own lock."""
    share = s.share_stage1
    if share is None:
        return
    key = stage1_key(s, mixture)
    dst = share / key
    if dst.is_dir():
        return
    share.mkdir(parents=True, exist_ok=True)
    with _store_lock(share, key):
        if dst.is_dir():  # another run stored the same key while this one waited
            return
        tmp = share / f".{dst.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(d, tmp, ignore=shutil.ignore_patterns(*_ENGINEER_FILES, _SOURCE_FILE, "*.tmp", "wandb"))
        write_json(tmp / _SOURCE_FILE, {"dir": str(d)})
        try:
            os.replace(tmp, dst)
        except OSError:  # another run stored the same key first
            shutil.rmtree(tmp, ignore_errors=True)


# ============================================================================ steps
def step_train(s: RunSettings, k: int, d: Path, mixture: Mixture) -> dict:
    """Train stage ``k`` (resuming from its checkpoint) unless ``train.json`` says it is done."""
    info = d / "train.json"
    if info.is_file():
        return read_json(info)
    from llm.training.stage import train_stage

    init = previous_policy(s, k)
    _log(f"stage {k}: training" + (f" from {init}" if init else ""))
    res = train_stage(s.stage_config(k), mixture, d, init_from=init)
    if res.eval_after is None:  # the trainer stopped before the end of its schedule
        raise PipelineError(
            f"training of stage {k} stopped after {res.warmstart_steps} warm-start and {res.grpo_steps} GRPO "
            f"steps; rerun the same command to resume from {res.checkpoint_dir}"
        )
    out = {  # paths relative to the stage folder (stage_path resolves them)
        "checkpoint_dir": _relative(Path(res.checkpoint_dir), d),
        "policy_dir": _relative(Path(res.policy_dir), d) if res.policy_dir else None,
        "init_from": _relative(init, d),
        "warmstart_steps": res.warmstart_steps,
        "grpo_steps": res.grpo_steps,
        "resumed": res.resumed,
        "eval_before": res.eval_before,
        "eval_after": res.eval_after,
        "wall_s": round(res.wall_s, 2),
    }
    write_json(info, out)
    return out


def _load(s: RunSettings, path: Optional[Path]):
    from llm.training.policy import load_policy

    return load_policy(s.model, path)


def step_eval(s: RunSettings, k: int, d: Path, mixture: Mixture, train: dict) -> dict:
    from llm.training.evaluate import evaluate_policy, is_suite_eval, write_eval

    path = d / "eval.json"
    if is_suite_eval(path):
        return read_json(path)
    policy_path = stage_path(s, d, train.get("policy_dir") or train["checkpoint_dir"])
    _log(f"stage {k}: evaluating {policy_path} on the held-out suite")
    policy = _load(s, policy_path)
    result = evaluate_policy(policy, _require_eval(s).node, s.prompt, current=mixture, stage=k,
                             checkpoint=_relative(policy_path, d))
    write_eval(path, result)
    return result


def history(s: RunSettings, k: int) -> list:
    """History entries of stages 1..k (stage k without its engineer decision yet)."""
    from jaxlake.summaries import history_entry

    out = []
    for j in range(1, k + 1):
        dj = s.stage_dir(j)
        if not (dj / "env.yaml").is_file():
            continue
        ev = read_json(dj / "eval.json") if (dj / "eval.json").is_file() else None
        if ev is not None:
            ev = {"modes": ev.get("modes", {}), "current_env": {"modes": (ev.get("current_env") or {}).get("modes", {})}}
        train = read_json(dj / "train.json") if (dj / "train.json").is_file() else {}
        after = train.get("eval_after") or {}
        t = {"grpo_steps": train.get("grpo_steps"), "success_after_training": after.get("success")}
        eng = read_json(dj / "engineer.json") if j < k and (dj / "engineer.json").is_file() else None
        out.append(history_entry(j, load_mixture(dj / "env.yaml"), ev, t, eng))
    return out


def step_summary(s: RunSettings, k: int, d: Path, mixture: Mixture, ev: dict) -> dict:
    path = d / "summary.json"
    if path.is_file():
        return read_json(path)
    import jax

    from jaxlake.summaries import environment_stats, render_summary, summarize

    e = _require_eval(s)
    _log(f"stage {k}: summarizing")
    stats = environment_stats(mixture, e.env_stats_lakes, jax.random.PRNGKey(1_000 * s.seed + k), solve=e.planner)
    summary = summarize(ev, stats, history(s, k), e.k_failures, e.summary_mode)
    write_text(d / "summary.txt", render_summary(summary) + "\n")
    write_json(path, summary)
    return summary


def engineer_context(cfg: Any, k: int, d: Path, mixture: Mixture, ev: dict, summary: dict, train: dict,
                     engineer: Any) -> EngineerContext:
    """What the engineer of stage ``k`` gets: the stage's environment, evaluation, summary and
    history, the previous decision's state, and a loader for the trained (``"policy"``) or
    stage-0 (``"base"``) model. Notebook 03 calls it to replay a decision. ``cfg``: the
    :class:`RunSettings` or a raw config (the context's ``run_cfg`` is the settings)."""
    s = RunSettings.of(cfg)
    prev_state = {}
    if k > 1 and (s.stage_dir(k - 1) / "engineer.json").is_file():
        prev_state = read_json(s.stage_dir(k - 1) / "engineer.json").get("state") or {}

    def load_model(which: str):
        path = stage_path(s, d, train.get("policy_dir") or train["checkpoint_dir"]) if which == "policy" else None
        policy = _load(s, path)
        return policy.module(), policy.tokenizer

    return EngineerContext(
        stage=k,
        current=mixture,
        initial=initial_mixture(s, engineer),
        eval_result=ev,
        summary=summary,
        history=summary.get("history", []),
        state=prev_state,
        seed=s.seed,
        stage_dir=d,
        checkpoint=stage_path(s, d, train["checkpoint_dir"]),
        base_checkpoint=None,
        run_cfg=s,
        load_model=load_model,
    )


def step_engineer(s: RunSettings, k: int, d: Path, mixture: Mixture, ev: dict, summary: dict, train: dict,
                  engineer: Any) -> dict:
    done = d / "engineer.json"
    nxt = d / "next_env.yaml"
    if done.is_file() and nxt.is_file():
        return read_json(done)
    ctx = engineer_context(s, k, d, mixture, ev, summary, train, engineer)
    _log(f"stage {k}: engineer {engineer.name} proposes stage {k + 1}'s environment")
    t0 = time.perf_counter()
    proposal = engineer.propose(ctx)
    record = proposal.to_json(engineer.name, k)
    record["wall_s"] = round(time.perf_counter() - t0, 2)
    record["changed"] = not same_mixture(proposal.mixture, mixture)
    write_json(done, record)
    write_text(nxt, mixture_to_yaml(proposal.mixture))
    return record


# ============================================================================ entry points
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
                      on_stale=lambda r: _log(f"took over the stale lock of {s.run_dir}: process {r.get('pid')} "
                                              f"on host {r.get('host')} (since {r.get('since', '?')}) is gone"))
    with lock:
        _LOCKED[key] = lock
        try:
            yield
        finally:
            _LOCKED.pop(key, None)


def _build(s: RunSettings) -> Any:
    """The run's engineer; a bad ``engineer`` setting raises :class:`PipelineError` naming it."""
    from jaxlake.config import ConfigError

    try:
        return build_engineer(s.engineer)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - hydra's InstantiationException wraps the engineer's own error
        cause = err.__cause__ or err
        raise PipelineError(f"engineer ({(s.engineer or {}).get('_target_', '?')}): {cause}") from err


def check_model(s: RunSettings) -> None:
    """``model.path``, when set, is a Hugging Face Qwen3 folder that loads: ``config.json``, every
    weights shard (headers parsed, lengths checked) and the tokenizer files
    (:func:`llm.model.hf_io.check_pretrained`); raises :class:`PipelineError` naming the file."""
    if not s.model.path:
        return
    from llm.model.hf_io import CheckpointError, check_pretrained

    try:
        check_pretrained(s.model.path)
    except (OSError, CheckpointError, ValueError) as err:
        raise PipelineError(f"model.path={s.model.path}: {user_error(err) or err}") from None


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
        "eval": _require_eval(s).name,
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
        changed = _diff(old.get("settings"), info["settings"]) if "settings" in old else []
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
    made_in = _made_in(s)
    if made_in is not None and made_in != d.resolve():
        for sd in sorted(d.glob("stage_*")):
            if sd.is_dir():
                _rewrite_paths(sd, str(made_in), str(d.resolve()))
        _log(f"{d} was made in {made_in}: its stage files now point into {d}")
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


def _diff(old: Any, new: Any, prefix: str = "") -> list:
    """``[(dotted key, old, new)]`` where two JSON trees differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += _diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [(prefix.rstrip("."), old, new)]


def run_stage(cfg: Any, k: int, engineer: Any = None) -> dict:
    """Run (or finish) stage ``k``: train, evaluate, summarize, engineer. Returns the
    stage's record (``stage``, ``dir``, ``scores``, ``decision``). ``cfg``: the
    :class:`RunSettings` or a raw config (resolved here: a bad setting fails before any work)."""
    s = RunSettings.of(cfg)
    k = int(k)
    if not 1 <= k <= s.stages:
        raise PipelineError(f"stage={k} not in [1, stages={s.stages}]")
    engineer = engineer or _build(s)
    check_model(s)
    with run_lock(s):
        return _run_stage(s, k, engineer)


def _run_stage(s: RunSettings, k: int, engineer: Any) -> dict:
    # everything checked before anything is written: a refused command leaves the folder as it was
    check_run_info(s, engineer)
    check_folder(s)
    d = s.stage_dir(k)
    was_complete = stage_complete(d)
    mixture = stage_mixture(s, k, engineer)
    previous_policy(s, k)  # fail early, before any work, when stage k-1 is missing
    env_file = d / "env.yaml"
    if env_file.is_file() and not same_mixture(load_mixture(env_file), mixture):
        raise PipelineError(
            f"{env_file} differs from the environment stage {k} should train on now (stage {k - 1}'s "
            f"next_env.yaml or env changed); delete the stage to retrain it: rm -r {shlex.quote(str(d))}"
        )
    write_run_info(s, engineer)
    d.mkdir(parents=True, exist_ok=True)
    if not env_file.is_file():
        write_text(env_file, mixture_to_yaml(mixture))
    if k == 1:
        restore_shared_stage1(s, d, mixture)
    train = step_train(s, k, d, mixture)
    ev = step_eval(s, k, d, mixture, train)
    summary = step_summary(s, k, d, mixture, ev)
    if k == 1:
        store_shared_stage1(s, d, mixture)
    decision = step_engineer(s, k, d, mixture, ev, summary, train, engineer)
    record = stage_record(d, k)
    if not was_complete:
        log_stage(s, record, decision)
    return record


def stage_metrics(record: dict, decision: dict) -> dict:
    """The metrics row of a finished stage: phase ``stage``, step ``k``, the suite scores per
    decoding mode, the own-environment scores and the engineer's decision."""
    return {
        "phase": "stage",
        "step": record["stage"],
        "suite": {m: v for m, v in record["scores"].items() if v is not None},
        "current_env": {m: v for m, v in record["current_env"].items() if v is not None},
        "engineer": {"decision": str(record["decision"]), "reason": str(record["reason"]),
                     "changed": bool(decision.get("changed")), "wall_s": float(decision.get("wall_s") or 0.0)},
    }


def log_stage(cfg: Any, record: dict, decision: dict) -> None:
    """Log :func:`stage_metrics` to the run's back ends (``logger``): ``<run dir>/stages.jsonl``,
    ``<run dir>/tb/stage/``, the run folder's W&B run. Stage ``k``'s row replaces any row of
    stage ``k`` or later from an earlier attempt (``truncate("stage", k - 1)``). ``cfg``: the
    :class:`RunSettings` or a raw config."""
    s = RunSettings.of(cfg)
    k = int(record["stage"])
    with build_writer(s.logger, s.run_dir, jsonl_name="stages.jsonl", phases=("stage",),
                      name=s.experiment, run_config=s.record()) as writer:
        writer.truncate("stage", k - 1)
        writer.append(stage_metrics(record, decision))


def stage_record(d: Path, k: int) -> dict:
    ev = read_json(d / "eval.json")
    eng = read_json(d / "engineer.json")
    cur = (ev.get("current_env") or {}).get("modes") or {}
    return {
        "stage": k,
        "dir": str(d),
        "env": mixture_to_obj(load_mixture(d / "env.yaml")),
        "scores": {m: r.get("score") for m, r in ev.get("modes", {}).items()},
        "current_env": {m: r.get("score") for m, r in cur.items()},
        "decision": eng.get("decision"),
        "reason": eng.get("reason"),
        "next_env": eng.get("proposal"),
    }


def short_env(mixture_obj: list) -> str:
    """A mixture in one line: ``5x5 n=2 holes=0.1 conflict=0.5``, ``0.50*(...) + 0.50*(...)``."""
    keys = ("height", "width", "num_agents", "hole_density", "conflict_density")
    parts = []
    for comp in mixture_obj:
        c = comp["config"]
        body = "{}x{} n={} holes={:g} conflict={:g}".format(*(c[k] for k in keys))
        parts.append(body if len(mixture_obj) == 1 else f"{comp['weight']:.2f}*({body})")
    return " + ".join(parts)


def stage_table(records: list) -> str:
    """Markdown table: stage, environment, suite scores, own-environment success, decision."""
    modes = sorted({m for r in records for m in r["scores"]}, key=lambda m: (m != "greedy", m))
    head = "| stage | environment | " + " | ".join(f"suite {m}" for m in modes) + " | own env (greedy) | engineer |"
    rows = [head, "|---|---|" + "---|" * len(modes) + "---|---|"]
    for r in records:
        scores = " | ".join("–" if r["scores"].get(m) is None else f"{r['scores'][m]:.3f}" for m in modes)
        own = r["current_env"].get("greedy")
        rows.append(
            f"| {r['stage']} | {short_env(r['env'])} | {scores} | {'–' if own is None else f'{own:.3f}'} | "
            f"{r['decision']}: {r['reason']} |"
        )
    return "\n".join(rows)


def run_pipeline(cfg: Any) -> list:
    """Run every stage, skipping complete ones; print and return the per-stage records.
    ``cfg``: the :class:`RunSettings` or a raw config."""
    s = RunSettings.of(cfg)
    engineer = _build(s)
    check_model(s)
    with run_lock(s):
        return _run_pipeline(s, engineer)


def _run_pipeline(s: RunSettings, engineer: Any) -> list:
    check_run_info(s, engineer)
    check_folder(s)
    initial_mixture(s, engineer)
    write_run_info(s, engineer)
    records = []
    for k in range(1, s.stages + 1):
        d = s.stage_dir(k)
        if stage_complete(d):
            _log(f"stage {k}: complete, skipped ({d})")
        else:
            _run_stage(s, k, engineer)
        records.append(stage_record(d, k))
    table = stage_table(records)
    try:
        from jaxlake.pipeline.report import build_report

        build_report(s.run_dir, plots=True)
    except Exception as err:  # noqa: BLE001 - the report is a convenience; the run is done
        _log(f"report not written: {err}")
    print(f"\n{s.run_dir}: engineer={engineer.name} seed={s.seed}\n{table}\n", flush=True)
    return records


def main(cfg: Any) -> Any:
    """What ``python -m jaxlake.run`` does: ``+stage=K`` runs stage K alone, else all stages.

    The Hydra config is resolved once, here, into :class:`RunSettings`, which every step gets.
    ``train.distributed.enabled=true`` (or ``JAXLAKE_DISTRIBUTED=1``) then calls
    ``jax.distributed.initialize``, before anything touches JAX (resolving the settings
    builds Python records only).
    """
    from llm.model.sharding import initialize_distributed

    s = resolve(cfg)
    initialize_distributed(dict(s.distributed))
    if s.stage is None:
        return run_pipeline(s)
    record = run_stage(s, s.stage)
    print(stage_table([record]), flush=True)
    return record


def resolve(cfg: Any) -> RunSettings:
    """:meth:`RunSettings.from_cfg`, every bad value raised as :class:`PipelineError` (the
    layers' own range errors are ``ValueError``)."""
    try:
        return RunSettings.from_cfg(cfg)
    except (ValueError, TypeError) as err:
        if isinstance(err, PipelineError) or user_error(err):
            raise
        raise PipelineError(" ".join(str(err).split())) from err
