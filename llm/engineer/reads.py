"""Does a policy read as an engineer? ``python -m llm.engineer.reads [--policy DIR]``.

Two behavioural checks of ``engineer=policy`` (its own prompt and constrained greedy decoding,
its think block when it reasons) on stage summaries of scripted policies played on a suite
(:mod:`jaxlake.engineers.contexts`), all on one environment (``--env``, the run's ``tiny`` by
default):

* **context swap**: a weak policy (skill 0.15) and a strong one (0.97), the same even failure
  profile: the answers must differ, and the strong one's mixture must be harder by
  :func:`jaxlake.engineers.teacher.difficulty` (the reference planner's mean sum of costs);
* **failure injection**: the same skill (0.5) failing only by the blind walk into holes, or
  only by plans cut short: the first answer's mixture must hold more holes (weighted mean
  ``hole_density``).

Each check runs over ``--seeds`` draws of the lakes; a check passes when it holds on every
seed. The shipped novice is the default policy; ``--policy`` takes any Hugging Face folder
(a pretraining run's ``stage/policy``). tests/llm/engineer/test_reads.py runs the same on the
shipped novice.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Mapping, Optional, Sequence

#: The weak and strong policies of the context swap, and the failing one of the injection.
WEAK, STRONG, HALF = 0.15, 0.97, 0.5
#: Failure profiles (over the alone, straight, short plans of jaxlake.engineers.contexts).
EVEN, FALLS, STALLS = (1 / 3, 1 / 3, 1 / 3), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)


def _summary(m: Any) -> list:
    return [[round(float(w), 3), c.height, c.width, c.num_agents, c.hole_density, c.conflict_density] for w, c in m]


def reading_checks(model: Any, tokenizer: Any, engineer: Any, pool: Any, seeds: Sequence[int] = (0,),
                   env: int = 0) -> dict:
    """Both checks for ``engineer`` answering with ``model`` on the pool's mixture ``env``:
    ``{"swap": {...}, "injection": {...}, "reads": bool}``, each check with its answers per
    seed (``[weight, height, width, agents, holes, conflict]`` per component), its measures
    and ``passed``."""
    from jaxlake.engineers.contexts import ScriptedPolicy
    from jaxlake.engineers.teacher import difficulty

    def answer(policy: ScriptedPolicy, seed: int) -> tuple[Any, Optional[str]]:
        ctx, _ = pool.context_of(env, policy, stage=1, seed=seed)
        ctx.load_model = lambda which: (model, tokenizer)
        proposal = engineer.propose(ctx)
        return proposal.mixture, proposal.record.get("analysis")

    swap, inject = [], []
    for seed in seeds:
        (weak, wa), (strong, sa) = answer(ScriptedPolicy(WEAK, EVEN), seed), answer(ScriptedPolicy(STRONG, EVEN), seed)
        dw, ds = difficulty(weak), difficulty(strong)
        swap.append({"seed": seed, "weak": _summary(weak), "strong": _summary(strong), "difficulty_weak": round(dw, 3),
                     "difficulty_strong": round(ds, 3), "analysis_weak": wa, "analysis_strong": sa,
                     "passed": weak != strong and ds > dw})
        (falls, _), (stalls, _) = answer(ScriptedPolicy(HALF, FALLS), seed), answer(ScriptedPolicy(HALF, STALLS), seed)
        hf, hs = (sum(w * c.hole_density for w, c in m) for m in (falls, stalls))
        inject.append({"seed": seed, "falls": _summary(falls), "stalls": _summary(stalls), "holes_falls": round(hf, 3),
                       "holes_stalls": round(hs, 3), "passed": hf > hs})
    out = {"swap": {"seeds": swap, "passed": all(r["passed"] for r in swap)},
           "injection": {"seeds": inject, "passed": all(r["passed"] for r in inject)}}
    out["reads"] = out["swap"]["passed"] and out["injection"]["passed"]
    return out


def build(policy: Optional[str] = None, eval_name: str = "large", env: str = "tiny",
          engineer_overrides: Optional[Mapping[str, Any]] = None, seed: int = 5) -> tuple:
    """``(model, tokenizer, engineer, pool)`` for :func:`reading_checks`: the policy (a Hugging
    Face folder; None: the shipped novice), ``conf/engineer/policy.yaml`` with
    ``engineer_overrides``, and a pool of the suite ``eval_name`` and ``conf/env/<env>.yaml``."""
    import yaml
    from flax import nnx

    from jaxlake.conf import CONF_DIR
    from jaxlake.config import to_plain
    from jaxlake.engineers import build_engineer
    from jaxlake.engineers.contexts import ContextPool
    from jaxlake.engineers.space import space_from_conf
    from jaxlake.mixture import load_mixture
    from jaxlake.suite import build_suite, load_eval_conf
    from llm.training.config import ModelConfig
    from llm.training.policy import load_policy

    from llm.engineer.local import taught_analysis

    node = yaml.safe_load((CONF_DIR / "engineer" / "policy.yaml").read_text())
    node.update(dict(engineer_overrides or {}))
    model_cfg = ModelConfig(path=policy) if policy else ModelConfig()
    engineer = build_engineer(node)
    if engineer.reasoning["enabled"] == "auto":  # as a run from this policy would: on when it was taught to
        engineer.reasoning = {**engineer.reasoning, "enabled": taught_analysis(model_cfg)}
    loaded = load_policy(model_cfg)
    model = nnx.merge(loaded.graphdef, loaded.state)
    mixture = load_mixture(CONF_DIR / "env" / f"{env}.yaml")
    eval_node = to_plain(load_eval_conf(eval_name))
    summary = dict(eval_node.get("summary") or {})
    pool = ContextPool(build_suite(eval_node, solve=True), space_from_conf(mixture.main, node["space"]),
                       mixtures=[mixture], current_env_lakes=int(eval_node.get("current_env_lakes", 32) or 32),
                       env_stats_lakes=int(summary.get("env_stats_lakes", 64)), k_failures=int(summary.get("k_failures", 6)),
                       seed=seed)
    return model, loaded.tokenizer, engineer, pool


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm.engineer.reads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default=None, help="a Hugging Face folder (default: the shipped novice)")
    parser.add_argument("--eval", default="large", help="the suite the summaries read (conf/eval)")
    parser.add_argument("--env", default="tiny", help="the environment the scripted policies trained on (conf/env)")
    parser.add_argument("--seeds", type=int, default=3, help="draws of the lakes each check runs over")
    parser.add_argument("--reasoning", choices=("auto", "true", "false"), default="auto",
                        help="engineer.reasoning.enabled (auto: as a run from this policy would)")
    parser.add_argument("--max-prompt-tokens", type=int, default=None, help="engineer.max_prompt_tokens")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    over: dict[str, Any] = {}
    if args.reasoning != "auto":
        over["reasoning"] = {"enabled": args.reasoning == "true"}
    if args.max_prompt_tokens:
        over["max_prompt_tokens"] = args.max_prompt_tokens
    model, tokenizer, engineer, pool = build(args.policy, args.eval, args.env, over)
    result = reading_checks(model, tokenizer, engineer, pool, seeds=range(args.seeds))
    for name in ("swap", "injection"):
        r = result[name]
        print(f"{name}: {'passed' if r['passed'] else 'failed'} "
              f"({sum(s['passed'] for s in r['seeds'])} of {len(r['seeds'])} seeds)")
        for s in r["seeds"]:
            keys = ("weak", "strong", "difficulty_weak", "difficulty_strong") if name == "swap" else (
                "falls", "stalls", "holes_falls", "holes_stalls")
            print("  " + ", ".join(f"{k} {s[k]}" for k in keys))
    print(f"reads: {result['reads']}")
    if args.out:
        from jaxlake.io import write_json

        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
