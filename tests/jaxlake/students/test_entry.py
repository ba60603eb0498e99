"""``python -m jaxlake.ippo`` end to end at the smallest settings (conf/ippo/smoke.yaml): its
files, a resume after a crash that equals an uninterrupted run, a folder of other settings
refused and a bad value ending in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxlake.io import read_json
from jaxlake.metrics import read_rows
from jaxlake.students import checkpoint as ckpt_module

REPO = Path(__file__).resolve().parents[3]


def _cli(monkeypatch, args) -> object:
    """``python -m jaxlake.ippo <args>`` in this process; the SystemExit code (None: ok)."""
    from hydra.core.global_hydra import GlobalHydra

    from jaxlake.students import run as entry

    GlobalHydra.instance().clear()
    quiet = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    monkeypatch.setattr(sys, "argv", ["jaxlake.ippo", *args, *quiet])
    try:
        entry.main()
    except SystemExit as err:
        return err.code
    finally:
        GlobalHydra.instance().clear()
    return None


def _values(rows):
    return [(r["step"], r["update"], r["env_steps"], r["train"], r["heldout"]) for r in rows]


def test_train_crash_resume_equals_an_uninterrupted_run(monkeypatch, tmp_path, capsys):
    args = ["ippo=smoke", f"runs_dir={tmp_path}", "progress=false"]
    # an uninterrupted run
    assert _cli(monkeypatch, [*args, "experiment=whole"]) is None
    whole = tmp_path / "whole"
    assert {"settings.json", "checkpoint.npz", "metrics.jsonl", "curve.png", "result.json"} <= {
        p.name for p in whole.iterdir()}
    rows = read_rows(whole / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[-1]["env_steps"] == 2 * 4 * 8
    assert rows[0]["env_steps"] == 0 and rows[0]["train"] == {}  # the untrained policy
    result = read_json(whole / "result.json")
    assert result["heldout_success"] == rows[-1]["heldout"]["success"] and result["cpu_s"] > 0
    assert (whole / "curve.png").read_bytes()[:4] == b"\x89PNG"

    # a run that dies writing its second checkpoint (after its second metrics row)
    save = ckpt_module.save
    calls = []

    def dying(path, tree, meta):
        calls.append(meta["chunk"])
        if meta["chunk"] == 2:
            raise KeyboardInterrupt("killed")
        return save(path, tree, meta)

    monkeypatch.setattr(ckpt_module, "save", dying)
    with pytest.raises(KeyboardInterrupt):
        _cli(monkeypatch, [*args, "experiment=crashed"])
    monkeypatch.setattr(ckpt_module, "save", save)
    crashed = tmp_path / "crashed"
    assert len(read_rows(crashed / "metrics.jsonl")) == 3 and not (crashed / "run.lock").exists()

    # the same command, as a user reruns it: resumes after chunk 1 and ends where `whole` did
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "jaxlake.ippo", *args, "experiment=crashed"], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming" in done.stderr and "after chunk 1 of 2" in done.stderr
    assert _values(read_rows(crashed / "metrics.jsonl")) == _values(rows)
    assert read_json(crashed / "result.json")["resumed"] is True

    # the folder refuses other settings, in one line, and writes nothing
    before = (crashed / "settings.json").read_text()
    capsys.readouterr()
    assert _cli(monkeypatch, [*args, "experiment=crashed", "ippo.lr=0.1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "ippo.lr: 0.0005 -> 0.1" in err[0], err
    assert (crashed / "settings.json").read_text() == before


@pytest.mark.parametrize("override, words", [
    ("ippo.num_envs=0", "error: ippo.num_envs=0 must be an integer in [1, inf)"),
    ("ippo.num_minibatches=3", "error: ippo.num_minibatches=3 must divide"),
    ("env.hole_density=2", "error: hole_density=2.0 not in [0.0, 0.9]"),
    ("seed=-1", "error: seed=-1 must be an integer in [0, inf)"),
])
def test_a_bad_value_ends_in_one_line(monkeypatch, tmp_path, capsys, override, words):
    assert _cli(monkeypatch, ["ippo=smoke", f"runs_dir={tmp_path}", override]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(words), err
    assert not (tmp_path / "ippo" / "settings.json").exists()
