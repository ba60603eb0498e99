"""The Flax Qwen3 against transformers' PyTorch Qwen3ForCausalLM, and its own KV cache.

Every torch model is built here from a ``transformers.Qwen3Config`` (no downloads) with all
weights randomised, RMSNorm weights included (all-ones norms would hide q/k-norm bugs).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip(
    "torch", reason="the live PyTorch checks need the `torch` extra: pip install -e \".[dev,torch]\" (a CPU-only machine: README, Development)")
transformers = pytest.importorskip("transformers")

from llm.model.errors import ModelConfigError as ConfigError  # noqa: E402
from llm.model.hf_io import model_from_hf_tensors  # noqa: E402
from llm.model.config import Qwen3Config
from llm.model.qwen3 import KVCache, Qwen3ForCausalLM, count_params  # noqa: E402
from jaxlake.conf import CONF_DIR

VOCAB = 97
ATOL = 1e-4

# name -> transformers.Qwen3Config kwargs. Together: GQA (4/2), MQA (4/1), MHA (2/2); tied and
# untied heads; head_dim larger than, equal to and unrelated to hidden/heads; three thetas.
CASES = {
    "gqa_untied_hd16": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False, theta=1e6),
    "mqa_tied_theta500": dict(num_attention_heads=4, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True, theta=500.0),
    "mha_tied_hd24": dict(num_attention_heads=2, num_key_value_heads=2, head_dim=24, tie_word_embeddings=True, theta=10_000.0),
}


def make_torch_model(seed: int, *, theta: float, **kw):
    """A random tiny torch Qwen3 (fp32, eval mode) with every weight randomised."""
    hf_cfg = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        # rope_parameters for transformers 5, rope_theta for 4.x (which ignores rope_parameters)
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        rope_theta=theta,
        rms_norm_eps=1e-6,
        **kw,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


def to_flax(torch_model, **overrides) -> Qwen3ForCausalLM:
    """Our model from the torch model's config dict and state dict (no files)."""
    config = Qwen3Config.from_hf_dict(torch_model.config.to_dict())
    if overrides:
        config = dataclasses.replace(config, **overrides)
    sd = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    return model_from_hf_tensors(config, sd.__getitem__)


def torch_logits(model, ids, mask=None, positions=None) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.as_tensor(np.asarray(ids), dtype=torch.long),
            attention_mask=None if mask is None else torch.as_tensor(np.asarray(mask).astype(np.int64)),
            position_ids=None if positions is None else torch.as_tensor(np.asarray(positions), dtype=torch.long),
        )
    return out.logits.float().numpy()


def left_padded_batch(rng: np.random.RandomState, lengths: list[int], width: int):
    """Token ids ``[B, width]`` with row b holding ``lengths[b]`` real tokens at the right."""
    ids = rng.randint(0, VOCAB, (len(lengths), width)).astype(np.int32)
    mask = np.zeros((len(lengths), width), bool)
    for b, n in enumerate(lengths):
        mask[b, width - n :] = True
    ids = np.where(mask, ids, 0).astype(np.int32)
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int32)
    return ids, mask, positions


@nnx.jit
def forward(model, ids, positions, mask):
    return model(ids, positions=positions, attention_mask=mask)[0]


@nnx.jit
def with_cache(model, ids, positions, mask, cache):
    return model(ids, positions=positions, attention_mask=mask, cache=cache)


# Fixed shapes keep the number of compilations small: every batch is B x W.
B, W = 3, 9


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request):
    kw = dict(CASES[request.param])
    tm = make_torch_model(seed=sorted(CASES).index(request.param), **kw)
    return request.param, tm, to_flax(tm)


# ----------------------------------------------------------------------------- equivalence
def test_logits_match_transformers_full_batch(pair):
    _, tm, fm = pair
    ids, mask, pos = left_padded_batch(np.random.RandomState(0), [W] * B, W)
    ours = forward(fm, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask))
    assert ours.shape == (B, W, VOCAB) and ours.dtype == jnp.float32
    ref = torch_logits(tm, ids)  # transformers' own default positions and mask
    assert np.abs(ref).max() > 1.0  # non-trivial logits, so 1e-4 means something
    np.testing.assert_allclose(np.asarray(ours), ref, atol=ATOL, rtol=0)


def test_logits_match_transformers_left_padded(pair):
    _, tm, fm = pair
    ids, mask, pos = left_padded_batch(np.random.RandomState(1), [W, 5, 1], W)
    ours = np.asarray(forward(fm, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask)))
    ref = torch_logits(tm, ids, mask, pos)
    assert np.isfinite(ours).all()  # padded query rows too
    np.testing.assert_allclose(ours[mask], ref[mask], atol=ATOL, rtol=0)


def test_left_padding_does_not_change_real_logits(pair):
    """Row 1 left-padded equals the same tokens at the start of an unpadded row (our model only).

    Causality makes the tokens after them irrelevant, so both batches have the same shape.
    """
    _, _, fm = pair
    ids, mask, pos = left_padded_batch(np.random.RandomState(2), [W, 4, 2], W)
    padded = np.asarray(forward(fm, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask)))
    shifted = np.array(ids)
    shifted[1, :4] = ids[1, W - 4 :]
    shifted[2, :2] = ids[2, W - 2 :]
    full_pos = np.broadcast_to(np.arange(W, dtype=np.int32), (B, W))
    plain = np.asarray(forward(fm, jnp.asarray(shifted), jnp.asarray(full_pos), jnp.ones((B, W), bool)))
    np.testing.assert_allclose(padded[1, W - 4 :], plain[1, :4], atol=1e-5, rtol=0)
    np.testing.assert_allclose(padded[2, W - 2 :], plain[2, :2], atol=1e-5, rtol=0)


def test_tied_head_on_many_rows_matches_transformers():
    """Above ``_SMALL_HEAD_ROWS`` (B * T) the tied head takes its other einsum form."""
    from llm.model.qwen3 import _SMALL_HEAD_ROWS

    tm = make_torch_model(5, **CASES["mqa_tied_theta500"])
    fm = to_flax(tm)
    ids = np.random.RandomState(4).randint(0, VOCAB, (2, _SMALL_HEAD_ROWS // 2 + 3)).astype(np.int32)
    ours = np.asarray(nnx.jit(lambda m, x: m(x)[0])(fm, jnp.asarray(ids)))
    np.testing.assert_allclose(ours, torch_logits(tm, ids), atol=ATOL, rtol=0)


def test_head_dim_is_independent_of_hidden_over_heads():
    tm = make_torch_model(7, **CASES["gqa_untied_hd16"])
    fm = to_flax(tm)
    c = fm.config
    assert c.head_dim * c.num_attention_heads != c.hidden_size
    assert fm.layers.self_attn.q_proj.kernel.shape == (2, 32, 4 * 16)
    assert fm.layers.self_attn.k_norm.weight.shape == (2, 16)
    assert fm.lm_head.kernel.shape == (32, VOCAB)


# ----------------------------------------------------------------------------- KV cache
@pytest.fixture(scope="module")
def gqa_pair():
    tm = make_torch_model(11, **CASES["gqa_untied_hd16"])
    return tm, to_flax(tm)


PROMPT, NEW, CAPACITY = 7, 4, 12


def full_inputs(lengths, seed):
    """A left-padded prompt batch ``[B, PROMPT]`` followed by NEW real tokens per row."""
    rng = np.random.RandomState(seed)
    ids, mask, _ = left_padded_batch(rng, lengths, PROMPT)
    new = rng.randint(0, VOCAB, (len(lengths), NEW)).astype(np.int32)
    full_ids = np.concatenate([ids, new], axis=1)
    full_mask = np.concatenate([mask, np.ones_like(new, bool)], axis=1)
    full_pos = np.clip(np.cumsum(full_mask, axis=1) - 1, 0, None).astype(np.int32)
    return full_ids, full_mask, full_pos


def cached_vs_full(fm, lengths, seed):
    """Logits from prefill + NEW single-token decode steps, and from one full forward."""
    ids, mask, pos = full_inputs(lengths, seed)
    cache = fm.init_cache(len(lengths), CAPACITY)
    steps = []
    for lo, hi in [(0, PROMPT)] + [(PROMPT + t, PROMPT + t + 1) for t in range(NEW)]:
        logits, cache = with_cache(fm, jnp.asarray(ids[:, lo:hi]), jnp.asarray(pos[:, lo:hi]), jnp.asarray(mask[:, lo:hi]), cache)
        steps.append(np.asarray(logits))
    cached = np.concatenate(steps, axis=1)
    full = np.asarray(forward(fm, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask)))
    return cached, full, ids, mask, pos, cache


def test_init_cache_is_empty(gqa_pair):
    _, fm = gqa_pair
    cache = fm.init_cache(3, 5)
    assert isinstance(cache, KVCache)
    assert cache.k.shape == cache.v.shape == (2, 3, 5, 2, 16)
    assert cache.k.dtype == jnp.float32
    assert cache.mask.shape == (3, 5) and not cache.mask.any()
    assert int(cache.index) == 0 and not cache.k.any()


def test_cache_prefill_decode_matches_full_forward_and_transformers(gqa_pair):
    tm, fm = gqa_pair
    cached, full, ids, mask, pos, cache = cached_vs_full(fm, [PROMPT, 3, 1], seed=3)
    np.testing.assert_allclose(cached[mask], full[mask], atol=1e-5, rtol=0)
    np.testing.assert_allclose(cached[mask], torch_logits(tm, ids, mask, pos)[mask], atol=ATOL, rtol=0)
    assert np.isfinite(cached).all()
    assert int(cache.index) == PROMPT + NEW
    np.testing.assert_array_equal(np.asarray(cache.mask[:, : PROMPT + NEW]), mask)
    assert not np.asarray(cache.mask[:, PROMPT + NEW :]).any()
    # logits_to_keep=1 on the prefill gives exactly the last column (every row's next token)
    last, _ = nnx.jit(lambda m, i, p, k, c: m(i, positions=p, attention_mask=k, cache=c, logits_to_keep=1))(
        fm, jnp.asarray(ids[:, :PROMPT]), jnp.asarray(pos[:, :PROMPT]), jnp.asarray(mask[:, :PROMPT]), fm.init_cache(B, CAPACITY)
    )
    assert last.shape == (B, 1, VOCAB)
    np.testing.assert_allclose(np.asarray(last[:, 0]), cached[:, PROMPT - 1], atol=1e-6, rtol=0)


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(1, PROMPT), min_size=3, max_size=3), st.integers(0, 10_000))
def test_cache_matches_full_forward_property(gqa_pair, lengths, seed):
    _, fm = gqa_pair
    cached, full, _, mask, _, _ = cached_vs_full(fm, lengths, seed)
    np.testing.assert_allclose(cached[mask], full[mask], atol=1e-5, rtol=0)


def test_chunked_prefill_equals_single_prefill(gqa_pair):
    _, fm = gqa_pair
    ids, mask, pos = full_inputs([PROMPT, 2, 5], seed=5)
    one, _ = with_cache(fm, jnp.asarray(ids[:, :PROMPT]), jnp.asarray(pos[:, :PROMPT]), jnp.asarray(mask[:, :PROMPT]), fm.init_cache(B, CAPACITY))
    cache = fm.init_cache(B, CAPACITY)
    parts = []
    for lo, hi in [(0, PROMPT - 1), (PROMPT - 1, PROMPT)]:
        logits, cache = with_cache(fm, jnp.asarray(ids[:, lo:hi]), jnp.asarray(pos[:, lo:hi]), jnp.asarray(mask[:, lo:hi]), cache)
        parts.append(np.asarray(logits))
    two = np.concatenate(parts, axis=1)
    real = mask[:, :PROMPT]
    np.testing.assert_allclose(two[real], np.asarray(one)[real], atol=1e-5, rtol=0)
    assert int(cache.index) == PROMPT


def test_default_positions_and_mask_continue_from_cache_index(gqa_pair):
    _, fm = gqa_pair
    ids, mask, pos = full_inputs([PROMPT] * B, seed=6)
    full = np.asarray(forward(fm, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask)))
    step = nnx.jit(lambda m, x, c: m(x, cache=c))
    first, cache = step(fm, jnp.asarray(ids[:, :PROMPT]), fm.init_cache(B, CAPACITY))
    second, cache = step(fm, jnp.asarray(ids[:, PROMPT : PROMPT + 1]), cache)
    np.testing.assert_allclose(np.asarray(first), full[:, :PROMPT], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(second), full[:, PROMPT : PROMPT + 1], atol=1e-5, rtol=0)
    assert np.asarray(cache.mask[:, : PROMPT + 1]).all()


# ----------------------------------------------------------------------------- gradients
def test_gradients_match_transformers(gqa_pair):
    """d(sum(w * logits))/d(params) equals torch's for every tensor (GRPO trains through this)."""
    from llm.model.hf_io import model_to_hf_tensors

    tm, fm = gqa_pair
    ids, mask, pos = left_padded_batch(np.random.RandomState(12), [W, 6, 3], W)
    weights = np.random.RandomState(13).standard_normal((B, W, VOCAB)).astype(np.float32) * mask[..., None]

    @nnx.jit
    def grads(model):
        def loss(m):
            return jnp.sum(m(jnp.asarray(ids), positions=jnp.asarray(pos), attention_mask=jnp.asarray(mask))[0] * weights)

        return nnx.grad(loss)(model)

    g = grads(fm)
    graphdef, _ = nnx.split(fm)
    ours = dict(model_to_hf_tensors(nnx.merge(graphdef, g)))
    tm.zero_grad()
    out = tm(input_ids=torch.as_tensor(ids, dtype=torch.long), attention_mask=torch.as_tensor(mask.astype(np.int64)),
             position_ids=torch.as_tensor(pos, dtype=torch.long)).logits
    (out * torch.as_tensor(weights)).sum().backward()
    theirs = {name: p.grad.numpy() for name, p in tm.named_parameters()}
    assert set(ours) == set(theirs)
    for name, ref in theirs.items():
        scale = max(np.abs(ref).max(), 1e-3)
        np.testing.assert_allclose(ours[name], ref, atol=2e-4 * scale, rtol=0, err_msg=name)
    tm.zero_grad()


# ----------------------------------------------------------------------------- precision
def test_bfloat16_runs_and_is_close(gqa_pair):
    tm, fm32 = gqa_pair
    fm16 = to_flax(tm, param_dtype="bfloat16", dtype="bfloat16")
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(fm16, nnx.Param)))
    ids, mask, pos = left_padded_batch(np.random.RandomState(8), [W, 5, 2], W)
    args = (jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask))
    l32 = np.asarray(forward(fm32, *args))
    l16 = forward(fm16, *args)
    assert l16.dtype == jnp.float32
    l16 = np.asarray(l16)
    assert np.isfinite(l16).all()
    scale = np.abs(l32[mask]).max()
    err = np.abs(l16[mask] - l32[mask]).max()
    assert err < 0.05 * scale, (err, scale)
    # bf16 and fp32 agree on the most likely next token almost everywhere
    agree = (l16.argmax(-1) == l32.argmax(-1))[mask].mean()
    assert agree >= 0.9
    # fp32 weights with bf16 compute also run
    mixed = to_flax(tm, param_dtype="float32", dtype="bfloat16")
    lm = np.asarray(forward(mixed, *args))
    assert np.abs(lm[mask] - l32[mask]).max() < 0.05 * scale


# ----------------------------------------------------------------------------- config
def test_num_parameters_matches_model_and_transformers():
    for case in CASES.values():
        tm = make_torch_model(0, **case)
        fm = to_flax(tm)
        n_torch = sum(p.numel() for p in tm.parameters())
        assert count_params(fm) == fm.config.num_parameters() == n_torch


@pytest.mark.parametrize("name", ["tiny", "small_100m", "qwen3_0_6b", "qwen3_1_7b", "qwen3_4b"])
def test_presets_match_transformers_parameter_count(name):
    config = Qwen3Config.from_yaml(CONF_DIR / "model" / f"{name}.yaml")
    hf_cfg = transformers.Qwen3Config(**{k: v for k, v in config.to_hf_dict().items() if k not in ("architectures", "transformers_version", "model_type")})
    with torch.device("meta"):
        n_torch = sum(p.numel() for p in transformers.Qwen3ForCausalLM(hf_cfg).parameters())
    assert config.num_parameters() == n_torch
    published = {"qwen3_0_6b": 0.6e9, "qwen3_1_7b": 1.7e9, "qwen3_4b": 4.0e9, "small_100m": 1.0e8}
    if name in published:
        assert abs(n_torch / published[name] - 1) < 0.05


def test_hf_dict_round_trip_and_rope_theta_locations():
    config = Qwen3Config(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=6, rope_theta=1234.0,
                         tie_word_embeddings=False, eos_token_id=3, bos_token_id=1)
    d = config.to_hf_dict()
    assert d["rope_parameters"] == {"rope_theta": 1234.0, "rope_type": "default"}
    # transformers 4.x reads only the top-level keys (without them: theta 10000)
    assert d["rope_theta"] == 1234.0 and d["rope_scaling"] is None
    assert Qwen3Config.from_hf_dict(d) == config
    # transformers reads our dict and writes back the same values
    hf = transformers.Qwen3Config(**{k: v for k, v in d.items() if k not in ("transformers_version", "model_type")})
    assert Qwen3Config.from_hf_dict(hf.to_dict()) == config
    # an older config.json: top-level rope_theta, torch_dtype, eos list
    old = {k: v for k, v in d.items() if k not in ("rope_parameters", "dtype")}
    old.update(rope_theta=777.0, torch_dtype="bfloat16", eos_token_id=[3, 4])
    got = Qwen3Config.from_hf_dict(old)
    assert got.rope_theta == 777.0 and got.param_dtype == got.dtype == "bfloat16" and got.eos_token_id == 3


@pytest.mark.parametrize(
    "change, needle",
    [
        (dict(architectures=["LlamaForCausalLM"]), "LlamaForCausalLM"),
        (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}), "yarn"),
        (dict(attention_bias=True), "attention_bias"),
        (dict(use_sliding_window=True), "use_sliding_window"),
        (dict(hidden_act="gelu"), "hidden_act"),
    ],
)
def test_unsupported_hf_configs_are_rejected(change, needle):
    d = Qwen3Config(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=8).to_hf_dict()
    d.update(change)
    with pytest.raises(ConfigError, match=needle) as err:
        Qwen3Config.from_hf_dict(d)
    if "architectures" in change:
        assert "Qwen3ForCausalLM" in str(err.value)


@pytest.mark.parametrize(
    "change, needle",
    [
        (dict(hidden_size=0), "hidden_size=0"),
        (dict(num_key_value_heads=4), "num_key_value_heads=4"),
        (dict(head_dim=7), "head_dim=7"),
        (dict(dtype="float16"), "dtype='float16'"),
        (dict(rope_theta=-1.0), "rope_theta"),
    ],
)
def test_invalid_config_names_the_field(change, needle):
    base = dict(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                num_attention_heads=6, num_key_value_heads=2, head_dim=8)
    base.update(change)
    with pytest.raises(ConfigError, match=needle):
        Qwen3Config(**base)


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ConfigError, match="hidden_sise"):
        Qwen3Config.from_dict(dict(vocab_size=50, hidden_sise=16))


def test_layers_are_initialised_independently():
    config = Qwen3Config.from_yaml(CONF_DIR / "model" / "tiny.yaml")
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    q = np.asarray(model.layers.self_attn.q_proj.kernel[...])
    assert q.shape[0] == config.num_hidden_layers
    assert not np.allclose(q[0], q[1])
    assert abs(q.std() - 0.02) < 0.005
