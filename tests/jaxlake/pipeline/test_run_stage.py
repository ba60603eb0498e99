"""``python -m jaxlake.run`` as a user runs it: a real subprocess, tiny overrides.

The in-process pipeline tests (tests/jaxlake/pipeline/test_stages.py) cover stages, resume and sweeps; this
file checks the module entry point itself: the per-stage table on stdout, the stage folder's
files, a finished run rerun as a no-op, and a clear error for a stage out of range.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

TINY = [
    # a 3x3 one-agent lake and a one-layer model keep compiles short
    "env.height=3", "env.width=3", "env.num_agents=1", "env.hole_density=0.0", "env.max_steps=6",
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1",
    "model.num_attention_heads=2", "model.num_key_value_heads=1", "model.head_dim=16",
    "stages=1", "eval=tiny", "engineer=fixed", "train.progress=false", "train.plot=false",
    "train.warmstart.steps=2", "train.warmstart.batch_size=4", "train.warmstart.checkpoint_every=1",
    "train.grpo.steps=2", "train.grpo.lakes_per_step=2", "train.grpo.group_size=2",
    "train.grpo.max_new_tokens=10", "train.grpo.checkpoint_every=1",
    "train.eval.num_lakes=2", "train.eval.batch_size=2",
    "eval.current_env_lakes=2", "eval.summary.env_stats_lakes=2", "eval.batch_size=16",
    "eval.sampled.num_samples=1", "eval.max_new_tokens=10",
]


def run(args, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "jaxlake.run", *args, f"hydra.run.dir={tmp_path}", *TINY],
                          cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_cli_one_stage_then_rerun_is_a_no_op(tmp_path):
    out = run([], tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "| stage | environment | suite greedy |" in out.stdout
    stage = tmp_path / "stage_1"
    for name in ("env.yaml", "train.json", "metrics.jsonl", "eval.json", "summary.json", "engineer.json",
                 "next_env.yaml", "policy/config.json", "policy/model.safetensors"):
        assert (stage / name).is_file(), name
    rows = (stage / "metrics.jsonl").read_text().splitlines()
    phases = [(json.loads(r)["phase"], json.loads(r)["step"]) for r in rows]
    assert phases == [("warmstart", 1), ("warmstart", 2), ("grpo", 1), ("grpo", 2)]
    assert json.loads((stage / "engineer.json").read_text())["engineer"] == "fixed"

    again = run([], tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "complete, skipped" in again.stderr
    assert (stage / "metrics.jsonl").read_text().splitlines() == rows


def test_stage_out_of_range_is_a_clear_error(tmp_path):
    out = run(["+stage=7"], tmp_path)
    assert out.returncode != 0
    assert "stage=7 not in [1, stages=1]" in out.stderr
    assert not (tmp_path / "stage_7").exists()
