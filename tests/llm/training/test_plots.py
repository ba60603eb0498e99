"""Learning curves of a stage (llm/training/plots.py): which panels a metrics file gets, and the PNG."""

from __future__ import annotations

import json

from llm.training.plots import plot_metrics, plot_panels


def _grpo_row(step: int, dynamic: bool) -> dict:
    row = {"phase": "grpo", "step": step, "reward": 0.1 * step, "success": 0.2, "kl": 0.0, "completion_len": 12.0}
    if dynamic:  # DAPO dynamic sampling's metrics (llm/training/grpo_loop.py)
        row.update(sampling_rounds=2, informative_groups=3, kept_groups=3, update_skipped=int(step == 1))
    return row


def test_dynamic_sampling_gets_its_panel_and_the_png_is_written(tmp_path):
    rows = [{"phase": "warmstart", "step": 1, "nll": 2.0, "token_acc": 0.1}] + [_grpo_row(s, True) for s in (1, 2, 3)]
    titles = [t for t, _, _ in plot_panels(rows)]
    assert "dynamic sampling (groups, rounds)" in titles and "warm start NLL" in titles
    assert "dynamic sampling (groups, rounds)" not in [t for t, _, _ in plot_panels([_grpo_row(1, False)])]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot_metrics(path)
    assert out == tmp_path / "curves.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
