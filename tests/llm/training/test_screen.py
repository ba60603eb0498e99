"""Greedy screening of GRPO's lakes (train.grpo.screen; llm/training/experiments/screen.py): a round keeps the
lakes its policy's greedy decode fails first, and the step's groups sample on them."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlake.config import LakeConfig
from jaxlake.suite import take_lakes
from llm.game import rewards
from llm.game.lakes import sample_lakes
from llm.game.prompter import Prompter
from llm.generation.decode import GenerationConfig
from llm.training.completions import sample_completions
from llm.training.config import GRPOConfig, ScreenConfig, TrainConfig
from llm.training.experiments.screen import screen_lakes, screen_order

# crowded, holed lakes of two agents: the shipped planner fails about a fifth of them greedily
HARD = LakeConfig(height=6, width=6, num_agents=2, hole_density=0.2, conflict_density=1.0, max_steps=16,
                  max_height=8, max_width=8, max_agents=4)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.data())
def test_screen_order_keeps_failures_first_each_in_drawing_order(failed, data):
    failed = np.asarray(failed)
    n = data.draw(st.integers(1, len(failed)))
    idx = screen_order(failed, n)
    assert len(idx) == n and len(set(idx.tolist())) == n
    want = [i for i in range(len(failed)) if failed[i]] + [i for i in range(len(failed)) if not failed[i]]
    assert idx.tolist() == want[:n]


def test_screen_order_rejects_keeping_more_than_it_screened():
    with pytest.raises(ValueError, match="cannot keep 5 of 4"):
        screen_order(np.zeros(4, bool), 5)


def test_screen_config_errors_name_the_field():
    with pytest.raises(ValueError, match="grpo.screen.lakes=-1"):
        TrainConfig.from_dict({"grpo": {"screen": {"lakes": -1}}})
    with pytest.raises(ValueError, match="grpo.screen.lakes=4 must be 0 .* >= lakes_per_step=8"):
        TrainConfig.from_dict({"grpo": {"screen": {"lakes": 4}}})
    with pytest.raises(ValueError, match="train.grpo.screen"):
        TrainConfig.from_dict({"grpo": {"screen": {"lake": 64}}})
    assert TrainConfig.from_dict({"grpo": {"screen": {"lakes": 64}}}).grpo.screen == ScreenConfig(lakes=64)
    assert not GRPOConfig().screen.enabled


@pytest.fixture(scope="module")
def planner():
    from llm.game.prompts import load_prompt_config
    from llm.training.config import ModelConfig
    from llm.training.policy import load_policy

    return load_policy(ModelConfig(shipped="planner")), load_prompt_config("planner")  # the expert planner


def _greedy_success(policy, prompter, lakes, max_new_tokens):
    """Success of each lake's greedy plan, decoded one lake at a time (no batch in common with
    the screen's decode)."""
    out = []
    gen = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, top_k=0, top_p=1.0)
    n = int(np.asarray(lakes.num_agents).shape[0])
    for i in range(n):
        one = take_lakes(lakes, np.asarray([i]))
        ids, pmask = prompter.encode(one)
        c = sample_completions(policy, ids, pmask, jax.random.PRNGKey(0), gen, None,
                               reasoning=prompter.config.reasoning)
        res = rewards.compute_rewards(one, c.texts, jax.random.PRNGKey(1), rewards.RewardConfig(),
                                      reasoning=prompter.config.reasoning.enabled)
        out.append(bool(res.success[0]))
    return np.asarray(out)


def test_screen_keeps_the_lakes_the_greedy_decode_fails(planner):
    """The shipped planner on 16 hard lakes: the screen's failures are the lakes whose greedy
    plan, decoded alone, fails; they come first among the kept lakes, in drawing order."""
    policy, prompter_config = planner
    lakes = sample_lakes(jax.random.PRNGKey(7), HARD, 16)
    prompter = Prompter.fit(policy.tokenizer, prompter_config, lakes, None, 16)
    s = screen_lakes(policy, prompter, lakes, 8, jax.random.PRNGKey(1), max_new_tokens=64,
                     horizon=HARD.max_steps, reward_config=rewards.RewardConfig())
    alone = _greedy_success(policy, prompter, lakes, 64)
    np.testing.assert_array_equal(s.greedy_failed, ~alone)
    assert 0 < s.greedy_failed.sum() < 8  # the case is informative: some fail, and fewer than kept
    k = int(s.greedy_failed.sum())
    assert s.index[:k].tolist() == np.flatnonzero(~alone).tolist()
    assert s.kept_failed == k and not s.greedy_failed[s.index[k:]].any()
    for a, b in zip(jax.tree_util.tree_leaves(s.lakes), jax.tree_util.tree_leaves(take_lakes(lakes, s.index))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_a_screened_step_samples_its_groups_on_the_greedy_failures(planner, tmp_path, monkeypatch):
    """run_grpo with screen.lakes=8 and 2 lakes a step: the groups' prompts are those of the
    screen's kept lakes (the greedy failures first), and the row counts them."""
    from llm.rl import updates as updates_mod
    from llm.rl.dynamic import DynamicSamplingConfig
    from llm.training import grpo_loop
    from llm.training.config import OptimConfig
    from llm.training.experiments import screen as screen_mod
    from llm.training.stage import MetricsLog

    policy, pcfg = planner
    screens, seen = [], []
    real_screen, real_update = screen_mod.screen_lakes, updates_mod.make_grpo_update

    def spy_screen(*args, **kwargs):
        screens.append(real_screen(*args, **kwargs))
        return screens[-1]

    def spy_update(*args, **kwargs):
        update = real_update(*args, **kwargs)

        def wrapped(state, opt_state, batch, *rest):
            seen.append(jax.tree_util.tree_map(np.asarray, batch))
            return update(state, opt_state, batch, *rest)

        return wrapped

    monkeypatch.setattr(screen_mod, "screen_lakes", spy_screen)
    monkeypatch.setattr(updates_mod, "make_grpo_update", spy_update)
    grpo_cfg = GRPOConfig(steps=1, lakes_per_step=2, group_size=4, max_new_tokens=64, screen=ScreenConfig(lakes=8),
                          optim=OptimConfig(lr=1e-5, warmup_steps=0),
                          dynamic_sampling=DynamicSamplingConfig(enabled=False))
    config = TrainConfig(seed=3, grpo=grpo_cfg, prompt=pcfg, progress=False)
    prompter = Prompter.fit(policy.tokenizer, pcfg, sample_lakes(jax.random.PRNGKey(0), HARD, 64), None, 16)
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    grpo_loop.run_grpo(policy, policy.state, config, HARD, tmp_path / "ckpt", metrics, prompter, mesh=None)
    (row,) = metrics.rows()
    (s,) = screens
    assert len(s.greedy_failed) == 8 and len(s.index) == 2
    assert row["screen_failed_share"] == pytest.approx(s.greedy_failed.mean())
    assert row["screen_kept_failed"] == s.kept_failed == min(2, int(s.greedy_failed.sum()))
    ids, _ = prompter.encode(s.lakes)
    (batch,) = seen
    np.testing.assert_array_equal(batch.prompt_ids, np.repeat(ids, 4, axis=0))


def test_the_anchor_screens_its_lakes_with_the_current_policy(planner):
    """anchor.screen_lakes=16, anchor.lakes=4: the anchor's batch holds the reference rows of the
    screen's kept lakes (the shipped planner's greedy failures first) of the warm start's draw."""
    from jaxlake.mixture import Mixture
    from llm.training import warmstart as ws
    from llm.training.config import AnchorConfig, WarmStartConfig
    from llm.training.anchor import anchor_batches as _anchor_batches

    policy, pcfg = planner
    wc = WarmStartConfig(blocked_share=0.75)
    config = TrainConfig(warmstart=wc, prompt=pcfg, grpo=GRPOConfig(max_new_tokens=64, anchor=AnchorConfig(
        weight=1.0, lakes=4, screen_lakes=16)))
    prompter = Prompter.fit(policy.tokenizer, pcfg, sample_lakes(jax.random.PRNGKey(0), HARD, 8), None, 16)
    draw = _anchor_batches(policy, config, Mixture.of(HARD), prompter, jax.random.PRNGKey(5), None)
    batch, s = draw(0, policy)
    assert len(s.greedy_failed) == 16 and s.kept_failed == min(4, int(s.greedy_failed.sum())) > 0
    key = jax.random.fold_in(jax.random.split(jax.random.PRNGKey(5))[1], 0)
    drawn = ws.reference_lakes(key, Mixture.of(HARD), 16, wc)
    kept = take_lakes(drawn, s.index)
    ids, _ = Prompter.fit(policy.tokenizer, pcfg, kept, batch.prompt_ids.shape[1], 16).encode(kept)
    np.testing.assert_array_equal(ids, np.asarray(batch.prompt_ids))
    with pytest.raises(ValueError, match="grpo.anchor.screen_lakes=8 must be 0 .* >= grpo.anchor.lakes=16"):
        TrainConfig.from_dict({"grpo": {"anchor": {"weight": 1, "screen_lakes": 8}}})
