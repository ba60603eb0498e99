"""One training stage of the Flax Qwen3 policy on MAPF-FrozenLake, resumable.

:func:`train_stage` runs the supervised warm start (:mod:`llm.training.warmstart`), then GRPO
(:mod:`llm.training.grpo_loop`), evaluates the policy on held-out lakes of the stage's environment
before and after GRPO (:mod:`llm.training.heldout`), exports it and plots the learning curves.
Restarting the same call resumes each phase from its latest checkpoint and truncates
``metrics.jsonl`` to it, so no metrics row is lost or repeated.

Stage layout::

    <stage_dir>/warmstart/      orbax checkpoints of the supervised warm start
    <stage_dir>/checkpoint/     orbax checkpoints of GRPO (the stage's policy)
    <stage_dir>/policy/         the final policy as a Hugging Face folder (export_hf)
    <stage_dir>/metrics.jsonl   one row per step (phase "warmstart" / "grpo" / "eval")
    <stage_dir>/train_eval.json held-out success before GRPO (after the warm start) and after
                                (``eval.json`` is left to the suite evaluation, llm/training/evaluate.py)
    <stage_dir>/curves.png      learning curves

The pieces: typed settings (:mod:`llm.training.config`), optimizer (:mod:`llm.rl.optim`), policy
(:mod:`llm.training.policy`), forward and updates (:mod:`llm.rl.updates`), lakes (:mod:`llm.game.lakes`),
prompts (:mod:`llm.game.prompter`), sampling (:mod:`llm.training.completions`), checkpoints of a phase
(:mod:`llm.training.phase`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
from flax import nnx

from jaxlake.io import write_json
from jaxlake.mixture import Mixture
from jaxlake.metrics import JsonlWriter, MetricsWriter, build_writer
from llm.game import rewards
from llm.model import sharding as shd
from llm.training.grpo_loop import run_grpo
from llm.training.heldout import evaluate_heldout
from llm.game.lakes import env_description, env_horizon, sample_lakes
from llm.rl.optim import make_optimizer
from llm.training.phase import Checkpoints
from llm.training.policy import Policy, load_policy
from llm.game.prompter import Prompter
from llm.training.config import StageConfig
from llm.training.warmstart import SideRows, run_warmstart

PHASES = ("warmstart", "grpo")


class MetricsLog(JsonlWriter):
    """The stage's ``metrics.jsonl``: the JSONL back end (:class:`jaxlake.metrics.JsonlWriter`)
    with the phase order ``warmstart`` -> ``grpo`` (truncated on resume to the checkpointed step)."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path, PHASES)



@dataclasses.dataclass
class StageResult:
    """What :func:`train_stage` produced.

    Attributes:
      stage_dir: the stage folder.
      checkpoint_dir: orbax directory of the final policy (GRPO, or the warm start when GRPO
        is disabled); pass it as ``init_from`` of the next stage.
      policy_dir: the final policy as a Hugging Face folder (``None`` without export_hf).
      metrics_path / eval_path / curves_path: files written (``eval_path`` is
        ``train_eval.json``).
      eval_before: held-out metrics before GRPO (after the warm start).
      eval_after: held-out metrics of the final policy.
      warmstart_steps / grpo_steps: steps done in each phase.
      resumed: whether any phase resumed from a checkpoint.
      wall_s: seconds this call took.
    """

    stage_dir: Path
    checkpoint_dir: Path
    policy_dir: Optional[Path]
    metrics_path: Path
    eval_path: Path
    curves_path: Optional[Path]
    eval_before: Optional[dict]
    eval_after: Optional[dict]
    warmstart_steps: int
    grpo_steps: int
    resumed: bool
    wall_s: float


def _abstract(x):
    """The shape, dtype and sharding of an array, without its buffer."""
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))


def train_stage(
    config: StageConfig,
    env_config: Mixture,
    stage_dir: str | os.PathLike,
    init_from: Optional[str | os.PathLike] = None,
    *,
    policy: Optional[Policy] = None,
    mesh=None,
    max_steps: Optional[Mapping[str, int]] = None,
    warmstart_env: Optional[Mixture] = None,
    side_rows: Optional[SideRows] = None,
    hooks: Sequence[Callable[[Any, Any], Any]] = (),
) -> StageResult:
    """Train one stage: (optional) supervised warm start, then GRPO; resumable.

    Args:
      config: the stage's settings, resolved once from the Hydra config by the caller
        (:meth:`llm.training.config.StageConfig.from_cfg`: groups ``train``, ``reward``,
        ``prompt``, ``model``, ``logger``, ``wandb``; see ``conf/``).
      env_config: the stage's environment, a :class:`~jaxlake.mixture.Mixture` (a ``LakeConfig``
        is read as its one component).
      stage_dir: output folder (created); rerunning with the same folder resumes.
      init_from: start from this policy (orbax checkpoint dir or HF folder) instead of
        ``config.model``.
      policy: start from this in-memory :class:`Policy` (wins over both). The stage copies
        its weights unless ``policy.owned`` (then it takes the arrays over: the caller must
        not use them again); a policy the stage loads itself is owned.
      mesh: the ``(data, fsdp)`` mesh (default: ``train.mesh`` over every device; :mod:`llm.model.sharding`).
      max_steps: ``{"warmstart": k, "grpo": k}`` stop early (simulates a killed run in tests).
      warmstart_env: the warm start's environment (default ``env_config``): a stage may warm
        start on a broad mixture (the engineers' whole space) and run GRPO on its own. GRPO's
        supervised anchor (``train.grpo.anchor``) draws its lakes from it too.
      side_rows: supervised rows of another task in every warm-start step
        (:class:`llm.training.warmstart.SideRows`: pretraining the engineer's role).
      hooks: ``make(tokenizer, mesh) -> hook`` of GRPO hooks added to those the config asks
        for (:mod:`llm.training.hooks`; the pipeline's engineer self-play,
        :mod:`jaxlake.pipeline.selfplay`).

    Metrics go to the back ends of ``config.logger`` (:mod:`jaxlake.metrics`; default
    ``[jsonl]``: ``<stage_dir>/metrics.jsonl``; ``tensorboard``: ``<stage_dir>/tb/<phase>/``;
    ``wandb``: ``<stage_dir>/wandb/``); on resume each drops or
    hides what came after the checkpoint as far as it can (:mod:`jaxlake.metrics`).

    Returns:
      :class:`StageResult`.
    """
    if not isinstance(config, StageConfig):
        raise TypeError(f"train_stage takes a StageConfig (llm.training.config.StageConfig.from_cfg of the Hydra "
                        f"config), not {type(config).__name__}")
    stage_dir = Path(stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    run_config = {"train": dict(config.record), "env": env_description(env_config)}
    with build_writer(config.logger, stage_dir, phases=PHASES, name=stage_dir.name,
                      run_config=run_config) as metrics:
        return _train_stage(config, env_config, stage_dir, init_from, policy, mesh, max_steps, metrics,
                            env_config if warmstart_env is None else Mixture.of(warmstart_env), side_rows, hooks)


def _train_stage(config: StageConfig, env_config: Mixture, stage_dir: Path, init_from: Optional[str | os.PathLike],
                 policy: Optional[Policy], mesh, max_steps: Optional[Mapping[str, int]],
                 metrics: MetricsWriter, warmstart_env: Mixture, side_rows: Optional[SideRows] = None,
                 hooks: Sequence[Callable[[Any, Any], Any]] = ()) -> StageResult:
    """:func:`train_stage` with its metrics writer open."""
    t_start = time.perf_counter()
    tcfg = config.train
    stage_dir = Path(stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    max_steps = dict(max_steps or {})
    mesh = shd.make_mesh(config=tcfg.mesh) if mesh is None else mesh
    if policy is None:  # loaded here: nobody else holds its arrays, the phases may take them over
        policy = dataclasses.replace(load_policy(config.model, init_from, tcfg.seed, mesh), owned=True)
    if policy.owned:
        # laid out on the mesh now (a view of the same buffers where it already is), so no
        # single-device original outlives the phases' placed state
        policy = Policy(policy.graphdef, shd.place_state(policy.state, mesh), policy.tokenizer, owned=True)
    ec, gc, wc = tcfg.eval, tcfg.grpo, tcfg.warmstart

    eval_lakes = sample_lakes(jax.random.PRNGKey(ec.seed), env_config, max(ec.num_lakes, 1))
    prompter = Prompter.fit(policy.tokenizer, tcfg.prompt, eval_lakes, tcfg.max_prompt_tokens, tcfg.prompt_bucket)
    eval_ref = rewards.reference_costs(eval_lakes)
    horizon = env_horizon(env_config)
    eval_tokens = ec.max_new_tokens or gc.max_new_tokens

    def run_eval(pol: Policy) -> dict:
        if ec.num_lakes == 0:
            return {"num_lakes": 0}
        return evaluate_heldout(pol, prompter, eval_lakes, eval_ref, tcfg.reward, eval_tokens, ec.batch_size, horizon, mesh,
                        jax.random.PRNGKey(ec.seed + 1))

    resumed = False
    ws_steps = 0
    ckpt_dir = stage_dir / "checkpoint"
    if wc.enabled and wc.steps > 0:
        res = run_warmstart(policy, tcfg, warmstart_env, stage_dir / "warmstart", metrics, prompter,
                                  gc.max_new_tokens, mesh, max_steps.get("warmstart"), side=side_rows)
        policy, ws_steps, resumed = dataclasses.replace(res.policy, owned=True), res.step, res.resumed_from is not None
        if ws_steps < wc.steps:  # stopped early on purpose
            return StageResult(stage_dir, stage_dir / "warmstart", None, metrics.path, stage_dir / "train_eval.json", None,
                               None, None, ws_steps, 0, resumed, time.perf_counter() - t_start)
        if not gc.enabled or gc.steps == 0:
            ckpt_dir = stage_dir / "warmstart"

    before_path = stage_dir / "eval_before_grpo.json"
    eval_before = None
    grpo_steps = 0
    if gc.enabled and gc.steps > 0:
        if before_path.is_file():
            eval_before = json.loads(before_path.read_text(encoding="utf-8"))
        else:
            eval_before = run_eval(policy)
            write_json(before_path, eval_before)

        def periodic(pol: Policy, step: int) -> dict:
            m = run_eval(pol)
            return {k: v for k, v in m.items() if k != "examples"}

        # The starting weights are handed over, not kept: they become the GRPO state (an owned
        # policy is not copied; the updates donate it) and, with beta > 0, the reference (which
        # run_grpo copies). Resuming, the state comes from the checkpoint and only the weights'
        # shapes are passed, so nothing here holds a second copy while GRPO samples: resident
        # are the weights, the AdamW moments and the reference when beta > 0 (tests/llm/
        # training/test_memory_plan.py counts them).
        handed = [policy.state if gc.loss.use_reference else None]
        if Checkpoints(ckpt_dir, gc.keep_checkpoints).latest() is not None:
            policy = Policy(policy.graphdef, jax.tree_util.tree_map(_abstract, policy.state), policy.tokenizer,
                            owned=True)
        res = run_grpo(policy, handed.pop(), tcfg, env_config, ckpt_dir, metrics, prompter, mesh, periodic,
                       max_steps.get("grpo"), anchor_env=warmstart_env,
                       extra_hooks=[make(policy.tokenizer, mesh) for make in hooks])
        policy, grpo_steps = res.policy, res.step
        resumed = resumed or res.resumed_from is not None
        if grpo_steps < gc.steps:
            return StageResult(stage_dir, ckpt_dir, None, metrics.path, stage_dir / "train_eval.json", None, eval_before,
                               None, ws_steps, grpo_steps, resumed, time.perf_counter() - t_start)
    elif not (wc.enabled and wc.steps > 0):
        ckpt = Checkpoints(ckpt_dir, 1)
        if ckpt.latest() is None:
            ckpt.save(policy, make_optimizer(gc.optim, 1).init(policy.state), 0, jax.random.PRNGKey(tcfg.seed), 0)

    eval_after = run_eval(policy)
    write_json(stage_dir / "train_eval.json", {
        "env": env_description(env_config),
        "num_lakes": ec.num_lakes,
        "eval_seed": ec.seed,
        "decoding": "greedy",
        "before_grpo": eval_before,
        "final": eval_after,
        "warmstart_steps": ws_steps,
        "grpo_steps": grpo_steps,
    })
    policy_dir = None
    if tcfg.export_hf:
        from llm.model.distributed import is_writer
        from llm.model.hf_io import save_pretrained

        host_state = shd.host_tree(policy.state)  # on every process: an all-gather when the mesh spans several
        policy_dir = stage_dir / "policy"
        if is_writer():  # process 0 writes the export
            policy_dir = save_pretrained(nnx.merge(policy.graphdef, host_state), policy.tokenizer, policy_dir)
    curves = None
    if tcfg.plot and metrics.rows():
        from llm.training.plots import plot_metrics

        curves = plot_metrics(metrics.path, stage_dir / "curves.png")
    return StageResult(stage_dir, ckpt_dir, policy_dir, metrics.path, stage_dir / "train_eval.json", curves, eval_before,
                       eval_after, ws_steps, grpo_steps, resumed, time.perf_counter() - t_start)
