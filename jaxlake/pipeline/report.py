"""Reports over pipeline runs: ``python -m jaxlake.report <run or multirun dir>``.

Finds every run under the directory -- a run directory is one with ``stage_<k>/eval.json``
files (``runs/<experiment>/``); a Hydra multirun directory is followed through the
``jaxlake_run.json`` pointer each job leaves in its output folder -- and writes, into the
directory (or ``--out``):

* ``report.md``: a markdown table engineer x stage of the aggregate score (mean success over
  the held-out suite) as ``mean ± 95 % CI (n seeds)``, the same for every decoding mode
  found, and per-dimension tables of the last stage;
* ``score_per_stage.png``: score per stage per engineer (mean with 95 % CI bars);
* ``breakdown.png``: last-stage score per value of every suite dimension, per engineer.

The table is also printed. The CI is Student's t interval over seeds (``n = 1``: no CI).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from jaxlake.io import write_text
from jaxlake.stats import mean_ci

_STAGE_DIR = re.compile(r"^stage_(\d+)$")
POINTER_FILE = "jaxlake_run.json"
RUN_FILE = "run.json"


def _fmt_ci(m: Optional[float], h: Optional[float], n: int) -> str:
    if m is None:
        return "–"
    if h is None:
        return f"{m:.3f} (n={n})"
    return f"{m:.3f} ± {h:.3f} (n={n})"


# ============================================================================ discovery
def _is_run_dir(path: Path) -> bool:
    return any(_STAGE_DIR.match(p.name) and (p / "eval.json").is_file() for p in path.iterdir() if p.is_dir())


def find_runs(root: Path) -> list[Path]:
    """Run directories under ``root`` (itself included), following multirun pointers.

    Stage folders (checkpoints) are not descended into.
    """
    import os

    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root} does not exist")
    found: dict[Path, None] = {}
    pointers: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if POINTER_FILE in filenames:
            pointers.append(here / POINTER_FILE)
        stage_dirs = [d for d in dirnames if _STAGE_DIR.match(d)]
        if any((here / d / "eval.json").is_file() for d in stage_dirs):
            found[here.resolve()] = None
        dirnames[:] = sorted(d for d in dirnames if not _STAGE_DIR.match(d) and d not in (".hydra",))
    for pointer in sorted(pointers):
        try:
            target = Path(json.loads(pointer.read_text())["run_dir"])
        except (OSError, ValueError, KeyError):
            continue
        if target.is_dir() and _is_run_dir(target):
            found[target.resolve()] = None
    return list(found)


def load_run(run_dir: Path) -> dict:
    """A run's engineer, seed and per-stage eval results (``{stage: eval.json}``)."""
    run_dir = Path(run_dir)
    meta: dict[str, Any] = {}
    if (run_dir / RUN_FILE).is_file():
        meta = json.loads((run_dir / RUN_FILE).read_text())
    stages: dict[int, dict] = {}
    for p in sorted(run_dir.iterdir()):
        m = _STAGE_DIR.match(p.name)
        if m and (p / "eval.json").is_file():
            stages[int(m.group(1))] = json.loads((p / "eval.json").read_text())
    engineer = meta.get("engineer")
    if engineer is None:
        first = run_dir / "stage_1" / "engineer.json"
        engineer = json.loads(first.read_text()).get("engineer") if first.is_file() else "unknown"
    return {
        "dir": str(run_dir),
        "experiment": meta.get("experiment", run_dir.name),
        "engineer": engineer,
        "seed": meta.get("seed", 0),
        "stages": stages,
    }


# ============================================================================ tables
def collect(runs: Sequence[dict], mode: str) -> dict:
    """``{engineer: {stage: [score per seed]}}`` for one decoding mode."""
    table: dict[str, dict[int, list]] = {}
    for r in runs:
        for stage, ev in r["stages"].items():
            res = (ev.get("modes") or {}).get(mode)
            if res and res.get("score") is not None:
                table.setdefault(r["engineer"], {}).setdefault(stage, []).append(float(res["score"]))
    return table


def score_table(runs: Sequence[dict], mode: str = "greedy") -> str:
    """Markdown table engineer x stage, ``mean ± 95 % CI (n)``."""
    data = collect(runs, mode)
    stages = sorted({s for per in data.values() for s in per})
    if not stages:
        return f"(no {mode} scores found)"
    head = "| engineer | " + " | ".join(f"stage {s}" for s in stages) + " |"
    sep = "|---|" + "---|" * len(stages)
    rows = [head, sep]
    for eng in sorted(data):
        cells = [_fmt_ci(*mean_ci(data[eng].get(s, []))) for s in stages]
        rows.append(f"| {eng} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _last_stage_breakdown(runs: Sequence[dict], mode: str) -> dict:
    """``{dim: {value: {engineer: [score per seed]}}}`` at each run's last stage."""
    out: dict[str, dict[str, dict[str, list]]] = {}
    for r in runs:
        if not r["stages"]:
            continue
        ev = r["stages"][max(r["stages"])]
        res = (ev.get("modes") or {}).get(mode) or {}
        for dim, vals in (res.get("by_dim") or {}).items():
            for v, m in vals.items():
                if m.get("score") is not None:
                    out.setdefault(dim, {}).setdefault(v, {}).setdefault(r["engineer"], []).append(float(m["score"]))
    return out


def breakdown_tables(runs: Sequence[dict], mode: str = "greedy") -> str:
    parts = []
    for dim, vals in _last_stage_breakdown(runs, mode).items():
        engineers = sorted({e for per in vals.values() for e in per})
        head = f"| {dim} | " + " | ".join(engineers) + " |"
        rows = [head, "|---|" + "---|" * len(engineers)]
        for v, per in vals.items():
            rows.append(f"| {v} | " + " | ".join(_fmt_ci(*mean_ci(per.get(e, []))) for e in engineers) + " |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


def modes_of(runs: Sequence[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for r in runs:
        for ev in r["stages"].values():
            for m in ev.get("modes") or {}:
                seen[m] = None
    order = [m for m in ("greedy", "sampled") if m in seen] + [m for m in seen if m not in ("greedy", "sampled")]
    return order


# ============================================================================ plots
def plot_scores(runs: Sequence[dict], path: Path, mode: str = "greedy") -> Path:
    """Score per stage per engineer (mean, 95 % CI error bars) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = collect(runs, mode)
    fig, ax = plt.subplots(figsize=(6 + 1.6 * (len(data) > 4), 4))
    for eng in sorted(data):
        stages = sorted(data[eng])
        stats = [mean_ci(data[eng][s]) for s in stages]
        ax.errorbar(stages, [m for m, _, _ in stats], yerr=[h or 0.0 for _, h, _ in stats], marker="o", capsize=3, label=eng)
    ax.set_xlabel("stage")
    ax.set_ylabel(f"aggregate score ({mode} success)")
    top = max([m + (h or 0.0) for per in data.values() for m, h, _ in (mean_ci(v) for v in per.values()) if m is not None] or [1.0])
    ax.set_ylim(-0.02, 1.02 if top > 0.5 else max(0.1, 1.15 * top))  # low scores: zoom in
    ax.set_title("Held-out score per stage")
    if data:
        if len(data) > 4:  # many engineers: the legend beside the axes, not over the lines
            ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
        else:
            ax.legend()
        all_stages = sorted({s for per in data.values() for s in per})
        ax.set_xticks(all_stages)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_breakdown(runs: Sequence[dict], path: Path, mode: str = "greedy") -> Path:
    """Last-stage score per dimension value, grouped by engineer, one panel per dimension."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = _last_stage_breakdown(runs, mode)
    dims = list(data) or ["(none)"]
    fig, axes = plt.subplots(1, len(dims), figsize=(4 * len(dims), 3.5), squeeze=False)
    for ax, dim in zip(axes[0], dims):
        vals = data.get(dim, {})
        engineers = sorted({e for per in vals.values() for e in per})
        width = 0.8 / max(len(engineers), 1)
        for j, eng in enumerate(engineers):
            xs, ys, es = [], [], []
            for i, v in enumerate(vals):
                m, h, _ = mean_ci(vals[v].get(eng, []))
                if m is not None:
                    xs.append(i + (j - (len(engineers) - 1) / 2) * width)
                    ys.append(m)
                    es.append(h or 0.0)
            ax.bar(xs, ys, width=width, yerr=es, capsize=2, label=eng)
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels(list(vals))
        ax.set_xlabel(dim)
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("score (last stage)")
    if data:
        axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ============================================================================ report
def build_report(root: Path, out: Optional[Path] = None, plots: bool = True) -> str:
    """Write ``report.md`` (+ PNGs) for the runs under ``root``; return the markdown."""
    root = Path(root)
    runs = [load_run(d) for d in find_runs(root)]
    if not runs:
        raise FileNotFoundError(
            f"no runs under {root}: expected runs/<experiment>/stage_<k>/eval.json "
            "(made by `python -m jaxlake.run`) or a multirun folder with jaxlake_run.json files"
        )
    out = Path(out) if out is not None else (root if root.is_dir() else root.parent)
    out.mkdir(parents=True, exist_ok=True)
    modes = modes_of(runs) or ["greedy"]
    lines = [
        f"# jaxlake report: {root}",
        "",
        f"{len(runs)} run(s): " + ", ".join(sorted(f"{r['engineer']} (seed {r['seed']})" for r in runs)),
        "",
        "Aggregate score = mean success over the held-out suite; mean ± 95 % CI over seeds (n seeds).",
    ]
    for mode in modes:
        lines += ["", f"## Score per stage ({mode})", "", score_table(runs, mode)]
    bd = breakdown_tables(runs, modes[0])
    if bd:
        lines += ["", f"## Per-dimension score at the last stage ({modes[0]})", "", bd]
    if plots:
        plot_scores(runs, out / "score_per_stage.png", modes[0])
        plot_breakdown(runs, out / "breakdown.png", modes[0])
        lines += ["", "![score per stage](score_per_stage.png)", "", "![per-dimension breakdown](breakdown.png)"]
    text = "\n".join(lines) + "\n"
    write_text(out / "report.md", text)
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxlake.report",
        description="Markdown table (engineer x stage, mean ± 95% CI over seeds) and PNG plots for pipeline runs.",
    )
    parser.add_argument("root", type=Path, help="a run directory (runs/<experiment>) or a multirun directory")
    parser.add_argument("--out", type=Path, default=None, help="where to write report.md and the PNGs (default: root)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = parser.parse_args(argv)
    try:
        text = build_report(args.root, args.out, plots=not args.no_plots)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
