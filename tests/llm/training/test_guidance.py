"""Reference guidance in GRPO (llm/training/guidance.py): the planner's completion in the groups where no
sample succeeded, and what the GRPO step then trains on."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jaxlake.config import LakeConfig
from llm.game import rewards
from llm.game.lakes import sample_lakes
from llm.game.prompter import Prompter
from llm.game.prompts import PromptConfig, load_prompt_config
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM
from llm.training.config import GRPOConfig, GuidanceConfig, OptimConfig, RewardConfig, TrainConfig
from llm.training.guidance import guide_round
from llm.training.policy import Policy
from llm.training.warmstart import plan_targets

ENV = LakeConfig(height=4, width=4, num_agents=2, hole_density=0.2, max_steps=10, max_height=4, max_width=4,
                 max_agents=2)


@pytest.fixture(scope="module")
def tokenizer():
    from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer

    return to_hf_tokenizer(build_game_tokenizer())


def test_all_failed_groups_get_the_planners_completion_which_plays(tokenizer):
    """Groups 0 and 2 failed in every sample, group 1 did not: only 0 and 2 are guided, in their
    last ``rows`` rows, with the warm start's target (think block included, all of it trained), and
    that completion succeeds in the simulator; every other row is untouched."""
    pcfg = load_prompt_config("planner")
    r = pcfg.reasoning
    n, g, width = 3, 4, r.thinking_tokens + 40
    lakes = sample_lakes(jax.random.PRNGKey(3), ENV, n)
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 50, (n * g, width)).astype(np.int32)
    mask = np.zeros((n * g, width), bool)
    mask[:, :7] = True
    train_mask = mask.copy()
    train_mask[:, 3] = False  # a forced token of a sample
    texts = [f"sample {i}" for i in range(n * g)]
    success = np.zeros((n * g,), bool)
    success[g + 1] = True  # group 1 has one success
    out = guide_round(lakes, tokens, mask, train_mask, texts, success, group_size=g, rows=2, tokenizer=tokenizer,
                      thinking_tokens=r.thinking_tokens, style=r.warmstart_style, cell=pcfg.cell)
    np.testing.assert_array_equal(out.groups, [True, False, True])
    guided = np.zeros((n * g,), bool)
    guided[[2, 3, 10, 11]] = True
    np.testing.assert_array_equal(out.rows, guided)
    ref_tokens, ref_mask, solved, ref_texts = plan_targets(jax.tree_util.tree_map(lambda x: np.asarray(x)[[0, 2]],
                                                                                  lakes),
                                                           tokenizer, width, r.thinking_tokens,
                                                           style=r.warmstart_style, cell=pcfg.cell)
    assert solved.all()
    for row, j in ((2, 0), (3, 0), (10, 1), (11, 1)):
        np.testing.assert_array_equal(out.tokens[row], ref_tokens[j])
        np.testing.assert_array_equal(out.mask[row], ref_mask[j])
        np.testing.assert_array_equal(out.train_mask[row], ref_mask[j])  # forced tokens: none, all trained
        assert out.texts[row] == ref_texts[j] and ref_texts[j].startswith("<think>")
    keep = ~guided
    np.testing.assert_array_equal(out.tokens[keep], tokens[keep])
    np.testing.assert_array_equal(out.train_mask[keep], train_mask[keep])
    assert [t for t, k in zip(out.texts, keep) if k] == [t for t, k in zip(texts, keep) if k]
    # the guided completion plays: scored like any sample, it succeeds
    res = rewards.compute_rewards(rewards.repeat_lakes(lakes, g), out.texts, jax.random.PRNGKey(0), RewardConfig(),
                                  reasoning=True)
    assert res.success[guided].all() and not res.success[[0, 1, 8, 9]].any()
    # the inputs were not written to
    assert texts[2] == "sample 2" and mask[2, 7:].sum() == 0


def test_nothing_is_guided_when_a_group_succeeded_or_the_plan_does_not_fit(tokenizer):
    lakes = sample_lakes(jax.random.PRNGKey(4), ENV, 2)
    tokens = np.zeros((4, 6), np.int32)
    mask = np.ones((4, 6), bool)
    texts = ["a", "b", "c", "d"]
    kwargs = dict(group_size=2, rows=1, tokenizer=tokenizer, thinking_tokens=None, style="paths", cell=" {row}{col}")
    out = guide_round(lakes, tokens, mask, mask, texts, np.array([True, False, False, True]), **kwargs)
    assert not out.groups.any() and out.texts == texts
    out = guide_round(lakes, tokens, mask, mask, texts, np.zeros(4, bool), **kwargs)  # 6 tokens: no plan fits
    assert not out.groups.any()
    with pytest.raises(ValueError, match=r"grpo.guidance.rows=2 must be in \[1, group_size - 1 = 1\]"):
        guide_round(lakes, tokens, mask, mask, texts, np.zeros(4, bool), **{**kwargs, "rows": 2})


def test_guidance_config_errors_name_the_field():
    with pytest.raises(ValueError, match="grpo.guidance.rows=0"):
        GuidanceConfig(rows=0)
    with pytest.raises(ValueError, match="grpo.guidance.enabled"):
        GuidanceConfig(enabled="yes")
    with pytest.raises(ValueError, match="grpo.guidance.rows=8 must be less than grpo.group_size=8"):
        GRPOConfig(group_size=8, guidance=GuidanceConfig(enabled=True, rows=8))
    with pytest.raises(ValueError, match="prompt.reasoning.warmstart=true"):
        TrainConfig.from_dict({"grpo": {"guidance": {"enabled": True}}},
                              prompt={"reasoning": {"enabled": True, "warmstart": False}})
    with pytest.raises(ValueError, match="train.grpo.guidance"):
        TrainConfig.from_dict({"grpo": {"guidance": {"enabled": True, "row": 1}}})
    cfg = TrainConfig.from_dict({"grpo": {"guidance": {"enabled": True, "rows": 2}}})
    assert cfg.grpo.guidance == GuidanceConfig(enabled=True, rows=2)


@pytest.mark.parametrize("reasoning, on", [
    ({"enabled": False}, True),                       # plan-only (the novice's compact prompt)
    ({"enabled": True, "warmstart": True}, True),     # a think block the warm start templates (the planner)
    ({"enabled": True, "warmstart": False}, False),   # a model thinking in its own words: no reference form
])
def test_auto_guidance_is_resolved_once_from_the_prompt(reasoning, on):
    cfg = TrainConfig.from_dict({"grpo": {"guidance": {"enabled": "auto", "rows": 1}}}, prompt={"reasoning": reasoning})
    assert cfg.grpo.guidance.enabled is on


def test_the_default_training_guides_the_novice_and_not_a_model_that_thinks_freely():
    """conf/train/default.yaml: guidance ``auto`` and 16 lakes a step (the novice's recipe); a
    pretrained model's reasoning prompt without a templated warm start composes and runs plain GRPO
    (it used to fail the guidance check), and the paper recipe keeps its own settings."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    conf = str(Path(__file__).resolve().parents[3] / "conf")

    def train_of(overrides):
        with initialize_config_dir(conf, version_base=None):
            cfg = compose("config", overrides=overrides)
        c = lambda k: OmegaConf.to_container(cfg[k], resolve=True)  # noqa: E731
        return TrainConfig.from_dict(c("train"), c("reward"), c("prompt")).grpo

    g = train_of([])
    assert g.guidance.enabled is True and g.lakes_per_step == 16
    assert train_of(["prompt=planner"]).guidance.enabled is True
    assert train_of(["prompt=reasoning", "train.warmstart.enabled=false"]).guidance.enabled is False
    assert train_of(["train.grpo.guidance.enabled=false"]).guidance.enabled is False
    paper = train_of(["+recipe=paper_qwen3_0_6b", "model.path=/nowhere"])
    assert paper.guidance.enabled is False and paper.lakes_per_step == 32
    study = train_of(["+study=novice"])  # pinned to the training its archived runs were measured with
    assert study.guidance.enabled is False and study.lakes_per_step == 8


@pytest.mark.slow
def test_a_guided_step_trains_the_planners_rows_up_and_the_failures_down(tokenizer, tmp_path, monkeypatch):
    """A random model fails every lake: with guidance every group holds the planner's completion in
    its last row, the batch trains on it with the group's one positive advantage, the policy's own
    rows with negative ones, and the metrics count the guided groups and the policy's own ties."""
    from llm.rl import updates as updates_mod
    from llm.rl.grpo import GRPOLossConfig
    from llm.training import guidance as guidance_mod
    from llm.training.grpo_loop import run_grpo
    from llm.training.stage import MetricsLog

    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    policy = Policy.from_model(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), tokenizer)
    seen = []
    real_update = updates_mod.make_grpo_update

    def spy_update(*args, **kwargs):
        update = real_update(*args, **kwargs)

        def wrapped(state, opt_state, batch, on_policy=None):
            seen.append(jax.tree_util.tree_map(np.asarray, batch))
            return update(state, opt_state, batch, on_policy)

        return wrapped

    guided_lakes = []
    real_guide = guidance_mod.guide_round

    def spy_guide(lakes, *args, **kwargs):
        guided_lakes.append(lakes)
        return real_guide(lakes, *args, **kwargs)

    monkeypatch.setattr(updates_mod, "make_grpo_update", spy_update)
    monkeypatch.setattr(guidance_mod, "guide_round", spy_guide)
    env = LakeConfig(height=3, width=3, num_agents=1, hole_density=0.0, max_steps=6, max_height=4, max_width=4,
                     max_agents=2)
    grpo_cfg = GRPOConfig(steps=1, lakes_per_step=2, group_size=4, max_new_tokens=12,
                          optim=OptimConfig(lr=1e-3, warmup_steps=0), loss=GRPOLossConfig(),
                          guidance=GuidanceConfig(enabled=True, rows=1))
    pcfg = PromptConfig(system="", user="{grid}\n{agents}", use_system=False)
    config = TrainConfig(seed=1, grpo=grpo_cfg, prompt=pcfg, progress=False)
    prompter = Prompter.fit(tokenizer, pcfg, sample_lakes(jax.random.PRNGKey(0), env, 2), None, 16)
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    run_grpo(policy, policy.state, config, env, tmp_path / "ckpt", metrics, prompter, mesh=None)
    (row,) = metrics.rows()
    assert row["success"] == 0.0  # the policy's own samples: all failed, so the metrics say so
    assert row["zero_adv_share"] == 1.0 and row["guided_groups"] == 2 and row["kept_groups"] == 2
    (batch,) = seen
    adv = batch.advantages.reshape(2, 4)
    assert (adv[:, 3] > 0).all() and (adv[:, :3] < 0).all()
    # the guided rows are the planner's plans (no think block: the prompt does not think)
    (lakes,) = guided_lakes  # one sampling round: every group was informative after guidance
    texts = tokenizer.batch_decode([batch.tokens[i][batch.mask[i]].tolist() for i in (3, 7)],
                                   skip_special_tokens=True)
    res = rewards.compute_rewards(lakes, texts, jax.random.PRNGKey(0), RewardConfig())
    assert res.success.all()
    assert (batch.weights[[3, 7]].sum(1) > 0).all()
