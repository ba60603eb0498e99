"""Sampling filters and batched KV-cache generation (llm/generation/sampling.py, llm/generation/decode.py,
llm/generation/text.py, llm/generation/logprobs.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.generation import sampling
from llm.generation.decode import (
    GenerationConfig,
    generate_ids,
    pad_prompts,
    split_model,
    trace_count,
)
from llm.generation.logprobs import sequence_logprobs
from llm.generation.text import generate
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM
from llm.game.tokenizer import save_game_tokenizer

VOCAB = 1024
N_NEW = 8
BUCKET = 8
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [3]]  # padded to P = 16


def _randomize(state, key, scale=0.3):
    """Replace every parameter with noise so logits are far from uniform (ones hide bugs).

    RMSNorm weights (paths ending in ``weight``) become ``1 + noise``, the rest ``noise``.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    keys = jax.random.split(key, len(flat))
    new = []
    for k, (path, x) in zip(keys, flat):
        noise = scale * jax.random.normal(k, x.shape, jnp.float32)
        is_norm = "weight" in jax.tree_util.keystr(path)
        new.append((1.0 + noise if is_norm else noise).astype(x.dtype))
    return jax.tree_util.tree_unflatten(treedef, new)


@pytest.fixture(scope="module")
def split():
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                      rope_theta=10_000.0)
    graphdef, state = nnx.split(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    return graphdef, _randomize(state, jax.random.PRNGKey(1))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    return save_game_tokenizer(path)


@pytest.fixture(scope="module")
def full_logits(split):
    """No-cache forward of one unpadded row -> logits ``[T, V]``.

    The row is right-padded to a fixed 32 tokens so one compilation serves every length
    (causal attention: the padding cannot change earlier positions).
    """
    graphdef, state = split

    @jax.jit
    def run(state, ids):
        logits, _ = nnx.merge(graphdef, state)(ids)
        return logits[0]

    def call(ids):
        padded = np.zeros((1, 32), np.int32)
        padded[0, : len(ids)] = ids
        return np.asarray(run(state, jnp.asarray(padded)))[: len(ids)]

    return call


GREEDY = GenerationConfig(max_new_tokens=N_NEW, temperature=0.0, prompt_bucket=BUCKET, eos_token_ids=())


@pytest.fixture(scope="module")
def greedy_result(split):
    return generate(split, None, PROMPTS, GREEDY, decode=False)


# ----------------------------------------------------------------------------- sampling filters
def test_top_k_filter_hand_example():
    logits = jnp.asarray([[1.0, 5.0, 3.0, 4.0, 2.0]])
    out = np.asarray(sampling.top_k_filter(logits, 2))
    np.testing.assert_array_equal(np.isfinite(out), [[False, True, False, True, False]])
    np.testing.assert_array_equal(out[np.isfinite(out)], [5.0, 4.0])
    assert sampling.top_k_filter(logits, 0) is logits and sampling.top_k_filter(logits, 5) is logits


def test_top_p_filter_hand_example():
    logits = jnp.log(jnp.asarray([[0.05, 0.5, 0.15, 0.3]]))
    keep = lambda p: np.isfinite(np.asarray(sampling.top_p_filter(logits, p)))[0].tolist()
    assert keep(0.4) == [False, True, False, False]  # the top token alone reaches 0.4
    assert keep(0.75) == [False, True, False, True]  # 0.5 < 0.75 <= 0.8
    assert keep(0.85) == [False, True, True, True]
    assert keep(0.99) == [True, True, True, True]


@settings(max_examples=30, deadline=None)
@given(logits=st.lists(st.integers(-50, 50), min_size=8, max_size=8, unique=True), p=st.floats(0.01, 0.99))
def test_top_p_keeps_smallest_set_reaching_p(logits, p):
    x = jnp.asarray([logits], jnp.float32) / 10.0  # distinct values: no ties at the threshold
    kept = np.isfinite(np.asarray(sampling.top_p_filter(x, p)))[0]
    probs = np.asarray(jax.nn.softmax(x))[0]
    order = np.argsort(-probs)
    n = kept.sum()
    assert kept[order[:n]].all()  # the kept set is a prefix of the sorted tokens
    before_last = probs[order[: n - 1]].sum()
    assert before_last < p + 1e-6  # dropping the last kept token would fall short of p
    assert n == len(logits) or probs[order[:n]].sum() >= p - 1e-6


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**30), k=st.integers(1, 6))
def test_samples_stay_in_top_k(seed, k):
    key = jax.random.PRNGKey(seed)
    logits = jax.random.normal(key, (64, 16))
    toks = np.asarray(sampling.sample_token(jax.random.fold_in(key, 1), logits, temperature=2.0, top_k=k))
    rank = np.argsort(np.argsort(-np.asarray(logits), axis=-1), axis=-1)
    assert (np.take_along_axis(rank, toks[:, None], axis=-1) < k).all()


def _reference_draw(key, logits, temperature, top_k, top_p):
    """The specification: the filters over the whole vocabulary, then ``categorical``."""
    warped = sampling.filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return jax.random.categorical(key, warped, axis=-1)


@pytest.mark.parametrize("vocab,scale,top_k,top_p", [
    (300, 4.0, 0, 1.0),  # unfiltered
    (300, 4.0, 5, 1.0),  # top-k from k + 1 candidates
    (300, 4.0, 0, 0.9),  # peaked: every nucleus inside the TOP_P_CANDIDATES
    (600, 0.2, 0, 0.9),  # flat: nuclei wider than the candidates -> full-sort fallback
    (300, 4.0, 7, 0.8),  # top-p within top-k
])
def test_choose_tokens_draws_the_reference_tokens(vocab, scale, top_k, top_p):
    """The sampling head draws exactly the tokens of the full-vocabulary filters followed by
    ``jax.random.categorical`` for the same key (so the distribution is unchanged), and reports
    the raw-model log-prob of each; both the candidate path and its fallback are covered."""
    logits = scale * jax.random.normal(jax.random.PRNGKey(vocab), (48, vocab))
    temperature = 0.7
    scaled = logits / temperature
    if top_p < 1.0 and top_k == 0:
        _, exact = sampling._threshold_candidates(scaled, 0, jnp.float32(top_p), True)
        assert bool(jnp.all(exact)) == (scale > 1.0)  # which path this case exercises
    head = jax.jit(lambda k, x: sampling.choose_tokens(k, x, greedy=False, temperature=jnp.float32(temperature),
                                                       top_k=top_k, top_p=jnp.float32(top_p), use_top_p=top_p < 1))
    reference = jax.jit(lambda k, x: _reference_draw(k, x, temperature, top_k, top_p))
    for seed in range(2):
        key = jax.random.PRNGKey(seed)
        tok, logp = head(key, logits)
        want = reference(key, logits)
        np.testing.assert_array_equal(np.asarray(tok), np.asarray(want))
        full = jax.nn.log_softmax(logits, axis=-1)
        np.testing.assert_allclose(np.asarray(logp), np.asarray(full[jnp.arange(48), tok]), atol=1e-5)
    greedy_tok, _ = sampling.choose_tokens(None, logits, greedy=True)
    np.testing.assert_array_equal(np.asarray(greedy_tok), np.asarray(jnp.argmax(logits, -1)))


def test_sampling_validation_names_the_field():
    with pytest.raises(ValueError, match="top_p=1.5"):
        GenerationConfig(top_p=1.5)
    with pytest.raises(ValueError, match="temperature=-1"):
        GenerationConfig(temperature=-1.0)
    with pytest.raises(ValueError, match="top_k=-2"):
        GenerationConfig(top_k=-2)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        GenerationConfig(max_new_tokens=0)


def test_pad_prompts_left_pads_to_bucket():
    ids, mask = pad_prompts([[1, 2, 3], [4]], pad_id=9, bucket=4)
    np.testing.assert_array_equal(ids, [[9, 1, 2, 3], [9, 9, 9, 4]])
    np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1]])
    assert pad_prompts([[1] * 5], 0, 4)[0].shape == (1, 8)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        pad_prompts([[1], []], 0)


# ----------------------------------------------------------------------------- generation
def test_greedy_equals_argmax_of_full_forward(greedy_result, full_logits):
    r = greedy_result
    assert r.tokens.shape == (3, N_NEW) and r.prompt_ids.shape == (3, 16)
    assert np.asarray(r.mask).all() and r.finish_reasons == ["length"] * 3
    for row, prompt in enumerate(PROMPTS):
        completion = np.asarray(r.tokens[row]).tolist()
        logits = full_logits(prompt + completion)  # unpadded, no cache, teacher-forced
        expected = logits[len(prompt) - 1: len(prompt) - 1 + N_NEW].argmax(-1)
        np.testing.assert_array_equal(completion, expected)
        logp = jax.nn.log_softmax(logits[len(prompt) - 1: len(prompt) - 1 + N_NEW], axis=-1)
        np.testing.assert_allclose(r.logprobs[row], np.take_along_axis(np.asarray(logp), expected[:, None], 1)[:, 0],
                                   atol=1e-4)
    assert len(set(np.asarray(r.tokens).ravel().tolist())) > 3  # not a degenerate repeat


def test_greedy_is_deterministic_and_not_recompiled(split, greedy_result):
    before = trace_count()
    again = generate(split, None, PROMPTS, GREEDY, decode=False)
    np.testing.assert_array_equal(again.tokens, greedy_result.tokens)
    # new parameters of the same structure and other prompts of the same bucket: no retrace
    graphdef, state = split
    other = _randomize(state, jax.random.PRNGKey(7))
    moved = generate((graphdef, other), None, [[1, 2], [3, 4, 5], [6] * 16], GREEDY, decode=False)
    assert trace_count() == before
    assert not np.array_equal(np.asarray(moved.tokens), np.asarray(greedy_result.tokens))


@pytest.mark.parametrize("top_k,top_p,temperature", [(0, 1.0, 1.0), (20, 0.9, 1.3)])
def test_cached_logprobs_match_full_forward(split, top_k, top_p, temperature):
    cfg = GenerationConfig(max_new_tokens=N_NEW, temperature=temperature, top_k=top_k, top_p=top_p,
                           prompt_bucket=BUCKET, eos_token_ids=(4, 5))
    r = generate(split, None, PROMPTS, cfg, key=jax.random.PRNGKey(3), decode=False)
    full = jax.jit(sequence_logprobs)(split, r.prompt_ids, r.prompt_mask, r.tokens, r.mask)
    np.testing.assert_allclose(np.asarray(full), np.asarray(r.logprobs), atol=1e-4)
    assert np.asarray(r.logprobs)[~np.asarray(r.mask)].tolist() == [0.0] * int((~np.asarray(r.mask)).sum())


def test_sequence_logprobs_equals_no_cache_full_forward(split):
    """Reference: one no-cache forward over the left-padded prompt + right-padded completion."""
    graphdef, state = split
    cfg = GenerationConfig(max_new_tokens=N_NEW, temperature=1.0, prompt_bucket=BUCKET, eos_token_ids=())
    r = generate(split, None, PROMPTS, cfg, key=jax.random.PRNGKey(3), decode=False)
    p = r.prompt_ids.shape[1]
    cmask = jnp.arange(N_NEW)[None, :] < jnp.asarray([[3], [N_NEW], [5]])  # right padding
    tokens = jnp.where(cmask, r.tokens, 0)

    @jax.jit
    def both(state, prompt_ids, prompt_mask, tokens, cmask):
        ids = jnp.concatenate([prompt_ids, tokens], axis=1)
        mask = jnp.concatenate([prompt_mask, cmask], axis=1)
        positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
        logits, _ = nnx.merge(graphdef, state)(ids, positions=positions, attention_mask=mask)
        out = []
        for temp in (1.0, 2.0):
            logp = jax.nn.log_softmax(logits[:, p - 1: p - 1 + N_NEW] / temp, axis=-1)
            ref = jnp.where(cmask, jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0], 0.0)
            ours = sequence_logprobs((graphdef, state), prompt_ids, prompt_mask, tokens, cmask, temperature=temp)
            out.append((ref, ours))
        return out

    results = both(state, r.prompt_ids, r.prompt_mask, tokens, cmask)
    for ref, ours in results:
        np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), atol=1e-4)
    # temperature 1: the generator's own log-probs on the kept tokens
    np.testing.assert_allclose(np.asarray(results[0][1])[:, :3], np.asarray(r.logprobs)[:, :3], atol=1e-4)


def test_sequence_logprobs_is_differentiable(split):
    graphdef, state = split
    ids, mask = pad_prompts(PROMPTS, 0, BUCKET)
    comp = jnp.asarray([[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]], jnp.int32)
    cmask = comp > 0

    def loss(st):
        return -jnp.sum(sequence_logprobs((graphdef, st), ids, mask, comp, cmask))

    grads = jax.jit(jax.grad(loss))(state)
    norms = [float(jnp.linalg.norm(g)) for g in jax.tree.leaves(grads)]
    assert all(np.isfinite(norms)) and sum(norms) > 0


def test_same_key_same_samples(split):
    cfg = GenerationConfig(max_new_tokens=N_NEW, temperature=1.0, prompt_bucket=BUCKET, eos_token_ids=())
    a = generate(split, None, PROMPTS, cfg, key=jax.random.PRNGKey(11), decode=False)
    b = generate(split, None, PROMPTS, cfg, key=jax.random.PRNGKey(11), decode=False)
    c = generate(split, None, PROMPTS, cfg, key=jax.random.PRNGKey(12), decode=False)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))
    with pytest.raises(ValueError, match="needs a PRNG key"):
        generate(split, None, PROMPTS, cfg, decode=False)


def test_top_k_one_equals_greedy(split, greedy_result):
    cfg = GenerationConfig(max_new_tokens=N_NEW, temperature=0.7, top_k=1, prompt_bucket=BUCKET, eos_token_ids=())
    r = generate(split, None, PROMPTS, cfg, key=jax.random.PRNGKey(5), decode=False)
    np.testing.assert_array_equal(r.tokens, greedy_result.tokens)


def test_stop_on_eos(split, greedy_result):
    free = np.asarray(greedy_result.tokens)
    eos = int(free[0, 2])  # row 0 emits it at step 2 (maybe earlier too)
    cfg = GenerationConfig(max_new_tokens=N_NEW, temperature=0.0, prompt_bucket=BUCKET, eos_token_ids=(eos,),
                           pad_token_id=1023)
    r = generate(split, None, PROMPTS, cfg, decode=False)
    for row in range(3):
        hits = np.flatnonzero(free[row] == eos)
        length = int(hits[0]) + 1 if hits.size else N_NEW
        assert int(r.lengths[row]) == length
        np.testing.assert_array_equal(r.tokens[row, :length], free[row, :length])
        assert (np.asarray(r.tokens[row, length:]) == 1023).all()
        assert np.asarray(r.mask[row]).tolist() == [True] * length + [False] * (N_NEW - length)
        assert (np.asarray(r.logprobs[row, length:]) == 0).all()
        assert r.finish_reasons[row] == ("eos" if hits.size else "length")
    assert int(r.lengths[0]) <= 3


def test_all_rows_stop_early(split, greedy_result):
    """With every row's first token as EOS the loop exits after the prefill."""
    first = tuple(sorted(set(np.asarray(greedy_result.tokens[:, 0]).tolist())))
    cfg = GenerationConfig(max_new_tokens=N_NEW, temperature=0.0, prompt_bucket=BUCKET, eos_token_ids=first)
    r = generate(split, None, PROMPTS, cfg, decode=False)
    assert np.asarray(r.lengths).tolist() == [1, 1, 1] and r.finish_reasons == ["eos"] * 3


def test_row_budgets_stop_rows_without_recompiling(split, greedy_result):
    """max_lengths: each row stops after its budget (a "length" finish, not EOS) with the
    free run's tokens before it; new budgets reuse the compiled function."""
    ids, mask = pad_prompts(PROMPTS, 0, BUCKET)
    free = np.asarray(greedy_result.tokens)
    before = trace_count()
    for budgets in ([2, 5, 1], [N_NEW, 3, 4]):
        tokens, out_mask, lengths, logps, hit = generate_ids(split, ids, mask, None, GREEDY, max_lengths=budgets,
                                                             pad_token_id=7)
        assert np.asarray(lengths).tolist() == budgets and not np.asarray(hit).any()
        for row, n in enumerate(budgets):
            np.testing.assert_array_equal(np.asarray(tokens[row, :n]), free[row, :n])
            assert (np.asarray(tokens[row, n:]) == 7).all() and (np.asarray(logps[row, n:]) == 0).all()
            assert np.asarray(out_mask[row]).tolist() == [True] * n + [False] * (N_NEW - n)
    assert trace_count() == before  # the budgets are traced (the pad id too): no new compilation
    with pytest.raises(ValueError, match="max_lengths"):
        generate_ids(split, ids, mask, None, GREEDY, max_lengths=[0, 2, 3])


def test_prompts_pay_for_their_bucket_one_compilation_per_bucket(split, greedy_result):
    """generate() pads a batch to its own longest prompt rounded up to prompt_bucket (not to the
    longest prompt seen so far): short batches run at P = 8, and each bucket compiles once."""
    before = trace_count()
    short = generate(split, None, [[5, 6], [7, 8, 9], [4]], GREEDY, decode=False)
    assert short.prompt_ids.shape == (3, BUCKET) and trace_count() == before + 1  # a new bucket: P = 8
    again = generate(split, None, [[3, 4, 5, 6, 7, 8, 9, 10], [7], [4, 4]], GREEDY, decode=False)
    assert again.prompt_ids.shape == (3, BUCKET)
    longer = generate(split, None, [[5] * 11, [6] * 9, [7]], GREEDY, decode=False)  # P = 16, greedy_result's bucket
    assert longer.prompt_ids.shape == (3, 2 * BUCKET) == greedy_result.prompt_ids.shape
    assert trace_count() == before + 1  # same buckets, same compiled functions


def test_string_prompts_texts_and_stop_strings(split, tokenizer):
    prompts = ["A . . ~ b\n. B ~ a .", "A: R R D"]
    cfg = GenerationConfig(max_new_tokens=N_NEW, temperature=0.0, prompt_bucket=BUCKET)
    r = generate(split, tokenizer, prompts, cfg)
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    np.testing.assert_array_equal(np.asarray(r.prompt_ids)[0, -len(ids[0]):], ids[0])
    for row in range(2):
        seq = np.asarray(r.tokens[row, : int(r.lengths[row])]).tolist()
        assert r.texts[row] == tokenizer.decode(seq, skip_special_tokens=True)
    # a stop string taken from the middle of row 0's text
    text = r.texts[0]
    assert len(text) >= 4, text
    stop = text[2:4]
    cut = generate(split, tokenizer, prompts, GenerationConfig(
        max_new_tokens=N_NEW, temperature=0.0, prompt_bucket=BUCKET, stop_strings=(stop,)))
    full = np.asarray(r.tokens[0]).tolist()
    n = next(i for i in range(1, N_NEW + 1) if stop in tokenizer.decode(full[:i], skip_special_tokens=True))
    assert int(cut.lengths[0]) == n and cut.finish_reasons[0] == "stop"
    assert cut.texts[0] == text[: text.index(stop) + len(stop)]
    np.testing.assert_array_equal(cut.tokens[0, :n], full[:n])
    assert (np.asarray(cut.logprobs[0, n:]) == 0).all() and not np.asarray(cut.mask[0, n:]).any()


def test_generate_ids_on_padded_arrays_matches(split, greedy_result):
    ids, mask = pad_prompts(PROMPTS, 0, BUCKET)
    tokens, mask_out, lengths, logps, hit = generate_ids(split, ids, mask, None, GREEDY)
    np.testing.assert_array_equal(tokens, greedy_result.tokens)
    assert not np.asarray(hit).any()


def test_module_and_split_forms_agree(split, greedy_result):
    model = nnx.merge(*split)
    r = generate(model, None, PROMPTS, GREEDY, decode=False)
    np.testing.assert_array_equal(r.tokens, greedy_result.tokens)
    with pytest.raises(TypeError, match="nnx.Module"):
        split_model("not a model")
