"""``engineer=random``: a uniformly random edit of the current mixture each stage."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from jaxlake.engineers.base import Engineer, EngineerContext, Proposal
from jaxlake.engineers.edits import Edit, edit_proposal
from jaxlake.engineers.space import ConfigSpace, space_from_conf
from jaxlake.mixture import Mixture


def random_edit(space: ConfigSpace, current: Mixture, rng: np.random.Generator) -> Edit:
    """A random edit of ``current`` under ``space.edits``: a kind uniform among those the rules
    allow (:meth:`~jaxlake.engineers.edits.EditRules.kinds`), then its values uniform: a
    weight of the rules' grid per component, a component to drop, 1 to ``max_add`` configs
    drawn field by field from the space (:meth:`ConfigSpace.sample`) with shares of the grid."""
    rules, n = space.edits, len(current)
    kinds = rules.kinds(n)
    kind = kinds[int(rng.integers(len(kinds)))]
    weights, drop, add = None, (), ()
    if kind == "reweight":
        weights = tuple(float(rules.weights[int(rng.integers(len(rules.weights)))]) for _ in range(n))
    if kind in ("drop", "replace"):
        drop = (int(rng.integers(n)),)
    if kind in ("add", "replace"):
        room = max(1, min(rules.max_add, rules.max_components - n + len(drop)))
        count = int(rng.integers(1, room + 1))
        add = tuple((float(rules.shares[int(rng.integers(len(rules.shares)))]), space.sample(rng))
                    for _ in range(count))
    return Edit(kind, weights, drop, add)


class RandomEngineer(Engineer):
    """A random edit of the current mixture each stage (:func:`random_edit`): the floor of the
    edit space, as a uniformly random config was the floor of the single-config space."""

    name = "random"

    def __init__(self, space: Optional[Mapping[str, Any]] = None, name: str = "random", **_: Any) -> None:
        self.space_node = space
        self.name = name

    def propose(self, ctx: EngineerContext) -> Proposal:
        space = space_from_conf(ctx.base, self.space_node)
        edit = random_edit(space, ctx.current, ctx.rng(1))
        return edit_proposal(ctx, edit, f"uniform random edit: {edit.describe()}", space=space)
