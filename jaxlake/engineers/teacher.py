"""The engineer's teacher: a rule that reads a stage summary and answers with an edit.

The shipped policies learn the engineer's role from examples (:mod:`jaxlake.engineers.contexts`
makes the contexts, :mod:`llm.engineer.examples` the training rows). Each example's answer is
this rule's, so it must follow from what the summary shows, and only from that:

* **level**: the policy's success on its own training environment (the summary's ``on the
  training environment`` line; the suite's overall success when that line is missing):
  ``>= HARD_AT`` (0.6) asks for a harder config, ``< EASY_BELOW`` (0.25) for an easier one,
  in between for one at the same size;
* **focus**: the more frequent of falls and conflicts on that environment when one is at
  least ``FOCUS_AT`` (0.1), else timeouts when they are (a conflict's episode times out too,
  so a timeout is read as the cause only when no other is seen): a policy that falls gets
  more holes, one that collides gets denser conflicts and at least two agents;
* **what it keeps**: the answer *adds* the new config beside the current components (share
  0.25, or 0.5 when easing), so nothing that works disappears; when the new config is
  already a component, it *re-weights* toward it instead; when the mixture is full it
  *replaces* its lightest component.

Level and focus move one grid step of the space a field (:meth:`ConfigSpace.shift`): harder is
one row and one column more (then one agent more when the lake is at its largest), easier one
agent fewer and one row and column fewer.

:func:`difficulty` is the measure the engineer's behavioural tests read an answer's hardness
by: the reference planner's mean sum of costs (moves to bring every agent home) on lakes of
the answer's mixture, which grows with the lake's size, its agents and its detours.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import jax
import numpy as np

from jaxlake.config import LakeConfig
from jaxlake.engineers.edits import Edit
from jaxlake.engineers.space import ConfigSpace
from jaxlake.mixture import Mixture
from jaxlake.summaries import current_env_line

#: Success on the training environment from which the teacher asks for a harder config.
HARD_AT = 0.6
#: Success below which it asks for an easier one.
EASY_BELOW = 0.25
#: The least failure rate that becomes the answer's focus.
FOCUS_AT = 0.1
#: The failure types the teacher reads, by their summary metric.
FOCUS_RATES = {"fell": "fall_rate", "conflict": "conflict_rate", "timeout": "timeout_rate"}


def read_summary(summary: Mapping[str, Any]) -> dict:
    """What the teacher reads: ``{"success", "rates": {type: rate}, "where"}`` from the
    summary's behaviour part (the training environment's line, else the suite's), and that
    line as the summary writes it (``line``, :func:`jaxlake.summaries.current_env_line`)."""
    b = (summary or {}).get("behaviour") or {}
    node, where = b.get("current_env"), "current_env"
    if not node or node.get("score") is None:
        node, where = b.get("overall") or {}, "suite"
    rates = {t: float(node.get(k) or 0.0) for t, k in FOCUS_RATES.items()}
    out = {"success": float(node.get("score") or 0.0), "rates": rates, "where": where}
    if where == "current_env" and "n" in node:
        out["line"] = current_env_line(node)
    return out


def level_of(success: float) -> int:
    """+1 (harder), 0 (same size) or -1 (easier) for a success rate."""
    return 1 if success >= HARD_AT else (-1 if success < EASY_BELOW else 0)


def focus_of(rates: Mapping[str, float]) -> Optional[str]:
    """The failure the answer aims at: the more frequent of falls and conflicts when one
    reaches :data:`FOCUS_AT` (ties: falls), else timeouts when they do. A conflict cancels
    moves, so its episode usually times out too: timeouts alone are the plans that stop short,
    and they are read only when no cause is seen."""
    causes = [t for t in ("fell", "conflict") if rates.get(t, 0.0) >= FOCUS_AT]
    if causes:
        return max(causes, key=lambda t: (rates.get(t, 0.0), -list(FOCUS_RATES).index(t)))
    return "timeout" if rates.get("timeout", 0.0) >= FOCUS_AT else None


def _moved(space: ConfigSpace, config: LakeConfig, names: tuple, rungs: int) -> LakeConfig:
    """``config`` moved ``rungs`` along ``names`` when the space allows it, else unchanged."""
    if any(n not in space.editable for n in names):
        return config
    moved = space.shift(config, names, rungs)
    return config if moved is None else moved


def _at_least(space: ConfigSpace, config: LakeConfig, name: str, value: Any) -> LakeConfig:
    """``config`` with ``name`` raised to the first allowed value ``>= value`` (if valid)."""
    if name not in space.editable or getattr(config, name) >= value:
        return config
    grid = [v for v in space.values[name] if v >= value]
    if not grid:
        return config
    try:
        return LakeConfig(**{**config.to_dict(), name: grid[0]})
    except Exception:  # noqa: BLE001 -- an invalid combination: leave the field
        return config


def teacher_config(base: LakeConfig, level: int, focus: Optional[str], space: ConfigSpace) -> LakeConfig:
    """The config the teacher adds: ``base`` moved by ``level`` and ``focus`` (module doc)."""
    c = space.snap(base)
    if level > 0:
        bigger = _moved(space, c, ("height", "width"), 1)
        c = bigger if bigger != c else _moved(space, c, ("num_agents",), 1)
    elif level < 0:
        c = _moved(space, c, ("num_agents",), -1)
        c = _moved(space, c, ("height", "width"), -1)
    if focus == "fell":
        c = _moved(space, _at_least(space, c, "hole_density", 0.1), ("hole_density",), 1 if level >= 0 else 0)
    elif focus == "conflict":
        c = _at_least(space, c, "num_agents", 2)
        c = _moved(space, _at_least(space, c, "conflict_density", 0.5), ("conflict_density",), 1 if level >= 0 else 0)
    elif focus is None and level == 0:
        c = _moved(space, c, ("num_agents",), 1)
    return space.snap(c)


def teacher_edit(summary: Mapping[str, Any], current: Mixture, space: ConfigSpace) -> tuple[Edit, dict]:
    """The teacher's edit of ``current`` for ``summary``, and what it read
    (``{success, rates, where, level, focus}``)."""
    current = Mixture.of(current)
    seen = read_summary(summary)
    level, focus = level_of(seen["success"]), focus_of(seen["rates"])
    seen.update(level=level, focus=focus)
    new = teacher_config(current.main, level, focus, space)
    rules = space.edits
    configs = list(current.configs)
    if new in configs:
        if len(configs) == 1:
            return Edit("keep"), seen
        heavy = max(rules.weights)
        weights = tuple(heavy if c == new else 1.0 for c in configs)
        return Edit("reweight", weights=weights), seen
    share = 0.5 if level < 0 else 0.25
    share = min(rules.shares, key=lambda s: abs(s - share))
    if len(configs) < rules.max_components and "add" in rules.kinds(len(configs)):
        return Edit("add", add=((share, new),)), seen
    lightest = int(np.argmin(np.asarray(current.weights)))
    return Edit("replace", drop=(lightest,), add=((share, new),)), seen


#: How the teacher's analysis names each level.
LEVEL_WORDS = {1: "harder: a row and a column more", 0: "the same size", -1: "easier: fewer agents, smaller"}


def teacher_analysis(read: Mapping[str, Any]) -> str:
    """The teacher's analysis, the short thinking its answer follows from: the line it read,
    word for word (the summary's ``on the training environment`` line: a copy, which a small
    model learns before it learns to read), the level and the focus. The shipped policies learn to write it before the answer
    (:mod:`llm.engineer.examples`)."""
    r = read["rates"]
    where = "on the training environment" if read.get("where") == "current_env" else "on the suite"
    focus = read.get("focus")
    first = read.get("line") or (f"{where}: success {read['success']:.2f}, fall {r['fell']:.2f}, conflict "
                                 f"{r['conflict']:.2f}, timeout {r['timeout']:.2f}")
    lines = [first,
             f"level: {LEVEL_WORDS[int(read['level'])]}",
             "focus: " + {"fell": "falls: more holes", "conflict": "conflicts: denser crossings",
                          "timeout": "timeouts", None: "none"}[focus]]
    return "\n".join(lines)


def difficulty(mixture: Mixture, lakes: int = 32, seed: int = 0) -> float:
    """How hard a mixture is: the reference planner's mean sum of costs over ``lakes`` lakes
    drawn from it (each component its share, at least one lake; unsolved lakes count as the
    horizon times the agents, the most a plan can cost)."""
    from jaxlake.suite import generate_lakes, reference_soc

    mixture = Mixture.of(mixture)
    total, weight = 0.0, 0.0
    for i, (w, cfg) in enumerate(mixture):
        m = max(1, int(round(float(w) * lakes)))
        keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), i), m)
        soc = np.asarray(reference_soc(generate_lakes(keys, [cfg] * m)), dtype=float)
        soc = np.where(soc >= 0, soc, cfg.max_steps * cfg.num_agents)
        total += float(w) * float(soc.mean())
        weight += float(w)
    return total / max(weight, 1e-9)
