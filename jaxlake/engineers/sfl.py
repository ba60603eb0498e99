"""``engineer=sfl``: sampling for learnability, as an edit of the mixture.

SFL (Rutherford et al., *No Regrets: Investigating and Improving Regret Approximations for
Curriculum Discovery*, 2024) trains on the levels of highest **learnability** ``p (1 - p)``,
``p`` the current policy's success on the level, beside fresh random levels. Here, at each
decision:

1. **Score.** The current components and ``candidates`` configs drawn from the space (none
   already in the mixture) are played by the stage's policy on ``lakes`` fresh lakes each,
   ``samples`` sampled plans a lake (``ctx.rollouts``: rollouts only, no training), and each
   gets ``L = p (1 - p)``.
2. **Answer** (:mod:`jaxlake.engineers.edits`): keep the mixture and **re-weight** it toward
   learnability, ``w' = (1 - shift) w + shift L / sum(L)`` over the current components (none
   moved when no component is learnable); **add** the ``max_add`` most learnable candidates
   whose ``L`` is at least ``min_learnability``, each with a share ``share``; when the
   mixture would pass ``max_components``, **drop** the least learnable component. The edit
   rules keep at least ``min_keep`` of the mass on the old mixture and ``floor`` on every
   component.

Cost per decision: ``(components + candidates) * lakes * samples`` sampled plans of the
policy, about 20 s for the defaults on 2 CPU cores with the tiny policy (the record keeps the
wall time). None after the run's last stage (``ctx.final``): no later stage trains on it.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional

from jaxlake.config import ConfigError
from jaxlake.engineers.base import Engineer, EngineerContext, Proposal
from jaxlake.engineers.edits import Edit, edit_proposal
from jaxlake.engineers.plr import learnability
from jaxlake.engineers.space import ConfigSpace, space_from_conf
from jaxlake.mixture import Mixture


def _int_at_least(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"engineer.{name}={value!r} must be an integer in [{low}, inf)")
    return int(value)


def _fraction(name: str, value: Any, low: float = 0.0, high: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= float(value) <= high:
        raise ConfigError(f"engineer.{name}={value!r} not in [{low}, {high}]")
    return float(value)


def draw_candidates(space: ConfigSpace, current: Mixture, rng: Any, count: int) -> list:
    """Up to ``count`` distinct configs drawn from the space field by field, none in ``current``."""
    out: list = []
    for _ in range(50 * count):
        if len(out) >= count:
            break
        c = space.sample(rng)
        if c not in current.configs and c not in out:
            out.append(c)
    return out


def score_learnability(ctx: EngineerContext, configs: list, lakes: int, samples: int) -> list[dict]:
    """``[{"config", "p", "n", "learnability"}]`` of each config: the stage policy's sampled
    success on ``lakes`` fresh lakes of it (``ctx.rollouts``)."""
    if ctx.rollouts is None:
        raise ConfigError("this engineer needs the pipeline's rollouts of the stage's policy (python -m jaxlake.run); "
                          "this context has none")
    results = ctx.rollouts(Mixture([(1.0, c) for c in configs]), lakes=lakes, samples=samples)
    return [{"config": c.to_dict(), "p": float(r["p"]), "n": int(r["n"]), "learnability": learnability(r["p"])}
            for c, r in zip(configs, results)]


def learnability_edit(current: Mixture, scored_current: list[dict], scored_candidates: list[dict],
                      candidates: list, space: ConfigSpace, shift: float, share: float, max_add: int,
                      min_learnability: float) -> Edit:
    """SFL's edit of ``current`` from the learnability of its components and of ``candidates``
    (the module docstring, step 2)."""
    rules = space.edits
    n = len(current)
    lc = [s["learnability"] for s in scored_current]
    weights = None
    if n >= 2 and sum(lc) > 0 and shift > 0:
        weights = tuple((1 - shift) * w + shift * x / sum(lc) for w, x in zip(current.weights, lc))
    order = sorted(range(len(candidates)), key=lambda j: (-scored_candidates[j]["learnability"], j))
    best = [candidates[j] for j in order if scored_candidates[j]["learnability"] >= min_learnability
            and scored_candidates[j]["learnability"] > 0][: min(max_add, rules.max_add)]
    drop: tuple = ()
    if best and n + len(best) > rules.max_components and n >= 2 and rules.max_drop >= 1:
        drop = (min(range(n), key=lambda j: (lc[j], -j)),)
    room = rules.max_components - n + len(drop)
    best = best[: max(0, room)]
    if not best:
        drop = ()
    add = tuple((share, c) for c in best)
    if drop and add:
        kind = "replace"
    elif add:
        kind = "add"
    else:
        kind = "reweight" if weights is not None else "keep"
    return Edit(kind, weights if kind != "keep" else None, drop, add)


class SFLEngineer(Engineer):
    """Sampling for learnability over the edit space (see the module docstring).

    Args:
      candidates: configs drawn from the space and scored each decision.
      lakes: fresh lakes a component or candidate is played on.
      samples: sampled plans a lake (``p`` is their mean success).
      shift: how far the current weights move toward learnability, in [0, 1].
      share: the share each added candidate gets (the rules' ``min_keep`` caps the total).
      max_add: candidates added at most (and the rules' ``max_add``).
      min_learnability: a candidate below this learnability is not added.
      space: the engineer's ``space:`` node (``editable``, ``values``, ``edits``).
    """

    name = "sfl"

    def __init__(self, candidates: int = 8, lakes: int = 8, samples: int = 4, shift: float = 0.5,
                 share: float = 0.25, max_add: int = 2, min_learnability: float = 0.0,
                 space: Optional[Mapping[str, Any]] = None, name: str = "sfl", **_: Any) -> None:
        self.candidates = _int_at_least("candidates", candidates, 0)
        self.lakes = _int_at_least("lakes", lakes, 1)
        self.samples = _int_at_least("samples", samples, 1)
        self.shift = _fraction("shift", shift)
        self.share = _fraction("share", share)
        if self.share <= 0:
            raise ConfigError(f"engineer.share={share!r} not in (0, 1]")
        self.max_add = _int_at_least("max_add", max_add, 0)
        self.min_learnability = _fraction("min_learnability", min_learnability, 0.0, 0.25)
        self.space_node, self.name = space, name

    def score(self, ctx: EngineerContext, space: ConfigSpace) -> tuple[list, list[dict], list[dict]]:
        """``(candidates, scored current components, scored candidates)``: one round of rollouts."""
        candidates = draw_candidates(space, ctx.current, ctx.rng(13), self.candidates)
        scored = score_learnability(ctx, list(ctx.current.configs) + candidates, self.lakes, self.samples)
        n = len(ctx.current)
        return candidates, scored[:n], scored[n:]

    def propose(self, ctx: EngineerContext) -> Proposal:
        if ctx.final:
            return Proposal(ctx.current, "kept", "the run's last stage: no later stage to score levels for",
                            record={"scores": None})
        space = space_from_conf(ctx.base, self.space_node)
        t0 = time.perf_counter()
        candidates, cur, cand = self.score(ctx, space)
        wall = round(time.perf_counter() - t0, 2)
        edit = learnability_edit(ctx.current, cur, cand, candidates, space, self.shift, self.share, self.max_add,
                                 self.min_learnability)
        plays = (len(cur) + len(cand)) * self.lakes * self.samples
        why = (f"learnability p(1-p) of {len(cur)} component(s) and {len(cand)} candidate(s) on {self.lakes} lakes x "
               f"{self.samples} samples: {edit.describe()}")
        return edit_proposal(ctx, edit, why, space=space,
                             record={"scores": {"current": cur, "candidates": cand},
                                     "cost": {"plays": plays, "wall_s": wall}})
