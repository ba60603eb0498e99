"""Typed settings of one pipeline run, resolved once from the Hydra config.

:meth:`RunSettings.from_cfg` reads every group the staged pipeline (:mod:`jaxlake.pipeline.
stages`) uses, once, at its entry point (``stages.main``; ``run_stage`` / ``run_pipeline`` /
``write_run_info`` also accept a raw config and resolve it on the spot), into frozen records
that the stages pass down; nothing below reads the raw config. The pieces reuse the typed
records of the layers below: :class:`jaxlake.mixture.Mixture` (stage 1's environment),
:class:`jaxlake.suite.SuiteSpec` (the held-out suite), :class:`jaxlake.metrics.LoggerConfig`
and the trainer's :class:`llm.training.config.StageConfig` (``train``, ``reward``, ``prompt``,
``model``, ``logger`` / ``wandb``). Every value is checked when built; an error names the
field (``stages=0 must be an integer in [1, inf)``, ``pipeline.warmstart='some' not in
['first', 'all']``).

Two views of the raw config are kept as plain data because they are written out as given:
:attr:`RunSettings.settings` (``run.json``'s ``settings``, which a resumed run must match, and
the stage-1 sharing key) and the ``eval`` node that ``eval.json`` records.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path
from typing import Any, Mapping, Optional

from jaxlake.config import cfg_get, to_plain
from jaxlake.metrics import LoggerConfig
from jaxlake.mixture import Mixture, mixture_from_node
from jaxlake.suite import SuiteSpec, decoding_modes

#: Config groups a run's results depend on; a run folder refuses to resume under others.
SETTINGS = ("env", "model", "train", "reward", "prompt", "eval")
#: Keys inside them that only change how a run reports or where it runs, not what it computes
#: (``mesh``: the same results up to float rounding, and checkpoints restore onto any mesh).
_COSMETIC = {"train": ("progress", "plot", "distributed", "mesh")}
#: ``pipeline.warmstart`` values: the supervised warm start in stage 1 only, or in every stage.
WARMSTART_MODES = ("first", "all")
#: ``student=<name>`` (conf/student/<name>.yaml): the language model (the default) or IPPO.
STUDENTS = ("llm", "ippo")
#: What a stage warm-starts on: its own environment, every config of the engineer's space, or
#: the held-out suite's cells.
WARMSTART_ENVS = ("stage", "space", "suite")


class PipelineError(RuntimeError):
    """A stage cannot run (missing inputs, inconsistent run directory, a bad pipeline setting)."""


def user_error(err: BaseException) -> Optional[str]:
    """The one line that ends a run stopped by a user's mistake, or ``None`` when ``err`` is not
    one (a bug, an interrupt: those keep their traceback).

    A user's mistake is a bad setting or run folder (:class:`PipelineError`, the layers'
    :class:`~jaxlake.config.ConfigError`), a locked or unwritable folder
    (:class:`~jaxlake.io.FolderLockError`), a missing, unreadable or unwritable file
    (``OSError``: the line names the file) and a corrupt model folder
    (:class:`llm.model.hf_io.CheckpointError`, naming the file). The line is the message with its
    whitespace folded, so it is one line.
    """
    from jaxlake.config import ConfigError
    from jaxlake.io import FolderLockError
    from llm.model.hf_io import CheckpointError

    if not isinstance(err, (PipelineError, ConfigError, FolderLockError, OSError, CheckpointError)):
        return None
    text = str(err)
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        text = f"{err.filename}: {err.strerror}"
    return " ".join(text.split()) or type(err).__name__


def _int(where: str, value: Any, low: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        bound = "" if low is None else f" in [{low}, inf)"
        raise PipelineError(f"{where}={value!r} must be an integer{bound}")
    return int(value)


#: The held-out suite's decoding modes (``eval.greedy``, ``eval.sampled``).
EVAL_MODES = ("greedy", "sampled")


def _number(where: str, value: Any, low: float, high: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            (low < value if low_open else low <= value) and value <= high):
        bracket = "(" if low_open else "["
        raise PipelineError(f"{where}={value!r} must be a number in {bracket}{low:g}, {high:g}]")
    return float(value)


def _check_decoding(node: Mapping[str, Any]) -> None:
    """The decoding fields of the ``eval`` group that :func:`llm.training.evaluate.
    evaluate_policy` reads after training: checked here, before anything is written."""
    _int("eval.batch_size", node.get("batch_size", 64), 1)
    _int("eval.current_env_lakes", node.get("current_env_lakes") or 0, 0)
    _int("eval.rollout_seed", node.get("rollout_seed", 7))
    if node.get("max_new_tokens") is not None:
        _int("eval.max_new_tokens", node["max_new_tokens"], 1)
    sampled = node.get("sampled") or {}
    if not isinstance(sampled, Mapping):
        raise PipelineError(f"eval.sampled must be a mapping, got {type(sampled).__name__}")
    samples = _int("eval.sampled.num_samples", sampled.get("num_samples", 0) or 0, 0)
    if samples:
        _number("eval.sampled.temperature", sampled.get("temperature", 1.0), 0.0, float("inf"))
        _int("eval.sampled.top_k", sampled.get("top_k", 0), 0)
        _number("eval.sampled.top_p", sampled.get("top_p", 1.0), 0.0, 1.0, low_open=True)
    if not node.get("greedy", True) and not samples:
        raise PipelineError("eval.greedy=false and eval.sampled.num_samples=0: enable at least one decoding mode")


def check_engineer_mode(engineer: Any, node: Mapping[str, Any], eval_name: str) -> None:
    """An engineer that reads one decoding mode's success (``engineer.mode``: PLR, ACCEL, the
    heuristic) needs the suite to score that mode; else it would read nothing after every stage
    (PLR would never score a level, so never replay). One line naming both settings."""
    mode = getattr(engineer, "mode", None)
    scored = [m for m, _ in decoding_modes(node)]
    if mode is None or mode in scored:
        return
    fix = "eval.sampled.num_samples=2" if mode == "sampled" else "eval.greedy=true"
    raise PipelineError(f"engineer.mode={mode} reads the suite's {mode} evaluation, but eval={eval_name} scores "
                        f"only {scored}: set engineer.mode={scored[0]} or {fix}")


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """The ``eval`` group: the held-out suite and what the stages read around it.

    Attributes:
      suite: the suite's definition (``name seed lakes_per_cell base grid``), checked.
      planner: the reference planner on every lake (also for the environment statistics).
      summary_mode / k_failures / env_stats_lakes: ``eval.summary`` (:mod:`jaxlake.summaries`).
      node: the whole group as plain data, as :func:`llm.training.evaluate.evaluate_policy`
        takes it (decoding modes, batch size, current-environment lakes ...).
    """

    suite: SuiteSpec
    planner: bool = True
    summary_mode: str = "greedy"
    k_failures: int = 6
    env_stats_lakes: int = 64
    node: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        name = self.node.get("name")
        return "" if name is None else str(name)

    @classmethod
    def from_node(cls, node: Any) -> "EvalSettings":
        plain = to_plain(node)
        if not isinstance(plain, Mapping):
            raise PipelineError(f"eval must be a mapping (conf/eval/<name>.yaml), got {type(plain).__name__}")
        plain = dict(plain)
        summary = plain.get("summary") or {}
        if not isinstance(summary, Mapping):
            raise PipelineError(f"eval.summary must be a mapping, got {type(summary).__name__}")
        _check_decoding(plain)
        mode = str(summary.get("mode", "greedy"))
        if mode not in EVAL_MODES:
            raise PipelineError(f"eval.summary.mode={mode!r} not in {list(EVAL_MODES)}")
        suite = SuiteSpec.from_conf(plain)
        return cls(
            suite=suite,
            planner=True if plain.get("planner") is None else bool(plain["planner"]),  # null: the default
            summary_mode=mode,
            k_failures=_int("eval.summary.k_failures", summary.get("k_failures", 6), 0),
            env_stats_lakes=_int("eval.summary.env_stats_lakes", summary.get("env_stats_lakes", 64), 1),
            node=plain,
        )


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything the staged pipeline reads from the Hydra config, typed.

    Attributes:
      experiment / runs_dir: the run's name and parent folder.
      run_dir: the run folder (Hydra's output folder; ``runs_dir/experiment`` outside Hydra).
      overrides: the command line's overrides (Hydra's ``overrides.task``; outside Hydra
        ``experiment=<name>``), which :meth:`command_for_stage` repeats.
      stages: number of stages; ``stage``: the one stage to run (``+stage=K``) or ``None``.
      seed: the run seed (training, engineer, environment statistics).
      env: stage 1's environment as configured (``None`` when the config has no ``env``), before
        the engineer's :meth:`~jaxlake.engineers.Engineer.initial_mixture`.
      engineer: the ``engineer`` node as plain data (``_target_`` + parameters, for
        :func:`jaxlake.engineers.build_engineer`), ``None`` when absent.
      eval: the held-out suite settings (``None`` when the config has no ``eval``).
      train: the trainer's settings of stage 1 (:class:`llm.training.config.StageConfig`);
        :meth:`stage_config` derives stage ``k``'s.
      logger: the metric back ends of the per-stage rows (the same as ``train.logger``).
      warmstart: ``pipeline.warmstart`` (``first`` | ``all``).
      warmstart_env: ``pipeline.warmstart_env`` (:data:`WARMSTART_ENVS`): the warm start on
        the stage's environment, on every config of the engineer's space
        (:func:`jaxlake.pipeline.pretrain.space_mixture`), or on the held-out suite's cells
        (:func:`jaxlake.suite.cells_mixture`: fresh lakes of its configs, never its own);
        GRPO always trains on the stage's (its supervised anchor, ``train.grpo.anchor``, takes
        the warm start's).
      start_eval: ``pipeline.start_eval``: before stage 1 trains, evaluate the starting policy
        on the suite once (``start_eval.json`` in the run folder): the stage table's row 0 and
        stage 1's paired change.
      share_stages: ``pipeline.share_stages``, the store of stages shared between runs
        (:mod:`jaxlake.pipeline.share`), or ``None``.
      archive: ``pipeline.archive``, where a finished run's record files are kept
        (:mod:`jaxlake.pipeline.archive`), or ``None``.
      distributed: ``train.distributed`` (for ``jax.distributed.initialize``).
      student: ``student.name`` (:data:`STUDENTS`): ``llm`` (GRPO on the policy, the default) or
        ``ippo`` (:mod:`jaxlake.pipeline.student`).
      ippo: the IPPO student's settings (:class:`jaxlake.students.config.IPPOConfig`, the ``ippo``
        group that ``student=ippo`` brings), ``None`` for the LLM.
      settings: ``run.json``'s ``settings`` (the groups of :data:`SETTINGS` less cosmetic keys,
        plus ``pipeline.warmstart``), plain JSON data.
      hydra_files: under Hydra, the run's ``.hydra/`` record (``config.yaml``, ``hydra.yaml``,
        ``overrides.yaml``: name -> YAML text). ``conf/config.yaml`` turns Hydra's own writing of
        it off (``hydra.output_subdir: null``) so that nothing lands in the run folder before the
        settings are checked and the folder is locked; the pipeline writes it with ``run.json``.
    """

    experiment: str = "default"
    runs_dir: Path = Path("runs")
    run_dir: Path = Path("runs/default")
    overrides: tuple[str, ...] = ("experiment=default",)
    stages: int = 3
    stage: Optional[int] = None
    seed: int = 0
    env: Optional[Mixture] = None
    engineer: Optional[Mapping[str, Any]] = None
    eval: Optional[EvalSettings] = None
    train: Any = None  # llm.training.config.StageConfig (imported lazily: the simulator stays llm-free)
    logger: LoggerConfig = LoggerConfig()
    warmstart: str = "first"
    warmstart_env: str = "stage"
    start_eval: bool = True
    share_stages: Optional[Path] = None
    archive: Optional[Path] = None
    distributed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    student: str = "llm"
    ippo: Any = None  # jaxlake.students.config.IPPOConfig with student=ippo
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    hydra_files: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------ building
    @classmethod
    def of(cls, cfg: Any) -> "RunSettings":
        """``cfg`` itself when it is already a :class:`RunSettings`, else :meth:`from_cfg`."""
        return cfg if isinstance(cfg, cls) else cls.from_cfg(cfg)

    @classmethod
    def from_cfg(cls, cfg: Any) -> "RunSettings":
        """From a Hydra ``DictConfig`` (or a plain mapping of the same groups). The logger is
        checked first, so a bad ``logger`` / ``wandb`` setting fails before anything else."""
        from llm.training.config import StageConfig

        logger = LoggerConfig.from_cfg(cfg)
        experiment = str(cfg_get(cfg, "experiment", "default"))
        runs_dir = Path(str(cfg_get(cfg, "runs_dir", "runs")))
        run_dir, overrides = runs_dir / experiment, (f"experiment={experiment}",)
        hydra_files: dict = {}
        try:
            from hydra.core.hydra_config import HydraConfig

            hydra = HydraConfig.get()
            run_dir, overrides = Path(hydra.runtime.output_dir), tuple(str(o) for o in hydra.overrides.task)
            hydra_files = _hydra_files(cfg, HydraConfig.instance().cfg, hydra)
        except (ValueError, ImportError):
            pass
        stages = _int("stages", cfg_get(cfg, "stages", 3), 1)
        stage = cfg_get(cfg, "stage")
        if stage is not None:
            if isinstance(stage, str) and stage.strip().lstrip("+-").isdigit():
                stage = int(stage)
            stage = _int("stage", stage)
        pipeline = cfg_get(cfg, "pipeline", {})
        warmstart = str(cfg_get(pipeline, "warmstart", "first"))
        if warmstart not in WARMSTART_MODES:
            raise PipelineError(f"pipeline.warmstart={warmstart!r} not in {list(WARMSTART_MODES)}")
        warmstart_env = str(cfg_get(pipeline, "warmstart_env", "stage"))
        if warmstart_env not in WARMSTART_ENVS:
            raise PipelineError(f"pipeline.warmstart_env={warmstart_env!r} not in {list(WARMSTART_ENVS)}")
        start_eval = cfg_get(pipeline, "start_eval", True)
        if not isinstance(start_eval, bool):
            raise PipelineError(f"pipeline.start_eval={start_eval!r} must be true or false")
        share = cfg_get(pipeline, "share_stages")
        archive = cfg_get(pipeline, "archive")
        env = cfg_get(cfg, "env")
        env = None if env is None else _env_mixture(env)
        engineer = to_plain(cfg_get(cfg, "engineer"))
        eval_node = cfg_get(cfg, "eval")
        if warmstart_env == "suite" and eval_node is None:
            raise PipelineError("pipeline.warmstart_env=suite needs a held-out suite (eval=...) to take its cells from")
        distributed = dict(to_plain(cfg_get(cfg_get(cfg, "train"), "distributed")) or {})
        student, ippo = _student(cfg, warmstart, warmstart_env, share, distributed)
        return cls(
            experiment=experiment,
            runs_dir=runs_dir,
            run_dir=run_dir,
            overrides=overrides,
            stages=stages,
            stage=stage,
            seed=_int("seed", cfg_get(cfg, "seed", 0)),
            env=env,
            engineer=None if engineer is None else dict(engineer),
            eval=None if eval_node is None else EvalSettings.from_node(eval_node),
            train=StageConfig.from_cfg(cfg),
            logger=logger,
            warmstart=warmstart,
            warmstart_env=warmstart_env,
            start_eval=start_eval,
            share_stages=Path(str(share)) if share not in (None, "", False) else None,
            archive=Path(str(archive)) if archive not in (None, "", False) else None,
            distributed=distributed,
            student=student,
            ippo=ippo,
            settings=_run_settings(cfg, warmstart, warmstart_env, ippo),
            hydra_files=hydra_files,
        )

    # ------------------------------------------------------------------ derived views
    @property
    def prompt(self) -> Any:
        """The policy's prompt settings (:class:`llm.game.prompts.PromptConfig`)."""
        return self.train.train.prompt

    @property
    def model(self) -> Any:
        """Where the policy comes from (:class:`llm.training.config.ModelConfig`)."""
        return self.train.model

    def record(self) -> dict:
        """A fresh copy of :attr:`settings` (``run.json``'s ``settings``)."""
        return json.loads(json.dumps(self.settings))

    def stage_dir(self, k: int) -> Path:
        return self.run_dir / f"stage_{k}"

    def command_for_stage(self, k: int) -> str:
        """The command line that runs stage ``k`` of this run (the current overrides kept)."""
        kept = [o for o in self.overrides if not re.match(r"^\+{0,2}stage=", o)]
        return "python -m jaxlake.run " + " ".join(shlex.quote(o) for o in [f"+stage={k}"] + kept)

    def stage_config(self, k: int) -> Any:
        """The trainer's settings of stage ``k``: the training seed ``train.seed + 7919 * seed +
        (k - 1)``, and no warm start after stage 1 unless ``pipeline.warmstart=all``."""
        cfg = self.train
        record = dict(cfg.record)
        seed = int(record.get("seed", 0)) + 7919 * self.seed + (k - 1)
        record["seed"] = seed
        warmstart = cfg.train.warmstart
        if k > 1 and self.warmstart == "first":
            record["warmstart"] = {**dict(record.get("warmstart") or {}), "enabled": False}
            warmstart = dataclasses.replace(warmstart, enabled=False)
        train = dataclasses.replace(cfg.train, seed=seed, warmstart=warmstart)
        return dataclasses.replace(cfg, train=train, record=record)


def _env_mixture(node: Any) -> Mixture:
    """Stage 1's environment from the ``env`` group; an error names the field as ``env.<field>``."""
    from jaxlake.config import ConfigError

    try:
        return mixture_from_node(node)
    except (ConfigError, TypeError) as err:
        msg = str(err)
        named = re.match(r"[A-Za-z_]\w*(\[\d+\])?[.=]", msg)
        raise PipelineError(f"env.{msg}" if named else f"env: {msg}") from None


def _hydra_files(cfg: Any, hydra_cfg: Any, hydra: Any) -> dict:
    """The ``.hydra/`` record Hydra writes itself unless ``hydra.output_subdir`` is null (then
    the pipeline writes it; with a folder set, Hydra does and this is empty)."""
    if hydra.output_subdir is not None:
        return {}
    try:
        from omegaconf import OmegaConf

        return {"config.yaml": OmegaConf.to_yaml(cfg), "hydra.yaml": OmegaConf.to_yaml(hydra_cfg),
                "overrides.yaml": OmegaConf.to_yaml(hydra.overrides.task)}
    except Exception:  # noqa: BLE001 - a record for the user; the run does not depend on it
        return {}


def _student(cfg: Any, warmstart: str, warmstart_env: str, share: Any, distributed: Mapping[str, Any]) -> tuple:
    """``(student.name, IPPOConfig or None)``; a setting the IPPO student cannot honour fails
    here with one line naming it."""
    node = cfg_get(cfg, "student")
    name = "llm" if node is None else cfg_get(node, "name", "llm")
    if name not in STUDENTS:
        raise PipelineError(f"student.name={name!r} not in {list(STUDENTS)} (select one with student=<name>)")
    if name == "llm":
        return name, None
    from jaxlake.students.config import IPPOConfig

    ippo = IPPOConfig.from_node(cfg_get(cfg, "ippo", {}))
    if ippo.radius is None:
        raise PipelineError("ippo.radius=null: student=ippo needs an egocentric crop (the stages' lakes and the "
                            "suite's differ in size); set ippo.radius=<int>")
    samples = ippo.num_envs * ippo.num_steps
    if samples % ippo.num_minibatches:  # then it divides samples * actors for any agent count an engineer picks
        raise PipelineError(f"ippo.num_minibatches={ippo.num_minibatches} must divide ippo.num_envs * ippo.num_steps "
                            f"= {samples} with student=ippo (the engineers change the agent count)")
    if warmstart != "first":
        raise PipelineError(f"pipeline.warmstart={warmstart!r}: the supervised warm start is the LLM's; "
                            "student=ippo has none (leave it at first)")
    if warmstart_env != "stage":
        raise PipelineError(f"pipeline.warmstart_env={warmstart_env!r}: the supervised warm start is the LLM's; "
                            "student=ippo has none (leave it at stage)")
    if share not in (None, "", False):
        raise PipelineError("pipeline.share_stages is for LLM stages; student=ippo trains its own (set it to null)")
    if distributed.get("enabled"):
        raise PipelineError("train.distributed.enabled=true: student=ippo runs in one process")
    return name, ippo


def _run_settings(cfg: Any, warmstart: str, warmstart_env: str = "stage", ippo: Any = None) -> dict:
    """The settings that fix a run's results (``SETTINGS`` groups and the warm-start policy)."""
    out = {}
    for group in SETTINGS:
        node = to_plain(cfg_get(cfg, group, {}))
        if isinstance(node, dict):
            node = {k: v for k, v in node.items() if k not in _COSMETIC.get(group, ())}
        out[group] = node
    out["pipeline.warmstart"] = warmstart
    model = out.get("model") if isinstance(out.get("model"), dict) else {}
    name = str(model.pop("shipped", "novice"))  # said by the key below (or moot with model.path / fresh weights)
    if model.get("pretrained", True) and not model.get("path"):  # starts from a shipped policy: which one
        from llm.game.default import shipped_fingerprint

        # model.<name>: that policy's fingerprint (model.planner, as runs of the expert always recorded it)
        out[f"model.{name}"] = shipped_fingerprint(name)
    if warmstart_env != "stage":  # (absent in the default: folders of earlier versions stay comparable)
        out["pipeline.warmstart_env"] = warmstart_env
    if ippo is not None:  # (absent for the LLM, the default, likewise)
        out["student"] = {"name": "ippo", "ippo": ippo.to_dict()}
    return json.loads(json.dumps(out, default=str))


def resolve(cfg: Any) -> RunSettings:
    """:meth:`RunSettings.from_cfg`, every bad value raised as :class:`PipelineError` (the
    layers' own range errors are ``ValueError``): what each command (``jaxlake.run``,
    ``jaxlake.pretrain``) calls first."""
    try:
        return RunSettings.from_cfg(cfg)
    except (ValueError, TypeError) as err:
        if isinstance(err, PipelineError) or user_error(err):
            raise
        raise PipelineError(" ".join(str(err).split())) from err
