"""Plan baselines: a floor and a ceiling beside every score a policy gets on a held-out suite.

* ``straight``: every agent walks straight to its goal, the rows first and then the columns,
  blind to holes and to the other agents. The floor: a policy that has learned where the
  goals are and nothing of the lake scores about this.
* ``alone``: every agent walks one shortest path to its own goal, as if it were alone on the
  lake (breadth-first distances over frozen cells: holes are avoided, the other agents are
  not). What a policy that reads the holes but does not coordinate would write; conflicts and
  blocked queues are what it loses.
* ``reference``: the reference planner's collision-free joint plan
  (:func:`jaxlake.planner.solve`); where it finds none, the lake counts as failed. It is a
  ceiling in practice, not a bound (prioritized planning is not complete).

All three go through the same path as a policy's answer: :func:`jaxlake.text.format_plan`,
then :func:`jaxlake.suite.score_texts` (parse, play in the simulator, score). A suite's
scores are the mean success over its lakes, the aggregate score a trained policy gets.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jaxlake.planner import bfs_distances, lake_arrays, solve_batch
from jaxlake.suite import Suite, described_lakes, metrics, score_texts, unbatch
from jaxlake.text import format_plan
from jaxlake.types import ACTION_DELTAS, DOWN, LEFT, RIGHT, STAY, UP, Lake

#: The baselines :func:`suite_baselines` scores, in the order tables show them.
NAMES = ("straight", "alone", "reference")
#: What a table says each baseline is.
LABELS = {"straight": "straight to the goal (rows, then columns; blind)",
          "alone": "each agent's shortest path, alone", "reference": "reference planner"}


def straight_plan(lake: Lake, horizon: int | None = None) -> np.ndarray:
    """``[max_agents, T]`` actions: each agent moves along its goal's rows first, then its
    columns, the Manhattan distance in all, ignoring holes and the other agents (cut at
    ``T``: ``horizon``, default ``lake.max_steps``). One unbatched lake."""
    d = lake_arrays(lake)
    T = d["max_steps"] if horizon is None else int(horizon)
    plan = np.full((d["starts"].shape[0], T), STAY, dtype=np.int32)
    for i in range(d["num_agents"]):
        (r, c), (gr, gc) = (tuple(int(x) for x in d[k][i]) for k in ("starts", "goals"))
        moves = [DOWN if gr > r else UP] * abs(gr - r) + [RIGHT if gc > c else LEFT] * abs(gc - c)
        plan[i, :min(len(moves), T)] = moves[:T]
    return plan


def straight_blocked(lakes) -> np.ndarray:
    """``[N]`` bool: some agent's straight walk (rows first, then columns: the plan of
    :func:`straight_plan`) steps on a hole of its batched lake. Vectorised over the batch and
    its agents (the warm start draws its blocked share of a batch with it)."""
    holes = np.asarray(lakes.holes, bool)                       # [N, H, W]
    starts, goals = np.asarray(lakes.starts), np.asarray(lakes.goals)  # [N, A, 2]
    n, h, w = holes.shape
    active = np.arange(starts.shape[1])[None, :] < np.asarray(lakes.num_agents).reshape(n, 1)
    r, c, gr, gc = starts[..., 0], starts[..., 1], goals[..., 0], goals[..., 1]
    rows, cols = np.arange(h)[None, None, :], np.arange(w)[None, None, :]
    # the row leg: column c, rows strictly after r up to gr; then the column leg: row gr, columns after c up to gc
    on_rows = (rows - r[..., None]) * np.sign(gr - r)[..., None]
    on_rows = (on_rows > 0) & (on_rows <= np.abs(gr - r)[..., None])
    on_cols = (cols - c[..., None]) * np.sign(gc - c)[..., None]
    on_cols = (on_cols > 0) & (on_cols <= np.abs(gc - c)[..., None])
    lake = np.arange(n)[:, None]
    column = holes[lake, :, c]                                  # [N, A, H]: holes of each agent's start column
    row = holes[lake, gr, :]                                    # [N, A, W]: holes of each agent's goal row
    hit = (column & on_rows).any(-1) | (row & on_cols).any(-1)
    return (hit & active).any(-1)


def alone_plan(lake: Lake, horizon: int | None = None) -> np.ndarray:
    """``[max_agents, T]`` actions: each agent's own shortest path to its goal, alone.

    At every step the agent takes the first move (in action order) to a frozen neighbour one
    step closer to its goal; an agent whose goal it cannot reach stays. ``T`` is ``horizon``
    (default ``lake.max_steps``). Deterministic; one unbatched lake.
    """
    d = lake_arrays(lake)
    frozen, width = d["frozen"], d["frozen"].shape[1]
    T = d["max_steps"] if horizon is None else int(horizon)
    plan = np.full((d["starts"].shape[0], T), STAY, dtype=np.int32)
    for i in range(d["num_agents"]):
        goal = tuple(int(x) for x in d["goals"][i])
        dist = bfs_distances(frozen, goal)
        r, c = (int(x) for x in d["starts"][i])
        for t in range(T):
            here = dist[r, c]
            if here <= 0:  # arrived (0) or the goal is out of reach (-1)
                break
            for a, (dr, dc) in enumerate(ACTION_DELTAS):
                nr, nc = r + dr, c + dc
                if a != STAY and 0 <= nr < frozen.shape[0] and 0 <= nc < width and dist[nr, nc] == here - 1:
                    plan[i, t], r, c = a, nr, nc
                    break
    return plan


def batch_plans(plan_one: Callable[[Lake, int], np.ndarray], lakes: Lake, horizon: int | None = None) -> np.ndarray:
    """``plan_one`` (:func:`straight_plan`, :func:`alone_plan`) on every lake of a batch:
    ``[B, max_agents, T]``, ``T`` the batch's largest ``max_steps`` unless given (a host
    loop, like :func:`jaxlake.planner.solve_batch`)."""
    T = int(np.max(np.asarray(lakes.max_steps))) if horizon is None else int(horizon)
    return np.stack([plan_one(lake, T) for lake in unbatch(lakes)])


def plan_texts(lakes: Lake, plans: np.ndarray) -> list[str]:
    """The answer texts of ``[B, max_agents, T]`` plans (as a policy would write them)."""
    counts = np.asarray(lakes.num_agents).astype(int)
    return [format_plan(p, n) for p, n in zip(np.asarray(plans), counts)]


def baseline_plans(lakes: Lake) -> dict[str, np.ndarray]:
    """``{name: [B, max_agents, T]}`` for every name of :data:`NAMES`."""
    return {"straight": batch_plans(straight_plan, lakes), "alone": batch_plans(alone_plan, lakes),
            "reference": np.asarray(solve_batch(lakes).actions)}


def score_plans(lakes: Lake, plans: np.ndarray, key: jax.Array) -> dict:
    """The suite metrics (:func:`jaxlake.suite.metrics`: ``score``, failure rates...) of
    playing ``plans`` on ``lakes``, through the text a policy would write."""
    return metrics(score_texts(lakes, plan_texts(lakes, plans), key))


def lake_baselines(lakes: Lake, seed: int = 0) -> dict[str, float]:
    """``{name: aggregate score}`` of every baseline on a batch of lakes (mean success)."""
    key = jax.random.PRNGKey(seed)
    return {name: float(score_plans(lakes, plans, key)["score"]) for name, plans in baseline_plans(lakes).items()}


def suite_baselines(suite: Suite, seed: int = 0) -> dict[str, float]:
    """:func:`lake_baselines` on a built suite."""
    return lake_baselines(suite.lakes, seed)


def described_baselines(description: Mapping[str, Any], seed: int = 0) -> dict[str, float]:
    """:func:`lake_baselines` on the suite an ``eval.json`` describes (``eval.json["suite"]``),
    rebuilt lake for lake (:func:`jaxlake.suite.described_lakes`)."""
    return lake_baselines(described_lakes(description), seed)


def table_rows(scores: Mapping[str, float], columns: int, extra: int = 0, names: Sequence[str] = NAMES) -> list[str]:
    """Markdown rows for a variant x stage table: each baseline's score in every one of
    ``columns`` stage columns (a suite's baselines do not train), no seeds, and ``extra``
    empty cells after them (a paired column)."""
    return [f"| *{LABELS[n]}* | – | " + " | ".join([f"{scores[n]:.3f}"] * columns) + " |" + " – |" * extra
            for n in names if n in scores]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jaxlake.baselines [SUITE ...]``: each baseline's score and failure rates on
    held-out suites (names of ``conf/eval/`` or YAML paths; default ``small``)."""
    import argparse

    from jaxlake.suite import SuiteError, build_suite, load_eval_conf

    parser = argparse.ArgumentParser(prog="python -m jaxlake.baselines", description=main.__doc__.split(":", 1)[1])
    parser.add_argument("suites", nargs="*", default=["small"], help="suite names (conf/eval/) or YAML paths")
    args = parser.parse_args(argv)
    print("| suite | lakes | baseline | score | fall rate | conflict rate | timeout rate |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for name in args.suites:
        try:
            suite = build_suite(load_eval_conf(name))
        except (SuiteError, OSError, ValueError) as err:
            parser.exit(1, f"error: suite {name!r}: {err}\n")
        for b, plans in baseline_plans(suite.lakes).items():
            m = score_plans(suite.lakes, plans, jax.random.PRNGKey(0))
            print(f"| {name} | {suite.size} | {LABELS[b]} | {m['score']:.3f} | {m['fall_rate']:.3f} "
                  f"| {m['conflict_rate']:.3f} | {m['timeout_rate']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
