"""A staged run builds its updates again every stage; equal settings give back the jitted function
built before (llm.rl.reuse), so the update compiles once per process, not once a stage."""

import optax

from llm.rl.grpo import GRPOLossConfig
from llm.rl.optim import OptimConfig, make_optimizer
from llm.rl.reuse import MAX_KEPT, reused
from llm.rl.updates import make_grpo_update


def test_equal_hashable_arguments_get_the_function_built_before():
    built = []

    @reused
    def factory(a, *, b=1):
        built.append((a, b))
        return object()

    first = factory(1, b=2)
    assert factory(1, b=2) is first and built == [(1, 2)]
    assert factory(1, b=3) is not first and factory([1], b=2) is not factory([1], b=2)  # unhashable: afresh
    assert built == [(1, 2), (1, 3), ([1], 2), ([1], 2)]
    for i in range(MAX_KEPT):
        factory(100 + i)
    assert factory(1, b=2) is not first  # the oldest was dropped
    factory.cache_clear()
    assert len(built) == 4 + MAX_KEPT + 1 and factory(7) is factory(7)


def test_a_stage_rebuilding_its_update_from_equal_settings_reuses_it():
    """What every GRPO stage does (llm.training.grpo_loop): the optimizer from the stage's
    settings, then the update from the model's graph definition; equal settings and an equal
    graph (another model's weights) give the same jitted function: no second compilation."""
    from flax import nnx

    from llm.model.config import Qwen3Config
    from llm.model.qwen3 import Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    g1, _ = nnx.split(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    g2, _ = nnx.split(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(1)))
    opt = OptimConfig(lr=1e-4)
    assert make_optimizer(opt, 30) is make_optimizer(OptimConfig(lr=1e-4), 30)
    assert make_optimizer(opt, 30) is not make_optimizer(opt, 31)
    update = make_grpo_update(g1, make_optimizer(opt, 30), GRPOLossConfig(), micro_batches=2)
    assert make_grpo_update(g2, make_optimizer(opt, 30), GRPOLossConfig(), micro_batches=2) is update
    assert make_grpo_update(g2, make_optimizer(opt, 30), GRPOLossConfig(beta=0.1), micro_batches=2) is not update
    # a hand-made optax transformation compares by identity: never shared
    sgd = optax.sgd(0.1)
    assert make_grpo_update(g1, sgd, GRPOLossConfig()) is make_grpo_update(g1, sgd, GRPOLossConfig())
    assert make_grpo_update(g1, optax.sgd(0.1), GRPOLossConfig()) is not make_grpo_update(g1, sgd, GRPOLossConfig())
