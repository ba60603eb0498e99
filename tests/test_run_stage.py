"""The Hydra entry point ``python -m jaxlake.run +stage=1`` end to end (subprocess, tiny overrides)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TINY = [
    # a 3x3 one-agent lake and a one-layer model keep compiles short
    "env.height=3", "env.width=3", "env.num_agents=1", "env.hole_density=0.0", "env.max_steps=6",
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1",
    "model.num_attention_heads=2", "model.num_key_value_heads=1", "model.head_dim=16",
    "train.progress=false",
    "train.warmstart.steps=2", "train.warmstart.batch_size=4", "train.warmstart.checkpoint_every=1",
    "train.grpo.steps=2", "train.grpo.lakes_per_step=4", "train.grpo.group_size=2",
    "train.grpo.max_new_tokens=10", "train.grpo.checkpoint_every=1",
    "train.eval.num_lakes=4", "train.eval.batch_size=4",
]


def run(args, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "jaxlake.run", *args, f"hydra.run.dir={tmp_path}", *TINY],
                          cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_hydra_single_stage_end_to_end_and_resume(tmp_path):
    out = run(["+stage=1"], tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    stage = tmp_path / "stage_1"
    assert summary["stage_dir"] == str(stage)
    assert (summary["warmstart_steps"], summary["grpo_steps"], summary["resumed"]) == (2, 2, False)
    for name in ("metrics.jsonl", "eval.json", "curves.png", "policy/config.json", "policy/model.safetensors"):
        assert (stage / name).is_file(), name
    assert (stage / "checkpoint").is_dir() and (stage / "warmstart").is_dir()
    rows = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    assert [(r["phase"], r["step"]) for r in rows] == [("warmstart", 1), ("warmstart", 2), ("grpo", 1), ("grpo", 2)]
    ev = json.loads((stage / "eval.json").read_text())
    assert ev["env"]["height"] == 3 and ev["final"]["num_lakes"] == 4
    assert 0.0 <= ev["final"]["success"] <= 1.0

    # the same command again resumes from the final checkpoints: nothing is redone or repeated
    again = run(["+stage=1"], tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["resumed"] is True
    assert (stage / "metrics.jsonl").read_text().splitlines() == [json.dumps(r) for r in rows]


def test_unknown_stage_is_a_clear_error(tmp_path):
    out = run(["+stage=7"], tmp_path)
    assert out.returncode != 0
    assert "stage=7 not in [1, 1]" in out.stderr
