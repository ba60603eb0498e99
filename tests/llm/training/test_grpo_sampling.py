"""GRPO trains on the distribution that drew the tokens (llm/training/grpo_loop.py, llm/rl/updates.py, issue
11): at a sampling temperature the behaviour log-probs, the training forward, the KL and the entropy all use
``softmax(logits / T)``; top-k / top-p are rejected."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from jaxlake.config import LakeConfig
from llm.training import grpo_loop
from llm.training.grpo_loop import run_grpo
from llm.game.lakes import sample_lakes
from llm.training.policy import Policy
from llm.game.prompter import Prompter
from llm.training.stage import MetricsLog
from llm.training.config import GRPOConfig, OptimConfig, TrainConfig
from llm.rl.updates import make_grpo_update
from llm.generation.decode import sequence_logprobs
from llm.rl.grpo import GRPOLossConfig
from llm.model.qwen3 import Qwen3Config, Qwen3ForCausalLM
from llm.game.prompts import PromptConfig

ENV = LakeConfig(height=3, width=3, num_agents=1, hole_density=0.0, max_steps=6, max_height=4, max_width=4, max_agents=2)


def test_grpo_config_rejects_filtered_sampling_naming_the_fields():
    with pytest.raises(ValueError, match="grpo.top_k=5"):
        GRPOConfig(top_k=5)
    with pytest.raises(ValueError, match="grpo.top_p=0.9"):
        GRPOConfig(top_p=0.9)
    with pytest.raises(ValueError, match="grpo.temperature"):
        GRPOConfig(temperature=0.0)
    assert GRPOConfig(temperature=0.7).temperature == 0.7


@pytest.mark.slow
def test_grpo_at_temperature_uses_the_sampling_distribution(tmp_path, monkeypatch):
    """One GRPO step at T=0.7 with mu=2 and a KL term: the batch's old and reference log-probs
    are the temperature-0.7 log-probs of the sampled tokens, the first inner iteration has
    ratio 1 and no clipping, and the second one moved."""
    from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer

    tokenizer = to_hf_tokenizer(build_game_tokenizer())
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    policy = Policy.from_model(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), tokenizer)
    ref_state = jax.tree_util.tree_map(lambda x: x + 0.01, policy.state)  # a reference that differs
    seen = []
    real = make_grpo_update

    def spy(*args, **kwargs):
        update = real(*args, **kwargs)

        def wrapped(state, opt_state, batch):
            seen.append(jax.tree_util.tree_map(np.asarray, batch))
            return update(state, opt_state, batch)

        return wrapped

    monkeypatch.setattr(grpo_loop, "make_grpo_update", spy)
    grpo_cfg = GRPOConfig(steps=1, lakes_per_step=2, group_size=2, mu=2, max_new_tokens=6, temperature=0.7,
                          optim=OptimConfig(lr=1e-2, warmup_steps=0),
                          loss=GRPOLossConfig(beta=0.05, kl_estimator="k2"))
    pcfg = PromptConfig(system="", user="{grid}\n{agents}", use_system=False)
    config = TrainConfig(seed=1, grpo=grpo_cfg, prompt=pcfg, progress=False)
    prompter = Prompter.fit(tokenizer, pcfg, sample_lakes(jax.random.PRNGKey(0), ENV, 2), None, 16)
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    run_grpo(policy, ref_state, config, ENV, tmp_path / "ckpt", metrics, prompter, mesh=None)
    row = metrics.rows()[-1]
    assert len(seen) == 2
    b = seen[0]
    assert b.mask.any()
    for state, key in ((policy.state, "old_logp"), (ref_state, "ref_logp")):
        expected = sequence_logprobs((policy.graphdef, state), *b.sequences, temperature=0.7)
        got = getattr(b, key)
        np.testing.assert_allclose(np.where(b.mask, got, 0), np.where(b.mask, expected, 0), atol=1e-5)
        raw = sequence_logprobs((policy.graphdef, state), *b.sequences)
        assert np.abs(np.asarray(raw) - got)[b.mask].max() > 1e-3  # T=1 would differ
    assert abs(row["ratio_mean"] - 1.0) < 1e-5
    assert row["clip_frac"] == 0.0
    assert abs(row["last/ratio_mean"] - 1.0) > 1e-6  # the first inner update moved the policy
