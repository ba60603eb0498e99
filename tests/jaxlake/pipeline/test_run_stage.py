"""``python -m jaxlake.run`` as a user runs it: a real subprocess, tiny overrides.

The whole pipeline by that command (the per-stage table on stdout, every stage's files, a
finished run rerun as a no-op) is in tests/jaxlake/pipeline/test_stages.py, which shares that
one run folder between its tests; this file checks a clear error for a stage out of range,
before anything is trained.
"""

import os
import subprocess
import sys
from pathlib import Path

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


def test_stage_out_of_range_is_a_clear_error(tmp_path):
    out = run(["+stage=7"], tmp_path)
    assert out.returncode != 0
    assert "stage=7 not in [1, stages=1]" in out.stderr
    assert not (tmp_path / "stage_7").exists()
