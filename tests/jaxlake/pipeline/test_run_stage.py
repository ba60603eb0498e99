"""``python -m jaxlake.run`` as a user runs it: a real subprocess, tiny overrides.

The whole pipeline by that command (the per-stage table on stdout, every stage's files, a
finished run rerun as a no-op, a second command refused while the first runs) is in
tests/jaxlake/pipeline/test_stages.py, which shares that one run folder between its tests; this
file checks that bad values (a stage out of range, an environment field) end in one line each,
before anything is written, in every job of a sweep.
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
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "jaxlake.run", *args, f"hydra.run.dir={tmp_path}",
                           f"hydra.sweep.dir={tmp_path}", *TINY],
                          cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=900)


def test_mistakes_end_in_one_line_and_a_sweep_runs_every_job(tmp_path):
    """A multirun of two jobs with bad values: each job ends in one line naming the field and its
    range (not Hydra's "Error executing job" and a traceback), every job runs, the sweep exits 1
    after them, and nothing is written into the job folders."""
    out = run(["-m", "+stage=7", "env.conflict_density=1.5,0.5"], tmp_path)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr and "Error executing job" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [f"error: {tmp_path / '0'}: env.conflict_density=1.5 not in [0.0, 1.0]",
                     f"error: {tmp_path / '1'}: stage=7 not in [1, stages=1]",
                     f"error: 2 job(s) of the sweep stopped; the first: {tmp_path / '0'}: env.conflict_density=1.5 not in "
                     "[0.0, 1.0]"]
    assert out.stderr.strip().splitlines()[-1] == lines[-1]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["0", "1", "multirun.yaml"]
