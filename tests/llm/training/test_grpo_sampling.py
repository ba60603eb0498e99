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
from llm.generation.logprobs import sequence_logprobs
from llm.rl.grpo import GRPOLossConfig
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM
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
def test_grpo_steps_refill_skip_and_train_on_the_sampling_distribution(tmp_path, monkeypatch):
    """Two GRPO steps at T=0.7 with mu=2, a KL term, 2 micro-batches and DAPO dynamic sampling
    in up to 2 rounds, the rewards scripted (llm/rl/dynamic.py):

    * step 1: no group of either round has differing rewards -> no update at all: step 2's
      first update gets the starting parameters and a fresh optimizer state (zero moments,
      count 0), and the lr did not advance;
    * step 2: round 0's group 1 and round 1's group 0 are informative -> the batch is exactly
      those rows, in that order, with their advantages.

    The batch's reference log-probs (micro-batched forward) are the temperature-0.7 log-probs
    of the sampled tokens; the first update is on-policy (no old log-probs: ratio 1, no
    clipping), the second gets the starting policy's temperature-0.7 log-probs from the
    first's forward and sees a moved policy."""
    from llm.game import rewards as rewards_mod
    from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer
    from llm.rl import updates as updates_mod
    from llm.rl.dynamic import DynamicSamplingConfig

    tokenizer = to_hf_tokenizer(build_game_tokenizer())
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    policy = Policy.from_model(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), tokenizer)
    start = [np.asarray(x) for x in jax.tree_util.tree_leaves(policy.state)]
    ref_state = jax.tree_util.tree_map(lambda x: x + 0.01, policy.state)  # a reference that differs
    seen, sampled = [], []
    real_update, real_sample, real_rewards = updates_mod.make_grpo_update, grpo_loop.sample_completions, \
        rewards_mod.compute_rewards

    def spy_update(*args, **kwargs):
        update = real_update(*args, **kwargs)

        def wrapped(state, opt_state, batch, on_policy=None):
            seen.append(jax.tree_util.tree_map(np.asarray, (state, opt_state, batch, on_policy)))
            return update(state, opt_state, batch, on_policy)

        return wrapped

    def spy_sample(policy, ids, *args, **kwargs):
        out = real_sample(policy, ids, *args, **kwargs)
        sampled.append((np.asarray(ids), np.asarray(out.tokens_np)))
        return out

    script = [[[0, 0], [1, 1]], [[2, 2], [0, 0]],  # step 1: rounds 0 and 1, every group tied
              [[0, 0], [1, 0]], [[0, 3], [5, 5]]]  # step 2: round 0 group 1, round 1 group 0 differ

    def scripted(*args, **kwargs):
        res = real_rewards(*args, **kwargs)
        return res.replace(reward=np.asarray(script.pop(0), np.float32).reshape(-1))

    monkeypatch.setattr(updates_mod, "make_grpo_update", spy_update)
    monkeypatch.setattr(grpo_loop, "sample_completions", spy_sample)
    monkeypatch.setattr(rewards_mod, "compute_rewards", scripted)
    grpo_cfg = GRPOConfig(steps=2, lakes_per_step=2, group_size=2, mu=2, micro_batches=2, max_new_tokens=6,
                          temperature=0.7, optim=OptimConfig(lr=1e-2, warmup_steps=0),
                          loss=GRPOLossConfig(beta=0.05, kl_estimator="k2"),
                          dynamic_sampling=DynamicSamplingConfig(enabled=True, max_rounds=2))
    pcfg = PromptConfig(system="", user="{grid}\n{agents}", use_system=False)
    config = TrainConfig(seed=1, grpo=grpo_cfg, prompt=pcfg, progress=False)
    prompter = Prompter.fit(tokenizer, pcfg, sample_lakes(jax.random.PRNGKey(0), ENV, 2), None, 16)
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    run_grpo(policy, ref_state, config, ENV, tmp_path / "ckpt", metrics, prompter, mesh=None)
    skipped, trained = metrics.rows()
    assert not script and len(sampled) == 4 and len(seen) == 2  # 2 rounds a step; updates only in step 2
    assert (skipped["update_skipped"], skipped["sampling_rounds"], skipped["kept_groups"]) == (1, 2, 0)
    assert "loss" not in skipped and skipped["kept_share"] == 0.0
    assert (trained["update_skipped"], trained["sampling_rounds"], trained["informative_groups"],
            trained["kept_groups"], trained["kept_share"]) == (0, 2, 2, 2, 1.0)
    assert trained["lr"] == skipped["lr"] == pytest.approx(1e-2)  # the skipped step did not advance the schedule
    # step 1 changed nothing: the parameters and a fresh optimizer state reach step 2's first update
    state, opt_state, b, first = seen[0]
    for a, s0 in zip(jax.tree_util.tree_leaves(state), start):
        np.testing.assert_array_equal(a, s0)
    assert all(not np.any(x) for x in jax.tree_util.tree_leaves(opt_state))  # zero moments, count 0
    # the batch: round 0's group 1 (rows 2, 3), then round 1's group 0 (rows 0, 1) of step 2
    (ids0, tok0), (ids1, tok1) = sampled[2], sampled[3]
    np.testing.assert_array_equal(b.prompt_ids, np.concatenate([ids0[2:4], ids1[0:2]]))
    np.testing.assert_array_equal(b.tokens, np.concatenate([tok0[2:4], tok1[0:2]]))
    a, c = 0.5 / (0.5 * 2**0.5 + 1e-4), 1.5 / (1.5 * 2**0.5 + 1e-4)  # [1, 0] and [0, 3]: sample std + 1e-4
    np.testing.assert_allclose(b.advantages, [a, -a, -c, c], rtol=1e-5)
    assert b.mask.any() and bool(first)  # on-policy: the placeholder old_logp is ignored
    _, _, b2, second = seen[1]
    assert not bool(second)
    for state, got in ((policy.state, b2.old_logp), (ref_state, b.ref_logp)):
        expected = sequence_logprobs((policy.graphdef, state), *b.sequences, temperature=0.7)
        np.testing.assert_allclose(np.where(b.mask, got, 0), np.where(b.mask, expected, 0), atol=1e-5)
        raw = sequence_logprobs((policy.graphdef, state), *b.sequences)
        assert np.abs(np.asarray(raw) - got)[b.mask].max() > 1e-3  # T=1 would differ
    assert abs(trained["ratio_mean"] - 1.0) < 1e-6 and trained["clip_frac"] == 0.0  # ratio 1 (a weighted mean of ones)
    assert abs(trained["last/ratio_mean"] - 1.0) > 1e-6  # the first inner update moved the policy
