"""Matplotlib pictures of lakes and rollouts (host side, one unbatched lake at a time).

* :func:`plot_lake` draws a lake (region, holes, starts, goals), optionally a state and the
  agents' paths from a :class:`jaxlake.env.Trajectory`, with conflicts marked.
* :func:`animate_rollout` writes an animated GIF of a rollout, one frame per step.
* :func:`plot_lakes` tiles several lakes of a batch into one figure.

Colours: frozen cells light blue, holes dark blue, walls (outside the region) grey; agent
``i`` has colour ``i`` of a qualitative palette; its goal is a ring of that colour with the
lowercase letter; conflicts are marked with a red ``x`` (vertex), ``<>`` (swap) or a red
square outline (blocked) at the agent's cell in the step where its move was cancelled.
"""

from __future__ import annotations

from typing import Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import animation
from matplotlib.patches import Circle, Rectangle

from jaxlake.types import ACTIVE, ARRIVED, ON_GOAL_STAY, Lake, State

FROZEN = "#dcefff"
HOLE = "#1b3a6b"
WALL = "#9a9a9a"


def _palette(n: int) -> list:
    cmap = plt.get_cmap("tab20" if n > 10 else "tab10")
    return [cmap(i % cmap.N) for i in range(max(n, 1))]


def _np(lake: Lake) -> dict:
    if np.ndim(lake.num_agents) != 0:
        raise ValueError(
            f"plot_lake takes one unbatched lake; got num_agents with shape {np.shape(lake.num_agents)} "
            "(index the batch first, e.g. jax.tree.map(lambda x: x[i], lakes))"
        )
    return {
        "holes": np.asarray(lake.holes),
        "region": np.asarray(lake.region),
        "starts": np.asarray(lake.starts),
        "goals": np.asarray(lake.goals),
        "n": int(lake.num_agents),
        "on_goal": int(lake.on_goal),
    }


def _draw_board(ax, d: dict) -> None:
    rows = int(d["region"].any(axis=1).sum())
    cols = int(d["region"].any(axis=0).sum())
    for r in range(rows):
        for c in range(cols):
            color = HOLE if d["holes"][r, c] else FROZEN
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, facecolor=color, edgecolor="white", lw=1))
    ax.add_patch(Rectangle((-0.5, -0.5), cols, rows, fill=False, edgecolor=WALL, lw=3))
    ax.set_xlim(-0.6, cols - 0.4)
    ax.set_ylim(rows - 0.4, -0.6)
    ax.set_aspect("equal")
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    ax.tick_params(length=0, labelsize=7)
    for spine in ax.spines.values():
        spine.set_visible(False)


def _draw_agents(ax, d: dict, pos: np.ndarray, status: Optional[np.ndarray], all_goals: bool = False) -> None:
    colors = _palette(d["n"])
    for i in range(d["n"]):
        letter = chr(ord("A") + i)
        on_board = True if status is None else status[i] == ACTIVE or (
            status[i] == ARRIVED and d["on_goal"] == ON_GOAL_STAY
        )
        goal_shown = all_goals or status is None or status[i] == ACTIVE
        gr, gc = d["goals"][i]
        if goal_shown:
            ax.add_patch(Circle((gc, gr), 0.38, fill=False, edgecolor=colors[i], lw=2.5))
            ax.text(gc, gr, letter.lower(), ha="center", va="center", fontsize=9, color=colors[i])
        if on_board:
            r, c = pos[i]
            ax.add_patch(Circle((c, r), 0.3, facecolor=colors[i], edgecolor="black", lw=0.8))
            ax.text(c, r, letter, ha="center", va="center", fontsize=9, color="white", weight="bold")


def plot_lake(
    lake: Lake,
    state: Optional[State] = None,
    *,
    trajectory=None,
    upto: Optional[int] = None,
    ax=None,
    title: Optional[str] = None,
):
    """Draw one lake; with ``state`` its agents where they are; with ``trajectory`` their paths.

    Args:
      lake: an unbatched :class:`Lake`.
      state: optional :class:`State`; default: agents at their starts.
      trajectory: optional :class:`jaxlake.env.Trajectory` of a rollout of this lake; paths
        (from the starts) and conflict markers are drawn up to step ``upto`` (default all).
      ax: a matplotlib axes to draw into (a new figure otherwise).
      title: axes title.

    Returns:
      The matplotlib axes.
    """
    d = _np(lake)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.6 * d["region"].any(axis=0).sum() + 1, 0.6 * d["region"].any(axis=1).sum() + 1))
    _draw_board(ax, d)
    pos, status = d["starts"], None
    if trajectory is not None:
        tpos = np.asarray(trajectory.pos)
        k = tpos.shape[0] if upto is None else int(upto)
        colors = _palette(d["n"])
        paths = np.concatenate([d["starts"][None], tpos[:k]], axis=0)  # [k+1, A, 2]
        tstatus = np.asarray(trajectory.status)
        for i in range(d["n"]):
            # Stop the path once the agent left ACTIVE (it keeps its last pos afterwards).
            alive = np.concatenate([[True], tstatus[:k, i] == ACTIVE])
            last = int(np.argmin(alive)) if not alive.all() else k
            seg = paths[: last + 1, i]
            jitter = (i - d["n"] / 2) * 0.04
            ax.plot(seg[:, 1] + jitter, seg[:, 0] + jitter, "-", color=colors[i], lw=2, alpha=0.7)
        info = trajectory.info
        prev = paths[:-1]
        for name, marker in (("vertex_conflict", "x"), ("swap_conflict", "$<>$"), ("blocked", "s")):
            flags = np.asarray(getattr(info, name))[:k]
            for s, i in zip(*np.nonzero(flags[:, : d["n"]])):
                r, c = prev[s, i]
                ax.plot(c, r, linestyle="none", marker=marker, ms=14, mfc="none", mec="red", mew=2)
        if k > 0:
            pos, status = tpos[k - 1], tstatus[k - 1]
    if state is not None:
        pos, status = np.asarray(state.pos), np.asarray(state.status)
    if trajectory is not None:  # mark the starts, keep every goal visible
        colors = _palette(d["n"])
        for i in range(d["n"]):
            r, c = d["starts"][i]
            ax.add_patch(Rectangle((c - 0.2, r - 0.2), 0.4, 0.4, facecolor="none", edgecolor=colors[i], lw=1.5, ls="--"))
    _draw_agents(ax, d, pos, status, all_goals=trajectory is not None)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def plot_lakes(lakes: Lake, indices: Sequence[int], *, cols: int = 4, titles: Optional[Sequence[str]] = None):
    """Tile the lakes ``indices`` of a batched :class:`Lake` into one figure; returns it."""
    import jax

    indices = list(indices)
    rows = (len(indices) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 3 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for j, idx in enumerate(indices):
        ax = axes.flat[j]
        ax.axis("on")
        one = jax.tree_util.tree_map(lambda x: x[idx], lakes)
        plot_lake(one, ax=ax, title=None if titles is None else titles[j])
    fig.tight_layout()
    return fig


def animate_rollout(lake: Lake, trajectory, path: str, *, fps: int = 3, title: str = "") -> str:
    """Write an animated GIF of a rollout to ``path`` (frame 0 = the start); returns ``path``.

    The GIF is written to a temporary file beside ``path`` and renamed, so no half-written
    file is left if drawing fails.
    """
    import os
    import tempfile

    steps = int(np.asarray(trajectory.pos).shape[0])
    last = int(np.asarray(trajectory.t)[-1]) if steps else 0  # stop once the episode is over
    frames = max(1, min(steps, last if last > 0 else steps) + 1)
    fig, ax = plt.subplots(figsize=(4, 4))

    def draw(k):
        ax.clear()
        plot_lake(lake, trajectory=trajectory, upto=k, ax=ax, title=f"{title} t={k}".strip())

    anim = animation.FuncAnimation(fig, draw, frames=frames)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".gif", dir=folder)
    os.close(fd)
    try:
        anim.save(tmp, writer=animation.PillowWriter(fps=fps))
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
