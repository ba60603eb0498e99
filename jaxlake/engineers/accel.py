"""``engineer=accel``: ACCEL, PLR whose new levels are small edits of replayed ones.

ACCEL (Parker-Holder et al., *Evolving Curricula with Regret-Based Environment Design*, 2022)
keeps PLR's buffer, scores, replay distribution and replay-or-new decision
(:class:`~jaxlake.engineers.plr.PLREngineer`) and changes where new levels come from: instead
of the generator, it **edits** levels it replayed, so difficulty grows in small steps from
levels that are currently learnable. Here an edit is one move of one editable field by one
grid step (:meth:`~jaxlake.engineers.space.ConfigSpace.neighbours`, the other fields snapped
onto the grid: always a valid config in the run's space). On a new-level decision the parents
are the top of the buffer, highest learnability first (the run's first environment is buffered
too, so ACCEL edits from the first decision on); each parent gives one child not already in
the buffer. With an empty buffer the new levels come from the space uniformly, as PLR's do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxlake.config import LakeConfig
from jaxlake.engineers.base import EngineerContext
from jaxlake.engineers.plr import PLREngineer, level_key
from jaxlake.engineers.space import ConfigSpace


class ACCELEngineer(PLREngineer):
    """PLR with new levels made by one small edit of a replayed level (see the module docstring)."""

    name = "accel"
    new_kind = "one-step edits of the buffer's most learnable levels"

    def __init__(self, name: str = "accel", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)

    def new_levels(self, ctx: EngineerContext, space: ConfigSpace, buffer: list[dict], probs: np.ndarray,
                   rng: np.random.Generator, k: int) -> list[LakeConfig]:
        if not buffer:
            return super().new_levels(ctx, space, buffer, probs, rng, k)
        top = sorted(range(len(buffer)), key=lambda i: (-buffer[i]["score"], buffer[i]["last_seen"], i))
        taken = {level_key(e["config"]) for e in buffer}
        children: list[LakeConfig] = []
        for i in top:
            if len(children) == k:
                break
            parent = LakeConfig.from_dict(buffer[i]["config"])
            options = []
            for c in space.neighbours(parent):
                c = space.snap(c)
                if level_key(c) not in taken and c != parent and c not in options:
                    options.append(c)
            if options:
                child = options[int(rng.integers(len(options)))]
                taken.add(level_key(child))
                children.append(child)
        if len(children) < k:  # every edit of the parents is already buffered: fill from the space
            children += super().new_levels(ctx, space, buffer + [{"config": c.to_dict()} for c in children], probs,
                                           rng, k - len(children))
        return children[:k]
