"""Engineer contexts for teaching the role: stage summaries of scripted policies of many skill
levels on many environments, played in the simulator and rendered as a run renders them.

A pretrained Qwen3 reads an engineer's prompt with what it knows of language; the shipped
0.9M policies learn the role from examples (:mod:`llm.engineer.examples`). An example's
context must be what an engineer really reads, so every number in it comes from rollouts:

* **scripted policies.** On every lake a policy plays one of four real plans
  (:data:`BEHAVIOURS`): the reference planner's (it succeeds), each agent's shortest path
  alone (:func:`jaxlake.baselines.alone_plan`: it collides), the blind straight walk
  (:func:`jaxlake.baselines.straight_plan`: it falls into holes) or the reference plan cut
  at half its length (it times out). A policy of skill ``s`` plays the reference on a lake
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
    cut = np.maximum(1, last.max(-1) // 2)  # [B]: half the longest path
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

    def choose(self, load: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``[B]`` behaviour indices into :data:`BEHAVIOURS` for lakes of ``load``."""
        ok = rng.random(load.shape) < self.skill ** load
        fail = 1 + rng.choice(3, size=load.shape, p=np.asarray(self.profile))
        return np.where(ok, 0, fail)

    @staticmethod
    def draw(rng: np.random.Generator) -> "ScriptedPolicy":
        return ScriptedPolicy(float(rng.uniform(0.05, 1.0) ** 0.7), tuple(rng.dirichlet([0.4, 0.4, 0.4])))


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
      mixtures: how many training mixtures (1 to 3 components each, drawn from the space).
      current_env_lakes: fresh lakes of each mixture the ``current_env`` line plays.
      env_stats_lakes: lakes of the environment statistics.
      k_failures: failure cases a summary shows.
      seed: everything is deterministic in it.
    """

    def __init__(self, suite: Suite, space: ConfigSpace, mixtures: int = 32, current_env_lakes: int = 16,
                 env_stats_lakes: int = 32, k_failures: int = 6, seed: int = 0) -> None:
        self.suite, self.space, self.k_failures, self.seed = suite, space, int(k_failures), int(seed)
        self.n_current = int(current_env_lakes)
        rng = np.random.default_rng([seed, 1])
        horizon = int(np.max(np.asarray(suite.lakes.max_steps)))
        self.suite_records = behaviour_records(suite.lakes, np.asarray([c["id"] for c in suite.cells])[suite.cell_of],
                                               suite.opt_soc, horizon, seed)
        self.suite_load = lake_load(suite.lakes)
        self.envs: list[_Env] = []
        for m in range(int(mixtures)):
            mix = self.draw_mixture(rng)
            key = jax.random.PRNGKey(10_007 * seed + m)
            lakes = generate_mixture(key, mix, self.n_current)
            cells_of = mixture_components(mix, self.n_current).astype(np.int64)
            recs = behaviour_records(lakes, cells_of, reference_soc(lakes), mix.horizon, seed + m + 1)
            stats = environment_stats(mix, int(env_stats_lakes), jax.random.fold_in(key, 1), solve=True)
            self.envs.append(_Env(mix, lakes, recs, render_grids(lakes), stats))

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
        episodes = pick_records(self.suite_records, policy.choose(self.suite_load, rng))
        cur = pick_records(env.records, policy.choose(lake_load(env.lakes), rng))
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
        the teacher reads and answers for it (``{"edit", "read"}``)."""
        rng = np.random.default_rng([self.seed, 2, int(index)])
        k = int(rng.integers(1, stages + 1))
        env = self.envs[int(rng.integers(len(self.envs)))]
        policy = ScriptedPolicy.draw(rng)
        history = []
        for j in range(1, k):  # earlier stages: weaker policies on other mixtures
            past = self.envs[int(rng.integers(len(self.envs)))]
            weaker = ScriptedPolicy(policy.skill * float(rng.uniform(0.5, 1.0)), policy.profile)
            ev = self.evaluation(past, weaker, rng)
            edit, _ = teacher_edit(summarize(ev, past.stats, (), 0), past.mixture, self.space)
            history.append(history_entry(j, past.mixture, ev, None,
                                         {"engineer": "policy", "decision": edit.describe()}))
        ev = self.evaluation(env, policy, rng)
        history.append(history_entry(k, env.mixture, ev))
        summary = summarize(ev, env.stats, history, self.k_failures)
        ctx = EngineerContext(stage=k, current=env.mixture, initial=env.mixture, eval_result=ev, summary=summary,
                              history=history, state={}, seed=int(index))
        edit, read = teacher_edit(summary, env.mixture, self.space)
        return ctx, {"edit": edit, "read": read, "next": apply_edit(env.mixture, edit, self.space.edits),
                     "skill": policy.skill, "profile": list(policy.profile)}
