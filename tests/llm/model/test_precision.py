"""Precision of training (issue 11): bfloat16 compute on float32 master weights and float32
AdamW moments keeps small updates that bfloat16 parameters lose; checkpoints and Hugging Face
export/import keep the dtypes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

from jaxlake.conf import CONF_DIR
from llm.rl.optim import apply_gradients, make_optimizer
from llm.training.policy import load_policy
from llm.training.config import ModelConfig, OptimConfig
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM

VOCAB, B, P = 40, 4, 5


def tiny(param_dtype: str, dtype: str = "bfloat16", vocab: int = VOCAB) -> Qwen3ForCausalLM:
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, param_dtype=param_dtype, dtype=dtype)
    return Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))


def run_updates(param_dtype: str, steps: int = 3):
    """``steps`` AdamW updates (the trainer's optimizer and apply step) at lr 1e-4, no warmup
    or decay, on a loss that reaches every parameter; returns (before, after, opt_state)."""
    graphdef, state = nnx.split(tiny(param_dtype))
    opt = make_optimizer(OptimConfig(lr=1e-4, warmup_steps=0, min_lr_ratio=1.0), 100)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, VOCAB, (B, P)), jnp.int32)

    def loss(s, k):
        logits, _ = nnx.merge(graphdef, s)(ids)
        return -jnp.mean(jax.nn.log_softmax(logits)[..., k])

    @jax.jit
    def step(s, o, k):
        s, o, _ = apply_gradients(opt, s, o, jax.grad(loss)(s, k))
        return s, o

    before = [np.asarray(x, np.float32) for x in jax.tree_util.tree_leaves(state)]
    opt_state = opt.init(state)
    for k in range(steps):
        state, opt_state = step(state, opt_state, k)
    after = [np.asarray(x, np.float32) for x in jax.tree_util.tree_leaves(state)]
    return before, after, opt_state


@pytest.mark.parametrize("name", ["qwen3_0_6b", "qwen3_1_7b", "qwen3_4b"])
def test_pretrained_presets_train_bf16_on_float32_master_weights(name):
    cfg = yaml.safe_load((CONF_DIR / "model" / f"{name}.yaml").read_text())
    assert (cfg["param_dtype"], cfg["dtype"]) == ("float32", "bfloat16")


def test_float32_master_weights_keep_small_updates_bf16_params_lose_them():
    before, after, opt_state = run_updates("float32")
    for i, (a, b) in enumerate(zip(before, after)):
        assert np.all(a != b), f"leaf {i}: {np.mean(a == b):.0%} of the entries did not move"
    moments = [x for x in jax.tree_util.tree_leaves(opt_state) if hasattr(x, "ndim") and x.ndim >= 1]
    assert moments and all(x.dtype == jnp.float32 for x in moments)
    # the defect this guards against: bfloat16 parameters (and moments) round the steps away,
    # every RMSNorm weight (1.0) included
    before16, after16, _ = run_updates("bfloat16")
    unchanged = [np.mean(a == b) for a, b in zip(before16, after16)]
    assert max(unchanged) == 1.0


def test_master_weights_survive_checkpoint_and_hf_round_trip(tmp_path):
    """orbax keeps float32 master weights; the HF export is in the parameters' dtype and
    ``load_policy`` reads it back with the model config's compute / master dtypes."""
    from llm.model.checkpoint import restore_checkpoint, save_checkpoint
    from llm.model.hf_io import from_pretrained, save_pretrained

    model = tiny("float32")
    save_checkpoint(tmp_path / "ckpt", model, 1)
    restored = restore_checkpoint(tmp_path / "ckpt").model
    assert (restored.config.param_dtype, restored.config.dtype) == ("float32", "bfloat16")
    for a, b in zip(jax.tree_util.tree_leaves(nnx.state(model)), jax.tree_util.tree_leaves(nnx.state(restored))):
        assert b.dtype == jnp.float32
        np.testing.assert_array_equal(a, b)
    save_pretrained(model, None, tmp_path / "hf")
    plain, _ = from_pretrained(tmp_path / "hf", tokenizer=False)
    assert plain.config.param_dtype == "float32"
    # a bfloat16 folder (what the hub ships) loads as float32 master weights with bf16 compute
    from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer

    tok = to_hf_tokenizer(build_game_tokenizer())
    save_pretrained(tiny("bfloat16", vocab=len(tok)), tok, tmp_path / "hf16")
    policy = load_policy(ModelConfig.from_dict({"path": str(tmp_path / "hf16"), "dtype": "bfloat16",
                                                "param_dtype": "float32"}))
    cfg = policy.config
    assert (cfg.param_dtype, cfg.dtype) == ("float32", "bfloat16")
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(policy.state))
    logits, _ = policy.module()(jnp.zeros((1, 3), jnp.int32))
    assert logits.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(logits)))
