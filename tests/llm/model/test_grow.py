"""Block expansion (llm.model.grow): the deeper model computes the original's logits exactly,
its new layers are copies with zeroed output projections that still get gradients, and the
command writes a Hugging Face folder that transformers reads to the same logits."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.model.config import Qwen3Config
from llm.model.errors import ModelConfigError
from llm.model.grow import OUTPUT_PROJECTIONS, expand_blocks, expansion_plan, main
from llm.model.qwen3 import Qwen3ForCausalLM

CONFIG = Qwen3Config(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=1000.0)


def _random_model(seed: int = 0) -> Qwen3ForCausalLM:
    """A model whose every weight (norms included) is random, so a layer that changed the
    residual stream would change the logits."""
    model = Qwen3ForCausalLM(CONFIG, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    pure = nnx.to_pure_dict(state)
    leaves, tree = jax.tree_util.tree_flatten_with_path(pure)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [(1.0 + 0.3 * jax.random.normal(k, x.shape, x.dtype)) if path[-1].key == "weight"  # the RMSNorms' scales
           else 0.2 * jax.random.normal(k, x.shape, x.dtype) for k, (path, x) in zip(keys, leaves)]
    nnx.replace_by_pure_dict(state, jax.tree_util.tree_unflatten(tree, new))
    return nnx.merge(graphdef, state)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16).flatmap(lambda n: st.tuples(st.just(n), st.integers(n + 1, 2 * n))))
def test_the_plan_keeps_every_layer_in_order_and_follows_each_new_one_after_its_source(case):
    n, target = case
    source, inserted = expansion_plan(n, target)
    assert len(source) == len(inserted) == target and sum(inserted) == target - n
    assert [s for s, new in zip(source, inserted) if not new] == list(range(n))
    for j, new in enumerate(inserted):
        if new:  # a copy of the layer just before it, never two new layers in a row
            assert j > 0 and not inserted[j - 1] and source[j] == source[j - 1]
    gaps = np.diff([-1] + [j for j, new in enumerate(inserted) if new])  # groups as equal as whole layers allow
    assert gaps.max() - gaps.min() <= 1


@pytest.mark.parametrize("target", [0, 3, 7])
def test_a_target_outside_more_than_and_at_most_twice_is_refused(target):
    with pytest.raises(ModelConfigError, match=f"--layers={target} must be more than the model's 3 layers"):
        expansion_plan(3, target)


@pytest.mark.parametrize("target", [4, 5, 6])
def test_the_deeper_model_computes_the_same_logits_and_its_new_layers_learn(target):
    model = _random_model()
    deeper = expand_blocks(model, target)
    assert deeper.config == dataclasses.replace(CONFIG, num_hidden_layers=target)
    tokens = jax.random.randint(jax.random.key(1), (2, 11), 0, CONFIG.vocab_size)
    base = model(tokens)[0]
    assert float(jnp.abs(base).max()) > 1.0  # the check below is not on near-zero logits
    np.testing.assert_allclose(np.asarray(deeper(tokens)[0]), np.asarray(base), atol=2e-5, rtol=2e-5)

    _, inserted = expansion_plan(CONFIG.num_hidden_layers, target)
    new = np.asarray(inserted)
    layers = nnx.to_pure_dict(nnx.state(deeper, nnx.Param))["layers"]
    for path in OUTPUT_PROJECTIONS:
        kernel = np.asarray(layers[path[0]][path[1]][path[2]])
        assert not kernel[new].any() and all(kernel[j].any() for j in np.flatnonzero(~new))

    def loss(m):  # the zeroed projections get a gradient on the first step
        return jnp.mean(jax.nn.logsumexp(m(tokens)[0], axis=-1))

    grads = nnx.to_pure_dict(nnx.grad(loss)(deeper))["layers"]
    for path in OUTPUT_PROJECTIONS:
        g = np.asarray(grads[path[0]][path[1]][path[2]])
        assert all(np.abs(g[j]).max() > 1e-6 for j in np.flatnonzero(new))


def test_the_command_writes_a_folder_transformers_reads_to_the_same_logits(tmp_path, capsys):
    torch = pytest.importorskip("torch", reason="the live PyTorch check needs the `torch` extra")
    transformers = pytest.importorskip("transformers")
    from tests.llm.model.test_hf_io import make_tokenizer

    from llm.model.hf_io import save_pretrained

    save_pretrained(_random_model(), make_tokenizer(CONFIG.vocab_size), tmp_path / "src")
    assert main([str(tmp_path / "src"), str(tmp_path / "deep"), "--layers", "5"]) == 0
    assert "3 layers -> " in capsys.readouterr().out
    ids = torch.tensor([[3, 9, 4, 17, 2, 30, 8]])
    with torch.no_grad():
        logits = [transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / name).eval()(ids).logits.numpy()
                  for name in ("src", "deep")]
    assert transformers.AutoConfig.from_pretrained(tmp_path / "deep").num_hidden_layers == 5
    np.testing.assert_allclose(logits[1], logits[0], atol=1e-4, rtol=1e-4)

    assert main([str(tmp_path / "src"), str(tmp_path / "deep"), "--layers", "5"]) == 2  # never over a folder
    assert main([str(tmp_path / "src"), str(tmp_path / "deeper"), "--layers", "7"]) == 2
    assert "must be more than the model's 3 layers" in capsys.readouterr().err
    assert not (tmp_path / "deeper").exists()
