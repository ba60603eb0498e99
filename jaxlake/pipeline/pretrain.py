"""Pretraining the embedded tiny planner: ``python -m jaxlake.pretrain``.

A run without ``model.path`` starts from the tiny Qwen3 of ``conf/model/tiny.yaml``. Fresh,
its weights cannot play; pretraining teaches them the game over the whole configuration space
the engineers choose from, as a pretrained Qwen3 arrives knowing language:

* the **data** is the supervised warm start of :mod:`llm.training.warmstart` (the reference
  planner's plans; prompt tokens take no loss) on :meth:`ConfigSpace.mixture
  <jaxlake.engineers.space.ConfigSpace.mixture>`: every valid config of the engineer's
  ``space`` around the run's ``env`` (every size, agent count and density of it: 3750
  configs for the default), equal weights, fresh lakes every step, each batch split over the
  configs at random (``split="random"`` of :func:`jaxlake.generator.generate_mixture`);
* the **trainer** is :func:`llm.training.stage.train_stage` with GRPO off: the settings are
  the run's (``train.warmstart.*``: steps, batch, schedule), composed from ``conf/pretrain.yaml``;
* the **curve**: every kept warm-start checkpoint is scored on the held-out suite
  (``eval``, greedy decoding) against the training time that made it.

Output, ``runs/<experiment>/`` (``experiment=pretrain`` by default; rerunning the same command
resumes from the last checkpoint, and a finished folder is only re-read)::

    run.lock        held while a process works here
    space.yaml      the mixture trained on
    stage/          the trainer's folder: warmstart/ (orbax), metrics.jsonl, policy/ (a Hugging Face folder)
    curve.json      [{step, train_minutes, success, ...}] greedy suite success of each checkpoint
    pretrain.json   the record: command, settings, mixture size, curve, final suite score

``pretrain.ship=true`` then copies ``stage/policy`` and ``pretrain.json`` into the package
(the folder of :data:`llm.game.default.SHIPPED_DIRS` that ``model.shipped`` names: ``novice``,
the default, or ``planner``, the expert), atomically: the starting point of every later run
without ``model.path`` that names it (``model.pretrained=false`` trains from scratch instead).

``model.pretrained=true`` continues the shipped planner instead of starting fresh (its own
schedule from its own weights); the record then holds the shipped one's as ``started_from``,
and ``total_steps`` / ``total_train_minutes`` count both.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional

from jaxlake.config import cfg_get, reject_unknown, to_plain
from jaxlake.io import read_json, write_json, write_text
from jaxlake.mixture import Mixture, mixture_to_yaml
from jaxlake.pipeline.engineer_role import EngineerRole, shown_share, side_rows
from jaxlake.pipeline.folder import check_model, log, run_lock
from jaxlake.pipeline.settings import PipelineError, RunSettings, resolve

#: The record's format name.
PRETRAIN_FORMAT = "jaxlake.pretrain/1"
#: Overrides that say where a run writes and what it prints, not what it computes: left out of
#: the command a record gives.
PLACE_ONLY = ("runs_dir=", "experiment=", "train.progress=", "train.plot=")


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """The ``pretrain`` node of ``conf/pretrain.yaml``.

    Attributes:
      curve: score every kept checkpoint on the suite (else only the last).
      ship: copy the result into the package, as the shipped policy ``model.shipped`` names
        (:data:`llm.game.default.SHIPPED_DIRS`).
      ship_to: another folder to ship to (tests; ``None``: the package's).
      engineer: the engineer's role taught beside the plans
        (:class:`jaxlake.pipeline.engineer_role.EngineerRole`; ``rows: 0``, the default: plans only).
    """

    curve: bool = True
    ship: bool = False
    ship_to: Optional[Path] = None
    engineer: EngineerRole = EngineerRole()

    @classmethod
    def from_node(cls, node: Optional[Mapping[str, Any]]) -> "PretrainSettings":
        node = dict(to_plain(node) or {})
        reject_unknown("pretrain", node, [f.name for f in dataclasses.fields(cls)], PipelineError)
        for key in ("curve", "ship"):
            if key in node and not isinstance(node[key], bool):
                raise PipelineError(f"pretrain.{key}={node[key]!r} must be true or false")
        if node.get("ship_to") is not None:
            node["ship_to"] = Path(str(node["ship_to"]))
        node["engineer"] = EngineerRole.from_node(node.get("engineer"))
        return cls(**node)


def space_mixture(s: RunSettings) -> Mixture:
    """Every valid config of the engineer's ``space`` around the run's environment, equal
    weights (:meth:`jaxlake.engineers.space.ConfigSpace.mixture`)."""
    from jaxlake.engineers.space import space_from_conf

    if s.env is None:
        raise PipelineError("pretraining needs an environment (env=...): the space is built around it")
    space = space_from_conf(s.env.main, (s.engineer or {}).get("space"))
    return space.mixture()


def _greedy_only(node: Mapping[str, Any]) -> dict:
    """The suite's eval settings, greedy decoding only (no sampled mode, no current-env lakes,
    no planner: the curve needs the score)."""
    node = dict(to_plain(node))
    node.update(greedy=True, sampled={**dict(node.get("sampled") or {}), "num_samples": 0}, current_env_lakes=0,
                planner=False)
    return node


def _train_minutes(metrics_path: Path) -> dict[int, float]:
    """``{step: wall minutes of training up to that step}`` from the warm start's metric rows."""
    from jaxlake.metrics import read_rows

    total, out = 0.0, {}
    for row in read_rows(metrics_path) if metrics_path.is_file() else []:
        if row.get("phase") == "warmstart" and "time/step_s" in row:
            total += float(row["time/step_s"])
            out[int(row["step"])] = total / 60.0
    return out


def score_curve(s: RunSettings, stage_dir: Path, every: bool = True) -> list[dict]:
    """Greedy suite success of the warm start's checkpoints (all kept ones, or the last),
    with the training minutes that made each; cached in ``curve.json`` beside the stage."""
    from llm.model.checkpoint import all_steps, restore_checkpoint
    from llm.training.evaluate import evaluate_policy
    from llm.training.policy import Policy, model_tokenizer

    if s.eval is None:
        raise PipelineError("pretraining needs a held-out suite (eval=...) to score its checkpoints")
    path = stage_dir.parent / "curve.json"
    done = {int(r["step"]): r for r in (read_json(path) if path.is_file() else [])}
    ckpt = stage_dir / "warmstart"
    steps = all_steps(ckpt)
    steps = steps if every else steps[-1:]
    minutes = _train_minutes(stage_dir / "metrics.jsonl")
    node = _greedy_only(s.eval.node)
    tokenizer = model_tokenizer(s.model)
    for step in steps:
        if step in done:
            continue
        restored = restore_checkpoint(ckpt, step=step)
        policy = Policy.from_model(restored.model, tokenizer)
        result = evaluate_policy(policy, node, s.prompt, checkpoint=f"stage/warmstart/{step}")
        greedy = result["modes"]["greedy"]
        done[step] = {"step": step, "train_minutes": round(minutes.get(step, float("nan")), 3),
                      "success": greedy["score"], "malformed_rate": greedy.get("malformed_rate"),
                      "fall_rate": greedy.get("fall_rate"), "n": greedy.get("n")}
        log(f"pretrain: step {step}: suite success {done[step]['success']:.3f} "
            f"({done[step]['train_minutes']:.1f} training minutes)")
        write_json(path, [done[k] for k in sorted(done)])
    return [done[k] for k in sorted(done)]


def ship(source: Path, record: Mapping[str, Any], target: Optional[Path] = None) -> Path:
    """Copy the Hugging Face folder ``source`` and ``record`` (as ``pretrain.json``) to
    ``target`` (default :data:`llm.game.default.DEFAULT_SHIPPED`'s folder): written in full beside
    it, then renamed into place, so a reader sees the old policy or the new one."""
    from llm.game.default import DEFAULT_SHIPPED, SHIPPED_DIRS

    target = Path(target or SHIPPED_DIRS[DEFAULT_SHIPPED])
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.ship-"))
    try:
        folder = staging / target.name
        shutil.copytree(source, folder)
        write_json(folder / "pretrain.json", dict(record))
        old = staging / "old"
        if target.exists():
            os.rename(target, old)
        os.rename(folder, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def started_from(s: RunSettings) -> Optional[dict]:
    """The shipped planner's record when this run continues it (``model.pretrained=true`` and
    no ``model.path``: the run starts from the package's planner), else None. Read when the
    record is written, before any shipping replaces it."""
    from llm.game.default import SHIPPED_DIRS, shipped_dir

    if s.model.path is not None or not s.model.pretrained or shipped_dir(s.model.shipped) is None:
        return None
    path = SHIPPED_DIRS[s.model.shipped] / "pretrain.json"
    return read_json(path) if path.is_file() else None


def pretrain(s: RunSettings, p: PretrainSettings) -> dict:
    """Pretrain (or resume, or re-read) in ``s.run_dir``; returns the record."""
    check_model(s)
    if s.train.train.grpo.enabled and s.train.train.grpo.steps > 0:
        raise PipelineError("pretraining is the supervised warm start alone: set train.grpo.enabled=false")
    if not (s.train.train.warmstart.enabled and s.train.train.warmstart.steps > 0):
        raise PipelineError("pretraining needs train.warmstart.enabled=true and train.warmstart.steps >= 1")
    with run_lock(s):
        return _pretrain(s, p)


def _pretrain(s: RunSettings, p: PretrainSettings) -> dict:
    from llm.training.stage import train_stage

    mixture = space_mixture(s)
    s.run_dir.mkdir(parents=True, exist_ok=True)
    write_text(s.run_dir / "space.yaml", mixture_to_yaml(mixture))
    d = s.run_dir / "stage"
    log(f"pretrain: the supervised warm start on {len(mixture)} configs of the engineer's space, "
        f"{s.train.train.warmstart.steps} steps of {s.train.train.warmstart.batch_size} lakes")
    side = side_rows(s, p.engineer, s.run_dir)
    res = train_stage(s.stage_config(1), mixture, d, side_rows=side)
    if res.policy_dir is None:
        raise PipelineError(f"pretraining stopped after {res.warmstart_steps} steps without a policy folder "
                            "(train.export_hf=false?)")
    curve = score_curve(s, d, every=p.curve)
    record = {
        "format": PRETRAIN_FORMAT,
        "command": " ".join(["python -m jaxlake.pretrain"] + [o for o in s.overrides if not o.startswith(PLACE_ONLY)]),
        "overrides": [o for o in s.overrides if not o.startswith(PLACE_ONLY)],
        "settings": s.record(),
        "space": to_plain((s.engineer or {}).get("space")),
        "space_configs": len(mixture),
        "steps": res.warmstart_steps,
        "train_minutes": curve[-1]["train_minutes"] if curve else None,
        "suite": s.eval.node.get("name") if s.eval else None,
        "success": curve[-1]["success"] if curve else None,
        "curve": curve,
    }
    if side is not None:
        import json

        record["engineer"] = dataclasses.asdict(p.engineer)
        examples = [json.loads(line) for line in (s.run_dir / "engineer_examples.jsonl").read_text().splitlines()
                    if line.strip()]
        record["engineer"]["shown_share"] = round(shown_share(examples), 4)
    parent = started_from(s)
    if parent is not None:  # a continuation of the shipped planner: its record, and the totals
        record["started_from"] = parent
        record["total_steps"] = res.warmstart_steps + int(parent.get("total_steps", parent["steps"]))
        before = parent.get("total_train_minutes", parent.get("train_minutes"))
        if before is not None and record["train_minutes"] is not None:
            record["total_train_minutes"] = round(float(before) + float(record["train_minutes"]), 3)
    write_json(s.run_dir / "pretrain.json", record)
    if p.ship:
        from llm.game.default import SHIPPED_DIRS

        target = ship(Path(res.policy_dir), record, p.ship_to or SHIPPED_DIRS[s.model.shipped])
        log(f"pretrain: shipped to {target}")
    print(f"\n{s.run_dir}: {res.warmstart_steps} steps, suite success (greedy) "
          f"{record['success']}", flush=True)
    return record


def main(cfg: Any) -> dict:
    """What ``python -m jaxlake.pretrain`` does (Hydra config ``conf/pretrain.yaml``)."""
    s = resolve(cfg)
    p = PretrainSettings.from_node(cfg_get(cfg, "pretrain"))
    return pretrain(s, p)
