"""The staged pipeline: train -> evaluate -> summarize -> engineer, for N stages.

One run lives in one directory, ``<run dir> = runs/<experiment>`` (Hydra's output folder;
a multirun job's is ``runs/<experiment>/multirun/<job>``)::

    run.json                    experiment, engineer, seed, stages, suite, settings (the run
                                resumes only under the same settings: SETTINGS groups)
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
results equal independent runs'; a sweep over engineers trains stage 1 once per seed.

On several JAX processes (``train.distributed.enabled=true``; :mod:`jaxlake.pipeline.cluster`)
process 0 runs everything above and writes every file; the others join it only in the steps
on the global mesh, a stage's training (:func:`step_train`) and its suite evaluation
(:func:`step_eval`), each started by :func:`jaxlake.pipeline.cluster.collective` with the
step's whole input, and write nothing but their checkpoint shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional

from jaxlake.engineers import EngineerContext, build_engineer
from jaxlake.io import read_json, write_json, write_text
from jaxlake.metrics import build_writer
from jaxlake.mixture import Mixture, load_mixture, mixture_to_obj, mixture_to_yaml, same_mixture
from jaxlake.pipeline import cluster
from jaxlake.pipeline.settings import SETTINGS, PipelineError, RunSettings  # noqa: F401 (re-exported)

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
    for key in ("policy_dir", "checkpoint_dir"):
        if t.get(key) and Path(t[key]).exists():
            return Path(t[key])
    raise PipelineError(f"{info} names no existing policy folder; rerun stage {k - 1}: {s.command_for_stage(k - 1)}")


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
    """Point the JSON files of stage folder ``d`` at ``new`` instead of ``old``."""
    if old == new:
        return
    for f in d.glob("*.json"):
        text = f.read_text(encoding="utf-8")
        if old in text:
            write_text(f, text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1]))


def restore_shared_stage1(s: RunSettings, d: Path, mixture: Mixture) -> bool:
    """Fill stage folder ``d`` from the shared stage-1 store when it holds this run's key."""
    share = s.share_stage1
    if share is None or (d / "train.json").is_file():
        return False
    src = share / stage1_key(s, mixture)
    if not (src / "summary.json").is_file():
        return False
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
    write_json(d / _SOURCE_FILE, {"dir": origin, "key": src.name})
    _log(f"stage 1: shared from {origin} (pipeline.share_stage1 key {src.name})")
    return True


def store_shared_stage1(s: RunSettings, d: Path, mixture: Mixture) -> None:
    """Copy a finished stage 1 (engineer files excluded) into the shared store, atomically."""
    share = s.share_stage1
    if share is None:
        return
    dst = share / stage1_key(s, mixture)
    if dst.is_dir():
        return
    share.mkdir(parents=True, exist_ok=True)
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
    res = cluster.collective(train_stage, s.stage_config(k), mixture, d, init_from=init)  # every process
    if res.eval_after is None:  # the trainer stopped before the end of its schedule
        raise PipelineError(
            f"training of stage {k} stopped after {res.warmstart_steps} warm-start and {res.grpo_steps} GRPO "
            f"steps; rerun the same command to resume from {res.checkpoint_dir}"
        )
    out = {
        "checkpoint_dir": str(res.checkpoint_dir),
        "policy_dir": str(res.policy_dir) if res.policy_dir else None,
        "init_from": str(init) if init else None,
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
    from llm.model.distributed import solo
    from llm.training.policy import load_policy

    with solo():  # process 0 alone (the engineer's model): the others wait for its decision, not in its reads
        return load_policy(s.model, path)


def step_eval(s: RunSettings, k: int, d: Path, mixture: Mixture, train: dict) -> dict:
    from llm.training.evaluate import is_suite_eval, write_eval

    path = d / "eval.json"
    if is_suite_eval(path):
        return read_json(path)
    policy_path = Path(train.get("policy_dir") or train["checkpoint_dir"])
    _log(f"stage {k}: evaluating {policy_path} on the held-out suite")
    _require_eval(s)
    result = cluster.collective(cluster.evaluate_suite, s, k, policy_path, mixture)  # every process
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
        path = Path(train.get("policy_dir") or train["checkpoint_dir"]) if which == "policy" else None
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
        checkpoint=Path(train["checkpoint_dir"]),
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
def write_run_info(cfg: Any, engineer: Any) -> None:
    """Write ``run.json``; refuse a run folder made with another engineer, seed or settings.
    ``cfg``: the :class:`RunSettings` or a raw config."""
    s = RunSettings.of(cfg)
    d = s.run_dir
    d.mkdir(parents=True, exist_ok=True)
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
        old = read_json(path)
        for key in ("engineer", "seed"):
            if old.get(key) not in (None, info[key]):
                raise PipelineError(
                    f"{d} belongs to a run with {key}={old[key]}, not {info[key]}; choose another "
                    "experiment=<name> (or delete the folder)"
                )
        changed = _diff(old.get("settings"), info["settings"]) if "settings" in old else []
        if changed:
            shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed[:6])
            more = f" (+{len(changed) - 6} more)" if len(changed) > 6 else ""
            raise PipelineError(
                f"{d} was made with other settings ({shown}{more}); resuming would mix them. Choose "
                "another experiment=<name>, restore the settings, or delete the folder"
            )
    write_json(path, info)


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
    engineer = engineer or build_engineer(s.engineer)
    write_run_info(s, engineer)
    d = s.stage_dir(k)
    was_complete = stage_complete(d)
    mixture = stage_mixture(s, k, engineer)
    previous_policy(s, k)  # fail early, before any work, when stage k-1 is missing
    d.mkdir(parents=True, exist_ok=True)
    env_file = d / "env.yaml"
    if env_file.is_file():
        if not same_mixture(load_mixture(env_file), mixture):
            raise PipelineError(
                f"{env_file} differs from the environment stage {k} should train on now (stage {k - 1}'s "
                f"next_env.yaml or env changed); delete {d} to retrain the stage"
            )
    else:
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
    engineer = build_engineer(s.engineer)
    write_run_info(s, engineer)
    records = []
    for k in range(1, s.stages + 1):
        d = s.stage_dir(k)
        if stage_complete(d):
            _log(f"stage {k}: complete, skipped ({d})")
        else:
            run_stage(s, k, engineer)
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
    builds Python records only), and process 0 leads while the others follow
    (:mod:`jaxlake.pipeline.cluster`).
    """
    s = RunSettings.from_cfg(cfg)

    def run() -> Any:
        if s.stage is None:
            return run_pipeline(s)
        record = run_stage(s, s.stage)
        print(stage_table([record]), flush=True)
        return record

    return cluster.run(s, run)
