"""The matplotlib viewer: pictures of lakes, paths with conflict marks, rollout GIFs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from jaxlake.env import rollout
from jaxlake.text import parse_lake, parse_plan
from jaxlake.viewer import animate_rollout, plot_lake, plot_lakes

LAKE = "A . . a\n. ~ . .\nB . b .\n. . . ."


def _rollout(text, plan_text, steps=6):
    lake = parse_lake(text, max_steps=steps)
    acts, malformed = parse_plan(plan_text, int(lake.num_agents), steps)
    assert not malformed
    plan = np.zeros((lake.max_agents, steps), np.int32)
    plan[: acts.shape[0]] = acts
    return lake, rollout(jax.random.PRNGKey(0), lake, jnp.asarray(plan))


def test_plot_lake_draws_board_agents_and_paths(tmp_path):
    lake, ro = _rollout(LAKE, "A: R R R\nB: R R")
    ax = plot_lake(lake)
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == ["A", "B", "a", "b"]
    ax = plot_lake(lake, trajectory=ro.trajectory)
    assert len(ax.lines) == 2  # one path per agent, no conflict marks
    out = tmp_path / "lake.png"
    ax.figure.savefig(out)
    assert Image.open(out).size[0] > 50


def test_conflicts_are_marked():
    # A and B both want the middle cell: a vertex conflict on step 1.
    lake, ro = _rollout("A . B\n. . .\na . b", "A: R\nB: L")
    assert bool(ro.trajectory.info.vertex_conflict[0, 0])
    ax = plot_lake(lake, trajectory=ro.trajectory)
    assert len(ax.lines) == 2 + 2  # two paths and one red mark per cancelled agent


def test_swap_conflicts_are_marked_and_animate():
    lake, ro = _rollout("A B\nb a", "A: R\nB: L", steps=3)
    assert bool(ro.trajectory.info.swap_conflict[0, 0]) and bool(ro.trajectory.info.swap_conflict[0, 1])
    ax = plot_lake(lake, trajectory=ro.trajectory)
    assert len(ax.lines) == 2 + 2


def test_animate_rollout_writes_gif_atomically(tmp_path):
    lake, ro = _rollout(LAKE, "A: R R R\nB: R R")
    path = animate_rollout(lake, ro.trajectory, str(tmp_path / "sub" / "ro.gif"))
    img = Image.open(path)
    assert img.format == "GIF" and img.n_frames == 4  # start + 3 steps until all arrived
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["ro.gif"]


def test_batched_lake_is_rejected_and_tiles_work():
    lake = parse_lake(LAKE)
    batch = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), lake)
    with pytest.raises(ValueError, match="unbatched"):
        plot_lake(batch)
    fig = plot_lakes(batch, [0, 1], cols=2, titles=["x", "y"])
    assert len(fig.axes) == 2
