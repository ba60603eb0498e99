"""Report over synthetic run folders: CI arithmetic, table, plots, multirun pointers."""

import json
import math

import pytest

from jaxlake.pipeline.report import build_report, find_runs, main, score_table, load_run
from jaxlake.stats import mean_ci


def test_mean_ci_hand_computed():
    m, h, n = mean_ci([0.2, 0.4, 0.6])
    assert (m, n) == (pytest.approx(0.4), 3)
    assert h == pytest.approx(4.302653 * 0.2 / math.sqrt(3), rel=1e-6)  # t(2)
    assert mean_ci([0.5]) == (0.5, None, 1)
    assert mean_ci([]) == (None, None, 0)
    m, h, n = mean_ci([0.0] * 40 + [1.0] * 40)   # t(79) = 1.99045, not the normal 1.96
    assert h == pytest.approx(1.990450 * math.sqrt(0.5 * 0.5 * 80 / 79) / math.sqrt(80), rel=1e-6)


def fake_run(root, name, engineer, seed, scores, pointer_dir=None):
    run = root / name
    for k, (g, s) in enumerate(scores, start=1):
        d = run / f"stage_{k}"
        d.mkdir(parents=True)
        by_dim = {"size": {"4": {"score": g, "n": 2}, "6": {"score": g / 2, "n": 2}}}
        (d / "eval.json").write_text(json.dumps({"modes": {"greedy": {"score": g, "by_dim": by_dim},
                                                           "sampled": {"score": s, "by_dim": by_dim}}}))
        (d / "checkpoint").mkdir()
    (run / "run.json").write_text(json.dumps({"engineer": engineer, "seed": seed, "experiment": name}))
    if pointer_dir is not None:
        pointer_dir.mkdir(parents=True)
        (pointer_dir / "jaxlake_run.json").write_text(json.dumps({"run_dir": str(run)}))
    return run


def test_table_plots_and_pointers(tmp_path, capsys):
    runs = tmp_path / "runs"
    fake_run(runs, "a", "heuristic", 0, [(0.2, 0.1), (0.4, 0.3)])
    fake_run(runs, "b", "heuristic", 1, [(0.4, 0.1), (0.6, 0.3)])
    elsewhere = fake_run(tmp_path / "elsewhere", "c", "fixed", 0, [(0.5, 0.5), (0.5, 0.5)],
                         pointer_dir=runs / "multirun" / "0")
    found = find_runs(runs)
    assert sorted(p.name for p in found) == ["a", "b", "c"] and elsewhere.resolve() in found
    runs_loaded = [load_run(p) for p in found]
    table = score_table(runs_loaded, "greedy")
    h = 12.706 * math.sqrt(0.02) / math.sqrt(2)    # sd of (0.2, 0.4) = sqrt(0.02)
    assert table.splitlines()[0] == "| engineer | stage 1 | stage 2 |"
    assert f"| heuristic | 0.300 ± {h:.3f} (n=2) | 0.500 ± {h:.3f} (n=2) |" in table
    assert "| fixed | 0.500 (n=1) | 0.500 (n=1) |" in table
    assert main([str(runs)]) == 0
    out = capsys.readouterr().out
    assert "## Score per stage (greedy)" in out and "## Score per stage (sampled)" in out
    assert "## Per-dimension score at the last stage (greedy)" in out and "| 6 | 0.250 (n=1) |" in out
    for f in ("report.md", "score_per_stage.png", "breakdown.png"):
        assert (runs / f).stat().st_size > 0
    assert main([str(tmp_path / "nothing_here")]) == 2
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no runs under"):
        build_report(tmp_path / "empty")
