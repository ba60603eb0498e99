"""Warm-start lakes whose reference path detours (an experiment: ``train.warmstart.detour_share``,
off by default and measured inside the noise). :func:`llm.training.warmstart.reference_lakes`
takes at least that share of such lakes first (the rarest), and the warm start's row counts them
(``detour_share``).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from jaxlake import planner


def detour_lakes(lakes, solutions: Optional[list] = None) -> np.ndarray:
    """``[N]`` bool: some agent's reference path (:func:`jaxlake.planner.solve`) takes a step
    away from its goal (its Manhattan distance grows): the lakes where, somewhere on the way,
    every cell toward the goal is a hole or taken, so the trace must write a detour. A host
    loop over the planner's solutions (``solutions``: the batch's, when already solved)."""
    sols = planner.solve_batch(lakes).solutions if solutions is None else solutions
    out = np.zeros((len(sols),), bool)
    for i, sol in enumerate(sols):
        if not sol.found:
            continue
        for path in sol.paths:
            cells = np.asarray(path)
            if cells.shape[0] > 1 and (np.diff(np.abs(cells - cells[-1]).sum(-1)) > 0).any():
                out[i] = True
                break
    return out
