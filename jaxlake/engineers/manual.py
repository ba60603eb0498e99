"""``engineer=manual``: a hand-written curriculum from ``conf/engineer/manual.yaml``."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from jaxlake.config import ConfigError, LakeConfig, to_plain
from jaxlake.engineers.base import Engineer, EngineerContext, Proposal, ProposalError
from jaxlake.engineers.edits import ANY_EDIT, EditRules, apply_edit, edit_between, edit_from_obj, is_edit_obj
from jaxlake.mixture import Mixture, MixtureError, mixture_from_obj


class ManualEngineer(Engineer):
    """A hand-written curriculum: ``stages[i]`` is the environment of stage ``i + 1``.

    Entries are LakeConfig field mappings (missing fields keep the current values),
    ``{mixture: [{weight, config}, ...]}``, or **edits** of the previous stage's mixture
    (``{edit: add, add: [...]}``, :mod:`jaxlake.engineers.edits`: keep what works and add a
    harder variant); past the end of the list the last entry repeats. With
    ``first_is_stage_1`` (default) ``stages[0]`` replaces the run's ``env`` for stage 1 (it
    must then be an environment, not an edit); otherwise stage 1 trains on ``env`` and
    ``stages[0]`` is stage 2's environment. A whole environment is recorded as the edit that
    makes it (:func:`~jaxlake.engineers.edits.edit_between`); edits apply under
    ``edits`` (:class:`~jaxlake.engineers.edits.EditRules`; default: any edit, no floor).
    """

    name = "manual"

    def __init__(self, stages: Sequence[Any], name: str = "manual", first_is_stage_1: bool = True,
                 edits: Optional[Mapping[str, Any]] = None, **_: Any) -> None:
        stages = to_plain(stages)
        if not stages:
            raise ConfigError("engineer.stages: give at least one stage environment")
        self.stages = list(stages)
        self.first_is_stage_1 = bool(first_is_stage_1)
        if self.first_is_stage_1 and is_edit_obj(self.stages[0]):
            raise ConfigError("engineer.stages[0] is an edit, but with first_is_stage_1 it is stage 1's environment: "
                              "give a config or a mixture")
        self.rules = ANY_EDIT if edits is None else EditRules.from_node(edits)
        self.name = name

    def _entry(self, index: int, current: Mixture, base: LakeConfig) -> tuple[Mixture, Any]:
        index = min(index, len(self.stages) - 1)
        try:
            entry = self.stages[index]
            if is_edit_obj(entry):
                edit = edit_from_obj(entry, current, base)
                return apply_edit(current, edit, self.rules), edit
            target = mixture_from_obj(entry, base)
            return target, edit_between(current, target)
        except (MixtureError, ProposalError) as err:
            raise ConfigError(f"engineer.stages[{index}]: {err}") from None

    def initial_mixture(self, default: Mixture) -> Mixture:
        default = Mixture.of(default)
        return self._entry(0, default, default.main)[0] if self.first_is_stage_1 else default

    def propose(self, ctx: EngineerContext) -> Proposal:
        index = ctx.stage if self.first_is_stage_1 else ctx.stage - 1
        index = min(index, len(self.stages) - 1)
        mixture, edit = self._entry(index, ctx.current, ctx.base)
        return Proposal(mixture, "proposed", f"manual curriculum entry {index}: {edit.describe()}",
                        record={"entry": index}, edit=edit)
