"""The staged pipeline: train -> evaluate -> summarize -> engineer, for N stages.

One run lives in one directory, ``<run dir> = runs/<experiment>`` (Hydra's output folder;
a multirun job's is ``runs/<experiment>/multirun/<job>``)::

    run.lock                    held while a process works in the folder (run_lock)
    run.json                    experiment, engineer, seed, stages, suite, settings (the run
                                resumes only under the same settings: SETTINGS groups)
    start_eval.json             the starting policy on the held-out suite, before stage 1
                                (``pipeline.start_eval``; :func:`step_start_eval`)
    .hydra/                     the command's config, Hydra config and overrides (under Hydra)
    report.md, *.png            per-stage table and plots (jaxlake.pipeline.report), rewritten at the end
    stages.jsonl                one metrics row per finished stage (phase "stage", step k): suite
                                scores, own-environment scores, the engineer's decision
                                (:func:`jaxlake.pipeline.records.log_stage`; with ``logger`` also ``tb/stage/``, ``wandb/``)
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

``student`` (``conf/student/<name>.yaml``) names what the stages train, through the protocol of
:mod:`jaxlake.pipeline.student`: the LLM (``llm``, the default: the files above) or IPPO
(``ippo``: a stage's ``checkpoint.npz``, ``metrics.jsonl`` and ``policy.npz`` instead of the
orbax folders; :mod:`jaxlake.students.stage`). Everything else, the suite, the summaries, the
engineers and the table, is the same for both.

``pipeline.share_stages`` (a folder, or null) shares stages between runs of a sweep
(:mod:`jaxlake.pipeline.share`: stage 1 per seed, a later stage when the engineers chose the same
environments); ``pipeline.archive`` (a folder, or null) keeps a finished run's record files
(:mod:`jaxlake.pipeline.archive`). The run folder's lock and the checks made before any write
live in :mod:`jaxlake.pipeline.folder`; a finished stage's records and tables in
:mod:`jaxlake.pipeline.records`.

On several JAX processes (``train.distributed.enabled=true``; :mod:`jaxlake.pipeline.cluster`)
process 0 runs everything above and writes every file; the others join it only in the steps
on the global mesh, a stage's training (:func:`step_train`) and its suite evaluation
(:func:`step_eval`), each started by :func:`jaxlake.pipeline.cluster.collective` with the
step's whole input, and write nothing but their checkpoint shards.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any, Optional

from jaxlake.engineers import EngineerContext, build_engineer
from jaxlake.io import read_json, write_json, write_text
from jaxlake.mixture import Mixture, load_mixture, mixture_to_yaml, same_mixture
from jaxlake.pipeline import cluster
from jaxlake.pipeline.folder import (
    check_folder,
    check_model,
    check_run_info,
    log,
    relative,
    require_eval,
    run_lock,
    stage_path,
    write_run_info,
)
from jaxlake.pipeline.records import START_EVAL, log_stage, run_gain_line, stage_record, stage_table
from jaxlake.pipeline.settings import (SETTINGS, PipelineError, RunSettings, check_engineer_mode,  # noqa: F401 (re-exported)
                                       resolve, user_error)
from jaxlake.pipeline.archive import archive_run
from jaxlake.pipeline.share import restore_shared_stage, store_shared_stage
from jaxlake.pipeline.student import build_student, policy_of

#: Files that make a stage complete (the checkpoint is named by train.json).
STAGE_FILES = ("env.yaml", "train.json", "eval.json", "summary.json", "engineer.json", "next_env.yaml")


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
    prev = s.stage_dir(k - 1)
    found = policy_of(build_student(s), s, prev, read_json(info))
    if found is not None:
        return found
    raise PipelineError(
        f"{info} names no existing policy folder (its policy/ and checkpoint/ are gone); train stage {k - 1} "
        f"again: rm -r {shlex.quote(str(prev))} && {s.command_for_stage(k - 1)}"
    )




# ============================================================================ steps
def step_train(s: RunSettings, k: int, d: Path, mixture: Mixture) -> dict:
    """Train stage ``k`` (resuming from its checkpoint) unless ``train.json`` says it is done."""
    info = d / "train.json"
    if info.is_file():
        return read_json(info)
    out = build_student(s).train(s, k, d, mixture, previous_policy(s, k))
    write_json(info, out)
    return out


def start_name(s: RunSettings) -> str:
    """What stage 1 starts from, in words: for the LLM ``model.path``, the shipped planner, or
    fresh weights (``model.pretrained=false``, or an architecture of one's own); for IPPO its
    initial parameters."""
    return build_student(s).start_name(s)


def step_start_eval(s: RunSettings, mixture: Mixture) -> Optional[dict]:
    """The starting policy (``model.path``, or the shipped planner) on the held-out suite,
    once per run folder (``start_eval.json``, reused when complete), before stage 1 trains:
    the stage table's row 0 and the baseline of stage 1's paired change. ``mixture``: stage
    1's environment; the record's own-environment check takes the lakes of stage 1's, so the
    two rows compare on the same lakes. ``None`` when ``pipeline.start_eval`` is off."""
    from llm.training.evaluate import is_suite_eval, write_eval

    if not s.start_eval:
        return None
    path = s.run_dir / START_EVAL
    if is_suite_eval(path):
        return read_json(path)
    log("start: evaluating the starting policy on the held-out suite")
    require_eval(s)
    # drawn as stage 1's record draws them, so row 0's own-environment check is on stage 1's lakes
    result = build_student(s).evaluate(s, 1, None, mixture, start_name(s))
    result["stage"] = 0
    write_eval(path, result)
    return result


def step_eval(s: RunSettings, k: int, d: Path, mixture: Mixture, train: dict) -> dict:
    from llm.training.evaluate import is_suite_eval, write_eval

    path = d / "eval.json"
    if is_suite_eval(path):
        return read_json(path)
    student = build_student(s)
    policy_path = stage_path(s, d, next(train[key] for key in student.policy_keys if train.get(key)))
    log(f"stage {k}: evaluating {policy_path} on the held-out suite")
    require_eval(s)
    result = student.evaluate(s, k, policy_path, mixture, relative(policy_path, d))
    write_eval(path, result)
    return result


def history(s: RunSettings, k: int) -> list:
    """History entries of stages 1..k (stage k without its engineer decision yet)."""
    from jaxlake.summaries import history_entry

    student = build_student(s)
    out = []
    for j in range(1, k + 1):
        dj = s.stage_dir(j)
        if not (dj / "env.yaml").is_file():
            continue
        ev = read_json(dj / "eval.json") if (dj / "eval.json").is_file() else None
        if ev is not None:
            ev = {"modes": ev.get("modes", {}), "current_env": {"modes": (ev.get("current_env") or {}).get("modes", {})}}
        train = read_json(dj / "train.json") if (dj / "train.json").is_file() else {}
        t = student.history(train)
        eng = read_json(dj / "engineer.json") if j < k and (dj / "engineer.json").is_file() else None
        out.append(history_entry(j, load_mixture(dj / "env.yaml"), ev, t, eng))
    return out


def step_summary(s: RunSettings, k: int, d: Path, mixture: Mixture, ev: dict) -> dict:
    path = d / "summary.json"
    if path.is_file():
        return read_json(path)
    import jax

    from jaxlake.summaries import environment_stats, render_summary, summarize

    e = require_eval(s)
    log(f"stage {k}: summarizing")
    stats = environment_stats(mixture, e.env_stats_lakes, jax.random.PRNGKey(1_000 * s.seed + k), solve=e.planner)
    summary = summarize(ev, stats, history(s, k), e.k_failures, e.summary_mode)
    write_text(d / "summary.txt", render_summary(summary) + "\n")
    write_json(path, summary)
    return summary


def engineer_context(cfg: Any, k: int, d: Path, mixture: Mixture, ev: dict, summary: dict, train: dict,
                     engineer: Any) -> EngineerContext:
    """What the engineer of stage ``k`` gets: the stage's environment, evaluation, summary and
    history, the previous decision's state, a loader for the trained (``"policy"``) or
    stage-0 (``"base"``) model, ``probe`` (:mod:`jaxlake.pipeline.probe`) for the oracle and
    ``rollouts`` (the stage's policy played on fresh lakes, no training) for ``sfl`` and the oracle. Notebook 03 calls it to replay a decision. ``cfg``: the
    :class:`RunSettings` or a raw config (the context's ``run_cfg`` is the settings)."""
    s = RunSettings.of(cfg)
    prev_state = {}
    if k > 1 and (s.stage_dir(k - 1) / "engineer.json").is_file():
        prev_state = read_json(s.stage_dir(k - 1) / "engineer.json").get("state") or {}

    student = build_student(s)

    def load_model(which: str):
        return student.engineer_model(s, d, train, which)

    def probe(mixture: Any, name: str, **settings: Any) -> dict:
        from jaxlake.pipeline.probe import make_probe

        return make_probe(s, k, d, policy_of(student, s, d, train))(mixture, name, **settings)

    def rollouts(mixture: Any, lakes: int = 8, samples: int = 4) -> list:
        from jaxlake.pipeline.probe import run_rollouts

        return run_rollouts(s, k, policy_of(student, s, d, train), mixture, lakes, samples)

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
        checkpoint=stage_path(s, d, train.get("checkpoint_dir") or train["checkpoint"]),
        base_checkpoint=None,
        run_cfg=s,
        load_model=load_model,
        probe=probe,
        rollouts=rollouts,
        final=k >= s.stages,
    )


def step_engineer(s: RunSettings, k: int, d: Path, mixture: Mixture, ev: dict, summary: dict, train: dict,
                  engineer: Any) -> dict:
    done = d / "engineer.json"
    nxt = d / "next_env.yaml"
    if done.is_file() and nxt.is_file():
        return read_json(done)
    ctx = engineer_context(s, k, d, mixture, ev, summary, train, engineer)
    log(f"stage {k}: engineer {engineer.name} proposes stage {k + 1}'s environment")
    t0 = time.perf_counter()
    proposal = engineer.propose(ctx)
    record = proposal.to_json(engineer.name, k)
    record["wall_s"] = round(time.perf_counter() - t0, 2)
    record["changed"] = not same_mixture(proposal.mixture, mixture)
    write_json(done, record)
    write_text(nxt, mixture_to_yaml(proposal.mixture))
    return record


# ============================================================================ entry points


def _build(s: RunSettings) -> Any:
    """The run's engineer; a bad ``engineer`` setting raises :class:`PipelineError` naming it, and
    so does a decoding mode it reads that the suite does not score (:func:`check_engineer_mode`)."""
    from jaxlake.config import ConfigError

    try:
        engineer = build_engineer(s.engineer)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - hydra's InstantiationException wraps the engineer's own error
        cause = err.__cause__ or err
        raise PipelineError(f"engineer ({(s.engineer or {}).get('_target_', '?')}): {cause}") from err
    ev = require_eval(s)
    check_engineer_mode(engineer, ev.node, ev.name)
    return engineer




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
    restore_shared_stage(s, k, d, mixture)
    if k == 1 and not (d / "train.json").is_file():
        step_start_eval(s, mixture)
    train = step_train(s, k, d, mixture)
    ev = step_eval(s, k, d, mixture, train)
    summary = step_summary(s, k, d, mixture, ev)
    store_shared_stage(s, k, d, mixture)
    decision = step_engineer(s, k, d, mixture, ev, summary, train, engineer)
    record = stage_record(d, k)
    if not was_complete:
        log_stage(s, record, decision)
    return record




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
            log(f"stage {k}: complete, skipped ({d})")
        else:
            _run_stage(s, k, engineer)
        records.append(stage_record(d, k))
    if s.archive is not None and archive_run(s.run_dir, s.archive) is not None:
        log(f"archived the run's records in {s.archive / s.run_dir.name} (pipeline.archive)")
    table = stage_table(records)
    gain = run_gain_line(records)
    if gain:
        table += f"\n\n{gain}"
    try:
        from jaxlake.pipeline.report import build_report

        build_report(s.run_dir, plots=True)
    except Exception as err:  # noqa: BLE001 - the report is a convenience; the run is done
        log(f"report not written: {err}")
    print(f"\n{s.run_dir}: engineer={engineer.name} seed={s.seed}\n{table}\n", flush=True)
    return records


def main(cfg: Any) -> Any:
    """What ``python -m jaxlake.run`` does: ``+stage=K`` runs stage K alone, else all stages.

    The Hydra config is resolved once, here, into :class:`RunSettings`, which every step gets.
    ``train.distributed.enabled=true`` (or ``JAXLAKE_DISTRIBUTED=1``) then calls
    ``jax.distributed.initialize``, before anything touches JAX (resolving the settings
    builds Python records only), and process 0 leads while the others follow
    (:mod:`jaxlake.pipeline.cluster`).
    """
    s = resolve(cfg)

    def run() -> Any:
        if s.stage is None:
            return run_pipeline(s)
        record = run_stage(s, s.stage)
        print(stage_table([record]), flush=True)
        return record

    return cluster.run(s, run)
