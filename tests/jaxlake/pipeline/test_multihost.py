"""The pipeline on two JAX processes on this machine, against one process with the same mesh.

One shared run of ``python -m jaxlake.launch -n 2 --cpu-devices 2`` (two processes x two
forced CPU devices, gloo collectives over a loopback coordinator, mesh ``data=2, fsdp=2``,
one tiny stage: warm start, GRPO, held-out check, suite evaluation, summary, engineer) and,
at the same time, one reference run of ``python -m jaxlake.run`` in a single process with
four forced CPU devices and the same mesh. The tests below read their folders:

* both exit 0;
* no file is written by two processes, the follower writes nothing but its checkpoint
  shards (a Python audit hook on every process: tests/jaxlake/pipeline/audited_run.py), and
  every metric row appears once;
* the first warm-start and GRPO steps equal the single process's within 1e-4; the later steps
  drift apart by float rounding only (the all-reduces sum in another order): losses within
  1e-3, the exported weights within 1e-3, and the held-out check, the suite evaluation and
  the engineer's next environment the same;
* the checkpoint the two processes wrote restores in this (one-process, one-device) pytest
  process;
* a process that dies makes the other end with JAX's error within a bounded time.

The model is a one-layer Qwen3 of width 32 (``model=tiny`` made smaller); twelve warm-start
steps on 3x3 one-agent lakes (at lr 3e-2) make GRPO's first groups differ in reward (non-zero
gradients). XLA's CPU back end compiles at ``-O0`` here (both runs alike) to keep compile time
down; the two runs cost about 100 CPU-seconds together (three processes that each compile the
stage's programs; a warm-start step of the two processes, gloo all-reducing, takes ~0.25 s
here), the dead-peer test about 10.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support import xla_flags

ROOT = Path(__file__).resolve().parents[3]
WARMSTART_STEPS, GRPO_STEPS = 12, 2
TINY = [
    "stages=1", "engineer=heuristic", "eval=tiny",
    "model=tiny", "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1",
    "model.num_attention_heads=2", "model.num_key_value_heads=2", "model.head_dim=16",
    # lakes of the suite's canvas (4x4, 2 agents) and prompt length (64), and lake counts of 8
    # or 16 throughout (warm start and GRPO 8; held-out check, current environment, statistics
    # and the suite 16): each program compiles once for all of them
    "env=tiny", "env.height=3", "env.width=3", "env.num_agents=1", "env.max_steps=4", "env.max_height=4", "env.max_width=4",
    "env.max_agents=2", "train.max_prompt_tokens=64",
    "prompt=compact",  # plan only: the default planner prompt would think first (a second sampler per shape)
    "train.mesh.data=2", "train.mesh.fsdp=2",
    f"train.warmstart.steps={WARMSTART_STEPS}", "train.warmstart.batch_size=8",
    f"train.warmstart.checkpoint_every={WARMSTART_STEPS}", "train.warmstart.optim.lr=3e-2",
    "train.warmstart.optim.warmup_steps=0",
    f"train.grpo.steps={GRPO_STEPS}", "train.grpo.lakes_per_step=8", "train.grpo.group_size=2",
    "train.grpo.max_new_tokens=8", "train.grpo.checkpoint_every=1",
    "train.eval.num_lakes=16", "train.eval.batch_size=16", "train.progress=false", "train.plot=false",
    "eval.current_env_lakes=16", "eval.summary.env_stats_lakes=16", "eval.batch_size=16",
    "eval.sampled.num_samples=0", "eval.max_new_tokens=8",
]
#: Metric keys that measure time, not results.
TIMING = ("time/", "tokens_per_s")
ORBAX_DIRS = ("checkpoint", "warmstart")


def _env(**extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two runs, started together; ``(root, {name: CompletedProcess-like}, audit dir)``."""
    root = tmp_path_factory.mktemp("multihost")
    audit = root / "audit"
    audit.mkdir()
    common = [f"runs_dir={root}", *TINY]
    two = subprocess.Popen(
        [sys.executable, "-m", "jaxlake.launch", "-n", "2", "--cpu-devices", "2", "--grace-s", "20",
         "--module", "tests.jaxlake.pipeline.audited_run", "--", "experiment=two", *common],
        cwd=str(ROOT), env=_env(XLA_FLAGS=xla_flags(), JAXLAKE_AUDIT_DIR=str(audit), JAXLAKE_AUDIT_ROOT=str(root / "two")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    one = subprocess.Popen(
        [sys.executable, "-m", "jaxlake.run", "experiment=one", *common], cwd=str(ROOT),
        env=_env(XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=4")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {}
    for name, proc in (("two", two), ("one", one)):
        stdout, stderr = proc.communicate(timeout=1200)
        out[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return root, out, audit


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _close(a, b, what: str, tol: float = 1e-4) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), what
        for k in a:
            _close(a[k], b[k], f"{what}.{k}", tol)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{what}[{i}]", tol)
    elif isinstance(a, float) or isinstance(b, float):
        assert abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b))), f"{what}: {a} vs {b}"
    else:
        assert a == b, f"{what}: {a!r} vs {b!r}"


def _results(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(t in k for t in TIMING)}


@pytest.mark.slow
def test_both_runs_exit_0(runs):
    root, out, _ = runs
    for name in ("two", "one"):
        assert out[name].returncode == 0, f"{name}:\n{out[name].stderr[-6000:]}"
    # the launcher passes process 0's output through: the run's table, printed once, by it
    assert out["two"].stdout.count("| stage | environment |") == 1
    assert not [line for line in out["two"].stdout.splitlines() if line.startswith("[process 1] |")]
    for name in ("two", "one"):
        assert (root / name / "stage_1" / "next_env.yaml").is_file()


@pytest.mark.slow
def test_every_file_is_written_by_one_process(runs):
    root, out, audit = runs
    assert out["two"].returncode == 0
    by_path: dict = {}   # path -> processes that wrote it
    renames: dict = {}   # path -> how often an atomic write put it in place
    for log in audit.glob("*.tsv"):
        for line in log.read_text().splitlines():
            pid, event, path = line.split("\t")
            by_path.setdefault(Path(path), set()).add(int(pid))
            if event in ("os.rename", "os.replace"):
                renames[Path(path)] = renames.get(Path(path), 0) + 1
    run = root / "two"
    assert by_path, "the audit hook recorded nothing"
    shared = [p for p, pids in by_path.items() if len(pids) > 1 and not set(p.relative_to(run).parts) & set(ORBAX_DIRS)]
    assert shared == [], f"written by both processes: {shared}"
    follower = sorted(p.relative_to(run) for p, pids in by_path.items() if 1 in pids)
    stray = [p for p in follower if not (len(p.parts) > 1 and p.parts[1] in ORBAX_DIRS)]
    assert stray == [], f"process 1 wrote outside its checkpoint shards: {stray}"
    assert follower, "process 1 wrote no checkpoint shard metadata"  # orbax: from every process
    # each result is put in place once, by process 0 (the exported policy is one folder rename)
    for name in ("env.yaml", "train.json", "train_eval.json", "eval.json", "summary.json", "summary.txt",
                 "engineer.json", "next_env.yaml", "policy"):
        assert renames.get(run / "stage_1" / name) == 1 and by_path[run / "stage_1" / name] == {0}, name
    for name in ("stages.jsonl", "report.md"):
        assert renames.get(run / name) == 1 and by_path[run / name] == {0}, name
    assert by_path[run / "run.json"] == by_path[run / "stage_1" / "metrics.jsonl"] == {0}
    assert by_path[run / ".hydra" / "overrides.yaml"] == {0}  # Hydra's copy of the config: process 0's


@pytest.mark.slow
def test_every_metric_row_appears_once(runs):
    root, out, _ = runs
    assert out["two"].returncode == 0
    rows = _rows(root / "two" / "stage_1" / "metrics.jsonl")
    assert [(r["phase"], r["step"]) for r in rows] == (
        [("warmstart", s) for s in range(1, WARMSTART_STEPS + 1)] + [("grpo", s) for s in range(1, GRPO_STEPS + 1)])
    assert [r["step"] for r in _rows(root / "two" / "stages.jsonl")] == [1]


@pytest.mark.slow
def test_first_steps_equal_one_process(runs):
    root, out, _ = runs
    assert out["two"].returncode == out["one"].returncode == 0
    two, one = (_rows(root / n / "stage_1" / "metrics.jsonl") for n in ("two", "one"))
    first = {}
    for phase in ("warmstart", "grpo"):
        a = next(r for r in two if r["phase"] == phase)
        b = next(r for r in one if r["phase"] == phase)
        _close(_results(a), _results(b), f"{phase} step 1")
        first[phase] = b
    # the steps are not trivial: the warm start learns and GRPO's groups differ in reward
    assert first["warmstart"]["grad_norm"] > 0 and first["warmstart"]["solved_share"] > 0
    assert first["grpo"]["grad_norm"] > 0 and first["grpo"]["reward_std"] > 0
    # later steps drift apart by rounding only (the two all-reduce in another order, and Adam
    # amplifies it step by step at lr 3e-2; forty steps made ~1e-4 of it): the losses stay
    # within 1e-3
    assert len(two) == len(one)
    for a, b in zip(two, one):
        _close(a.get("nll", a.get("loss")), b.get("nll", b.get("loss")), f"{a['phase']} step {a['step']} loss", tol=1e-3)


@pytest.mark.slow
def test_final_artifacts_equal_one_process(runs):
    from safetensors.numpy import load_file

    root, out, _ = runs
    assert out["two"].returncode == out["one"].returncode == 0
    two, one = root / "two" / "stage_1", root / "one" / "stage_1"
    wa, wb = (load_file(str(d / "policy" / "model.safetensors")) for d in (two, one))
    assert set(wa) == set(wb)
    for k in wa:  # 14 steps of rounding apart (see above); observed max |diff| ~1e-6
        np.testing.assert_allclose(wa[k], wb[k], atol=1e-3, rtol=0, err_msg=k)
    ta, tb = (json.loads((d / "train_eval.json").read_text()) for d in (two, one))
    _close(ta, tb, "train_eval.json")
    ea, eb = (json.loads((d / "eval.json").read_text()) for d in (two, one))
    for key in ("score", "modes", "episodes", "current_env", "suite"):
        _close(ea[key], eb[key], f"eval.json {key}")
    assert (two / "next_env.yaml").read_text() == (one / "next_env.yaml").read_text()
    ja, jb = (json.loads((d / "engineer.json").read_text()) for d in (two, one))
    assert (ja["decision"], ja["reason"]) == (jb["decision"], jb["reason"])


@pytest.mark.slow
def test_checkpoint_of_two_processes_restores_in_one(runs):
    """Orbax wrote the GRPO checkpoint from both processes (each its shards of a 4-device mesh);
    this one-device process restores it, equal to the single-process run's checkpoint."""
    import jax
    from flax import nnx

    from llm.model.checkpoint import latest_step, restore_checkpoint

    root, out, _ = runs
    assert out["two"].returncode == out["one"].returncode == 0
    assert jax.process_count() == 1
    restored = {}
    for name in ("two", "one"):
        d = root / name / "stage_1" / "checkpoint"
        assert latest_step(d) == GRPO_STEPS
        r = restore_checkpoint(d)
        leaves = jax.tree_util.tree_leaves_with_path(jax.device_get(nnx.state(r.model)))
        restored[name] = {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}
        assert int(np.asarray(r.extra["step"])) == GRPO_STEPS
    assert set(restored["two"]) == set(restored["one"])
    for k in restored["two"]:
        np.testing.assert_allclose(restored["two"][k], restored["one"][k], atol=1e-3, rtol=0, err_msg=k)
    # and it is the policy the two processes exported
    from safetensors.numpy import load_file

    exported = load_file(str(root / "two" / "stage_1" / "policy" / "model.safetensors"))
    kernel = next(k for k in restored["two"] if "embed_tokens" in k)
    np.testing.assert_array_equal(restored["two"][kernel], exported["model.embed_tokens.weight"])


@pytest.mark.slow
def test_a_dead_peer_ends_the_other_with_an_error(tmp_path):
    """Process 1 is killed after joining; process 0, waiting for it at a barrier, is ended by
    the coordination service's heartbeat check (3 s here) with JAX's error, well before its own
    600 s barrier timeout, and the launcher reports both. Before that, process 0 restored a
    checkpoint on its own (what an engineer that loads the policy does) while process 1 waited."""
    from flax import nnx

    from llm.model.checkpoint import save_checkpoint
    from llm.model.qwen3 import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=8)
    save_checkpoint(tmp_path / "ck", Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), 3, extra={"step": np.int64(3)})
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "jaxlake.launch", "-n", "2", "--grace-s", "120",
                          "--module", "tests.jaxlake.pipeline.dying_peer"], cwd=str(ROOT),
                         env=_env(PEER_HEARTBEAT_S="3", PEER_CHECKPOINT_DIR=str(tmp_path / "ck")),
                         capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    assert "process 0: restored step 3 alone" in out.stdout, out.stderr[-3000:]
    assert "process 0: gathered [0, 1]" in out.stdout and "process 1: gathered [0, 1]" in out.stdout
    assert "barrier passed" not in out.stdout
    assert out.returncode != 0
    assert "[launch] process 1 exited with code -9" in out.stderr
    own = "\n".join(line for line in out.stderr.splitlines() if not line.startswith("[process 1]"))
    assert "Terminating process because the JAX distributed service detected fatal errors" in own
    assert "another task died" in own
    assert wall < 90, f"process 0 took {wall:.0f} s to end"


# ---------------------------------------------------------------------------- the cheap parts
def test_launcher_commands():
    from jaxlake.launch import process_command, process_env

    cmd = process_command("jaxlake.run", ["experiment=x"], "127.0.0.1:1234", 2, 1, [2, 3])
    assert cmd[1:] == ["-m", "jaxlake.run", "experiment=x", "train.distributed.enabled=true",
                       "train.distributed.coordinator_address=127.0.0.1:1234", "train.distributed.num_processes=2",
                       "train.distributed.process_id=1", "train.distributed.local_device_ids=[2,3]"]
    env = process_env({"XLA_FLAGS": "--foo --xla_force_host_platform_device_count=8"}, 2)
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=2"
    assert process_env({"A": "1"}, None) == {"A": "1"}


def test_followers_leave_hydra_files_to_process_0():
    from jaxlake.pipeline.cluster import follower_hydra_overrides, launched_process_id

    on = ["train.distributed.enabled=true"]
    assert launched_process_id(on + ["train.distributed.process_id=3"], {}) == 3
    assert launched_process_id(on, {"SLURM_PROCID": "2"}) == 2
    assert launched_process_id(["train.distributed.process_id=3"], {}) is None  # distributed off
    assert launched_process_id([], {"JAXLAKE_DISTRIBUTED": "1", "OMPI_COMM_WORLD_RANK": "1"}) == 1
    assert follower_hydra_overrides(on + ["train.distributed.process_id=0"], {}) == []
    assert follower_hydra_overrides(on + ["train.distributed.process_id=1"], {}) == [
        "hydra.output_subdir=null", "hydra/job_logging=none"]
    assert follower_hydra_overrides(on + ["train.distributed.process_id=1", "hydra/job_logging=disabled"], {}) == [
        "hydra.output_subdir=null"]


def test_distributed_settings_are_checked():
    from llm.model.distributed import DistributedConfig
    from llm.model.errors import ModelConfigError

    cfg = DistributedConfig.from_dict({"enabled": True, "coordinator_address": "10.0.0.1:1234", "num_processes": 4,
                                       "process_id": 3, "local_device_ids": 1})
    assert cfg.local_device_ids == (1,)
    assert cfg.initialize_kwargs() == {"initialization_timeout": 300, "heartbeat_timeout_seconds": 100,
                                       "coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 3,
                                       "local_device_ids": [1]}
    for bad, field in (({"process_id": 4, "num_processes": 4}, "process_id=4"),
                       ({"coordinator_address": "nohost"}, "coordinator_address='nohost'"),
                       ({"heartbeat_timeout_s": 0}, "heartbeat_timeout_s=0"),
                       ({"cpu_collectives": "nccl"}, "cpu_collectives='nccl'"),
                       ({"timeout": 3}, "unknown train.distributed field(s) ['timeout']")):
        with pytest.raises(ModelConfigError, match=re.escape(field)):
            DistributedConfig.from_dict(bad)


def test_one_process_rows_and_agreement_are_the_identity():
    from llm.model import distributed as dist

    assert dist.process_rows(8) == slice(0, 8)
    tree = (np.arange(4), np.ones((4, 2)))
    got = dist.gather_rows(dist.take_rows(tree, dist.process_rows(4)))
    np.testing.assert_array_equal(got[0], tree[0])
    assert dist.broadcast_object("x", {"a": 1}) == {"a": 1}
    dist.barrier("nothing to wait for")
    assert dist.is_writer()
