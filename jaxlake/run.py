"""Hydra entry point: ``python -m jaxlake.run +stage=1`` trains one stage.

The stage logic lives in :func:`llm.train.train_stage`; this module only composes the
configuration (``conf/config.yaml``: groups ``env``, ``model``, ``train``, ``reward``,
``prompt``), resolves the stage's environment and output folder, and prints a summary.

* ``+stage=K`` (a plain key; unset means "all stages"): for now there is a single stage, the
  fixed-environment baseline on ``env``; the multi-stage pipeline with an environment
  engineer extends :func:`main`.
* Output: ``<hydra run dir>/stage_<K>/`` (the run dir defaults to ``runs/<experiment>``, a
  fixed folder, so rerunning the same command resumes from the last checkpoint).
* ``train.distributed.enabled=true`` (or ``JAXLAKE_DISTRIBUTED=1``) calls
  ``jax.distributed.initialize`` before anything else touches JAX.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import hydra
from omegaconf import DictConfig, OmegaConf

#: Stages the single-stage runner knows (the pipeline adds more).
NUM_STAGES = 1


def stage_env(cfg: DictConfig, stage: int) -> Any:
    """The environment of ``stage``: ``cfg.env`` (a ``LakeConfig`` or a weighted mixture)."""
    from jaxlake.engineers import mixture_from_env_node

    mixture = mixture_from_env_node(cfg.env)
    return mixture[0][1] if len(mixture) == 1 else mixture


def output_dir(cfg: DictConfig) -> Path:
    """The Hydra run folder (``runs/<experiment>`` unless ``hydra.run.dir`` says otherwise)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # called outside Hydra
        return Path(cfg.get("runs_dir", "runs")) / str(cfg.get("experiment", "default"))


def run_stage(cfg: DictConfig, stage: int, init_from: Optional[str] = None):
    """Train ``stage`` into ``<run dir>/stage_<stage>`` and return its ``StageResult``."""
    from llm.train import train_stage

    return train_stage(cfg, stage_env(cfg, stage), output_dir(cfg) / f"stage_{stage}", init_from=init_from)


def _summary(result) -> dict:
    before, after = result.eval_before or {}, result.eval_after or {}
    return {
        "stage_dir": str(result.stage_dir),
        "checkpoint": str(result.checkpoint_dir),
        "warmstart_steps": result.warmstart_steps,
        "grpo_steps": result.grpo_steps,
        "resumed": result.resumed,
        "success_before_grpo": before.get("success"),
        "success_final": after.get("success"),
        "wall_s": round(result.wall_s, 1),
    }


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from llm.sharding import initialize_distributed

    initialize_distributed(OmegaConf.to_container(cfg.train.get("distributed", {}), resolve=True))
    stage = cfg.get("stage", None)
    stages = range(1, NUM_STAGES + 1) if stage is None else [int(stage)]
    for k in stages:
        if not 1 <= k <= NUM_STAGES:
            raise ValueError(f"stage={k} not in [1, {NUM_STAGES}] (the single-stage runner has one stage)")
        result = run_stage(cfg, k)
        print(json.dumps(_summary(result)), file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
