"""Engineer contexts for teaching the role: stage summaries of scripted policies of many skill
levels on many environments, played in the simulator and rendered as a run renders them.

A pretrained Qwen3 reads an engineer's prompt with what it knows of language; the shipped
0.9M policies learn the role from examples (:mod:`llm.engineer.examples`). An example's
context must be what an engineer really reads, so every number in it comes from rollouts:

* **scripted policies.** On every lake a policy plays one of four real plans
  (:data:`BEHAVIOURS`): the reference planner's (it succeeds), each agent's shortest path
  alone (:func:`jaxlake.baselines.alone_plan`: it collides), the blind straight walk
  (:func:`jaxlake.baselines.straight_plan`: it falls into holes) or the reference plan cut
  at half its length, rounded down (it times out, on any lake). A policy of skill ``s`` plays the reference on a lake
  with probability ``s ** d``, ``d`` the lake's load (agents times its longer side over 8:
  bigger, more crowded lakes fail more), and otherwise one of the three failing plans by its
  own failure profile (Dirichlet weights). Each behaviour is played once per lake
  (:func:`jaxlake.suite.score_texts`); a policy picks among the records, so a context costs no
  rollout of its own;
* **the evaluation** is an ``eval.json`` dict as :func:`llm.training.evaluate.evaluate_policy`
  writes it: the held-out suite of the run's ``eval`` config (``modes.greedy`` with its
  ``by_dim`` breakdown, the episodes, the grids) and ``current_env`` on fresh lakes of the
  training mixture (per component);
* **the summary** is :func:`jaxlake.summaries.summarize` of it, with the environment's
  statistics (:func:`jaxlake.summaries.environment_stats`) and a stage history of earlier
  scripted stages.

:class:`ContextPool` holds the suite's and a set of mixtures' behaviour records;
:meth:`ContextPool.context` draws one :class:`EngineerContext`, deterministic in its index.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np

from jaxlake.baselines import alone_plan, batch_plans, plan_texts, straight_plan
from jaxlake.config import LakeConfig
from jaxlake.engineers.base import EngineerContext
from jaxlake.engineers.edits import apply_edit
from jaxlake.engineers.space import ConfigSpace
from jaxlake.engineers.teacher import teacher_edit
from jaxlake.generator import generate_mixture, mixture_components
from jaxlake.mixture import Mixture
from jaxlake.planner import solve_batch
from jaxlake.suite import (Suite, aggregate, by_component, reference_soc, render_grids, score_texts)
from jaxlake.summaries import environment_stats, history_entry, summarize
from jaxlake.types import STAY, Lake

#: The plans a scripted policy plays, the first one the successful.
BEHAVIOURS = ("reference", "alone", "straight", "short")


def behaviour_plans(lakes: Lake, horizon: int) -> dict[str, np.ndarray]:
    """``{behaviour: [B, max_agents, horizon]}`` plans of every lake (module doc)."""
    ref = np.asarray(solve_batch(lakes, horizon=horizon).actions)
    moving = ref != STAY
    last = np.where(moving.any(-1), horizon - np.argmax(moving[..., ::-1], axis=-1), 0)  # [B, A] moves kept
    cut = last.max(-1) // 2  # [B]: half the longest path, rounded down (a one-step plan becomes no move)
    short = np.where(np.arange(horizon)[None, None, :] < cut[:, None, None], ref, STAY)
    return {"reference": ref, "alone": batch_plans(alone_plan, lakes, horizon),
            "straight": batch_plans(straight_plan, lakes, horizon), "short": short.astype(np.int32)}


def behaviour_records(lakes: Lake, cells_of: np.ndarray, opt_soc: Optional[np.ndarray], horizon: int,
                      seed: int = 0) -> dict[str, list[dict]]:
    """``{behaviour: [B episode records]}``: each behaviour's plan played on every lake."""
    plans = behaviour_plans(lakes, horizon)
    n = int(np.asarray(lakes.num_agents).shape[0])
    out = {}
    for i, name in enumerate(BEHAVIOURS):
        out[name] = score_texts(lakes, plan_texts(lakes, plans[name]), jax.random.PRNGKey(seed * 31 + i),
                                lake_ids=np.arange(n), cell_ids=np.asarray(cells_of),
                                opt_soc=None if opt_soc is None else np.asarray(opt_soc), mode="greedy",
                                horizon=horizon)
    return out


def lake_load(lakes: Lake) -> np.ndarray:
    """``[B]``: agents times the longer side over 8 (how hard a lake is for a scripted policy)."""
    side = np.maximum(np.asarray(lakes.height), np.asarray(lakes.width))
    return np.asarray(lakes.num_agents) * side / 8.0


@dataclasses.dataclass(frozen=True)
class ScriptedPolicy:
    """A scripted policy: ``skill`` in (0, 1] and its ``profile`` over the failing behaviours
    (``alone``, ``straight``, ``short``; sums to 1)."""

    skill: float
    profile: tuple

    def choose(self, load: np.ndarray, rng: np.random.Generator, wins: Optional[np.ndarray] = None) -> np.ndarray:
        """``[B]`` behaviour indices into :data:`BEHAVIOURS` for lakes of ``load``.

        ``wins`` (``[4, B]``: whether each behaviour wins each lake): a lake the policy fails
        gets a failing plan of its profile that really fails there (the profile renormalised
        over those; on a small lake the shortest paths alone often meet no one, and the blind
        walk finds no hole; any failing plan that fails there when none of its profile's does),
        and the reference plan where none does."""
        ok = rng.random(load.shape) < self.skill ** load
        profile = np.asarray(self.profile, np.float64)
        if wins is None:
            fail = 1 + rng.choice(3, size=load.shape, p=profile)
        else:
            fails = 1 - np.asarray(wins[1:], np.float64)
            p = profile[:, None] * fails
            p = np.where(p.sum(0) > 0, p, fails) + 1e-12  # none of its own fails there: any that does
            u = rng.random(load.shape) * p.sum(0)
            fail = 1 + np.minimum((np.cumsum(p, 0) < u[None]).sum(0), 2)
            fail = np.where(np.asarray(wins[1:]).all(0), 0, fail)
        return np.where(ok, 0, fail)

    def success(self, load: np.ndarray, wins: np.ndarray) -> np.ndarray:
        """``[B]`` expected success on lakes of ``load`` whose behaviours win as ``wins``
        (``[4, B]``) when the policy plays as it would on lakes it has not seen
        (:meth:`choose` without ``wins``): the reference plan with probability ``skill ** load``,
        else a failing plan drawn by its profile, which wins where that plan happens to win
        (a policy that walks blind wins a lake without holes on the way)."""
        wins = np.asarray(wins, np.float64)
        s = self.skill ** np.asarray(load, np.float64)
        return s * wins[0] + (1 - s) * np.tensordot(np.asarray(self.profile, np.float64), wins[1:], axes=1)

    @staticmethod
    def draw(rng: np.random.Generator) -> "ScriptedPolicy":
        return ScriptedPolicy(float(rng.uniform(0.05, 1.0) ** 0.7), tuple(rng.dirichlet([0.4, 0.4, 0.4])))

    @staticmethod
    def for_success(target: float, load: np.ndarray, profile: Sequence[float],
                    wins: Optional[np.ndarray] = None) -> "ScriptedPolicy":
        """The policy of failure ``profile`` whose expected success on lakes of ``load`` is
        closest to ``target`` (by bisection on its skill). ``wins`` (``[4, B]``, whether each of
        :data:`BEHAVIOURS` wins each lake) counts the lakes no failing plan fails (as
        :meth:`choose` plays them); without it only the reference plan wins
        (``mean(skill ** load) = target``)."""
        load = np.asarray(load, np.float64)
        wins = np.vstack([np.ones_like(load), np.zeros((3, load.size))]) if wins is None else np.asarray(wins, np.float64)

        def expected(skill: float) -> float:  # as choose(wins=...) plays: a failing plan that fails, if any
            s = skill ** load
            return float(np.mean(s * wins[0] + (1 - s) * np.where(wins[1:].all(0), wins[0], 0.0)))

        lo, hi = 1e-4, 1.0
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if expected(mid) < target else (lo, mid)
        return ScriptedPolicy(float(0.5 * (lo + hi)), tuple(float(p) for p in profile))


def wins_of(records: Mapping[str, Sequence[dict]]) -> np.ndarray:
    """``[4, B]``: whether each of :data:`BEHAVIOURS` wins each lake of ``records``."""
    return np.asarray([[bool(r["success"]) for r in records[b]] for b in BEHAVIOURS])


def pick_records(records: Mapping[str, Sequence[dict]], choice: np.ndarray) -> list[dict]:
    """Lake ``i``'s record from behaviour ``choice[i]``."""
    return [dict(records[BEHAVIOURS[int(c)]][i]) for i, c in enumerate(choice)]


@dataclasses.dataclass
class _Env:
    mixture: Mixture
    lakes: Lake
    records: dict
    grids: list
    stats: dict


class ContextPool:
    """Behaviour records of a suite and of ``mixtures`` training mixtures, from which
    :meth:`context` draws engineer contexts.

    Args:
      suite: the held-out suite the summaries' behaviour part reads (the run's ``eval``).
      space: the engineer's space (the mixtures' components are drawn from it; the teacher
        answers in it).
      mixtures: how many training mixtures (1 to 3 components each, drawn from the space), or
        the mixtures themselves.
      current_env_lakes: fresh lakes of each mixture the ``current_env`` line plays.
      env_stats_lakes: lakes of the environment statistics.
      k_failures: failure cases a summary shows.
      seed: everything is deterministic in it.
      start: a run's first environment, or several: then ``reachable`` of the mixtures (the
        starts among them) are those a curriculum from them visits (the teacher's edits for
        scripted policies, any number of stages deep, up to the space's ``max_components``),
        the rest drawn at random; :meth:`context` draws a start with probability
        ``start_share``, another reached mixture with ``reachable``, a random one otherwise.
      reachable: the share of the mixtures (and of the contexts) reached from the starts.
      start_share: the share of the contexts on the starts themselves.
    """

    def __init__(self, suite: Suite, space: ConfigSpace, mixtures: int | Sequence[Any] = 32, current_env_lakes: int = 16,
                 env_stats_lakes: int = 32, k_failures: int = 6, seed: int = 0, start: Any = None,
                 reachable: float = 0.5, start_share: float = 0.2) -> None:
        self.suite, self.space, self.k_failures, self.seed = suite, space, int(k_failures), int(seed)
        self.env_stats_lakes, self.start_share, self.reach_share = int(env_stats_lakes), float(start_share), float(reachable)
        self.n_current = int(current_env_lakes)
        rng = np.random.default_rng([seed, 1])
        horizon = int(np.max(np.asarray(suite.lakes.max_steps)))
        self.suite_records = behaviour_records(suite.lakes, np.asarray([c["id"] for c in suite.cells])[suite.cell_of],
                                               suite.opt_soc, horizon, seed)
        self.suite_load = lake_load(suite.lakes)
        self.suite_wins = wins_of(self.suite_records)
        self.envs: list[_Env] = []
        self.reached = 0  # envs[:reached] are the starts and the mixtures reached from them
        self.starts = 0  # envs[:starts] are the starts
        if start is not None and isinstance(mixtures, int):
            starts = [Mixture.of(m) for m in (start if isinstance(start, (list, tuple)) else [start])]
            for m in starts:
                self.envs.append(self._env(m, len(self.envs)))
            self.starts = len(starts)
            n_reach = max(len(starts), int(round(reachable * int(mixtures))))
            for _ in range(50 * n_reach):
                if len(self.envs) >= n_reach:
                    break
                parent = int(rng.integers(len(self.envs)))
                ctx, label = self.context_of(parent, ScriptedPolicy.draw(rng), 1, rng)
                child = label["next"]
                if len(child) <= space.edits.max_components and all(child != e.mixture for e in self.envs):
                    self.envs.append(self._env(child, len(self.envs)))
            self.reached = len(self.envs)
        given = None if isinstance(mixtures, int) else [Mixture.of(m) for m in mixtures]
        for m in range(len(self.envs), len(given) if given is not None else int(mixtures)):
            self.envs.append(self._env(given[m] if given is not None else self.draw_mixture(rng), m))

    def _env(self, mix: Mixture, m: int) -> _Env:
        key = jax.random.PRNGKey(10_007 * self.seed + m)
        lakes = generate_mixture(key, mix, self.n_current)
        cells_of = mixture_components(mix, self.n_current).astype(np.int64)
        recs = behaviour_records(lakes, cells_of, reference_soc(lakes), mix.horizon, self.seed + m + 1)
        stats = environment_stats(mix, self.env_stats_lakes, jax.random.fold_in(key, 1), solve=True)
        return _Env(mix, lakes, recs, render_grids(lakes), stats)

    def success_on(self, policy: ScriptedPolicy, mixture: Any, lakes: int, seed: int = 0) -> np.ndarray:
        """``[lakes]`` expected success of ``policy`` on fresh lakes of ``mixture``
        (:meth:`ScriptedPolicy.success`, its four behaviours played once a lake)."""
        mix = Mixture.of(mixture)
        found = generate_mixture(jax.random.PRNGKey(seed), mix, int(lakes))
        cells_of = mixture_components(mix, int(lakes)).astype(np.int64)
        wins = wins_of(behaviour_records(found, cells_of, None, mix.horizon, seed))
        return policy.success(lake_load(found), wins)

    def learnability(self, policy: ScriptedPolicy, mixture: Any, lakes: int, seed: int = 0) -> float:
        """``mean(4 p (1 - p))`` over :meth:`success_on`: how much the policy a context
        describes would learn from ``mixture`` (engineer self-play on scripted contexts,
        :mod:`llm.engineer.selfplay`)."""
        p = self.success_on(policy, mixture, lakes, seed)
        return float(np.mean(4.0 * p * (1.0 - p)))

    def draw_mixture(self, rng: np.random.Generator) -> Mixture:
        """1 to 3 distinct configs of the space, weights from {1, 2, 4} (normalised)."""
        k = int(rng.choice([1, 1, 2, 3]))
        configs: list[LakeConfig] = []
        while len(configs) < k:
            c = self.space.sample(rng)
            if c not in configs:
                configs.append(c)
        weights = rng.choice([1.0, 2.0, 4.0], size=k)
        return Mixture.of([(float(w / weights.sum()), c) for w, c in zip(weights, configs)])

    def evaluation(self, env: _Env, policy: ScriptedPolicy, rng: np.random.Generator) -> dict:
        """The ``eval.json`` dict of ``policy`` on the suite and on ``env``'s lakes."""
        suite = self.suite
        episodes = pick_records(self.suite_records, policy.choose(self.suite_load, rng, self.suite_wins))
        cur = pick_records(env.records, policy.choose(lake_load(env.lakes), rng, wins_of(env.records)))
        cells = [{"id": i, "values": {}, "config": c} for i, c in enumerate(env.mixture.configs)]
        result = {
            "suite": suite.describe(), "grids": suite.grids, "episodes": episodes,
            "modes": {"greedy": aggregate(episodes, suite.cells, suite.dims)},
            "current_env": {"env": [{"weight": float(w), "config": c.to_dict()} for w, c in env.mixture],
                            "grids": env.grids, "episodes": cur,
                            "modes": {"greedy": by_component(aggregate(cur, cells, []), env.mixture.weights)}},
        }
        result["score"] = result["modes"]["greedy"]["score"]
        return result

    def context(self, index: int, stages: int = 3) -> tuple[EngineerContext, dict]:
        """Context ``index``: a scripted policy after stage ``k`` (1 to ``stages``) on one of
        the pool's mixtures, with ``k - 1`` earlier scripted stages in its history; and what
        the teacher reads and answers for it (``{"edit", "read", "next", "skill", "profile"}``)."""
        rng = np.random.default_rng([self.seed, 2, int(index)])
        k = int(rng.integers(1, stages + 1))
        env = self.draw_env(rng)
        # the skill is drawn for a success uniform on the training environment's lakes, so that
        # the teacher's three levels are about as frequent as their ranges are wide
        target, profile = float(rng.uniform(0.02, 1.0)), rng.dirichlet([0.4, 0.4, 0.4])
        here = self.envs[env]
        policy = ScriptedPolicy.for_success(target, lake_load(here.lakes), profile, wins_of(here.records))
        return self.context_of(env, policy, k, rng, seed=int(index))

    def draw_env(self, rng: np.random.Generator) -> int:
        """A mixture's index: a start with probability ``start_share``, another reached
        mixture with ``reachable``, a random one otherwise (uniform without a start)."""
        u = rng.random()
        if self.starts and u < self.start_share:
            return int(rng.integers(self.starts))
        if self.reached > self.starts and u < self.start_share + self.reach_share:
            return int(rng.integers(self.starts, self.reached))
        if len(self.envs) > self.reached:
            return int(rng.integers(self.reached, len(self.envs)))
        return int(rng.integers(len(self.envs)))

    def context_of(self, env: int, policy: ScriptedPolicy, stage: int = 1, rng: Optional[np.random.Generator] = None,
                   seed: int = 0) -> tuple[EngineerContext, dict]:
        """The context of ``policy`` after stage ``stage`` on the pool's mixture ``env`` (its
        earlier stages: weaker copies of it on other mixtures), and the teacher's label."""
        rng = rng if rng is not None else np.random.default_rng([self.seed, 3, int(seed)])
        here = self.envs[int(env)]
        history = []
        for j in range(1, int(stage)):  # earlier stages: weaker policies on other mixtures
            past = self.envs[int(rng.integers(len(self.envs)))]
            weaker = ScriptedPolicy(policy.skill * float(rng.uniform(0.5, 1.0)), policy.profile)
            ev = self.evaluation(past, weaker, rng)
            edit, _ = teacher_edit(summarize(ev, past.stats, (), 0), past.mixture, self.space)
            history.append(history_entry(j, past.mixture, ev, None,
                                         {"engineer": "policy", "decision": edit.describe()}))
        ev = self.evaluation(here, policy, rng)
        history.append(history_entry(int(stage), here.mixture, ev))
        summary = summarize(ev, here.stats, history, self.k_failures)
        ctx = EngineerContext(stage=int(stage), current=here.mixture, initial=here.mixture, eval_result=ev,
                              summary=summary, history=history, state={}, seed=int(seed))
        edit, read = teacher_edit(summary, here.mixture, self.space)
        return ctx, {"edit": edit, "read": read, "next": apply_edit(here.mixture, edit, self.space.edits),
                     "skill": policy.skill, "profile": list(policy.profile)}
