"""``engineer=random``: a uniformly random valid config from the space each stage."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from jaxlake.engineers.base import Engineer, EngineerContext, Proposal
from jaxlake.engineers.space import check_in_space, space_from_conf
from jaxlake.mixture import Mixture


class RandomEngineer(Engineer):
    """A random valid config from the space each stage, chosen field by field uniformly among
    the values that still complete to a valid config (:meth:`ConfigSpace.sample`)."""

    name = "random"

    def __init__(self, space: Optional[Mapping[str, Any]] = None, name: str = "random", **_: Any) -> None:
        self.space_node = space
        self.name = name

    def propose(self, ctx: EngineerContext) -> Proposal:
        space = space_from_conf(ctx.base, self.space_node)
        mixture = Mixture.of(space.sample(ctx.rng(1)))
        check_in_space(mixture, space, 1)
        return Proposal(mixture, "proposed", "uniform random config")
