"""The students the staged pipeline trains, behind one small protocol (:class:`Student`).

``python -m jaxlake.run`` trains the LLM (``student=llm``, the default: GRPO on the policy of
:mod:`llm.training.stage`) or the IPPO student (``student=ippo``: :mod:`jaxlake.students`).
Everything else of a stage is the same for both (:mod:`jaxlake.pipeline.stages`): the stage's
environment is the engineer's mixture, the held-out suite is the same ``jaxlake.suite`` cells and
lakes, the summaries and the engineers read the same ``eval.json``, and the stage table is
printed the same way. A student does four things:

* :meth:`Student.train` -- train stage ``k`` on its mixture from the previous stage's policy
  (``None``: the student's start), resumable; returns ``train.json``'s record (paths relative to
  the stage folder);
* :meth:`Student.evaluate` -- the policy on the held-out suite (and on lakes of the stage's own
  mixture), as an ``eval.json`` dict (``llm.training.evaluate``'s format: modes, per-cell and
  per-dimension metrics, one episode record per lake with its success and failure kinds);
* :meth:`Student.policy` -- where a finished stage's policy is (what the next stage starts from);
* :meth:`Student.history` -- the training line of a stage in the summaries' history;
* :meth:`Student.success` -- the policy's sampled success on fresh lakes of each component of
  a mixture, rollouts only (what the learnability engineers ``sfl`` and ``oracle`` read).

The IPPO student (:class:`IPPOStudent`) plays every suite lake closed loop, step by step
(:func:`jaxlake.students.play.play_plans`: greedy, and sampled when ``eval.sampled.num_samples``
is on, actions drawn from the policy itself) and scores the actions it took with the suite's own
scorer (:func:`jaxlake.suite.score_texts`), which replays them exactly. A stage is
``ippo.num_updates`` updates (:func:`jaxlake.students.stage.train_stage`). The model-backed
engineers (``policy``, ``base``, ``external``) keep reading the summaries with their own model:
for the IPPO student that model is the run's ``model`` (the shipped tiny LLM by default), for
``policy`` and ``base`` alike, since the student is not a language model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Protocol

import numpy as np

from jaxlake.mixture import Mixture
from jaxlake.pipeline import cluster
from jaxlake.pipeline.folder import log, relative, stage_path
from jaxlake.pipeline.settings import PipelineError, RunSettings

#: ``student=<name>`` values (conf/student/<name>.yaml).
STUDENTS = ("llm", "ippo")


class Student(Protocol):
    """What the stage loop asks of a student (module docstring)."""

    name: str
    #: ``train.json`` keys that may name the trained policy, in order of preference.
    policy_keys: tuple[str, ...]

    def train(self, s: RunSettings, k: int, d: Path, mixture: Mixture, init: Optional[Path],
              quiet: bool = False) -> dict: ...

    def evaluate(self, s: RunSettings, k: int, policy: Optional[Path], mixture: Mixture, checkpoint: str,
                 suite: Any = None) -> dict: ...

    def probe_settings(self, s: RunSettings, steps: int) -> RunSettings: ...

    def start_name(self, s: RunSettings) -> str: ...

    def history(self, train: dict) -> dict: ...

    def engineer_model(self, s: RunSettings, d: Path, train: dict, which: str) -> tuple[Any, Any]: ...

    def success(self, s: RunSettings, policy: Optional[Path], mixture: Mixture, lakes: int, samples: int,
                seed: int) -> list[dict]: ...


def component_lakes(mixture: Mixture, lakes: int, seed: int) -> tuple[Any, np.ndarray]:
    """``lakes`` fresh lakes of each component of ``mixture`` (in component blocks, component 0
    first) and ``[n]`` the component of each: what :meth:`Student.success` plays."""
    import jax

    from jaxlake.generator import mixture_components
    from llm.game.lakes import sample_lakes

    equal = Mixture([(1.0, c) for c in Mixture.of(mixture).configs])
    n = int(lakes) * len(equal)
    return sample_lakes(jax.random.PRNGKey(int(seed)), equal, n), mixture_components(equal, n).astype(np.int64)


def per_component(episodes: list[dict], components: int) -> list[dict]:
    """``[{"p", "n"}]``: mean success of the episodes of each component (``episode["cell"]``)."""
    wins = np.zeros(components)
    count = np.zeros(components, dtype=np.int64)
    for e in episodes:
        wins[e["cell"]] += bool(e["success"])
        count[e["cell"]] += 1
    return [{"p": float(wins[i] / count[i]) if count[i] else 0.0, "n": int(count[i])} for i in range(components)]


def policy_of(student: Student, s: RunSettings, d: Path, train: dict) -> Optional[Path]:
    """The trained policy a stage's ``train.json`` names that exists (``None``: none does)."""
    for key in student.policy_keys:
        if train.get(key) and stage_path(s, d, train[key]).exists():
            return stage_path(s, d, train[key])
    return None


def _load_llm(s: RunSettings, path: Optional[Path]):
    from llm.model.distributed import solo
    from llm.training.policy import load_policy

    with solo():  # process 0 alone (the engineer's model): the others wait for its decision, not in its reads
        return load_policy(s.model, path)


# ============================================================================ the LLM
class LLMStudent:
    """The language-model policy (the default): GRPO stages, suite evaluation by decoding."""

    name = "llm"
    policy_keys = ("policy_dir", "checkpoint_dir")

    def train(self, s: RunSettings, k: int, d: Path, mixture: Mixture, init: Optional[Path],
              quiet: bool = False) -> dict:
        from llm.training.stage import train_stage

        if not quiet:  # (a probe says what it is itself)
            log(f"stage {k}: training" + (f" from {init}" if init else ""))
        warmstart_env = None
        tc = s.stage_config(k).train
        if s.warmstart_env != "stage" and (tc.warmstart.enabled or tc.grpo.anchor.enabled):
            # GRPO stays on the stage's mixture (its anchor takes this one)
            if s.warmstart_env == "suite":  # an experiment; settings refuse it without a suite
                from llm.training.experiments.suite_env import suite_mixture

                warmstart_env = suite_mixture(s.eval.suite)
            else:
                from jaxlake.pipeline.pretrain import space_mixture

                warmstart_env = space_mixture(s)
        from jaxlake.pipeline.selfplay import selfplay_hooks

        res = cluster.collective(train_stage, s.stage_config(k), mixture, d, init_from=init,  # every process
                                 warmstart_env=warmstart_env, hooks=selfplay_hooks(s, k, mixture))
        if res.eval_after is None:  # the trainer stopped before the end of its schedule
            raise PipelineError(
                f"training of stage {k} stopped after {res.warmstart_steps} warm-start and {res.grpo_steps} GRPO "
                f"steps; rerun the same command to resume from {res.checkpoint_dir}"
            )
        return {  # paths relative to the stage folder (stage_path resolves them)
            "checkpoint_dir": relative(Path(res.checkpoint_dir), d),
            "policy_dir": relative(Path(res.policy_dir), d) if res.policy_dir else None,
            "init_from": relative(init, d),
            "warmstart_steps": res.warmstart_steps,
            "grpo_steps": res.grpo_steps,
            "resumed": res.resumed,
            "eval_before": res.eval_before,
            "eval_after": res.eval_after,
            "wall_s": round(res.wall_s, 2),
        }

    def evaluate(self, s: RunSettings, k: int, policy: Optional[Path], mixture: Mixture, checkpoint: str,
                 suite: Any = None) -> dict:
        return cluster.collective(cluster.evaluate_suite, s, k, policy, mixture,  # every process
                                  checkpoint=checkpoint, suite=suite)

    def probe_settings(self, s: RunSettings, steps: int) -> RunSettings:
        """``steps`` GRPO steps, no warm start, no held-out evaluation, export or plot, metrics
        to ``metrics.jsonl`` only (a probe of :mod:`jaxlake.pipeline.probe`)."""
        import dataclasses

        tc = s.train.train
        grpo = dataclasses.replace(tc.grpo, steps=int(steps), eval_every=0, checkpoint_every=int(steps),
                                   keep_checkpoints=1)
        train = dataclasses.replace(tc, warmstart=dataclasses.replace(tc.warmstart, enabled=False), grpo=grpo,
                                    eval=dataclasses.replace(tc.eval, num_lakes=0), export_hf=False, plot=False,
                                    progress=False,
                                    engineer_selfplay=dataclasses.replace(tc.engineer_selfplay, enabled=False))
        logger = dataclasses.replace(s.train.logger, backends=("jsonl",))
        return dataclasses.replace(s, train=dataclasses.replace(s.train, train=train, logger=logger))

    def start_name(self, s: RunSettings) -> str:
        from llm.training.policy import start_source

        source = start_source(s.model)
        if source == "shipped":
            return f"the shipped {'expert planner' if s.model.shipped == 'planner' else s.model.shipped}"
        return str(s.model.path) if source == "path" else "fresh weights"

    def history(self, train: dict) -> dict:
        after = train.get("eval_after") or {}
        return {"grpo_steps": train.get("grpo_steps"), "success_after_training": after.get("success")}

    def engineer_model(self, s: RunSettings, d: Path, train: dict, which: str) -> tuple[Any, Any]:
        path = stage_path(s, d, train.get("policy_dir") or train["checkpoint_dir"]) if which == "policy" else None
        policy = _load_llm(s, path)
        return policy.module(), policy.tokenizer

    def success(self, s: RunSettings, policy: Optional[Path], mixture: Mixture, lakes: int, samples: int,
                seed: int) -> list[dict]:
        """Sampled plans (temperature 1, the suite's sampled decoding) of the policy at ``policy``
        on ``lakes`` fresh lakes of each component, ``samples`` a lake: each component's success."""
        from llm.game.lakes import env_horizon
        from llm.game.prompter import Prompter
        from llm.game.prompts import PromptConfig
        from llm.training.evaluate import plan_token_budget, run_modes

        mixture = Mixture.of(mixture)
        model = _load_llm(s, policy)
        lk, cells_of = component_lakes(mixture, lakes, seed)
        pcfg = s.prompt if isinstance(s.prompt, PromptConfig) else PromptConfig.from_dict(dict(s.prompt or {}))
        prompter = Prompter.fit(model.tokenizer, pcfg, lk, None, 16)
        horizon = env_horizon(mixture)
        agents = int(np.max(np.asarray(lk.num_agents)))
        sampled = dict((s.eval.node or {}).get("sampled") or {}) if s.eval is not None else {}
        mode = ("sampled", {"temperature": float(sampled.get("temperature", 1.0)), "top_k": int(sampled.get("top_k", 0)),
                            "top_p": float(sampled.get("top_p", 1.0)), "num_samples": int(samples)})
        batch = int((s.eval.node or {}).get("batch_size", 64)) if s.eval is not None else 64
        episodes = run_modes(model, prompter, lk, modes=[mode], cells_of=cells_of, opt_soc=None,
                             max_new_tokens=plan_token_budget(model.tokenizer, agents, horizon), batch_size=batch,
                             horizon=horizon, seed=int(seed) + 1)
        return per_component(episodes, len(mixture))


# ============================================================================ IPPO
def stage_key(s: RunSettings, k: int):
    """Stage ``k``'s training key (stage 1's also draws the starting parameters)."""
    import jax

    return jax.random.fold_in(jax.random.PRNGKey(s.seed), k)


class IPPOStudent:
    """The IPPO student of :mod:`jaxlake.students` (module docstring)."""

    name = "ippo"
    policy_keys = ("policy",)

    def train(self, s: RunSettings, k: int, d: Path, mixture: Mixture, init: Optional[Path],
              quiet: bool = False) -> dict:
        from jaxlake.students.stage import train_stage

        if not quiet:
            log(f"stage {k}: IPPO, {s.ippo.num_updates} updates" + (f" from {init}" if init else ""))
        out = train_stage(s.ippo, mixture, d, key=stage_key(s, k), init_from=init)
        return {"policy": out["policy"], "checkpoint": out["checkpoint"], "init_from": relative(init, d),
                **{key: out[key] for key in ("updates", "env_steps", "resumed", "eval_before", "eval_after", "wall_s")}}

    def params(self, s: RunSettings, policy: Optional[Path], mixture: Mixture) -> Any:
        from jaxlake.students.stage import init_params, load_params

        if policy is None:  # the start: stage 1's initial parameters
            return init_params(s.ippo, mixture, stage_key(s, 1))
        return load_params(policy, s.ippo, mixture)

    def evaluate(self, s: RunSettings, k: int, policy: Optional[Path], mixture: Mixture, checkpoint: str,
                 suite: Any = None) -> dict:
        return suite_eval(s, k, self.params(s, policy, mixture), mixture, checkpoint, suite=suite)

    def probe_settings(self, s: RunSettings, steps: int) -> RunSettings:
        """``steps`` IPPO updates, one chunk (a probe of :mod:`jaxlake.pipeline.probe`)."""
        import dataclasses

        return dataclasses.replace(s, ippo=dataclasses.replace(s.ippo, num_updates=int(steps), eval_every=int(steps)))

    def start_name(self, s: RunSettings) -> str:
        return "the initial IPPO parameters"

    def history(self, train: dict) -> dict:
        after = train.get("eval_after") or {}
        return {"ippo_updates": train.get("updates"), "success_after_training": after.get("success")}

    def engineer_model(self, s: RunSettings, d: Path, train: dict, which: str) -> tuple[Any, Any]:
        policy = _load_llm(s, None)  # the run's model (the shipped planner by default): the engineer's own
        return policy.module(), policy.tokenizer

    def success(self, s: RunSettings, policy: Optional[Path], mixture: Mixture, lakes: int, samples: int,
                seed: int) -> list[dict]:
        """Sampled closed-loop plays (actions drawn from the policy) on ``lakes`` fresh lakes of
        each component, ``samples`` a lake: each component's success."""
        mixture = Mixture.of(mixture)
        lk, cells_of = component_lakes(mixture, lakes, seed)
        episodes = _episodes(s, self.params(s, policy, mixture), lk, modes=[("sampled", int(samples))],
                             cells_of=cells_of, opt_soc=None, horizon=mixture.horizon, seed=int(seed) + 1)
        return per_component(episodes, len(mixture))


def build_student(s: RunSettings) -> Student:
    return IPPOStudent() if s.student == "ippo" else LLMStudent()


# ============================================================================ IPPO on the suite
#: The jitted closed-loop players, by (hidden, conv, actors, radius, horizon).
_PLAYERS: dict = {}


def _episodes(s: RunSettings, params: Any, lakes: Any, *, modes: list, cells_of: np.ndarray,
              opt_soc: Optional[np.ndarray], horizon: int, seed: int) -> list[dict]:
    """Episode records of every mode on ``lakes``, played closed loop and scored by the suite's
    scorer (as :func:`llm.training.evaluate.run_modes` scores the LLM's plans)."""
    import jax

    from jaxlake.students.network import ActorCritic
    from jaxlake.students.play import play_plans
    from jaxlake.suite import score_texts, take_lakes
    from jaxlake.text import format_plan

    c = s.ippo
    num_agents = np.asarray(lakes.num_agents).astype(int)
    n = int(num_agents.shape[0])
    actors = int(num_agents.max())
    tag = (c.hidden, c.conv, actors, c.radius, horizon)
    if tag not in _PLAYERS:  # one compile per network, actor count and horizon in the process
        network = ActorCritic(num_actions=5, hidden=c.hidden, conv=c.conv)
        _PLAYERS[tag] = (
            jax.jit(lambda p, l, k: play_plans(p, network.apply, l, k, actors=actors, radius=c.radius,
                                               horizon=horizon)),
            jax.jit(lambda p, l, k, sk: play_plans(p, network.apply, l, k, actors=actors, radius=c.radius,
                                                   horizon=horizon, sample_key=sk)))
    play_greedy, play = _PLAYERS[tag]
    episodes: list[dict] = []
    for m, (mode, k) in enumerate(modes):
        index = np.repeat(np.arange(n), k)
        rep = lakes if k == 1 else take_lakes(lakes, index)
        key = jax.random.fold_in(jax.random.PRNGKey(seed), m)
        slips = jax.random.fold_in(key, 2)  # score_texts replays lake i with split(slips, b)[i]
        keys = jax.random.split(slips, n * k)
        plans = np.asarray(play_greedy(params, rep, keys) if mode == "greedy"
                           else play(params, rep, keys, jax.random.fold_in(key, 1)))
        agents = num_agents[index]
        texts = [format_plan(plans[i], int(agents[i])) for i in range(n * k)]
        episodes += score_texts(rep, texts, slips, lake_ids=index, cell_ids=cells_of[index],
                                opt_soc=None if opt_soc is None else opt_soc[index], mode=mode,
                                samples=np.tile(np.arange(k), n), horizon=horizon)
    return episodes


def suite_eval(s: RunSettings, k: int, params: Any, mixture: Mixture, checkpoint: str, suite: Any = None) -> dict:
    """The ``eval.json`` dict of IPPO parameters on the held-out suite (or ``suite``, a built
    :class:`jaxlake.suite.Suite`) and on ``eval.current_env_lakes`` lakes of ``mixture``, drawn
    as the LLM's evaluation draws them."""
    import time

    import jax

    from jaxlake.suite import aggregate, build_suite, decoding_modes
    from llm.game.lakes import env_horizon, sample_lakes
    from llm.training.evaluate import EVAL_FORMAT, current_env_eval

    t0 = time.perf_counter()
    node = dict(s.eval.node)
    solve = bool(node.get("planner", True))
    suite = suite or build_suite(s.eval.suite, solve=solve)
    modes = decoding_modes(node)
    seed = int(node.get("rollout_seed", 7))
    lakes = suite.lakes
    horizon = int(np.max(np.asarray(lakes.max_steps)))
    n_current = int(node.get("current_env_lakes", 0) or 0)
    current_lakes = None
    if n_current > 0:
        current_lakes = sample_lakes(jax.random.PRNGKey(int(suite.spec.seed) + 7919 * (k + 1)), list(mixture),
                                     n_current)
        horizon = max(horizon, env_horizon(list(mixture)))
    cells_of = np.asarray([c["id"] for c in suite.cells])[suite.cell_of]
    episodes = _episodes(s, params, lakes, modes=modes, cells_of=cells_of, opt_soc=suite.opt_soc, horizon=horizon,
                         seed=seed)
    result: dict[str, Any] = {
        "format": EVAL_FORMAT,
        "checkpoint": str(checkpoint),
        "stage": k,
        "student": "ippo",
        "suite": suite.describe(),
        "grids": suite.grids,
        "modes": {mode: aggregate([e for e in episodes if e["mode"] == mode], suite.cells, suite.dims)
                  for mode, _ in modes},
        "episodes": episodes,
    }
    result["score"] = result["modes"][modes[0][0]]["score"]
    if current_lakes is not None:
        result["current_env"] = current_env_eval(
            mixture, current_lakes, n_current, modes, solve,
            lambda lakes, cells_of, opt_soc: _episodes(s, params, lakes, modes=modes, cells_of=cells_of,
                                                       opt_soc=opt_soc, horizon=horizon, seed=seed + 1))
    result["settings"] = {
        "student": "ippo",
        "modes": {m: {"num_samples": n, "actions": "greedy" if m == "greedy" else "sampled from the policy"}
                  for m, n in modes},
        "rollout_seed": seed,
        "radius": s.ippo.radius,
    }
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    return result
