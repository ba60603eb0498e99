"""The ``summary`` and ``paths`` warm-start traces (an experiment: ``prompt.reasoning.warmstart_style``
``summary`` / ``paths``, measured against ``checks`` and ``crowd`` and not shipped).

A trace is the think block a warm-start target opens with, templated from the reference
planner's own solution and therefore true (:func:`llm.training.warmstart.reasoning_text` picks
the lines by style). Style ``summary``: each agent's start, goal, moves, the steps at which it
waits and its arrival step, and for each pair of agents the first cell both paths use (who is
there first). Style ``paths``: each agent's path cell by cell, so each written cell is one step
from the last and can be checked against the prompt's hole list. The shipped styles, ``checks``
and ``crowd``, stay in :mod:`llm.training.warmstart`.
"""

from __future__ import annotations

import numpy as np

from jaxlake import planner


def _letter(i: int) -> str:
    return chr(ord("A") + int(i))


def reasoning_lines(solution: planner.Solution, num_agents: int) -> list[str]:
    """True statements about a planner solution, most important first.

    One line per agent (``A: 0 0 to 3 4, 7 moves, waits at step 2, arrives at step 8``), then
    one per pair of agents whose paths use a common cell (``A and B both use 2 3: A at step
    3, B at step 5``; the earliest such cell by the first visit), or ``no two paths share a
    cell``. Steps count from 0 at the start; a wait is a step where the agent stays before it
    arrives.
    """
    if not solution.found:
        return []
    lines: list[str] = []
    visits: list[dict] = []
    for i in range(int(num_agents)):
        path = np.asarray(solution.paths[i])
        arrive = len(path) - 1
        waits = [t + 1 for t in range(arrive) if (path[t + 1] == path[t]).all()]
        first: dict = {}
        for t, cell in enumerate(map(tuple, path.tolist())):
            first.setdefault(cell, t)
        visits.append(first)
        line = f"{_letter(i)}: {path[0][0]} {path[0][1]} to {path[-1][0]} {path[-1][1]}, {arrive - len(waits)} moves"
        if waits:
            line += ", waits at step " + " ".join(str(t) for t in waits)
        lines.append(line + f", arrives at step {arrive}")
    shared = []
    for i in range(int(num_agents)):
        for j in range(i + 1, int(num_agents)):
            common = set(visits[i]) & set(visits[j])
            if common:
                cell = min(common, key=lambda c: (min(visits[i][c], visits[j][c]), c))
                shared.append(f"{_letter(i)} and {_letter(j)} both use {cell[0]} {cell[1]}: "
                              f"{_letter(i)} at step {visits[i][cell]}, {_letter(j)} at step {visits[j][cell]}")
    lines += shared or (["no two paths share a cell"] if num_agents > 1 else [])
    return lines


def path_lines(solution: planner.Solution, num_agents: int, cell: str = " {row}{col}") -> list[str]:
    """Each agent's path, one cell per time step from its start to its arrival.

    ``A 42 32 32 33`` (with ``cell=" {row}{col}"``): agent A starts on row 4 col 2, moves up,
    waits one step, moves right and arrives. ``plan = differences of consecutive cells``.
    """
    if not solution.found:
        return []
    lines = []
    for i in range(int(num_agents)):
        path = np.asarray(solution.paths[i])
        lines.append(_letter(i) + "".join(cell.format(row=int(r), col=int(c)) for r, c in path))
    return lines
