"""Attention kernels (llm/model/attention.py): the chunked (flash-style), fused (cuDNN's layout,
through XLA on the CPU) and splash (Pallas' interpreter) paths against the dense reference,
values and gradients, with the trainer's masks (a left-padded prompt, then a right-padded
completion) and grouped-query heads; the chunked backward holds no [B, heads, T, T] buffer;
implementation names and their resolution."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from llm.model.errors import ModelConfigError as ConfigError
from llm.model import attention as att
from llm.generation.decode import left_pad_positions
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM

B, HEADS, KV, D = 3, 4, 2, 8
PROMPT, COMPLETION = 6, 5
T = PROMPT + COMPLETION
PROMPT_PADS = np.array([0, 3, 5])  # left padding of the prompts
COMPLETION_LENGTHS = np.array([5, 2, 0])  # right padding of the completions: row 2 keeps one real token


def trainer_mask(prompt_pads=PROMPT_PADS, completion_lengths=COMPLETION_LENGTHS) -> np.ndarray:
    """``[B, P + C]``: a left-padded prompt, then a right-padded completion (the GRPO batch)."""
    return np.concatenate([np.arange(PROMPT)[None, :] >= np.asarray(prompt_pads)[:, None],
                           np.arange(COMPLETION)[None, :] < np.asarray(completion_lengths)[:, None]], axis=1)


def inputs(dtype=jnp.float32, seed: int = 0):
    rng = np.random.RandomState(seed)
    q, k, v = (jnp.asarray(rng.randn(B, T, n, D), dtype) for n in (HEADS, KV, KV))
    key_mask = jnp.asarray(trainer_mask())
    # A loss on real query rows only (padding rows are meaningless in every implementation).
    cot = jnp.asarray(rng.randn(B, T, HEADS, D), jnp.float32) * key_mask[:, :, None, None]
    return q, k, v, key_mask, cot


def dense(q, k, v, key_mask):
    return att.causal_attention(q, k, v, key_mask, impl="dense")


def values_and_grads(fn, q, k, v, key_mask, cot):
    def loss(q, k, v):
        out = fn(q, k, v, key_mask)
        return jnp.sum(out.astype(jnp.float32) * cot), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


@pytest.fixture(scope="module")
def reference():
    """The inputs and the dense path's outputs and gradients (computed once)."""
    q, k, v, key_mask, cot = inputs()
    return (q, k, v, key_mask, cot), values_and_grads(dense, q, k, v, key_mask, cot)


@pytest.mark.parametrize("q_block,k_block", [(4, 3), (2, 5)])
def test_chunked_equals_dense_values_and_gradients(reference, q_block, k_block):
    """Tiles that do not divide T (padded keys) and unequal query/key tiles, either larger:
    the same outputs on real rows and the same gradients (one tile: the model test)."""
    (q, k, v, key_mask, cot), (ref_out, ref_grads) = reference

    def chunked(q, k, v, m):
        return att.chunked_attention(q, k, v, m, q_block=q_block, k_block=k_block)

    out, grads = values_and_grads(chunked, q, k, v, key_mask, cot)
    real = np.asarray(key_mask)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref_out)[real], atol=2e-6)
    blind = np.cumsum(real, axis=1) == 0  # left padding: no key at or before it
    assert not np.asarray(out)[blind].any() and np.isfinite(np.asarray(out)).all()  # zeros, no NaN
    for name, a, b in zip("qkv", grads, ref_grads):
        np.testing.assert_allclose(a, b, atol=5e-6, err_msg=f"d{name}")


def test_chunked_bfloat16_is_close_to_dense():
    q, k, v, key_mask, _ = inputs(jnp.bfloat16, seed=1)
    out = jax.jit(lambda *a: att.chunked_attention(*a, q_block=4, k_block=4))(q, k, v, key_mask)
    assert out.dtype == jnp.bfloat16
    real = np.asarray(key_mask)
    ref = np.asarray(jax.jit(dense)(q, k, v, key_mask), np.float32)
    np.testing.assert_allclose(np.asarray(out, np.float32)[real], ref[real], atol=3e-2)


def test_fused_attention_layout_gives_the_dense_values_and_gradients(reference):
    """The cuDNN path: each row's real tokens rotated to the front, jax.nn.dot_product_attention
    with is_causal and the sequence lengths (no mask, no bias), rotated back; through its XLA
    implementation (cuDNN itself needs an NVIDIA GPU): the dense path's outputs on real rows
    and its gradients, with the trainer's masks."""
    (q, k, v, key_mask, cot), (ref_out, ref_grads) = reference

    def fused(q, k, v, m):
        return att.fused_attention(q, k, v, m, implementation="xla")

    out, grads = values_and_grads(fused, q, k, v, key_mask, cot)
    real = np.asarray(key_mask)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref_out)[real], atol=2e-6)
    for name, a, b in zip("qkv", grads, ref_grads):
        np.testing.assert_allclose(a, b, atol=5e-6, err_msg=f"d{name}")


def test_left_align_moves_each_rows_real_tokens_to_the_front():
    mask = jnp.asarray(trainer_mask())
    start, length = att.real_run(mask)
    np.testing.assert_array_equal(start, PROMPT_PADS)
    np.testing.assert_array_equal(length, PROMPT - PROMPT_PADS + COMPLETION_LENGTHS)
    ids = jnp.broadcast_to(jnp.arange(T), (B, T))
    aligned = att.left_align(ids, start)
    for row in range(B):
        real = np.flatnonzero(np.asarray(mask[row]))
        np.testing.assert_array_equal(np.asarray(aligned[row, : len(real)]), real)  # in order, at the front
    np.testing.assert_array_equal(att.left_align(aligned, start, inverse=True), ids)


@pytest.mark.slow
def test_splash_attention_in_the_pallas_interpreter_equals_dense():
    """The TPU kernel's wiring (segment ids, causal mask, grouped heads through the MQA kernel,
    the query scale, padding to its block) run by Pallas' interpreter on the CPU: the dense
    path's outputs on real rows. One row: the interpreter costs seconds per kernel launch."""
    rng = np.random.RandomState(5)
    q, k, v = (jnp.asarray(rng.randn(1, T, n, D), jnp.float32) for n in (HEADS, KV, KV))
    mask = jnp.asarray(trainer_mask([2], [3]))
    out = jax.jit(lambda *a: att.splash_attention(*a, interpret=True))(q, k, v, mask)
    ref = jax.jit(dense)(q, k, v, mask)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref)[real], atol=2e-6)


def test_chunked_backward_holds_no_full_score_buffer():
    """XLA's memory analysis of the chunked gradient stays far below one [B, heads, T, T]
    float32 buffer, which the dense gradient needs several of."""
    b, t, heads, kv, d = 1, 1024, 4, 2, 8
    sds = jax.ShapeDtypeStruct
    args = (sds((b, t, heads, d), jnp.float32), sds((b, t, kv, d), jnp.float32), sds((b, t, kv, d), jnp.float32),
            sds((b, t), jnp.bool_))

    def temp_bytes(fn):
        grad = jax.jit(jax.grad(lambda q, k, v, m: jnp.sum(fn(q, k, v, m)), argnums=(0, 1, 2)))
        return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes

    scores = b * heads * t * t * 4
    chunked = temp_bytes(lambda q, k, v, m: att.chunked_attention(q, k, v, m, q_block=128, k_block=128))
    assert chunked < scores / 4, (chunked, scores)
    assert temp_bytes(dense) > scores  # the reference does hold them: the check can fail


def test_implementation_names():
    assert att.resolve_impl("auto", jnp.bfloat16, backend="cpu") == "chunked"
    assert att.resolve_impl("auto", jnp.bfloat16, backend="gpu") == "cudnn"
    assert att.resolve_impl("auto", jnp.float32, backend="gpu") == "chunked"  # cuDNN has no float32 kernel
    assert att.resolve_impl("auto", jnp.bfloat16, backend="gpu", head_dim=12) == "chunked"  # not a multiple of 8
    assert att.resolve_impl("auto", jnp.bfloat16, backend="tpu") == "splash"
    assert att.resolve_impl("auto", jnp.bfloat16, backend="tpu", head_dim=64) == "chunked"  # lanes of 128
    assert att.resolve_impl("xla", jnp.bfloat16, backend="gpu") == "xla"
    assert att.resolve_impl("dense", jnp.bfloat16, backend="gpu") == "dense"
    with pytest.raises(ValueError, match="attention_impl='flash'"):
        att.resolve_impl("flash", jnp.float32)
    with pytest.raises(ValueError, match="q_block=0"):
        att.chunked_attention(*inputs()[:4], q_block=0)
    cfg = Qwen3Config(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=4)
    with pytest.raises(ConfigError, match="attention_impl='flash'"):
        dataclasses.replace(cfg, attention_impl="flash")
    assert "attention_impl" not in cfg.to_hf_dict()
    assert Qwen3Config.from_dict(cfg.to_dict()) == cfg


def test_model_logits_equal_across_implementations():
    """The model's forward without a cache gives the same logits on real tokens with
    attention_impl dense, chunked (one tile) and xla (cuDNN's layout), with the trainer's
    mask. (Random weights are filled in from numpy into
    the abstract model: building a model runs one compilation per initialiser shape.)"""
    cfg = Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, attention_impl="chunked")
    rng = np.random.RandomState(3)
    graphdefs = []
    for impl in ("dense", "chunked", "xla"):
        abstract = nnx.eval_shape(lambda c=dataclasses.replace(cfg, attention_impl=impl): Qwen3ForCausalLM(c, rngs=nnx.Rngs(0)))
        graphdef, abstract_state = nnx.split(abstract)
        graphdefs.append(graphdef)
    state = jax.tree.map(lambda a: jnp.asarray(0.3 * rng.randn(*a.shape), a.dtype), abstract_state)
    mask = jnp.asarray(trainer_mask()[:2])
    ids = jnp.asarray(rng.randint(0, 32, (2, T)), jnp.int32)
    pos = left_pad_positions(mask)
    ref, *others = (np.asarray(jax.jit(lambda s, g=g: nnx.merge(g, s)(ids, positions=pos, attention_mask=mask)[0])(state))
                    for g in graphdefs)
    real = np.asarray(mask)
    assert np.abs(ref[real]).max() > 0.1  # a forward that did something
    for ours in others:
        np.testing.assert_allclose(ours[real], ref[real], atol=1e-5)
