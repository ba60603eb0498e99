"""PNG learning curves from a training metrics file (``metrics.jsonl``), matplotlib Agg.

Usage: ``python -m llm.training.plots runs/<exp>/stage_1/metrics.jsonl [out.png]``.
"""

from __future__ import annotations

import io
import math
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from jaxlake.io import write_bytes
from jaxlake.metrics import read_rows

#: (title, metric keys) of the GRPO panels; missing keys are skipped.
GRPO_PANELS = (
    ("reward", ("reward",)),
    ("success / arrival", ("success", "arrived_rate")),
    ("failure rates", ("fall_rate", "timeout_rate", "malformed_rate", "conflict_rate")),
    ("reward terms", ("term/arrived", "term/all_arrived", "term/fell", "term/conflict", "term/malformed", "term/efficiency")),
    ("KL / entropy", ("kl", "last/kl", "entropy")),
    ("clipping / zero-advantage groups", ("clip_frac", "last/clip_frac", "zero_adv_share")),
    ("dynamic sampling (groups, rounds)", ("kept_groups", "informative_groups", "sampling_rounds",
                                           "update_skipped")),
    ("completion length (tokens)", ("completion_len",)),
    ("throughput (tokens/s)", ("tokens_per_s", "train_tokens_per_s")),
)
WARMSTART_PANELS = (
    ("warm start NLL", ("nll",)),
    ("warm start token accuracy", ("token_acc",)),
)


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Rows of a metrics JSONL file (a torn last line is ignored)."""
    return read_rows(path)


def _series(rows: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(int(r.get("step", len(xs) + 1)))
            ys.append(float(v))
    return xs, ys


def _smooth(ys: list[float], window: int) -> list[float]:
    if window <= 1 or len(ys) < 3:
        return ys
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_panels(rows: list[dict]) -> list[tuple[str, tuple, list]]:
    """``(title, keys, rows)`` of every panel with data: the warm-start panels over its rows,
    the GRPO panels over the GRPO rows (a panel none of whose keys has a value is left out)."""
    ws = [r for r in rows if r.get("phase") == "warmstart"]
    gr = [r for r in rows if r.get("phase") == "grpo"]
    panels = [(t, k, ws) for t, k in WARMSTART_PANELS if ws] + [(t, k, gr) for t, k in GRPO_PANELS if gr]
    return [(t, keys, rs) for t, keys, rs in panels if any(_series(rs, k)[0] for k in keys)]


def plot_metrics(path: str | os.PathLike, out: Optional[str | os.PathLike] = None, smooth: int = 5) -> Path:
    """Draw the learning curves of ``path`` into ``out`` (default: ``curves.png`` beside it).

    Panels: warm-start NLL and accuracy (if present), then GRPO reward, success, failure
    rates, reward terms, KL / entropy, clipping, completion lengths and throughput; held-out
    evaluations (``eval`` inside GRPO rows) are drawn as points on the success panel.
    Returns the PNG path. Raises ``ValueError`` when the file holds no rows.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(path)
    if not rows:
        raise ValueError(f"metrics file {str(path)!r} has no rows to plot")
    out = Path(out) if out is not None else Path(path).with_name("curves.png")
    panels = plot_panels(rows)
    if not panels:
        raise ValueError(f"metrics file {str(path)!r} has no known metric to plot")
    cols = 2
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 3.2 * nrows), squeeze=False)
    for ax, (title, keys, rs) in zip(axes.flat, panels):
        for k in keys:
            xs, ys = _series(rs, k)
            if not xs:
                continue
            line, = ax.plot(xs, _smooth(ys, smooth), label=k)
            if smooth > 1 and len(ys) > 2:
                ax.plot(xs, ys, color=line.get_color(), alpha=0.25, linewidth=0.8)
        if title.startswith("success"):
            ev = [(int(r["step"]), r["eval"]["success"]) for r in rs if isinstance(r.get("eval"), dict)
                  and "success" in r["eval"]]
            if ev:
                ax.plot([e[0] for e in ev], [e[1] for e in ev], "k^", label="held-out success")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    write_bytes(out, buf.getvalue())
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or len(argv) > 2:
        print("usage: python -m llm.training.plots METRICS.jsonl [OUT.png]", file=sys.stderr)
        raise SystemExit(2)
    print(plot_metrics(argv[0], argv[1] if len(argv) > 1 else None))


if __name__ == "__main__":
    main()
