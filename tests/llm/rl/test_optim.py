"""The trainer's optimizer (llm/rl/optim.py): weight decay by parameter role, and a warmup
whose first update is not 0."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM
from llm.rl.optim import OptimConfig, decay_mask, make_optimizer, parameter_role, schedule_value, update_count


def test_weight_decay_reaches_matrices_and_embeddings_never_norms():
    """By role, not by rank: the stacked [L, d] layer norms and the [d] final norm are both
    spared; every kernel (an untied LM head too) and the embedding decay. With zero gradients
    one AdamW step moves exactly the decayed parameters, by lr x decay x weight."""
    cfg = Qwen3Config(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=False)
    _, abstract = nnx.split(nnx.eval_shape(lambda: Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.RandomState(0)  # the model's tree, filled without running its initialisers
    state = jax.tree_util.tree_map(lambda s: jnp.asarray(rng.uniform(0.5, 1.5, s.shape), s.dtype), abstract)
    leaves = jax.tree_util.tree_leaves_with_path(state)
    roles = {jax.tree_util.keystr(p): parameter_role(p) for p, _ in leaves}
    assert "other" not in roles.values()  # a new kind of parameter must be given a role
    norms = {k for k, r in roles.items() if r == "norm"}
    assert {k.split("]")[-3].strip("['") for k in norms} == {"input_layernorm", "post_attention_layernorm", "q_norm",
                                                             "k_norm", "norm"}
    assert roles["['norm']['weight'].value"] == "norm" and roles["['lm_head']['kernel'].value"] == "matrix"
    assert roles["['embed_tokens']['embedding'].value"] == "embedding"
    assert any(x.ndim == 2 for p, x in leaves if parameter_role(p) == "norm")  # a rank rule would decay these
    mask = dict((jax.tree_util.keystr(p), m) for p, m in jax.tree_util.tree_leaves_with_path(decay_mask(state)))
    assert mask == {k: r in ("matrix", "embedding") for k, r in roles.items()}

    lr, wd = 0.1, 0.5
    opt = make_optimizer(OptimConfig(lr=lr, warmup_steps=0, weight_decay=wd), 10)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, state)
    updates, _ = jax.jit(opt.update)(zeros, opt.init(state), state)
    for (p, x), u in zip(leaves, jax.tree_util.tree_leaves(updates)):
        want = -lr * wd * np.asarray(x) if mask[jax.tree_util.keystr(p)] else np.zeros(x.shape)
        np.testing.assert_allclose(u, want, rtol=1e-6, atol=1e-8, err_msg=jax.tree_util.keystr(p))


def test_warmup_starts_above_zero_and_reaches_the_peak_then_cosine():
    cfg = OptimConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    lrs = [schedule_value(cfg, 20, k) for k in range(21)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # update 0 already moves the weights
    assert all(a >= b - 1e-9 for a, b in zip(lrs[3:], lrs[4:]))
    assert lrs[19] == pytest.approx(0.1) and lrs[20] == pytest.approx(0.1)  # the last update ends the cosine
    # a run shorter than the warmup still reaches the peak at its last update
    assert [schedule_value(OptimConfig(lr=1.0, warmup_steps=20, min_lr_ratio=1.0), 4, k)
            for k in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    # no warmup: the peak at update 0, the end value at the last one
    assert [schedule_value(OptimConfig(lr=1.0, warmup_steps=0, min_lr_ratio=0.0), 3, k)
            for k in range(3)] == pytest.approx([1.0, 0.5, 0.0], abs=1e-7)
    # the schedule the optimizer applies is this one, at its own update count
    params = {"w": {"kernel": jnp.ones((2, 2))}}
    opt = make_optimizer(cfg, 20)
    st = opt.init(params)
    assert update_count(st) == 0
    update = jax.jit(opt.update)
    for k in range(2):
        upd, st = update({"w": {"kernel": jnp.full((2, 2), 1e-3)}}, st, params)
        # Adam's first steps move by ~lr x sign(g)
        assert float(jnp.abs(upd["w"]["kernel"]).max()) == pytest.approx(lrs[k], rel=1e-3)
    assert update_count(st) == 2
