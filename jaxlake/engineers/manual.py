"""``engineer=manual``: a hand-written curriculum from ``conf/engineer/manual.yaml``."""

from __future__ import annotations

from typing import Any, Sequence

from jaxlake.config import ConfigError, LakeConfig, to_plain
from jaxlake.engineers.base import Engineer, EngineerContext, Proposal
from jaxlake.mixture import Mixture, MixtureError, mixture_from_obj


class ManualEngineer(Engineer):
    """A hand-written curriculum: ``stages[i]`` is the environment of stage ``i + 1``.

    Entries are LakeConfig field mappings (missing fields keep the current values) or
    ``{mixture: [{weight, config}, ...]}``; past the end of the list the last entry repeats.
    With ``first_is_stage_1`` (default) ``stages[0]`` replaces the run's ``env`` for stage 1;
    otherwise stage 1 trains on ``env`` and ``stages[0]`` is stage 2's environment.
    """

    name = "manual"

    def __init__(self, stages: Sequence[Any], name: str = "manual", first_is_stage_1: bool = True, **_: Any) -> None:
        stages = to_plain(stages)
        if not stages:
            raise ConfigError("engineer.stages: give at least one stage environment")
        self.stages = list(stages)
        self.first_is_stage_1 = bool(first_is_stage_1)
        self.name = name

    def _entry(self, index: int, base: LakeConfig) -> Mixture:
        index = min(index, len(self.stages) - 1)
        try:
            return mixture_from_obj(self.stages[index], base)
        except MixtureError as err:
            raise ConfigError(f"engineer.stages[{index}]: {err}") from None

    def initial_mixture(self, default: Mixture) -> Mixture:
        return self._entry(0, Mixture.of(default).main) if self.first_is_stage_1 else default

    def propose(self, ctx: EngineerContext) -> Proposal:
        index = ctx.stage if self.first_is_stage_1 else ctx.stage - 1
        index = min(index, len(self.stages) - 1)
        return Proposal(self._entry(index, ctx.base), "proposed", f"manual curriculum entry {index}",
                        record={"entry": index})
