"""The learning curve: success against environment steps, from the run's ``metrics.jsonl`` rows."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Mapping, Sequence

from jaxlake.io import write_bytes

__all__ = ["learning_curve"]


def learning_curve(rows: Sequence[Mapping], path: str | os.PathLike, *, title: str = "IPPO",
                   target: float = 0.9) -> Path:
    """Write a PNG of the greedy held-out success and the sampled training success (one point
    per chunk) against lake steps, marking the first chunk at ``target`` with its process CPU
    seconds, atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["env_steps"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    ax.plot(steps, [r["heldout"]["success"] for r in rows], marker="o", ms=3, label="held-out, greedy")
    trained = [r for r in rows if r.get("train", {}).get("success") is not None]
    ax.plot([r["env_steps"] / 1e6 for r in trained], [r["train"]["success"] for r in trained], ls="--",
            label="training episodes, sampled")
    ax.axhline(target, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("lake steps (millions)")
    ax.set_ylabel("success (every agent home)")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    if rows:
        last = rows[-1]
        ax.set_title(f"{title}\n{last['heldout']['success']:.3f} held-out after {last['env_steps'] / 1e6:.2f}M steps, "
                     f"{last['cpu_s']:.0f} CPU s", fontsize=9)
        hit = next((r for r in rows if r["step"] > 0 and r["heldout"]["success"] >= target), None)
        if hit is not None:
            ax.axvline(hit["env_steps"] / 1e6, color="grey", lw=0.8, ls=":")
            ax.annotate(f"{target:g} after {hit['cpu_s']:.0f} CPU s", (hit["env_steps"] / 1e6, 0.05), fontsize=8,
                        xytext=(4, 0), textcoords="offset points")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return write_bytes(path, buf.getvalue())

