"""``engineer=oracle``: the engineers' ceiling, as the reference planner is the policies'.

At each decision the oracle tries ``candidates`` environments from the engineer's space with
short **probe stages** from the current policy (the pipeline's ``ctx.probe``,
:mod:`jaxlake.pipeline.probe`): each is trained ``probe_steps`` steps and scored, greedy, on a
validation suite of the held-out suite's cells whose lakes are none of the held-out suite's.
It proposes the candidate whose probe scored best. It sees what no other engineer sees (what
training on an environment does), which is what makes it a ceiling, and costs ``candidates``
short stages per decision (none after the run's last stage, ``ctx.final``: it keeps the
environment).

The candidates are the current environment (with ``keep_current``) and environments drawn from
the space, reproducibly from ``(seed, stage)``: each a mixture of 1 to ``max_components``
configs chosen field by field (:meth:`ConfigSpace.sample`), equal weights, no two alike. Every
candidate but the current one passes :func:`check_in_space`, as every engineer's proposal
does. The record keeps every probe (mixture, validation score, lakes, wall time).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from jaxlake.config import ConfigError
from jaxlake.engineers.base import Engineer, EngineerContext, Proposal
from jaxlake.engineers.space import check_in_space, space_from_conf
from jaxlake.mixture import Mixture, mixture_to_obj, same_mixture


def _int_at_least(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"engineer.{name}={value!r} must be an integer in [{low}, inf)")
    return int(value)


class OracleEngineer(Engineer):
    """Probes ``candidates`` environments and proposes the best (module docstring)."""

    name = "oracle"

    def __init__(self, candidates: int = 4, probe_steps: int = 8, validation_lakes_per_cell: int = 8,
                 keep_current: bool = True, max_components: int = 1, space: Optional[Mapping[str, Any]] = None,
                 name: str = "oracle", **_: Any) -> None:
        self.candidates = _int_at_least("candidates", candidates, 1)
        self.probe_steps = _int_at_least("probe_steps", probe_steps, 1)
        self.validation_lakes_per_cell = _int_at_least("validation_lakes_per_cell", validation_lakes_per_cell, 1)
        self.max_components = _int_at_least("max_components", max_components, 1)
        if not isinstance(keep_current, bool):
            raise ConfigError(f"engineer.keep_current={keep_current!r} must be true or false")
        if keep_current and self.candidates < 2:
            raise ConfigError("engineer.candidates must be at least 2 with keep_current=true (the current "
                              "environment and one new)")
        self.keep_current = keep_current
        self.space_node = space
        self.name = name

    def candidate_mixtures(self, ctx: EngineerContext) -> list[Mixture]:
        """The environments to probe: the current one first (``keep_current``), then draws
        from the space (as many as differ, up to ``candidates``)."""
        space = space_from_conf(ctx.base, self.space_node)
        rng = ctx.rng(11)
        out = [ctx.current] if self.keep_current else []
        for _ in range(50 * self.candidates):
            if len(out) >= self.candidates:
                break
            m = int(rng.integers(1, self.max_components + 1))
            mixture = Mixture([(1.0 / m, space.sample(rng)) for _ in range(m)])
            if any(same_mixture(mixture, o) for o in out):
                continue
            check_in_space(mixture, space, self.max_components)
            out.append(mixture)
        return out

    def propose(self, ctx: EngineerContext) -> Proposal:
        if ctx.probe is None:
            raise ConfigError("engineer=oracle needs the pipeline's probe stages (python -m jaxlake.run); this "
                              "context has none")
        if ctx.final:  # no stage of this run trains on the answer: no probes
            return Proposal(ctx.current, "kept", "the run's last stage: no later stage to probe for",
                            record={"probes": [], "best": None})
        mixtures = self.candidate_mixtures(ctx)
        probes = []
        for i, mixture in enumerate(mixtures):
            rec = ctx.probe(mixture, f"candidate_{i}", steps=self.probe_steps,
                            lakes_per_cell=self.validation_lakes_per_cell)
            probes.append({"candidate": i, "current": self.keep_current and i == 0,
                           "mixture": mixture_to_obj(mixture), "score": rec["score"], "n": rec["n"],
                           "wall_s": rec.get("wall_s")})
        best = max(range(len(probes)), key=lambda i: (probes[i]["score"], -i))  # ties: the earlier (current first)
        kept = probes[best]["current"]
        reason = (f"best of {len(probes)} probes of {self.probe_steps} steps: {probes[best]['score']:.3f} on "
                  f"{probes[best]['n']} validation lakes" + (" (the current environment)" if kept else ""))
        record = {"probes": probes, "best": best,
                  "validation": {"lakes_per_cell": self.validation_lakes_per_cell, "steps": self.probe_steps}}
        return Proposal(mixtures[best], "kept" if kept else "proposed", reason, record=record)
