"""The KV-cache decoder's cost structure (llm/model/qwen3.py, llm/generation/decode.py) and the
``python -m llm.benchmark generate`` mode (llm/benchmark/generate.py, llm/benchmark/roofline.py)."""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from llm.benchmark import cli as benchmark
from llm.benchmark import roofline
from llm.generation.decode import (
    MAX_DECODE_SEGMENTS,
    MAX_EOS_IDS,
    GenerationConfig,
    _generate_core,
    decode_segments,
)
from llm.generation.logprobs import sequence_logprobs
from llm.generation.text import generate
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM

CFG = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                  rope_theta=10_000.0)
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [3]]


@pytest.fixture(scope="module")
def split():
    graphdef, state = nnx.split(Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(0)))
    # noise far from the N(0, 0.02) init so logits are peaked and ties impossible
    flat, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.PRNGKey(3), len(flat))
    flat = [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, flat)]
    return graphdef, jax.tree.unflatten(treedef, flat)


# ----------------------------------------------------------------------------- the decode plan
@pytest.mark.parametrize("prompt_len,n,block", [(16, 8, 64), (16, 40, 4), (3, 200, 8), (5, 2, 1), (7, 1, 4)])
def test_decode_segments_cover_every_step_with_enough_keys(prompt_len, n, block):
    plan = decode_segments(prompt_len, n, block)
    assert len(plan) <= MAX_DECODE_SEGMENTS
    steps = [s for first, end, _ in plan for s in range(first, end)]
    assert steps == list(range(1, n))  # every decode step exactly once, in order
    for first, end, kv_len in plan:
        # step s writes slot P + s - 1 and attends over slots [0, P + s): the bound must cover it
        assert kv_len == prompt_len + end - 1 <= prompt_len + n
        assert end - first <= max(block, -(-(n - 1) // MAX_DECODE_SEGMENTS))


def test_decode_segments_hand_example():
    assert decode_segments(10, 9, 3) == [(1, 4, 13), (4, 7, 16), (7, 9, 18)]
    assert decode_segments(10, 9, 64) == [(1, 9, 18)]


# ----------------------------------------------------------------------------- correctness
def test_kv_len_bound_equals_full_capacity(split):
    """Attention over the first kv_len slots gives the same logits and cache as over all S."""
    graphdef, state = split
    model = nnx.merge(graphdef, state)
    ids = jnp.asarray([[4, 5, 6, 7, 8], [9, 10, 11, 12, 13]], jnp.int32)
    cache = model.init_cache(2, 16)
    _, cache = model(ids[:, :3], cache=cache, kv_len=3)
    full, c_full = model(ids[:, 3:], cache=cache)
    bounded, c_bounded = model(ids[:, 3:], cache=cache, kv_len=5)
    np.testing.assert_allclose(np.asarray(bounded), np.asarray(full), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(c_bounded.k), np.asarray(c_full.k), rtol=1e-5, atol=1e-5)
    assert int(c_bounded.index) == 5
    with pytest.raises(ValueError, match="kv_len"):
        model(ids[:, 3:], cache=cache, kv_len=17)


def test_segmented_decode_matches_full_forward(split):
    """kv_block=1 splits decoding into MAX_DECODE_SEGMENTS loops with growing attention bounds
    (here with the layers unrolled over per-layer weights): tokens equal the single-loop
    layer-scan run and the reported log-probs equal the full forward
    (``sequence_logprobs``, itself tested against the no-cache forward in test_generate.py)."""
    n = 9
    one = generate(split, None, PROMPTS, GenerationConfig(max_new_tokens=n, temperature=0.0, prompt_bucket=4,
                                                          eos_token_ids=()), decode=False)
    many = generate(split, None, PROMPTS, GenerationConfig(max_new_tokens=n, temperature=0.0, prompt_bucket=4,
                                                           eos_token_ids=(), kv_block=1, unroll_layers=True),
                    decode=False)
    assert len(decode_segments(one.prompt_ids.shape[1], n, 1)) == MAX_DECODE_SEGMENTS
    np.testing.assert_array_equal(np.asarray(many.tokens), np.asarray(one.tokens))
    np.testing.assert_allclose(np.asarray(many.logprobs), np.asarray(one.logprobs), atol=1e-5)
    full = sequence_logprobs(split, many.prompt_ids, many.prompt_mask, many.tokens, many.mask)
    np.testing.assert_allclose(np.asarray(many.logprobs), np.asarray(full), atol=1e-4)


def test_cached_attention_through_dot_product_attention_equals_dense(split):
    """attention_impl="xla": the cached path (prefill into the cache, a decode step over a
    kv_len bound, left padding) goes through jax.nn.dot_product_attention and gives the
    default path's logits and cache at every real token (the prefill is causal self-attention
    by the configured kernel; padded query rows are meaningless and masked out of every use)."""
    import dataclasses

    graphdef, state = split
    fused_def, _ = nnx.split(nnx.eval_shape(
        lambda: Qwen3ForCausalLM(dataclasses.replace(CFG, attention_impl="xla"), rngs=nnx.Rngs(0))))
    ids = jnp.asarray([[0, 0, 4, 5, 6], [7, 8, 9, 10, 11]], jnp.int32)
    mask = ids > 0
    pos = jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)

    def run(gd):
        @jax.jit
        def f(state):
            model = nnx.merge(gd, state)
            pre, cache = model(ids, positions=pos, attention_mask=mask, cache=model.init_cache(2, 9), kv_len=5)
            step, cache = model(jnp.asarray([[12], [13]]), positions=pos[:, -1:] + 1, cache=cache, kv_len=7)
            return pre, step, cache.k

        return f(state)

    real = np.asarray(mask)
    (pre_a, step_a, k_a), (pre_b, step_b, k_b) = run(fused_def), run(graphdef)
    np.testing.assert_allclose(np.asarray(pre_a)[real], np.asarray(pre_b)[real], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(step_a), np.asarray(step_b), rtol=1e-5, atol=1e-5)
    slots = np.concatenate([real, np.ones((2, 1), bool)], axis=1)  # the prompt's real slots + the step's
    np.testing.assert_allclose(np.asarray(k_a)[:, :, :6][:, slots], np.asarray(k_b)[:, :, :6][:, slots],
                               rtol=1e-5, atol=1e-5)


def test_prefill_in_row_blocks_fills_the_same_cache(split):
    """A prefill one row at a time (a fori_loop writing each block's rows of one cache) gives
    the whole-batch prefill's last logits and cache (the per-layer head-major buffers of the
    unrolled layers, what real models prefill into)."""
    from llm.generation.decode import pad_prompts, prefill

    graphdef, state = split
    ids, mask = (jnp.asarray(x) for x in pad_prompts(PROMPTS, 0, 4))

    @jax.jit
    def run(state):
        model = nnx.merge(graphdef, state)
        layers = model.layer_states()
        whole = prefill(model, ids, mask, ids.shape[1] + 3, block_rows=3, layer_states=layers)
        rows = prefill(model, ids, mask, ids.shape[1] + 3, block_rows=1, layer_states=layers)
        return whole, rows

    (la, ca), (lb, cb) = run(state)
    assert isinstance(ca.k, tuple) and ca.k[0].shape == (3, CFG.num_key_value_heads, ids.shape[1] + 3, CFG.head_dim)
    np.testing.assert_allclose(np.asarray(lb), np.asarray(la), rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(ca), jax.tree.leaves(cb)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)
    assert int(cb.index) == ids.shape[1] and np.array_equal(np.asarray(cb.mask[:, : ids.shape[1]]), np.asarray(mask))
    with pytest.raises(ValueError, match="block_rows=2"):
        prefill(nnx.merge(graphdef, state), ids, mask, 16, block_rows=2)


def test_choose_row_block_takes_the_largest_divisor_that_fits():
    from llm.generation.row_blocks import choose_row_block

    asked = []

    def need(rows):  # 20 bytes whatever the rows, 10 per row
        asked.append(rows)
        return 20 + 10 * rows

    assert choose_row_block(12, need, 200) == 12 and asked == [12]
    assert choose_row_block(12, need, 85) == 6
    asked.clear()
    assert choose_row_block(12, need, 55) == 3
    assert asked == [12, 4, 3]  # 6 rows: at least 140 * 6 / 12 = 70 > 55, not compiled
    asked.clear()
    assert choose_row_block(12, need, 25) is None  # nothing fits
    assert asked == [12, 2, 1]
    asked.clear()
    # 60 bytes whatever the rows: after 3 rows failed, the line through 12 and 3 rows says no
    # divisor can fit in 55, and 2 and 1 are not compiled
    assert choose_row_block(12, lambda r: asked.append(r) or 60 + 10 * r, 55) is None
    assert asked == [12, 3]


def test_sampling_in_row_blocks_chosen_from_the_memory_analysis(split, monkeypatch):
    """row_block=None where the device reports too little free memory for the whole batch
    (faked here: the CPU reports none): the compiled call's memory analysis rules the whole
    batch out, one row per call follows, and each block samples with its own key, as an
    explicit row_block=1 does."""
    import llm.generation.decode as dec
    import llm.generation.row_blocks as rb

    config = GenerationConfig(max_new_tokens=4, temperature=1.0, prompt_bucket=4, eos_token_ids=())
    ids, mask = dec.pad_prompts(PROMPTS, 0, 4)
    asked = []
    real_choose = rb.choose_row_block

    def spy(batch, need, free):
        asked.append((batch, need(batch), free))
        return real_choose(batch, need, free)

    monkeypatch.setattr(rb, "choose_row_block", spy)
    monkeypatch.setattr(rb, "free_device_bytes", lambda x: 1000)  # less than any call needs
    monkeypatch.setattr(rb, "_ROW_BLOCKS", {})
    key = jax.random.PRNGKey(7)
    auto = dec.generate_ids(split, ids, mask, key, config)
    (batch, need, free), = asked
    assert batch == 3 and need > 1000 > free  # the compiled 3-row call's bytes, against 95 % of 1000
    assert list(rb._ROW_BLOCKS.values()) == [1]
    explicit = dec.generate_ids(split, ids, mask, key, dataclasses.replace(config, row_block=1))
    for a, b in zip(auto, explicit):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    one = dec.generate_ids(split, ids[1:2], mask[1:2], jax.random.fold_in(key, 1), config)
    np.testing.assert_array_equal(np.asarray(one[0])[0], np.asarray(auto[0])[1])
    with pytest.raises(ValueError, match="row_block"):
        GenerationConfig(row_block=0)


def test_sampling_state_is_one_compute_dtype_copy():
    """float32 masters computed in bfloat16: the sampler reads a bfloat16 copy; same-width
    dtypes pass through (no copy)."""
    from llm.generation.decode import sampling_state

    state = {"w": jnp.ones((2, 2), jnp.float32), "n": jnp.ones((2,), jnp.int32)}
    out = sampling_state(dataclasses.replace(CFG, dtype="bfloat16"), state)
    assert out["w"].dtype == jnp.bfloat16 and out["n"].dtype == jnp.int32
    same = sampling_state(CFG, state)
    assert same["w"] is state["w"]


def test_unroll_layers_default_follows_layer_bytes():
    """unroll_layers=None: scan for the tiny test models, unrolled for real-size layer stacks."""
    from llm.generation.decode import UNROLL_MIN_BYTES, _unroll_layers

    def state_of(cfg):
        return nnx.split(nnx.eval_shape(lambda: Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))))[1]

    big = Qwen3Config(vocab_size=512, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=64)  # small_100m's layers: 100 MB
    assert 25e6 * 4 > UNROLL_MIN_BYTES
    assert _unroll_layers(GenerationConfig(), state_of(big)) is True
    assert _unroll_layers(GenerationConfig(), state_of(CFG)) is False
    assert _unroll_layers(GenerationConfig(unroll_layers=True), state_of(CFG)) is True
    assert _unroll_layers(GenerationConfig(unroll_layers=False), state_of(big)) is False


def test_kv_block_and_unroll_are_validated():
    with pytest.raises(ValueError, match="kv_block"):
        GenerationConfig(kv_block=0)
    with pytest.raises(ValueError, match="unroll_layers"):
        GenerationConfig(unroll_layers=1)


# ----------------------------------------------------------------------------- cost structure
def _cache_copies(hlo: str, shape: str, dtype: str = "f32") -> int:
    return len(re.findall(rf"= {dtype}\[{shape}\]\{{[0-9,]*\}} copy\(", hlo))


@pytest.mark.parametrize("unroll", [False, True])
def test_decode_loop_does_not_copy_the_cache(split, unroll):
    """The cache is updated in place: the compiled generation holds no copy of it besides the
    initial zeros. The layer scan carries the stacked [L, B, S, kv, d] cache (the old design
    passed it through the scan as xs/ys, which cost two full copies per step); the unrolled
    layers (the path of real models, bfloat16 compute) write L per-layer [B, kv, S, d]
    buffers and never copy them (a stacked buffer written by several layers of one loop step
    was copied). XLA:CPU does copy per-layer float32 buffers: it fuses each write into the
    read after it (docs/performance.md)."""
    import dataclasses

    graphdef, state = split
    cfg = CFG
    if unroll:
        cfg = dataclasses.replace(CFG, dtype="bfloat16")
        graphdef, state = nnx.split(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    b, p, n = 3, 8, 6
    ids, mask = jnp.ones((b, p), jnp.int32), jnp.ones((b, p), bool)
    compiled = _generate_core.lower(
        graphdef, state, ids, mask, jax.random.PRNGKey(0), jnp.float32(1), jnp.float32(1),
        jnp.full((MAX_EOS_IDS,), -1, jnp.int32), jnp.int32(0),
        max_new_tokens=n, greedy=True, top_k=0, use_top_p=False, kv_block=2, unroll_layers=unroll).compile()
    hlo = compiled.as_text()
    layers = cfg.num_hidden_layers
    if unroll:
        shape, dtype, copies = f"{b},{cfg.num_key_value_heads},{p + n},{cfg.head_dim}", "bf16", 0
        assert f"bf16[{layers},{b},{p + n}" not in hlo  # per layer only
    else:
        shape, dtype, copies = f"{layers},{b},{p + n},{cfg.num_key_value_heads},{cfg.head_dim}", "f32", 2
    assert f"{dtype}[{shape}]" in hlo  # the cache is there ...
    assert _cache_copies(hlo, shape, dtype) <= copies  # ... and not copied (the scan: once per k/v, its zero init)


def test_decode_step_aliases_a_donated_cache(split):
    """A jitted decode step with the cache donated writes the new cache into the old buffers."""
    graphdef, state = split

    @jax.jit
    def step(state, cache, tok):
        logits, cache = nnx.merge(graphdef, state)(tok, cache=cache, kv_len=cache.k.shape[2])
        return logits, cache

    model = nnx.merge(graphdef, state)
    cache = model.init_cache(2, 2048)
    tok = jnp.ones((2, 1), jnp.int32)
    donated = jax.jit(step.__wrapped__, donate_argnums=(1,)).lower(state, cache, tok).compile()
    cache_bytes = cache.k.nbytes + cache.v.nbytes
    mem = donated.memory_analysis()
    assert mem.alias_size_in_bytes >= cache_bytes
    assert mem.temp_size_in_bytes < cache_bytes  # no second cache (only this layer's [B, S] slices)


# ----------------------------------------------------------------------------- benchmark
def test_roofline_figures_by_hand():
    c = CFG
    weights = c.num_parameters() * 4
    kv = 2 * 2 * 3 * (10 + 4 / 2) * 2 * 16 * 4  # k,v x L x B x mean filled x kv x d x bytes
    assert roofline.decode_bytes_per_step(c, batch=3, prompt_len=10, new_tokens=4) == weights + kv
    body = c.num_parameters() - 2 * c.vocab_size * c.hidden_size  # untied: embedding and head
    attn = 2 * 2 * 2 * 4 * 16 * 10 * 10 / 2
    assert roofline.prefill_flops(c, batch=3, prompt_len=10) == 3 * (2 * body * 10 + attn + 2 * 512 * 64)


@pytest.mark.slow
def test_benchmark_generate_mode_tiny(tmp_path, capsys):
    out = tmp_path / "gen.json"
    rows = benchmark.main(["generate", "--models", "tiny", "--batch", "2", "--prompt-len", "8", "--new-tokens", "5",
                           "--repeats", "1", "--peers", "dynamic,static", "--bandwidth", "10", "--peak-tflops", "0.1",
                           "--eos-after", "2,5", "--out", str(out)])
    engines = [r.engine for r in rows]
    assert engines == ["ours", "transformers (dynamic cache)", "transformers (static cache)"]
    for r in rows:
        assert r.prefill_tok_s > 0 and 0 < r.prefill_roofline
        assert r.agreement == 1.0  # same weights, greedy: the same tokens
    ours = rows[0]
    assert ours.compile_s > 0 and ours.peak_memory_bytes > 0
    saved = json.loads(out.read_text())
    assert saved["bandwidth"] == 10e9 and saved["bandwidth_source"].startswith("stated")
    assert [r["engine"] for r in saved["rows"]] == engines
    (early,) = saved["early_finish"]  # rows stop after 2 and 5 tokens: 7 useful tokens in 5 steps
    assert early["schedule"] == [2, 5] and early["useful_tokens"] == 7 and early["steps"] == 5
    assert early["early_s"] > 0 and early["full_s"] > 0
    table = capsys.readouterr().out
    assert "| tiny (float32) | ours |" in table and "roofline" in table and "useful tok/s, early exit" in table
