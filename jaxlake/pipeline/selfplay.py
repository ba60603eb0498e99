"""Engineer self-play in a run's stages (``train.engineer_selfplay``): the context a stage's
self-play re-answers, and the GRPO hook that does it (:mod:`llm.engineer.selfplay`).

Stage ``k`` re-answers the decision that chose its environment, with the policy as it trains:

* ``k >= 2``: stage ``k - 1``'s summary and environment (``summary.json``, ``env.yaml``), as the
  engineer read them at the end of stage ``k - 1``;
* ``k = 1``: the starting policy's suite evaluation (``start_eval.json``, on with
  ``pipeline.start_eval``) summarised with stage 1's environment. Without it stage 1 has no
  summary to read and trains without self-play (said in the log).

The engineer is the run's own when it is an LLM engineer (its prompt, space and reasoning),
else ``conf/engineer/policy.yaml``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from jaxlake.engineers import EngineerContext, build_engineer
from jaxlake.io import read_json
from jaxlake.mixture import Mixture, load_mixture
from jaxlake.pipeline.folder import log, require_eval
from jaxlake.pipeline.records import START_EVAL
from jaxlake.pipeline.settings import RunSettings


def selfplay_context(s: RunSettings, k: int, mixture: Mixture) -> Optional[EngineerContext]:
    """The context stage ``k``'s self-play answers (module docstring), or None without one."""
    if k >= 2:
        prev = s.stage_dir(k - 1)
        summary = read_json(prev / "summary.json")
        current = load_mixture(prev / "env.yaml")
        stage = k - 1
    else:
        path = Path(s.run_dir) / START_EVAL
        if not path.is_file():
            return None
        import jax

        from jaxlake.summaries import environment_stats, summarize

        e = require_eval(s)
        stats = environment_stats(mixture, e.env_stats_lakes, jax.random.PRNGKey(1_000 * s.seed), solve=e.planner)
        summary = summarize(read_json(path), stats, [], e.k_failures, e.summary_mode)
        current, stage = Mixture.of(mixture), 0
    return EngineerContext(stage=stage, current=current, initial=current, eval_result=None, summary=summary,
                           history=summary.get("history", []), state={}, seed=int(s.seed), run_cfg=s)


def selfplay_engineer(s: RunSettings) -> Any:
    """The LLM engineer whose prompt self-play answers: the run's, or ``policy``'s."""
    from llm.engineer.local import LLMEngineer

    engineer = build_engineer(s.engineer) if s.engineer else None
    if isinstance(engineer, LLMEngineer):
        return engineer
    import yaml

    from jaxlake.conf import CONF_DIR

    return build_engineer(yaml.safe_load((CONF_DIR / "engineer" / "policy.yaml").read_text()))


def selfplay_hooks(s: RunSettings, k: int, mixture: Mixture) -> list[Callable]:
    """``[make(tokenizer, mesh) -> hook]`` for :func:`llm.training.stage.train_stage`: the
    self-play hook of stage ``k`` when ``train.engineer_selfplay.enabled`` and the stage has a
    context; else ``[]``."""
    tc = s.stage_config(k).train
    cfg = tc.engineer_selfplay
    if not cfg.enabled:
        return []
    ctx = selfplay_context(s, k, mixture)
    if ctx is None:
        log(f"stage {k}: engineer self-play off (no summary to read before stage 1: pipeline.start_eval is off)")
        return []
    engineer = selfplay_engineer(s)
    if cfg.contexts == "scripted":
        log(f"stage {k}: engineer self-play every {cfg.every} step(s), {cfg.proposals} proposals of a fresh scripted "
            f"context each, rewarded by its policy's learnability on {cfg.lakes * cfg.samples} lakes")
    else:
        log(f"stage {k}: engineer self-play every {cfg.every} step(s), {cfg.proposals} proposals of the "
            f"stage-{ctx.stage} context, {cfg.lakes} lakes x {cfg.samples} plans each")

    def make(tokenizer: Any, mesh: Any) -> Any:
        from llm.engineer.selfplay import EngineerSelfPlay

        pool = scripted_pool(s, k, mixture, engineer) if cfg.contexts == "scripted" else None
        return EngineerSelfPlay(cfg, ctx, engineer, tc.prompt, tokenizer, tc.grpo.micro_batches, mesh, tc.seed, pool)

    return [make]


def scripted_pool(s: RunSettings, k: int, mixture: Mixture, engineer: Any) -> Any:
    """The :class:`~jaxlake.engineers.contexts.ContextPool` of stage ``k``'s scripted self-play
    contexts: scripted policies on the run's held-out suite and on ``engineer_selfplay.mixtures``
    environments, half of them those a curriculum from the stage's environment reaches."""
    import time

    from jaxlake.engineers.contexts import ContextPool
    from jaxlake.engineers.space import space_from_conf
    from jaxlake.suite import build_suite

    e = require_eval(s)
    cfg = s.stage_config(k).train.engineer_selfplay
    t0 = time.perf_counter()
    current = Mixture.of(mixture)
    pool = ContextPool(build_suite(e.suite, solve=True), space_from_conf(current.main, engineer.space_node),
                       mixtures=cfg.mixtures, current_env_lakes=int(e.node.get("current_env_lakes", 32) or 32),
                       env_stats_lakes=e.env_stats_lakes, k_failures=e.k_failures, seed=1_000 * int(s.seed) + int(k),
                       start=[current])
    log(f"stage {k}: {cfg.mixtures} environments of scripted contexts ready ({time.perf_counter() - t0:.1f} s)")
    return pool
