"""Engineer self-play (llm/engineer/selfplay.py): sampled proposals of the engineer's prompt,
rewarded by the current policy's learnability on lakes drawn from them, their answers' log-
likelihood weighted by the proposals' z-scored rewards."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxlake.config import LakeConfig, to_plain
from jaxlake.engineers import edit_from_obj
from jaxlake.engineers.contexts import ContextPool
from jaxlake.engineers.edits import apply_edit
from jaxlake.engineers.space import ConfigSpace
from jaxlake.suite import build_suite, load_eval_conf
from llm.engineer.local import PolicyEngineer
from llm.engineer.selfplay import EngineerSelfPlay, learnability, proposal_advantages
from llm.game.prompts import load_prompt_config
from llm.training.config import SelfPlayConfig, TrainConfig
from tests.support import small_policy

BASE = LakeConfig(height=4, width=4, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=8,
                  max_height=5, max_width=5, max_agents=3)
NODE = {"editable": ["height", "width", "num_agents", "hole_density"],
        "values": {"height": [3, 4, 5], "width": [3, 4, 5], "hole_density": [0.0, 0.1, 0.2]}}


def test_learnability_peaks_at_half_and_advantages_are_z_scores():
    assert learnability([0.5, 0.5]) == 1.0 and learnability([0.0, 1.0]) == 0.0
    assert learnability([0.25]) == pytest.approx(0.75)
    adv = proposal_advantages([1.0, 0.0, 0.0, 0.0])
    assert adv[0] > 0 > adv[1] and adv.mean() == pytest.approx(0.0) and adv.std() == pytest.approx(1.0, abs=1e-4)
    assert (proposal_advantages([0.3, 0.3, 0.3]) == 0).all()  # a tie teaches nothing


def test_config_refuses_bad_values_and_the_anchor_beside_it():
    with pytest.raises(ValueError, match="engineer_selfplay.proposals"):
        SelfPlayConfig(proposals=1)
    with pytest.raises(ValueError, match="train.engineer_selfplay.samples"):
        TrainConfig.from_dict({"engineer_selfplay": {"samples": 0}})
    with pytest.raises(ValueError, match="auxiliary batch"):
        TrainConfig.from_dict({"engineer_selfplay": {"enabled": True}, "grpo": {"anchor": {"weight": 0.1}}})


@pytest.fixture(scope="module")
def hook():
    policy, tokenizer = small_policy()
    space = ConfigSpace(BASE, editable=tuple(NODE["editable"]), values=NODE["values"])
    pool = ContextPool(build_suite(to_plain(load_eval_conf("tiny")), solve=True), space, mixtures=1,
                       current_env_lakes=4, env_stats_lakes=4, k_failures=2, seed=1)
    ctx, _ = pool.context(0)
    cfg = SelfPlayConfig(enabled=True, every=2, proposals=4, lakes=2, samples=2)
    return EngineerSelfPlay(cfg, ctx, PolicyEngineer(space=NODE), load_prompt_config("compact"),
                            tokenizer), policy, ctx


def test_a_batch_rewards_sampled_proposals_by_learnability(hook, monkeypatch):
    sp, policy, ctx = hook
    from flax import nnx

    model = nnx.merge(policy.graphdef, policy.state)
    proposals = sp.propose(model, 0)
    assert len(proposals) == 4
    assert len({a for _, a in proposals}) >= 2  # sampled, not one greedy answer
    for mixture, answer in proposals:  # each answer is the valid edit that made its mixture
        edit = edit_from_obj(json.loads(answer), ctx.current, ctx.base)
        assert apply_edit(ctx.current, edit, _space().edits) == mixture
    r, success = sp.rewards(policy, [m for m, _ in proposals], 0)
    assert r.shape == (4,) and ((0 <= r) & (r <= 1)).all() and 0 <= success <= 1
    # the rows: the engineer's prompt, each answer, weighted by its advantage over its length
    monkeypatch.setattr(sp, "rewards", lambda pol, ms, step: (np.asarray([1.0, 0.0, 0.0, 0.0]), 0.5))
    rows, metrics = sp.batch(0, policy)
    w = np.asarray(rows.weights).sum(1)
    # one context for every row: the update runs it once (llm.rl.updates.shared_prompt_forward)
    assert rows.shared_prompt and (np.asarray(rows.prompt_ids) == np.asarray(rows.prompt_ids)[:1]).all()
    assert w[0] > 0 > w[1] and w.sum() == pytest.approx(0.0, abs=1e-6)
    assert metrics["selfplay/learnability"] == 0.25 and metrics["selfplay/distinct"] == len({a for _, a in proposals})
    parts = metrics["time/selfplay_propose_s"] + metrics["time/selfplay_rollouts_s"]
    assert 0 < parts <= metrics["time/selfplay_s"]
    assert sp.batch(1, policy) == (None, {})  # every 2nd step only
    for j, (_, answer) in enumerate(proposals):  # the batch's answers are the step's proposals (deterministic)
        ids = sp.tokenizer.encode(answer, add_special_tokens=False)
        assert list(np.asarray(rows.tokens)[j, : len(ids)]) == ids



def test_scripted_contexts_change_every_step_and_pay_by_their_policys_learnability(hook):
    """``contexts: scripted``: each self-play step answers a fresh scripted context of the pool
    (another prompt), and each proposal is rewarded by the learnability of the policy that
    context describes (not the LLM's): the same proposals pay differently for two contexts."""
    sp, policy, ctx = hook
    from flax import nnx

    pool = ContextPool(build_suite(to_plain(load_eval_conf("tiny")), solve=True), _space(), mixtures=3,
                       current_env_lakes=4, env_stats_lakes=4, k_failures=2, seed=1)
    cfg = SelfPlayConfig(enabled=True, every=1, proposals=2, lakes=2, samples=2, contexts="scripted")
    scripted = EngineerSelfPlay(cfg, ctx, PolicyEngineer(space=NODE), load_prompt_config("compact"), sp.tokenizer,
                                pool=pool)
    model = nnx.merge(policy.graphdef, policy.state)
    (c0, p0), (c1, p1) = scripted.scripted_context(0), scripted.scripted_context(1)
    assert p0 != p1 and scripted._prompt_text(model, c0)[0] != scripted._prompt_text(model, c1)[0]
    assert scripted._prompt_text(model, c0)[3] % 256 == 0  # few row widths for the update to compile
    mixtures = [m for m, _ in scripted.propose(model, 0, c0)]
    r0, s0 = scripted.scripted_rewards(p0, mixtures, 0)
    want = [pool.learnability(p0, m, 4, seed=0) for m in mixtures]
    np.testing.assert_allclose(r0, want, atol=1e-9)
    r1, _ = scripted.scripted_rewards(p1, mixtures, 0)
    assert not np.allclose(r0, r1) and 0 <= s0 <= 1
    rows, metrics = scripted.batch(0, policy)
    assert rows.shared_prompt and np.asarray(rows.prompt_ids).shape[1] % 256 == 0
    assert 0 <= metrics["selfplay/learnability"] <= 1
    with pytest.raises(ValueError, match="contexts=scripted needs a ContextPool"):
        EngineerSelfPlay(cfg, ctx, PolicyEngineer(space=NODE), load_prompt_config("compact"), sp.tokenizer)
    with pytest.raises(ValueError, match="engineer_selfplay.contexts='all'"):
        SelfPlayConfig(contexts="all")


def _space():
    return ConfigSpace(BASE, editable=tuple(NODE["editable"]), values=NODE["values"])


@pytest.mark.slow
def test_a_run_with_self_play_proposes_in_its_grpo_steps(monkeypatch, tmp_path, micro_model):
    """``python -m jaxlake.run train.engineer_selfplay.enabled=true``, two stages: stage 1 re-answers
    the starting policy's summary (start_eval.json), stage 2 stage 1's; each GRPO step that
    trains logs the proposals' learnability; a probe's settings turn it off."""
    from tests.support import run_cli, tiny_run_overrides

    from jaxlake.pipeline.selfplay import selfplay_context
    from jaxlake.pipeline.settings import RunSettings
    from jaxlake.pipeline.student import LLMStudent

    args = [f"runs_dir={tmp_path}", "experiment=sp", "stages=2", "engineer=heuristic", *tiny_run_overrides(micro_model),
            "train.engineer_selfplay.enabled=true", "train.engineer_selfplay.every=1",
            "train.engineer_selfplay.proposals=2", "train.engineer_selfplay.lakes=1",
            "train.engineer_selfplay.samples=2"]
    assert run_cli(monkeypatch, args) is None
    for k in (1, 2):
        rows = [json.loads(x) for x in (tmp_path / "sp" / f"stage_{k}" / "metrics.jsonl").read_text().splitlines()]
        grpo = [r for r in rows if r.get("phase") == "grpo" and not r.get("update_skipped")]
        assert grpo and all("selfplay/learnability" in r and 0 <= r["selfplay/learnability"] <= 1 for r in grpo)
    from hydra import compose, initialize_config_dir

    from jaxlake.conf import CONF_DIR
    from jaxlake.mixture import load_mixture

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=args)
    s = RunSettings.of(cfg)
    env1 = load_mixture(tmp_path / "sp" / "stage_1" / "env.yaml")
    assert selfplay_context(s, 2, None).stage == 1 and selfplay_context(s, 1, env1).stage == 0
    assert not LLMStudent().probe_settings(s, 2).train.train.engineer_selfplay.enabled


def test_a_run_builds_its_scripted_contexts_around_the_stages_environment():
    """``contexts: scripted`` in a run: the stage's pool holds its environment first and
    ``mixtures`` environments in all, its contexts read the run's held-out suite."""
    from hydra import compose, initialize_config_dir

    from jaxlake.conf import CONF_DIR
    from jaxlake.pipeline.selfplay import scripted_pool, selfplay_engineer
    from jaxlake.pipeline.settings import RunSettings

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=["env=tiny", "eval=tiny", "engineer=policy", "train.engineer_selfplay.enabled=true",
                                           "train.engineer_selfplay.contexts=scripted",
                                           "train.engineer_selfplay.mixtures=2"])
    s = RunSettings.of(cfg)
    pool = scripted_pool(s, 1, s.env, selfplay_engineer(s))
    assert len(pool.envs) == 2 and pool.envs[0].mixture == s.env and pool.suite.lakes is not None
    ctx, label = pool.context(0)
    assert ctx.summary and 0 < label["skill"] <= 1
