"""Orbax checkpoints of the model plus an arbitrary extra pytree."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from llm.model.checkpoint import all_steps, latest_step, restore_checkpoint, save_checkpoint
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM

CONFIG = Qwen3Config(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=False,
                     rope_theta=321.0, eos_token_id=2)


def random_model(config: Qwen3Config, seed: int) -> Qwen3ForCausalLM:
    """A model with normal(0, 1) weights drawn by numpy (no XLA compiles, unlike ``nnx.Rngs`` init)."""
    rng = np.random.default_rng(seed)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))))
    values = jax.tree.map(lambda a: jnp.asarray(rng.standard_normal(a.shape).astype(a.dtype)), nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


@pytest.fixture(scope="module")
def model():
    return random_model(CONFIG, 0)


def pure(m):
    return nnx.to_pure_dict(nnx.state(m))


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_builds_model_from_saved_config(model, tmp_path):
    path = save_checkpoint(tmp_path / "ck", model, 3)
    assert path.name == "3" and path.is_dir()
    r = restore_checkpoint(tmp_path / "ck")
    assert r.step == 3 and r.extra is None
    assert r.config == CONFIG and r.model.config == CONFIG
    assert r.model is not model
    assert_trees_equal(pure(r.model), pure(model))


def test_restore_in_place_with_optimizer_state(model, tmp_path):
    params = nnx.state(model, nnx.Param)
    tx = optax.adamw(1e-3)
    opt_state = tx.init(params)
    rng = np.random.default_rng(9)  # non-trivial moments and count, without compiling tx.update
    opt_state = jax.tree.map(lambda a: jnp.asarray((rng.standard_normal(a.shape) * 10).astype(a.dtype)), opt_state)
    extra = {"opt": opt_state, "rng": jax.random.key_data(jax.random.key(5)), "epoch": jnp.int32(4)}
    save_checkpoint(tmp_path / "ck", model, 10, extra=extra)

    other = random_model(CONFIG, 1)
    assert not np.array_equal(np.asarray(other.lm_head.kernel[...]), np.asarray(model.lm_head.kernel[...]))
    template = {"opt": tx.init(nnx.state(other, nnx.Param)), "rng": jax.random.key_data(jax.random.key(0)), "epoch": jnp.int32(0)}
    r = restore_checkpoint(tmp_path / "ck", other, extra=template)
    assert r.model is other
    assert_trees_equal(pure(other), pure(model))
    assert jax.tree.structure(r.extra) == jax.tree.structure(extra)  # optax NamedTuples back
    assert_trees_equal(r.extra, extra)
    # without a template the extra state comes back as plain containers of equal leaves
    raw = restore_checkpoint(tmp_path / "ck").extra
    assert sorted(raw) == ["epoch", "opt", "rng"]
    np.testing.assert_array_equal(sorted(np.asarray(x).sum() for x in jax.tree.leaves(raw)),
                                  sorted(np.asarray(x).sum() for x in jax.tree.leaves(extra)))


def test_bfloat16_model_round_trip(tmp_path):
    cfg = dataclasses.replace(CONFIG, param_dtype="bfloat16", dtype="bfloat16")
    m = random_model(cfg, 2)
    save_checkpoint(tmp_path / "ck", m, 0)
    r = restore_checkpoint(tmp_path / "ck")
    assert r.config.param_dtype == "bfloat16"
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(pure(r.model)))
    assert_trees_equal(pure(r.model), pure(m))


def test_steps_latest_and_max_to_keep(model, tmp_path):
    d = tmp_path / "ck"
    assert latest_step(d) is None and all_steps(d) == []
    for step in (1, 2, 5):
        save_checkpoint(d, model, step, max_to_keep=2)
    assert all_steps(d) == [2, 5] and latest_step(d) == 5
    assert restore_checkpoint(d, step=2).step == 2
    assert not [n for n in os.listdir(d) if "tmp" in n]


def test_errors(model, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        restore_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint steps"):
        restore_checkpoint(tmp_path / "empty")
    save_checkpoint(tmp_path / "ck", model, 1)
    with pytest.raises(FileNotFoundError, match=r"step 7 .*\[1\]"):
        restore_checkpoint(tmp_path / "ck", step=7)
    with pytest.raises(ValueError, match="step 1 already exists"):
        save_checkpoint(tmp_path / "ck", model, 1)
    with pytest.raises(ValueError, match="step=-1"):
        save_checkpoint(tmp_path / "ck", model, -1)
    other = random_model(dataclasses.replace(CONFIG, rope_theta=999.0), 0)
    with pytest.raises(ValueError, match="differs from the saved config"):
        restore_checkpoint(tmp_path / "ck", other)
