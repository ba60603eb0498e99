"""Chunked token log-probs (llm/model/logprobs.py) against the full-vocabulary path, the model's own
logits and transformers' gradients; the trainer's forward at a sampling temperature."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from llm.model import logprobs as lp
from llm.rl.updates import completion_forward
from llm.generation.decode import left_pad_positions
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM

B, P, T, V = 3, 5, 7, 61


def tiny(tied: bool, seed: int = 0) -> Qwen3ForCausalLM:
    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, tie_word_embeddings=tied)
    return Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(seed))


def batch(seed: int = 0):
    rng = np.random.RandomState(seed)
    pmask = np.arange(P)[None, :] >= np.array([0, 2, 4])[:, None]
    cmask = np.arange(T)[None, :] < np.array([T, 4, 1])[:, None]
    return (jnp.asarray(rng.randint(0, V, (B, P)), jnp.int32), jnp.asarray(pmask),
            jnp.asarray(rng.randint(0, V, (B, T)), jnp.int32), jnp.asarray(cmask))


def reference_forward(model, prompt_ids, pmask, tokens, cmask, temperature):
    """Today's path: the model's [B, T, V] logits, log-softmax at the temperature."""
    ids = jnp.concatenate([prompt_ids, tokens], axis=1)
    m = jnp.concatenate([pmask, cmask], axis=1)
    logits, _ = model(ids, positions=left_pad_positions(m), attention_mask=m, logits_to_keep=T + 1)
    logits = logits[:, :T] / temperature
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], axis=-1)[..., 0]
    p = jax.nn.softmax(logits)
    ent = -jnp.sum(p * jax.nn.log_softmax(logits), axis=-1)
    return jnp.where(cmask, logp, 0.0), jnp.where(cmask, ent, 0.0)


@pytest.mark.parametrize("tied,chunk", [(True, 3), (False, 128)])
def test_token_logprobs_chunked_equal_full_values_and_grads(tied, chunk):
    """Chunks (3 does not divide T = 7: padded; 128 > T: one chunk) give the full path's
    values and gradients with respect to the hidden states and the head weight."""
    rng = np.random.RandomState(1)
    hidden = jnp.asarray(rng.randn(B, T, 16), jnp.float32)
    weight = jnp.asarray(rng.randn(V, 16) if tied else rng.randn(16, V), jnp.float32) * 0.5
    tokens = jnp.asarray(rng.randint(0, V, (B, T)), jnp.int32)
    cot = jnp.asarray(rng.randn(2, B, T), jnp.float32)

    def scalar(h, w, c):
        logp, ent, _ = lp.token_logprobs(h, w, tokens, tied=tied, temperature=0.7, chunk=c)
        return jnp.sum(logp * cot[0]) + jnp.sum(ent * cot[1])

    full = lp.token_logprobs(hidden, weight, tokens, tied=tied, temperature=0.7, chunk=None)
    ours = lp.token_logprobs(hidden, weight, tokens, tied=tied, temperature=0.7, chunk=chunk)
    logits = jnp.einsum("bth,vh->btv" if tied else "bth,hv->btv", hidden, weight) / 0.7
    by_hand = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(full[0], by_hand, atol=1e-5)
    for a, b in zip(ours, full):
        np.testing.assert_allclose(a, b, atol=1e-5)
    g_full = jax.jit(jax.grad(scalar, argnums=(0, 1)), static_argnums=2)(hidden, weight, None)
    g_ours = jax.jit(jax.grad(scalar, argnums=(0, 1)), static_argnums=2)(hidden, weight, chunk)
    for a, b in zip(g_ours, g_full):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_token_logprobs_rejects_bad_settings():
    h, w, t = jnp.zeros((1, 2, 4)), jnp.zeros((5, 4)), jnp.zeros((1, 2), jnp.int32)
    with pytest.raises(ValueError, match="chunk"):
        lp.token_logprobs(h, w, t, tied=True, chunk=0)
    with pytest.raises(ValueError, match="temperature"):
        lp.token_logprobs(h, w, t, tied=True, temperature=0.0)
    ids, mask = jnp.zeros((1, 3), jnp.int32), jnp.ones((1, 3), bool)
    abstract = nnx.eval_shape(lambda: tiny(True))  # checked before any computation
    with pytest.raises(ValueError, match="remat='some'"):
        abstract.hidden_states(ids, ids, mask, remat="some")


@pytest.mark.parametrize("tied,remat", [(False, "save_matmuls")])  # tied, full: the transformers test
def test_completion_forward_equals_full_logits_path(tied, remat):
    """The trainer's chunked, rematerialised forward equals log-softmax of the model's own
    logits at T=0.7: values, entropies and parameter gradients."""
    model = tiny(tied)
    graphdef, state = nnx.split(model)
    pids, pmask, tokens, cmask = batch()
    cot = jnp.asarray(np.random.RandomState(2).randn(B, T), jnp.float32)

    def ours(s):
        logp, ent, _ = completion_forward(graphdef, s, pids, pmask, tokens, cmask, entropy=True, temperature=0.7,
                                             chunk=3, remat=remat)
        return jnp.sum(logp * cot) + 0.1 * jnp.sum(ent), (logp, ent)

    def theirs(s):
        logp, ent = reference_forward(nnx.merge(graphdef, s), pids, pmask, tokens, cmask, 0.7)
        return jnp.sum(logp * cot) + 0.1 * jnp.sum(ent), (logp, ent)

    (v1, (l1, e1)), g1 = jax.jit(jax.value_and_grad(ours, has_aux=True))(state)
    (v2, (l2, e2)), g2 = jax.jit(jax.value_and_grad(theirs, has_aux=True))(state)
    np.testing.assert_allclose(l1, l2, atol=1e-5)
    np.testing.assert_allclose(e1, e2, atol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_logprobs_gradients_match_transformers():
    """d(sum(c * log softmax(logits / T)[token]))/d(params) of the chunked path equals torch's."""
    torch = pytest.importorskip("torch", reason="needs the `torch` extra")
    transformers = pytest.importorskip("transformers")
    from llm.model.hf_io import model_from_hf_tensors, model_to_hf_tensors

    hf_cfg = transformers.Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      tie_word_embeddings=True, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    tm = transformers.Qwen3ForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for name, p in tm.named_parameters():
            p.copy_((1.0 + 0.3 * torch.randn_like(p)) if name.endswith("norm.weight") else 0.15 * torch.randn_like(p))
    config = Qwen3Config.from_hf_dict(tm.config.to_dict())
    fm = model_from_hf_tensors(config, {k: v.detach().numpy() for k, v in tm.state_dict().items()}.__getitem__)
    graphdef, state = nnx.split(fm)
    pids, pmask, tokens, cmask = batch(3)
    cot = np.random.RandomState(4).randn(B, T).astype(np.float32) * np.asarray(cmask)

    def loss(s):
        logp, _, _ = completion_forward(graphdef, s, pids, pmask, tokens, cmask, temperature=0.7, chunk=3,
                                           remat="full")
        return jnp.sum(logp * cot)

    ours = dict(model_to_hf_tensors(nnx.merge(graphdef, jax.jit(jax.grad(loss))(state))))
    ids = np.concatenate([np.asarray(pids), np.asarray(tokens)], axis=1)
    m = np.concatenate([np.asarray(pmask), np.asarray(cmask)], axis=1)
    pos = np.clip(np.cumsum(m, axis=1) - 1, 0, None)
    out = tm(input_ids=torch.as_tensor(ids, dtype=torch.long), attention_mask=torch.as_tensor(m.astype(np.int64)),
             position_ids=torch.as_tensor(pos, dtype=torch.long)).logits[:, P - 1 : P + T - 1]
    logp = torch.log_softmax(out / 0.7, dim=-1).gather(-1, torch.as_tensor(np.array(tokens), dtype=torch.long)[..., None])
    (logp[..., 0] * torch.as_tensor(cot)).sum().backward()
    theirs = {name: p.grad.numpy() for name, p in tm.named_parameters()}
    assert set(ours) == set(theirs)
    for name, ref in theirs.items():
        scale = max(np.abs(ref).max(), 1e-3)
        np.testing.assert_allclose(ours[name], ref, atol=2e-4 * scale, rtol=0, err_msg=name)
