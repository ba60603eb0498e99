"""``engineer=fixed``: the fixed-environment baseline (every stage trains on stage 1's environment)."""

from __future__ import annotations

from typing import Any

from jaxlake.engineers.base import Engineer, EngineerContext, Proposal


class FixedEngineer(Engineer):
    """The fixed-environment baseline: every stage trains on the initial environment."""

    name = "fixed"

    def __init__(self, name: str = "fixed", **_: Any) -> None:
        self.name = name

    def propose(self, ctx: EngineerContext) -> Proposal:
        return Proposal(ctx.initial, "kept", "fixed baseline: the initial environment every stage")
