"""Pictures used by README.md and docs/rules.md: ``python docs/figures.py`` rewrites ``docs/img/*.png``.

``game.png``: one lake drawn by :mod:`jaxlake.viewer`, twice. Left, each agent follows the
shortest path it would take alone (planned with the other agents removed), so both reach
the gap at once and their moves are cancelled (conflict marks); right, the reference
planner's joint plan, where one agent waits.

``conflicts.png``: the one-step examples of docs/rules.md#conflicts (read from that page's
```` ```step```` blocks, so the picture always shows what the text says and the tests run),
each drawn after its step with the moves that were cancelled marked.
"""

import re
from pathlib import Path

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jaxlake.env import rollout  # noqa: E402
from jaxlake.planner import solve  # noqa: E402
from jaxlake.text import format_plan, parse_lake, parse_plan  # noqa: E402
from jaxlake.viewer import plot_lake  # noqa: E402

OUT = Path(__file__).resolve().parent / "img"
RULES = Path(__file__).resolve().parent / "rules.md"
LAKE = """\
A . . . B
~ ~ . ~ ~
b . . . a"""


def alone_plan(text: str, letter: str, max_steps: int) -> np.ndarray:
    """Agent ``letter``'s shortest plan with every other agent and goal removed."""
    keep = {letter, letter.lower()}
    cells = [[c if (c in keep or not c.isalpha()) else "." for c in row.split()] for row in text.splitlines()]
    solo = "\n".join(" ".join("A" if c == letter else "a" if c == letter.lower() else c for c in row) for row in cells)
    return np.asarray(solve(parse_lake(solo, max_steps=max_steps)).actions)[0]


def conflict_examples() -> list[tuple[str, str]]:
    """``(grid, plan)`` of each ```` ```step```` block in the Conflicts section of docs/rules.md."""
    text = RULES.read_text(encoding="utf-8")
    section = text[text.index("### Conflicts"): text.index("### Holes")]
    examples = []
    for block in re.findall(r"^```step[^\n]*\n(.*?)^```", section, re.S | re.M):
        cols = [[part.strip() for part in line.split("|")] for line in block.splitlines() if not line.startswith("=")]
        examples.append(("\n".join(c[0] for c in cols if c[0]), "\n".join(c[1] for c in cols if c[1])))
    return examples


CONFLICT_TITLES = ("vertex", "swap", "blocked queue", "following", "vertex, then blocked", "rotation")


def conflicts_figure() -> None:
    examples = conflict_examples()
    if len(examples) != len(CONFLICT_TITLES):
        raise SystemExit(f"docs/rules.md#conflicts has {len(examples)} examples, expected {len(CONFLICT_TITLES)}")
    fig, axes = plt.subplots(1, len(examples), figsize=(2.6 * len(examples), 3.0))
    for ax, (grid, plan), title in zip(axes, examples, CONFLICT_TITLES):
        lake = parse_lake(grid, max_steps=4, max_height=4, max_width=4, max_agents=4)
        n = int(lake.num_agents)
        actions = np.zeros((4, 1), np.int32)
        actions[:n] = parse_plan(plan, n, 1)[0]
        out = rollout(jax.random.PRNGKey(0), lake, actions)
        plot_lake(lake, out.final_state, trajectory=out.trajectory, ax=ax, title=title + "\n" + plan.replace("\n", "  "))
    fig.tight_layout()
    fig.savefig(OUT / "conflicts.png", dpi=90)
    plt.close(fig)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    conflicts_figure()
    lake = parse_lake(LAKE, max_steps=12)
    sol = solve(lake)
    key = jax.random.PRNGKey(0)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    naive = np.zeros_like(np.asarray(sol.actions))
    for i in range(int(lake.num_agents)):
        naive[i] = alone_plan(LAKE, "ABCDEFGH"[i], int(lake.max_steps))
    for ax, plan, title in ((axes[0], naive, "each agent's own shortest path"), (axes[1], np.asarray(sol.actions), "reference planner")):
        out = rollout(key, lake, plan)
        plot_lake(lake, out.final_state, trajectory=out.trajectory, ax=ax,
                  title=f"{title}: success {bool(out.outcome.success)}")
    fig.tight_layout()
    fig.savefig(OUT / "game.png", dpi=90)
    print("alone:\n" + format_plan(naive, num_agents=int(lake.num_agents)))
    print("planner:\n" + format_plan(sol.actions, num_agents=int(lake.num_agents)))


if __name__ == "__main__":
    main()
