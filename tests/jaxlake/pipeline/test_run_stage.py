"""Bad values and files end in one line each, before anything is written, in every job of a sweep.

The whole pipeline by ``python -m jaxlake.run`` (the per-stage table on stdout, every stage's
files, a finished run rerun as a no-op, a second command refused while the first runs, in one
line) is in tests/jaxlake/pipeline/test_stages.py, which shares that one run folder between its
tests. Here the entry point runs in this process (``tests.support.run_cli``): a multirun whose
jobs stop on a bad value and on a corrupt model, and the pieces that decide what a user's
mistake is.
"""

import json

import pytest
from hydra import compose, initialize_config_dir
from tests.support import run_cli

from jaxlake.conf import CONF_DIR
from jaxlake.pipeline.settings import PipelineError, RunSettings, user_error
from jaxlake.pipeline.stages import run_stage


def test_a_sweep_reports_each_job_s_mistake_in_one_line(monkeypatch, capsys, tmp_path):
    """Both jobs run; one stops on a bad value (naming the field and its range), one on a
    truncated model file (naming the file); the sweep exits 1 after them; Hydra's "Error
    executing job" and a traceback never appear, and the job folders stay empty."""
    from llm.model.config import Qwen3Config

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32,
                                                               num_hidden_layers=1, num_attention_heads=2,
                                                               num_key_value_heads=1, head_dim=8).to_hf_dict()))
    (model / "model.safetensors").write_bytes(b"\x10\x00")  # cut short inside its header
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    sweep = tmp_path / "sweep"
    code = run_cli(monkeypatch, ["-m", f"hydra.sweep.dir={sweep}", "env=tiny", "env.conflict_density=1.5,0.5",
                                 f"+model.path={model}", "stages=1"])
    assert code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Error executing job" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    first = f"error: {sweep / '0'}: env.conflict_density=1.5 not in [0.0, 1.0]"
    assert lines[0] == first
    assert lines[1].startswith(f"error: {sweep / '1'}: model.path={model}: '{model / 'model.safetensors'}' is not a "
                               "valid safetensors file")
    assert lines[2:] == [f"error: 2 job(s) of the sweep stopped; the first: {first[len('error: '):]}"]
    assert err.strip().splitlines()[-1] == lines[-1]
    assert sorted(p.name for p in sweep.rglob("*")) == ["0", "1", "multirun.yaml"]  # no run.json, .hydra/, log


def test_hydra_writes_nothing_before_the_pipeline():
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", return_hydra_config=True)
    assert cfg.hydra.output_subdir is None  # the pipeline writes .hydra/ once the folder is checked and locked
    assert cfg.hydra.job_logging.handlers.file.delay is True  # an unwritable folder fails in the pipeline


def test_what_counts_as_a_user_s_mistake(tmp_path):
    from jaxlake.io import FolderLockError
    from jaxlake.mixture import MixtureError
    from llm.model.hf_io import CheckpointError

    with pytest.raises(PipelineError, match=r"^stage=7 not in \[1, stages=1\]$"):
        run_stage(RunSettings.from_cfg({"stages": 1}), 7)
    try:
        open(tmp_path / "missing.json")
    except OSError as err:
        assert user_error(err) == f"{tmp_path / 'missing.json'}: No such file or directory"
    assert user_error(MixtureError("a/next_env.yaml: mixture[0].config:\n hole_density=1.5")) == (
        "a/next_env.yaml: mixture[0].config: hole_density=1.5")  # one line
    assert user_error(CheckpointError("x")) == "x" and user_error(FolderLockError("y")) == "y"
    assert user_error(PipelineError("z")) == "z"
    for bug in (ValueError("a bug"), KeyError("k"), KeyboardInterrupt()):
        assert user_error(bug) is None  # keeps its traceback


def test_a_field_set_on_the_default_mixture_is_one_line_naming_both_ways_out(monkeypatch, capsys, tmp_path):
    from jaxlake.run import mixture_field_error

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert run_cli(monkeypatch, ["env.height=5"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == ("error: env.height=5: env=broad is a mixture of 8 configs, with no single 'height' to set; pick a "
                    "one-config environment and set it there (env=tiny env.height=...), or set it on one component "
                    "(env.mixture.0.config.height=...)")
    assert list(tmp_path.iterdir()) == []  # refused before Hydra or the pipeline wrote anything
    # a one-config environment, the mixture's own keys, and a mixture picked on the command line
    assert mixture_field_error(["env=tiny", "env.height=5"]) is None
    assert mixture_field_error(["env.mixture.0.config.height=5"]) is None
    assert mixture_field_error(["env=tiny", "env=broad", "++env.num_agents=2"]).startswith("++env.num_agents=2: env=broad")
    # both ways out compose
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        assert compose("config", overrides=["env=tiny", "env.height=5"]).env.height == 5
        assert compose("config", overrides=["env.mixture.0.config.height=5"]).env.mixture[0].config.height == 5


def test_an_engineer_reading_a_mode_the_suite_does_not_score_is_one_line(monkeypatch, capsys, tmp_path):
    """PLR scoring its levels with `sampled` success on eval=large (greedy only) would read nothing
    after every stage and never replay: refused at the start, naming both settings."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert run_cli(monkeypatch, ["engineer=plr", "engineer.mode=sampled"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == ("error: engineer.mode=sampled reads the suite's sampled evaluation, but eval=large scores only "
                    "['greedy']: set engineer.mode=greedy or eval.sampled.num_samples=2")
    assert not any(tmp_path.rglob("*.json"))  # nothing of a run written
