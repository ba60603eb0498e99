"""``engineer=accel``: ACCEL, PLR whose new levels are small edits of replayed ones.

ACCEL (Parker-Holder et al., *Evolving Curricula with Regret-Based Environment Design*, 2022)
keeps PLR's buffer, scores, replay distribution and replay-or-new decision
(:class:`~jaxlake.engineers.plr.PLREngineer`) and changes where new levels come from: instead
of the generator, it **edits** levels it replayed, so difficulty grows in small steps from
levels that are currently learnable. Here an edit is one move of one editable field by one
grid step (:meth:`~jaxlake.engineers.space.ConfigSpace.neighbours`: always a valid config in
the run's space). On a new-level decision the parents are the levels the stage just replayed
(when it was a replay stage) or else levels drawn from the replay distribution; each parent
gives one child not already in the buffer. With an empty buffer (the first stage) the new
levels come from the space uniformly, as PLR's do.
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
    new_kind = "one-step edits of replayed levels"

    def __init__(self, name: str = "accel", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)

    def new_levels(self, ctx: EngineerContext, space: ConfigSpace, buffer: list[dict], probs: np.ndarray,
                   rng: np.random.Generator, k: int) -> list[LakeConfig]:
        if not buffer:
            return super().new_levels(ctx, space, buffer, probs, rng, k)
        state = ctx.state or {}
        just_replayed = set(state.get("proposed") or []) if state.get("replay") else set()
        parents = [LakeConfig.from_dict(e["config"]) for e in buffer if level_key(e["config"]) in just_replayed]
        if not parents:
            order = rng.choice(len(buffer), size=min(k, len(buffer)), replace=False, p=probs)
            parents = [LakeConfig.from_dict(buffer[int(i)]["config"]) for i in order]
        taken = {level_key(e["config"]) for e in buffer}
        children: list[LakeConfig] = []
        for j in range(k):
            parent = parents[j % len(parents)]
            options = [c for c in space.neighbours(parent) if level_key(c) not in taken]
            if options:
                child = options[int(rng.integers(len(options)))]
                taken.add(level_key(child))
                children.append(child)
        if len(children) < k:  # every edit of the parents is already buffered: fill from the space
            children += super().new_levels(ctx, space, buffer + [{"config": c.to_dict()} for c in children], probs,
                                           rng, k - len(children))
        return children[:k]
