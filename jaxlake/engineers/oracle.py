"""``engineer=oracle``: the engineers' ceiling, as the reference planner is the policies'.

At each decision the oracle tries ``candidates`` environments from the engineer's space with
short **probe stages** from the current policy (the pipeline's ``ctx.probe``,
:mod:`jaxlake.pipeline.probe`): each is trained ``probe_steps`` steps and scored, greedy, on a
validation suite of the held-out suite's cells whose lakes are none of the held-out suite's.
It proposes the candidate whose probe scored best. It sees what no other engineer sees (what
training on an environment does), which is what makes it a ceiling, and costs ``candidates``
short stages per decision (none after the run's last stage, ``ctx.final``: it keeps the
environment).

**Candidates over edits** (``candidates_from: edits``, ``engineer=oracle``): structured edits
of the current mixture (:mod:`jaxlake.engineers.edits`), scored by the learnability the
``sfl`` engineer reads (:mod:`jaxlake.engineers.sfl`: one round of rollouts of the stage's
policy on the components and ``pool`` candidates from the space):

* ``keep``: the current mixture;
* ``reweight``: re-weighted toward learnability;
* ``sfl``: re-weighted, plus ``sfl``'s most learnable additions;
* ``drop``: the least learnable component dropped;
* ``reference``: the ``reference_env`` mixture itself (``env=broad`` by default), when it has
  the run's capacity.

Identical mixtures are probed once. **Candidates from the space** (``candidates_from: space``,
``engineer=oracle_single``, the oracle of earlier versions): the current environment (with
``keep_current``) and ``candidates`` environments drawn from the space, reproducibly from
``(seed, stage)``: each a mixture of 1 to ``max_components`` configs chosen field by field
(:meth:`ConfigSpace.sample`), equal weights, no two alike, each in the space. Either way the
answer is recorded as the edit that makes it (:func:`~jaxlake.engineers.edits.edit_between`)
and the record keeps every probe (mixture, validation score, lakes, wall time).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from jaxlake.config import ConfigError
from jaxlake.engineers.base import Engineer, EngineerContext, Proposal
from jaxlake.engineers.edits import Edit, apply_edit, edit_between
from jaxlake.engineers.sfl import draw_candidates, learnability_edit, score_learnability
from jaxlake.engineers.space import check_in_space, space_from_conf
from jaxlake.mixture import CAPACITY_FIELDS, Mixture, mixture_from_node, mixture_to_obj, same_mixture

#: Where ``candidates_from`` takes the oracle's candidates.
CANDIDATE_SOURCES = ("edits", "space")


def reference_mixture(name: str) -> Mixture:
    """The mixture of ``conf/env/<name>.yaml`` (the oracle's ``reference`` candidate)."""
    from jaxlake.conf import CONF_DIR

    path = CONF_DIR / "env" / f"{name}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in (CONF_DIR / "env").glob("*.yaml"))
        raise ConfigError(f"engineer.reference_env={name!r} is not an env preset; choose from {options}")
    from omegaconf import OmegaConf

    return mixture_from_node(OmegaConf.to_container(OmegaConf.load(path), resolve=True))


def _int_at_least(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"engineer.{name}={value!r} must be an integer in [{low}, inf)")
    return int(value)


class OracleEngineer(Engineer):
    """Probes ``candidates`` environments and proposes the best (module docstring)."""

    name = "oracle"

    def __init__(self, candidates: int = 4, probe_steps: int = 8, validation_lakes_per_cell: int = 8,
                 keep_current: bool = True, max_components: int = 1, space: Optional[Mapping[str, Any]] = None,
                 name: str = "oracle", candidates_from: str = "edits", pool: int = 8, lakes: int = 8,
                 samples: int = 4, shift: float = 0.5, share: float = 0.25, reference_env: Optional[str] = "broad",
                 **_: Any) -> None:
        if candidates_from not in CANDIDATE_SOURCES:
            raise ConfigError(f"engineer.candidates_from={candidates_from!r} not in {list(CANDIDATE_SOURCES)}")
        self.candidates_from = candidates_from
        self.pool = _int_at_least("pool", pool, 0)
        self.lakes = _int_at_least("lakes", lakes, 1)
        self.samples = _int_at_least("samples", samples, 1)
        for key, v in (("shift", shift), ("share", share)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ConfigError(f"engineer.{key}={v!r} not in [0, 1]")
        self.shift, self.share = float(shift), float(share)
        self.reference = reference_mixture(reference_env) if reference_env else None
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

    def edit_candidates(self, ctx: EngineerContext) -> tuple[list[tuple[str, Mixture]], dict]:
        """The structured edits to probe (``candidates_from: edits``): ``[(name, mixture)]``,
        distinct, ``keep`` first, and the learnability record they were built from."""
        space = space_from_conf(ctx.base, self.space_node)
        current = ctx.current
        pool = draw_candidates(space, current, ctx.rng(13), self.pool)
        scored = score_learnability(ctx, list(current.configs) + pool, self.lakes, self.samples)
        cur, cand = scored[:len(current)], scored[len(current):]
        edits = [("keep", Edit("keep")),
                 ("reweight", learnability_edit(current, cur, cand, pool, space, self.shift, self.share, 0, 0.0)),
                 ("sfl", learnability_edit(current, cur, cand, pool, space, self.shift, self.share,
                                           space.edits.max_add, 0.0))]
        if len(current) >= 2:
            weakest = min(range(len(current)), key=lambda j: (cur[j]["learnability"], -j))
            edits.append(("drop", Edit("drop", None, (weakest,))))
        out: list[tuple[str, Mixture]] = []
        for name, edit in edits:
            mixture = apply_edit(current, edit, space.edits)
            if not any(same_mixture(mixture, m, 1e-6) for _, m in out):
                out.append((name, mixture))
        ref = self.reference
        if ref is not None and all(getattr(c, f) == getattr(current.main, f) for c in ref.configs for f in CAPACITY_FIELDS):
            if not any(same_mixture(ref, m, 1e-6) for _, m in out):
                out.append(("reference", ref))
        return out, {"current": cur, "candidates": cand}

    def candidate_mixtures(self, ctx: EngineerContext) -> list[Mixture]:
        """The environments to probe (``candidates_from: space``): the current one first
        (``keep_current``), then draws from the space (as many as differ, up to ``candidates``)."""
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
        learn = None
        if self.candidates_from == "edits":
            named, learn = self.edit_candidates(ctx)
        else:
            named = [("keep" if self.keep_current and i == 0 else f"draw_{i}", m)
                     for i, m in enumerate(self.candidate_mixtures(ctx))]
        probes = []
        for i, (label, mixture) in enumerate(named):
            rec = ctx.probe(mixture, f"candidate_{i}", steps=self.probe_steps,
                            lakes_per_cell=self.validation_lakes_per_cell)
            probes.append({"candidate": i, "name": label, "current": same_mixture(mixture, ctx.current, 1e-6),
                           "mixture": mixture_to_obj(mixture), "score": rec["score"], "n": rec["n"],
                           "wall_s": rec.get("wall_s")})
        best = max(range(len(probes)), key=lambda i: (probes[i]["score"], -i))  # ties: the earlier (current first)
        kept = probes[best]["current"]
        reason = (f"best of {len(probes)} probes of {self.probe_steps} steps: {probes[best]['name']}, "
                  f"{probes[best]['score']:.3f} on {probes[best]['n']} validation lakes"
                  + (" (the current environment)" if kept else ""))
        record = {"probes": probes, "best": best, "candidates_from": self.candidates_from, "learnability": learn,
                  "validation": {"lakes_per_cell": self.validation_lakes_per_cell, "steps": self.probe_steps}}
        mixture = named[best][1]
        return Proposal(mixture, "kept" if kept else "proposed", reason, record=record,
                        edit=edit_between(ctx.current, mixture))
