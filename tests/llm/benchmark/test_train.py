"""``python -m llm.benchmark train`` and ``grpo`` (llm/benchmark/train.py) on the tiny preset,
one layer, a few tokens: the modes run end to end through the command line, their figures
follow from their own timings (tokens/s, MFU, the step's split) and XLA's memory analysis holds
at least the training state. Speed itself is not asserted (measurements, not tests)."""

import json
import math

import pytest

from llm.benchmark.cli import main

PEAK_TFLOPS = 1.0  # stated, so no matmul is timed to find the peak


def test_train_mode_reports_tokens_mfu_memory_and_a_real_update(tmp_path):
    out = tmp_path / "train.json"
    (row,) = main(["train", "--models", "tiny", "--layers", "1", "--rows", "4", "--prompt-len", "8",
                   "--completion-len", "8", "--micro-batches", "2", "--repeats", "1",
                   "--peak-tflops", str(PEAK_TFLOPS), "--out", str(out)])
    assert (row.rows, row.micro_batches, row.layers, row.remat) == (4, 2, 1, "full")
    assert row.update_s > 0 and row.compile_s > 0
    assert row.tokens_per_s == pytest.approx(4 * (8 + 8) / row.update_s)
    assert row.mfu == pytest.approx(6 * row.params * 4 * 16 / row.update_s / (PEAK_TFLOPS * 1e12))
    # float32 weights and two float32 AdamW moments are arguments of the update: >= 12 bytes/param
    assert row.argument_bytes >= 12 * row.params and row.peak_bytes >= row.argument_bytes and row.temp_bytes > 0
    assert math.isfinite(row.loss) and row.grad_norm > 0  # gradients flow through the update
    saved = json.loads(out.read_text())
    assert saved["peak_source"] == "stated (--peak-tflops)" and saved["rows"][0]["tokens_per_s"] == row.tokens_per_s


def test_grpo_mode_splits_a_whole_step(tmp_path):
    out = tmp_path / "grpo.json"
    (row,) = main(["grpo", "--models", "tiny", "--layers", "1", "--lakes", "2", "--group-size", "2",
                   "--prompt-len", "8", "--new-tokens", "8", "--beta", "0.04", "--repeats", "1",
                   "--peak-tflops", str(PEAK_TFLOPS), "--out", str(out)])
    assert row.rows == 4 and row.mu == 1
    parts = (row.sample_s, row.ref_logp_s, row.update_s)
    assert all(p > 0 for p in parts)  # beta > 0: the reference forward is part of the step
    assert sum(parts) <= row.step_s * (1 + 1e-6)
    # the old log-prob forward is not part of the step (the first update is on-policy); timed apart
    assert row.old_logp_s > 0 and row.old_logp_saved == pytest.approx(row.old_logp_s / (row.step_s + row.old_logp_s))
    assert row.sample_tokens_per_s == pytest.approx(4 * 8 / row.sample_s)
    assert row.update_mfu == pytest.approx(6 * row.params * 4 * 16 / row.update_s / (PEAK_TFLOPS * 1e12))
    assert row.compile_s > 0 and row.grad_norm > 0
    assert json.loads(out.read_text())["rows"][0]["step_s"] == row.step_s


def test_settings_are_checked_before_any_model_is_built():
    from llm.benchmark.train import bench_grpo_step, bench_train

    with pytest.raises(ValueError, match="rows=6 must be divisible by micro_batches=4"):
        bench_train("tiny", rows=6, prompt_len=8, completion_len=8, micro_batches=4, peak_flops=1e12)
    with pytest.raises(ValueError, match="remat='some'"):
        bench_train("tiny", rows=4, prompt_len=8, completion_len=8, remat="some", peak_flops=1e12)
    with pytest.raises(ValueError, match="group_size=1 must be >= 2"):
        bench_grpo_step("tiny", lakes=2, group_size=1, prompt_len=8, new_tokens=8, peak_flops=1e12)


def test_pack_mode_times_padded_and_packed_updates_on_pretraining_lakes(tmp_path):
    out = tmp_path / "pack.json"
    result = main(["pack", "--batch", "4", "--rows", "2,1", "--steps", "1", "--out", str(out)])
    assert result["space_configs"] == 3750  # the lakes pretraining draws
    padded, two, one = result["layouts"]
    assert (padded["layout"], padded["rows"], padded["speedup"], padded["dropped"]) == ("padded", 4, 1.0, 0)
    assert two["rows"] == 2 and one["rows"] == 1
    for r in (two, one):
        assert r["step_s"] > 0 and r["speedup"] == pytest.approx(padded["step_s"] / r["step_s"])
        assert r["fill"] == pytest.approx(padded["fill"] * 4 / r["rows"])
    # 4 sequences of 30-256 tokens do not all fit one 256-position row: some are left out and counted
    assert one["dropped"] >= 1 and 0 < padded["fill"] < 1
    assert json.loads(out.read_text())["layouts"][1]["dropped"] == two["dropped"]


def test_prefetch_mode_times_the_warm_start_in_line_and_prefetched(tmp_path, capsys):
    out = tmp_path / "prefetch.json"
    result = main(["prefetch", "--steps", "3", "--batch", "4", "--pack-rows", "2", "--out", str(out)])
    assert result["space_configs"] == 3750 and result["style"] == "crowd"  # pretraining's lakes and trace
    line, ahead = result["ways"]
    assert (line["way"], line["prefetch"], line["speedup"]) == ("in line", False, 1.0)
    assert (ahead["way"], ahead["prefetch"]) == ("prefetched", True)
    for w in (line, ahead):
        assert w["steps_timed"] == 2 and w["step_s"] > 0 and 0 <= w["data_wait_s"] <= w["step_s"]
        assert w["update_s"] <= w["step_s"] and w["wall_s"] > 0
    assert ahead["speedup"] == pytest.approx(line["step_s"] / ahead["step_s"])
    assert line["data_wait_s"] > 0  # in line, every step prepares its own batch first
    assert json.loads(out.read_text())["ways"][1]["prefetch"] is True
    assert "| prefetched |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["prefetch", "--style", "grid"])
