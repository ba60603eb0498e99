"""Does the shipped policy read as an engineer? Behavioural tests of ``engineer=policy`` on the
shipped novice (llm/game/novice), with its own constrained greedy decoding, on contexts of
scripted policies played on the run's suite (jaxlake/engineers/contexts.py):

* **context swap**: a weak and a strong policy on the same environment get different answers,
  and the strong one's mixture is harder by :func:`jaxlake.engineers.teacher.difficulty` (the
  reference planner's mean sum of costs, itself tested in tests/jaxlake/engineers/test_teacher.py);
* **failure injection**: the same skill failing by falling, against failing by timing out,
  moves the answer toward lakes with more holes.

``xfail(strict=True)`` marks what the shipped model does not do yet: such a test fails the
suite the day the model starts to pass it, so the mark is removed with the model that earns it
(docs/research/engineer-role.md records both).
"""

from __future__ import annotations

import pytest
from flax import nnx

from jaxlake.config import LakeConfig, to_plain
from jaxlake.engineers import build_engineer
from jaxlake.engineers.contexts import ContextPool, ScriptedPolicy
from jaxlake.engineers.space import space_from_conf
from jaxlake.engineers.teacher import difficulty
from jaxlake.conf import CONF_DIR
from jaxlake.mixture import Mixture
from jaxlake.suite import build_suite, load_eval_conf

pytestmark = pytest.mark.slow

TINY = LakeConfig(height=5, width=5, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=16,
                  max_height=8, max_width=8, max_agents=4)
#: the shipped novice does not read yet (docs/research/engineer-role.md)
NOT_YET = pytest.mark.xfail(strict=True, reason="the shipped novice does not read its context yet")


@pytest.fixture(scope="module")
def reader():
    import yaml

    from llm.training.config import ModelConfig
    from llm.training.policy import load_policy

    node = yaml.safe_load((CONF_DIR / "engineer" / "policy.yaml").read_text())
    engineer = build_engineer(node)
    policy = load_policy(ModelConfig())  # the shipped novice
    model = nnx.merge(policy.graphdef, policy.state)
    eval_node = to_plain(load_eval_conf("large"))
    pool = ContextPool(build_suite(eval_node, solve=True), space_from_conf(TINY, node["space"]),
                       mixtures=[Mixture.of(TINY)], current_env_lakes=32, env_stats_lakes=64, k_failures=6, seed=5)

    def answer(policy_: ScriptedPolicy, seed: int = 0) -> Mixture:
        ctx, _ = pool.context_of(0, policy_, stage=1, seed=seed)
        ctx.load_model = lambda which: (model, policy.tokenizer)
        return engineer.propose(ctx).mixture

    return answer


EVEN = (1 / 3, 1 / 3, 1 / 3)


@NOT_YET
def test_context_swap_a_strong_policy_gets_a_harder_environment(reader):
    weak = reader(ScriptedPolicy(0.15, EVEN))
    strong = reader(ScriptedPolicy(0.97, EVEN))
    assert weak != strong
    assert difficulty(strong) > difficulty(weak)


@NOT_YET
def test_failure_injection_falls_move_the_answer_toward_holes(reader):
    def holes(m: Mixture) -> float:
        return sum(w * c.hole_density for w, c in m)

    falls = reader(ScriptedPolicy(0.5, (0.0, 1.0, 0.0)))  # failing lakes: the blind walk into holes
    stalls = reader(ScriptedPolicy(0.5, (0.0, 0.0, 1.0)))  # failing lakes: plans cut short
    assert holes(falls) > holes(stalls)
