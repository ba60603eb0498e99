"""``engineer=fixed``: the fixed-environment baseline (every stage trains on stage 1's environment)."""

from __future__ import annotations

from typing import Any

from jaxlake.engineers.base import Engineer, EngineerContext, Proposal
from jaxlake.engineers.edits import edit_between


class FixedEngineer(Engineer):
    """The fixed-environment baseline: every stage trains on the initial environment (the edit
    ``keep``, as the current environment is the initial one)."""

    name = "fixed"

    def __init__(self, name: str = "fixed", **_: Any) -> None:
        self.name = name

    def propose(self, ctx: EngineerContext) -> Proposal:
        return Proposal(ctx.initial, "kept", "fixed baseline: the initial environment every stage",
                        edit=edit_between(ctx.current, ctx.initial))
