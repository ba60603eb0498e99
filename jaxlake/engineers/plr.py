"""``engineer=plr``: Prioritized Level Replay over lake configs, from its definition.

PLR (Jiang, Grefenstette and Rocktäschel, *Prioritized Level Replay*, 2021) keeps a buffer of
levels the learner has trained on, each with a score of how much there is still to learn on
it, and at each decision either **replays** a level drawn from the buffer by a rank- and
staleness-based distribution (probability ``p_replay``) or plays a **new** level from the
generator. Here a level is a :class:`~jaxlake.config.LakeConfig` of the run's space, and a
decision is one stage's environment:

* **Buffer**: the levels the policy trained on, from the run's first environment on. After
  stage ``k`` each component of the stage's mixture is scored from the policy's rollouts on
  fresh lakes of **that component** (the ``current_env`` evaluation of the training mixture,
  split per component: ``current_env.modes[mode].by_component``) and inserted or updated with
  ``last_seen = k``. The held-out suite is never read: PLR sees what every engineer's training
  sees, no test cells. Full buffer (``capacity``): a new level replaces the lowest-scoring one
  (the stalest among equals) when it scores higher.
* **Score**: learnability ``p (1 - p)`` of the level's success rate ``p`` (largest at ``p =
  0.5``; 0 for a level always or never solved). The paper's positive value loss needs a
  value function, which GRPO does not have.
* **Replay distribution** over the ``N`` buffered levels::

      P_S(i) = h(rank_i)^(1/temperature) / sum_j h(rank_j)^(1/temperature),   h(r) = 1 / r
      P_C(i) = (now - last_seen_i) / sum_j (now - last_seen_j)       (staleness)
      P(i)   = (1 - staleness_coef) P_S(i) + staleness_coef P_C(i)

  Ranks sort by score, highest first; **tied levels share their ranks' mass equally** (each
  gets the mean of ``h^(1/temperature)`` over the ranks they occupy), so equal scores get
  equal probability whatever the buffer order. When no level is stale (all just trained)
  ``P = P_S``.
* **Decision, as an edit of the mixture** (:mod:`jaxlake.engineers.edits`): with probability
  ``p_replay`` (once the buffer holds ``min_replay`` scored levels) **replay**: ``levels``
  buffered levels are drawn from ``P`` without replacement, those not in the mixture are
  added, and the mixture is re-weighted by ``P`` (each stage samples its lakes' levels as PLR
  samples its episodes' levels). Otherwise **new**: ``levels`` new configs
  (:meth:`PLREngineer.new_levels`: uniform from the space, none already in the buffer) are
  added, each with a share of ``1 / (components + levels)``; when the mixture would pass
  ``max_components`` the lowest-scoring component is dropped. The edit rules' floor keeps
  every level in play.

Every proposal lies in the run's space (:func:`~jaxlake.engineers.space.check_in_space`).
:class:`~jaxlake.engineers.accel.ACCELEngineer` replaces the new-level step by an edit of a
replayed level. Everything the engineer keeps between stages is its ``state`` in
``engineer.json`` (the buffer, the levels it proposed, the decision).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from jaxlake.config import ConfigError, LakeConfig
from jaxlake.engineers.base import Engineer, EngineerContext, Proposal, check_mode
from jaxlake.engineers.edits import Edit, edit_proposal
from jaxlake.engineers.space import ConfigSpace, check_in_space, space_from_conf
from jaxlake.mixture import Mixture


# ============================================================================ the buffer, as pure functions
def level_key(config: LakeConfig | Mapping[str, Any]) -> str:
    """A level's identity in the buffer: its fields as sorted JSON."""
    values = config.to_dict() if isinstance(config, LakeConfig) else dict(config)
    return json.dumps(values, sort_keys=True)


def learnability(p: float) -> float:
    """``p (1 - p)``: how much a level with success rate ``p`` still has to teach."""
    return float(p) * (1.0 - float(p))


#: Scores closer than this are one tie: ``p (1 - p)`` of 0.1 and of 0.9 differ in the last bits
#: (0.09000000000000001 and 0.08999999999999998) but are the same learnability.
TIE_TOLERANCE = 1e-9


def rank_priorities(scores: Sequence[float], temperature: float) -> np.ndarray:
    """``P_S``: rank prioritisation, ``h(r) = 1 / r`` sharpened by ``1 / temperature``, highest
    score first; tied scores (within :data:`TIE_TOLERANCE` of the group's first) split their
    ranks' mass equally (equal scores, equal mass)."""
    scores = np.asarray(scores, dtype=np.float64)
    n = scores.shape[0]
    if n == 0:
        return np.zeros(0)
    h = np.arange(1, n + 1, dtype=np.float64) ** (-1.0 / float(temperature))
    order = np.argsort(-scores, kind="stable")
    out = np.empty(n)
    start = 0
    while start < n:  # groups of equal scores in sorted order
        end = start + 1
        while end < n and abs(scores[order[end]] - scores[order[start]]) <= TIE_TOLERANCE:
            end += 1
        out[order[start:end]] = h[start:end].mean()
        start = end
    return out / out.sum()


def staleness_priorities(last_seen: Sequence[int], now: int) -> Optional[np.ndarray]:
    """``P_C``: proportional to stages since each level was last trained; None when no level
    is stale."""
    stale = np.maximum(float(now) - np.asarray(last_seen, dtype=np.float64), 0.0)
    total = stale.sum()
    return stale / total if total > 0 else None


def replay_distribution(scores: Sequence[float], last_seen: Sequence[int], now: int, temperature: float,
                        staleness_coef: float) -> np.ndarray:
    """``P = (1 - staleness_coef) P_S + staleness_coef P_C`` (``P_S`` alone when no level is stale)."""
    p_score = rank_priorities(scores, temperature)
    p_stale = staleness_priorities(last_seen, now)
    if p_stale is None or len(p_score) == 0:
        return p_score
    return (1.0 - staleness_coef) * p_score + staleness_coef * p_stale


def update_buffer(buffer: Sequence[Mapping[str, Any]], scored: Sequence[tuple[LakeConfig, float, int]], now: int,
                  capacity: int) -> list[dict]:
    """The buffer after scoring ``scored`` = ``[(config, success p, episodes n), ...]`` at stage
    ``now``: a level already buffered gets its new score and ``last_seen = now``; a new one is
    appended, or, when the buffer is full, replaces the lowest-scoring level (the stalest
    among equals) if it scores higher."""
    out = [dict(e) for e in buffer]
    index = {level_key(e["config"]): i for i, e in enumerate(out)}
    for config, p, n in scored:
        entry = {"config": config.to_dict(), "p": float(p), "n": int(n), "score": learnability(p), "last_seen": int(now)}
        key = level_key(config)
        if key in index:
            old = out[index[key]]
            entry["visits"] = int(old.get("visits", 1)) + 1
            out[index[key]] = entry
            continue
        entry["visits"] = 1
        if len(out) < capacity:
            index[key] = len(out)
            out.append(entry)
            continue
        worst = min(range(len(out)), key=lambda i: (out[i]["score"], out[i]["last_seen"]))
        if entry["score"] > out[worst]["score"]:
            del index[level_key(out[worst]["config"])]
            out[worst] = entry
            index[key] = worst
    return out


def component_success(eval_result: Mapping[str, Any], mode: str) -> dict[str, tuple[float, int]]:
    """``level_key -> (success, episodes)`` of each component of the training mixture, from
    the policy's rollouts on that component's own lakes (``current_env`` of ``eval.json``,
    ``modes[mode].by_component``); empty when the evaluation has no per-component results."""
    modes = (eval_result.get("current_env") or {}).get("modes") or {}
    out = {}
    for comp in (modes.get(mode) or {}).get("by_component") or []:
        if comp.get("n", 0) > 0 and comp.get("score") is not None:
            out[level_key(comp["config"])] = (float(comp["score"]), int(comp["n"]))
    return out


# ============================================================================ the engineer
class PLREngineer(Engineer):
    """Prioritized Level Replay over the run's space (see the module docstring).

    Args:
      levels: components of each proposed mixture (equal weights).
      p_replay: probability of replaying buffered levels rather than playing new ones.
      temperature: rank prioritisation temperature (smaller: more mass on the top ranks).
      staleness_coef: share of the staleness term in the replay distribution, in [0, 1].
      capacity: buffer size.
      min_replay: scored levels the buffer needs before replay is possible (at least ``levels``).
      mode: the evaluation mode whose per-component success scores the levels.
      space: the engineer's ``space:`` node (``editable``, ``values``).
    """

    name = "plr"
    #: How :meth:`new_levels` makes levels (shown in the decision's reason).
    new_kind = "uniform from the space"

    def __init__(
        self,
        levels: int = 2,
        p_replay: float = 0.5,
        temperature: float = 0.3,
        staleness_coef: float = 0.3,
        capacity: int = 32,
        min_replay: int = 2,
        mode: str = "sampled",
        space: Optional[Mapping[str, Any]] = None,
        name: str = "plr",
        **_: Any,
    ) -> None:
        if int(levels) < 1:
            raise ConfigError(f"engineer.levels={levels} not in [1, inf)")
        if not 0.0 <= float(p_replay) <= 1.0:
            raise ConfigError(f"engineer.p_replay={p_replay} not in [0, 1]")
        if not float(temperature) > 0:
            raise ConfigError(f"engineer.temperature={temperature} not in (0, inf)")
        if not 0.0 <= float(staleness_coef) <= 1.0:
            raise ConfigError(f"engineer.staleness_coef={staleness_coef} not in [0, 1]")
        if int(capacity) < int(levels):
            raise ConfigError(f"engineer.capacity={capacity} not in [levels={int(levels)}, inf)")
        if not int(levels) <= int(min_replay) <= int(capacity):
            raise ConfigError(f"engineer.min_replay={min_replay} not in [levels={int(levels)}, capacity={int(capacity)}]")
        self.levels, self.p_replay, self.temperature = int(levels), float(p_replay), float(temperature)
        self.staleness_coef, self.capacity, self.min_replay = float(staleness_coef), int(capacity), int(min_replay)
        self.mode, self.space_node, self.name = check_mode(mode), space, name

    # ------------------------------------------------------------------ steps
    def score_stage(self, ctx: EngineerContext) -> tuple[list[dict], list[str]]:
        """The buffer after this stage: every component of the mixture the stage trained on (the
        run's first environment included), scored on its own lakes."""
        state = ctx.state or {}
        buffer = list(state.get("buffer") or [])
        success = component_success(ctx.eval_result, self.mode)
        scored, notes = [], []
        for _, config in ctx.current:
            key = level_key(config)
            if key not in success:
                notes.append("no per-component success on the training environment (eval.current_env_lakes=0?)")
            else:
                scored.append((config, *success[key]))
        return update_buffer(buffer, scored, ctx.stage, self.capacity), sorted(set(notes))

    def new_levels(self, ctx: EngineerContext, space: ConfigSpace, buffer: list[dict], probs: np.ndarray,
                   rng: np.random.Generator, k: int) -> list[LakeConfig]:
        """``k`` distinct new levels, none in the buffer: uniform from the space (PLR's generator)."""
        taken = {level_key(e["config"]) for e in buffer}
        out: list[LakeConfig] = []
        for _ in range(50 * k):
            if len(out) == k:
                break
            config = space.sample(rng)
            if level_key(config) not in taken:
                taken.add(level_key(config))
                out.append(config)
        return out or [space.sample(rng)]

    def propose(self, ctx: EngineerContext) -> Proposal:
        space = space_from_conf(ctx.base, self.space_node)
        rules = space.edits
        rng = ctx.rng(2)
        buffer, notes = self.score_stage(ctx)
        current = list(ctx.current.configs)
        n = len(current)
        # a level can be in play when it is in the mixture, or can be added (it lies in this
        # stage's space: a space that changed does not replay levels outside it)
        eligible = [i for i, e in enumerate(buffer)
                    if LakeConfig.from_dict(e["config"]) in current or _in_space(LakeConfig.from_dict(e["config"]), space)]
        scores = [buffer[i]["score"] for i in eligible]
        probs = replay_distribution(scores, [buffer[i]["last_seen"] for i in eligible], ctx.stage, self.temperature,
                                    self.staleness_coef)
        can_replay = len(eligible) >= self.min_replay
        replay = bool(rng.random() < self.p_replay) and can_replay
        score_of = {level_key(e["config"]): e["score"] for e in buffer}
        if replay:
            k = min(self.levels, len(eligible))
            picked = [eligible[int(i)] for i in rng.choice(len(eligible), size=k, replace=False, p=probs)]
            prob_of = {level_key(buffer[i]["config"]): float(probs[j]) for j, i in enumerate(eligible)}
            drawn = [LakeConfig.from_dict(buffer[i]["config"]) for i in picked]
            room = max(0, rules.max_components - n)
            new = [c for c in drawn if c not in current][: min(room, rules.max_add)]
            weights = tuple(prob_of.get(level_key(c), 0.0) for c in current)
            if sum(weights) <= 0:
                weights = None
            add = tuple((prob_of[level_key(c)], c) for c in new)
            kind = "add" if add else ("reweight" if n >= 2 and weights is not None else "keep")
            edit = Edit(kind, weights if kind != "keep" else None, (), add)
            configs = drawn
            why = (f"replay: {len(drawn)} buffered level(s) drawn by rank ({self.temperature}) and staleness "
                   f"({self.staleness_coef}) priority; the mixture re-weighted by that priority"
                   + (f", {len(add)} added" if add else ""))
        else:
            chosen = [buffer[i] for i in eligible]
            configs = [c for c in self.new_levels(ctx, space, chosen, probs, rng, self.levels) if c not in current]
            drop: tuple = ()
            if n + len(configs) > rules.max_components and n >= 2 and rules.max_drop >= 1:
                worst = min(range(n), key=lambda j: (score_of.get(level_key(current[j]), 0.0), -j))
                drop = (worst,)
            room = rules.max_components - n + len(drop)
            configs = configs[: max(0, min(room, rules.max_add))]
            share = 1.0 / (n - len(drop) + len(configs)) if configs else 0.0
            add = tuple((share, c) for c in configs)
            kind = "replace" if drop and add else ("add" if add else ("drop" if drop else "keep"))
            edit = Edit(kind, None, drop, add)
            why = f"new: {len(add)} level(s) added ({self.new_kind})" + (
                f", the lowest-scoring component #{drop[0]} dropped" if drop else "") + (
                "" if can_replay else f"; the buffer has {len(eligible)} of the {self.min_replay} levels replay needs")
        table = sorted(
            ({"config": buffer[i]["config"], "p": buffer[i]["p"], "score": buffer[i]["score"],
              "last_seen": buffer[i]["last_seen"], "priority": round(float(probs[j]), 6)}
             for j, i in enumerate(eligible)),
            key=lambda r: -r["priority"],
        )[:10]
        return edit_proposal(
            ctx, edit, why, space=space,
            record={"replay": replay, "buffer_size": len(buffer), "top_priorities": table, "notes": notes},
            state={"buffer": buffer, "proposed": [level_key(c) for c in configs], "replay": replay},
        )


def _in_space(config: LakeConfig, space: ConfigSpace) -> bool:
    try:
        check_in_space(Mixture.of(config), space, 1)
        return True
    except ConfigError:
        return False
