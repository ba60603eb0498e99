"""The trainer's typed batch records (llm.rl.batches) and the sampler's (Completions): pytrees
with documented fields; the updates take nothing else."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from llm.rl.batches import GRPOBatch, TokenBatch
from llm.rl.grpo import GRPOLossConfig
from llm.rl.updates import _micro_split, make_grpo_update

B, P, T = 4, 3, 5


def _grpo(ref: bool = False) -> GRPOBatch:
    z = np.zeros((B, T), np.float32)
    return GRPOBatch(prompt_ids=np.ones((B, P), np.int32), prompt_mask=np.ones((B, P), bool),
                     tokens=np.ones((B, T), np.int32), mask=np.ones((B, T), bool), weights=z + 1 / (B * T),
                     advantages=np.arange(B, dtype=np.float32), old_logp=z, ref_logp=z if ref else None)


def test_records_are_pytrees_and_none_is_an_empty_subtree():
    assert len(jax.tree_util.tree_leaves(_grpo())) == 7 and len(jax.tree_util.tree_leaves(_grpo(True))) == 8
    split = jax.tree_util.tree_map(lambda x: _micro_split(jnp.asarray(x), 2), _grpo())
    assert isinstance(split, GRPOBatch) and split.tokens.shape == (2, B // 2, T) and split.advantages.shape == (2, 2)
    assert split.ref_logp is None
    shapes = jax.eval_shape(lambda b: b, _grpo(True))
    assert isinstance(shapes, GRPOBatch) and shapes.ref_logp.shape == (B, T)
    tb = TokenBatch(*(_grpo().sequences), weights=np.zeros((B, T), np.float32))
    assert tb.rows == B and tb.sequences[2].shape == (B, T)
    with pytest.raises(Exception):
        tb.tokens = None  # frozen
    assert tb.replace(weights=None).weights is None


def test_the_grpo_update_takes_a_grpo_batch_only():
    from llm.model.config import Qwen3Config
    from llm.model.qwen3 import Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    graphdef, state = nnx.split(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    opt = optax.sgd(0.1)
    update = make_grpo_update(graphdef, opt, GRPOLossConfig(), micro_batches=2, remat="none")
    batch = jax.tree_util.tree_map(jnp.asarray, _grpo())
    with pytest.raises(TypeError, match="GRPOBatch"):
        update(state, opt.init(state), {k: getattr(batch, k) for k in ("prompt_ids", "tokens")})
    _, _, metrics = update(state, opt.init(state), batch)
    assert np.isfinite(float(metrics["loss"]))


def test_completions_plans_and_train_mask():
    from llm.training.completions import Completions

    mask = np.ones((2, 3), bool)
    plain = Completions(tokens=mask, mask=mask, lengths=np.array([3, 3]), logp=mask * 0.0, hit_eos=np.ones(2, bool),
                        tokens_np=mask, texts=["a", "b"])
    assert plain.plans == ["a", "b"] and plain.train_mask is mask and plain.thinking is None
    loss = np.zeros((2, 3), bool)
    think = plain.replace(answers=["x", "y"], loss_mask=loss)
    assert think.plans == ["x", "y"] and think.train_mask is loss and think.texts == ["a", "b"]
    assert len(jax.tree_util.tree_leaves(think)) == 7  # texts / answers / thinking are static
