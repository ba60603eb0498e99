"""Helpers shared by the tests (imported as ``tests.support``): the pipeline's end-to-end runs and
the trainer's small models."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path


def small_policy(num_layers: int = 2, seed: int = 1):
    """``(policy, tokenizer)``: a random two-head Qwen3 of width 32 on the game tokenizer, for
    tests of the trainer's updates (a second layer, so a token attends through another's)."""
    from flax import nnx

    from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer
    from llm.model.config import Qwen3Config
    from llm.model.qwen3 import Qwen3ForCausalLM
    from llm.training.policy import Policy

    tokenizer = to_hf_tokenizer(build_game_tokenizer())
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    return Policy.from_model(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(seed)), tokenizer), tokenizer


def xla_flags(*extra: str) -> str:
    """``XLA_FLAGS`` for a subprocess that needs flags of its own (a forced device count):
    this session's flags (tests/conftest.py's compile-effort ones) followed by ``extra``."""
    return " ".join([os.environ.get("XLA_FLAGS", ""), *extra]).strip()


def tiny_run_overrides(micro):
    """Hydra overrides that make a pipeline stage take seconds: the micro model, a tiny suite,
    one or two optimisation steps, lake counts equal to the trainer's (2) and the suite's (16)
    so that no extra generator compiles happen."""
    return [
        "eval=tiny", "env=tiny", f"+model.path={micro}",
        "train.warmstart.steps=1", "train.warmstart.batch_size=4", "train.warmstart.checkpoint_every=1",
        "train.grpo.steps=2", "train.grpo.lakes_per_step=2", "train.grpo.group_size=2",
        "train.grpo.max_new_tokens=16", "train.grpo.checkpoint_every=1", "train.eval.num_lakes=2",
        # a random micro model's groups all tie: dynamic sampling (on by default) would sample 3
        # rounds and skip every update; its refill and skip are tested in test_grpo_sampling.py
        "train.grpo.dynamic_sampling.enabled=false",
        "train.eval.batch_size=2", "train.progress=false", "train.plot=false",
        "eval.current_env_lakes=2", "eval.summary.env_stats_lakes=2", "eval.batch_size=16",
        "eval.sampled.num_samples=1", "eval.max_new_tokens=16",
        # the pipeline's mechanics with a random micro model: the plan-only prompt (the default
        # planner prompt thinks first, one more compiled sampler per shape); tests that run the
        # default prompt add planner_prompt_overrides()
        "prompt=compact",
    ]


def planner_prompt_overrides():
    """The default prompt (conf/prompt/planner.yaml: the policy thinks first) with a short thinking
    budget, for the tiny runs that exercise it end to end."""
    return ["prompt=planner", "prompt.reasoning.thinking_tokens=8"]


def run_cli(monkeypatch, args):
    """``python -m jaxlake.run <args>`` in this process; returns the SystemExit code (None: ok)."""
    from hydra.core.global_hydra import GlobalHydra

    import jaxlake.run as entry

    GlobalHydra.instance().clear()
    # resolve config_path="conf" from jaxlake/run.py as `python -m jaxlake.run` does
    monkeypatch.setenv("HYDRA_MAIN_MODULE", "__main__")
    # Hydra's logging set-up (dictConfig) closes existing handlers, and absl's handler closes
    # its stream (pytest's capture) when that is not the current sys.stderr: leave logging be
    quiet = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    monkeypatch.setattr(sys, "argv", [str(Path(__file__).resolve().parents[1] / "jaxlake" / "run.py"), *args, *quiet])
    try:
        entry.main()
    except SystemExit as err:
        return err.code
    finally:
        GlobalHydra.instance().clear()
    return None


@contextlib.contextmanager
def unwritable(folder: Path):
    """``folder`` refuses new files for the block: mode 0o555, and for root (whom permissions do
    not bind) the immutable attribute (``chattr +i``); skips the test where neither binds."""
    folder = Path(folder)
    mode = folder.stat().st_mode
    immutable = False
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
            immutable = done.returncode == 0
            if not immutable:
                import pytest

                pytest.skip("cannot make a folder unwritable here (root, and chattr +i fails)")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        folder.chmod(mode)
