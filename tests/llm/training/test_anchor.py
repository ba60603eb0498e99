"""GRPO's supervised anchor (train.grpo.anchor; llm/rl/updates.py, llm/training/anchor.py): the
anchored update descends the GRPO loss plus the weighted NLL of reference completions, and each
step's anchor batch holds the reference planner's completions of fresh lakes of the warm-start
environment, written as the warm start writes them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlake.baselines import straight_blocked
from jaxlake.config import LakeConfig
from jaxlake.mixture import Mixture
from llm.game.lakes import sample_lakes
from llm.game.prompter import Prompter
from llm.game.prompts import load_prompt_config
from llm.rl.batches import GRPOBatch, TokenBatch
from llm.rl.grpo import GRPOLossConfig
from llm.rl.updates import make_grpo_update, token_nll
from llm.training import warmstart as ws
from llm.training.config import AnchorConfig, GRPOConfig, OptimConfig, TrainConfig, WarmStartConfig
from llm.training.anchor import anchor_batches as _anchor_batches
from llm.training.policy import copy_state
from tests.support import small_policy

STAGE_ENV = LakeConfig(height=3, width=3, num_agents=1, hole_density=0.0, max_steps=8, max_height=6, max_width=6,
                       max_agents=2)
ANCHOR_ENV = LakeConfig(height=6, width=6, num_agents=2, hole_density=0.2, max_steps=16, max_height=6,
                        max_width=6, max_agents=2)


#: Lakes per draw: the stage's GRPO rows and the prompter's fit draw GRPO_LAKES, every anchor
#: batch ANCHOR_LAKES (one lake generator compiled per environment and count).
GRPO_LAKES, ANCHOR_LAKES = 4, 6


@pytest.fixture(scope="module")
def setup():
    policy, tokenizer = small_policy()
    pcfg = load_prompt_config("planner")
    prompter = Prompter.fit(tokenizer, pcfg, sample_lakes(jax.random.PRNGKey(0), STAGE_ENV, GRPO_LAKES), None, 16)
    return policy, tokenizer, pcfg, prompter


def _batches(policy, prompter, lakes: int = ANCHOR_LAKES):
    r = prompter.config.reasoning
    length = 24 + r.thinking_tokens
    grpo_lakes = sample_lakes(jax.random.PRNGKey(3), STAGE_ENV, GRPO_LAKES)
    ids, pmask, tokens, mask, scale, solved = ws.reference_rows(grpo_lakes, policy.tokenizer, prompter, length,
                                                                r.thinking_tokens, 1.0)
    assert solved.all()
    adv = np.asarray([1.0, -0.5, 0.25, -0.75], np.float32)
    grpo_batch = GRPOBatch(prompt_ids=ids, prompt_mask=pmask, tokens=tokens, mask=mask,
                           weights=(mask / mask.sum()).astype(np.float32), advantages=adv)
    a_lakes = sample_lakes(jax.random.PRNGKey(4), ANCHOR_ENV, lakes)
    a_prompter = Prompter.fit(policy.tokenizer, prompter.config, a_lakes, None, 16)
    ids, pmask, tokens, mask, scale, _ = ws.reference_rows(a_lakes, policy.tokenizer, a_prompter, length,
                                                           r.thinking_tokens, 3.0)
    anchor = TokenBatch(prompt_ids=ids, prompt_mask=pmask, tokens=tokens, mask=mask,
                        weights=(scale / scale.sum()).astype(np.float32))
    to_jax = lambda b: jax.tree_util.tree_map(jnp.asarray, b)  # noqa: E731
    return to_jax(grpo_batch), to_jax(anchor)


def test_the_anchored_update_descends_the_grpo_loss_plus_the_weighted_nll(setup):
    """With plain SGD at rate 1 the new parameters are the old minus the gradient: the anchored
    update's step is the GRPO step plus ``weight`` times the supervised step on the anchor batch,
    and it reports the anchor's NLL (the warm start's loss on that batch) beside the GRPO loss."""
    policy, tokenizer, pcfg, prompter = setup
    grpo_batch, anchor = _batches(policy, prompter)
    opt = optax.sgd(1.0)
    weight = 0.5

    def run(update, *args):
        state = copy_state(policy.state)
        new, _, metrics = update(state, opt.init(state), *args)
        return [np.asarray(x) for x in jax.tree_util.tree_leaves(new)], jax.device_get(metrics)

    start = [np.asarray(x) for x in jax.tree_util.tree_leaves(policy.state)]
    plain, m_plain = run(make_grpo_update(policy.graphdef, opt, GRPOLossConfig()), grpo_batch)
    sft, m_sft = run(ws.make_sft_update(policy.graphdef, opt), anchor)
    anchored, m = run(make_grpo_update(policy.graphdef, opt, GRPOLossConfig(), anchor_weight=weight),
                      grpo_batch, None, anchor)
    for p0, p1, p2, p3 in zip(start, plain, sft, anchored):
        np.testing.assert_allclose(p3, p1 + weight * (p2 - p0), rtol=1e-4, atol=1e-6)
    assert not all(np.allclose(p3, p1) for p1, p3 in zip(plain, anchored))  # the anchor moved the weights
    # two micro-batches, each with half the GRPO rows and half the anchor's: the same step
    halves, m2 = run(make_grpo_update(policy.graphdef, opt, GRPOLossConfig(), anchor_weight=weight, micro_batches=2),
                     grpo_batch, None, anchor)
    for p3, p4 in zip(anchored, halves):
        np.testing.assert_allclose(p4, p3, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(m2["anchor_nll"], m["anchor_nll"], rtol=1e-5)
    np.testing.assert_allclose(m["anchor_nll"], m_sft["nll"], rtol=1e-5)
    np.testing.assert_allclose(m["anchor_token_acc"], m_sft["token_acc"], rtol=1e-5)
    np.testing.assert_allclose(m["loss"], m_plain["loss"], rtol=1e-5)  # `loss` stays the GRPO loss
    assert "anchor_nll" not in m_plain
    # weight 0: the anchor batch is ignored, the update is the plain one
    zero, m0 = run(make_grpo_update(policy.graphdef, opt, GRPOLossConfig(), anchor_weight=0.0),
                   grpo_batch, None, anchor)
    for p1, p0 in zip(plain, zero):
        np.testing.assert_allclose(p0, p1, rtol=1e-6, atol=1e-8)
    assert "anchor_nll" not in m0
    with pytest.raises(TypeError, match="TokenBatch"):
        make_grpo_update(policy.graphdef, opt, GRPOLossConfig(), anchor_weight=1.0)(
            copy_state(policy.state), opt.init(policy.state), grpo_batch, None, grpo_batch)


def test_one_pass_of_the_layers_gives_each_row_set_its_own_forward(setup):
    """joint_forward pads the two sets' prompts and completions to common widths, stacks them
    through one decoder pass and applies the head apart: each set's log-probs, entropies and
    arg-max matches are its own completion_forward's (first at the sampling temperature, second
    at 1), at its own widths."""
    from llm.rl.updates import completion_forward, joint_forward

    policy, tokenizer, pcfg, prompter = setup
    grpo_batch, anchor = _batches(policy, prompter)
    first = grpo_batch.sequences[:2] + (grpo_batch.tokens[:, :40], grpo_batch.mask[:, :40])  # a shorter completion
    (a, ea, ma), (b, eb, mb) = joint_forward(policy.graphdef, policy.state, first, anchor.sequences, entropy=True,
                                             temperature=0.7)
    a0, ea0, ma0 = completion_forward(policy.graphdef, policy.state, *first, entropy=True, temperature=0.7)
    b0, _, mb0 = completion_forward(policy.graphdef, policy.state, *anchor.sequences)
    assert first[0].shape[1] < anchor.prompt_ids.shape[1] and a.shape == (4, 40) and b.shape == anchor.tokens.shape
    np.testing.assert_allclose(np.asarray(a), np.asarray(a0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ea), np.asarray(ea0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(b), np.asarray(b0), rtol=1e-5, atol=1e-5)
    assert eb is None
    np.testing.assert_array_equal(np.asarray(ma), np.asarray(ma0))
    np.testing.assert_array_equal(np.asarray(mb), np.asarray(mb0))


def test_token_nll_is_the_weighted_negative_log_likelihood(setup):
    policy, tokenizer, pcfg, prompter = setup
    _, anchor = _batches(policy, prompter)
    from llm.rl.updates import completion_forward

    logp, _, _ = completion_forward(policy.graphdef, policy.state, *anchor.sequences)
    nll, m = token_nll(policy.graphdef, policy.state, anchor)
    np.testing.assert_allclose(float(nll), -float(np.sum(np.asarray(logp) * np.asarray(anchor.weights))), rtol=1e-6)
    assert 0.0 <= float(m["token_acc"]) <= 1.0


def test_each_step_anchors_on_fresh_warm_start_lakes_of_its_own_environment(setup):
    """The anchor's lakes come from the warm-start environment (6x6 lakes with two agents here,
    while the stage's prompter was fitted on 3x3 lakes with one), at the warm start's blocked
    share, in a prompt width of their own; a step's batch is the same when drawn again and
    another step's differs; the weights are the token mean with the marks weighed up."""
    policy, tokenizer, pcfg, prompter = setup
    wc = WarmStartConfig(blocked_share=1.0, mark_weight=3.0)
    config = TrainConfig(warmstart=wc, grpo=GRPOConfig(max_new_tokens=24, anchor=AnchorConfig(weight=1.0, lakes=5)),
                         prompt=pcfg)
    draw = _anchor_batches(policy, config, Mixture.of(ANCHOR_ENV), prompter, jax.random.PRNGKey(9), None)
    (b0, s0), (b0_again, _), (b1, _) = draw(0, policy), draw(0, policy), draw(1, policy)
    assert s0 is None  # no screening asked for
    assert b0.rows == 5 and b0.tokens.shape[1] == 24 + pcfg.reasoning.thinking_tokens
    assert b0.prompt_ids.shape[1] > prompter.length  # its own width: the 6x6 prompts are longer
    np.testing.assert_allclose(float(jnp.sum(b0.weights)), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(b0.tokens), np.asarray(b0_again.tokens))
    assert not np.array_equal(np.asarray(b0.tokens), np.asarray(b1.tokens))
    texts = tokenizer.batch_decode(np.asarray(b0.prompt_ids), skip_special_tokens=True)
    assert all("6 6" in t for t in texts)
    marks = np.asarray(b0.tokens) == tokenizer.convert_tokens_to_ids("~")
    w = np.asarray(b0.weights)
    assert marks.any() and np.allclose(w[marks], 3 * w[np.asarray(b0.mask) & ~marks].max())
    # the lakes are the warm start's own draw of that step
    key = jax.random.split(jax.random.PRNGKey(9))[1]
    lakes = ws.reference_lakes(jax.random.fold_in(key, 0), Mixture.of(ANCHOR_ENV), 5, wc)
    assert straight_blocked(lakes).all()
    ids, _ = Prompter.fit(tokenizer, pcfg, lakes, b0.prompt_ids.shape[1], 16).encode(lakes)
    np.testing.assert_array_equal(ids, np.asarray(b0.prompt_ids))


def test_anchor_config_errors_name_the_field():
    assert not AnchorConfig().enabled and AnchorConfig(weight=0.5).enabled
    cfg = TrainConfig.from_dict({"grpo": {"anchor": {"weight": 2, "lakes": 8}}})
    assert cfg.grpo.anchor == AnchorConfig(weight=2, lakes=8)
    with pytest.raises(ValueError, match=r"train\.grpo\.anchor\.weight=-1 not a number in \[0, 100\]"):
        TrainConfig.from_dict({"grpo": {"anchor": {"weight": -1}}})
    with pytest.raises(ValueError, match=r"train\.grpo\.anchor\.lakes=0 must be an integer >= 1"):
        TrainConfig.from_dict({"grpo": {"anchor": {"lakes": 0}}})
    with pytest.raises(ValueError, match=r"train\.grpo\.anchor\.lakes=6 must be divisible by micro_batches=4"):
        TrainConfig.from_dict({"grpo": {"micro_batches": 4, "anchor": {"weight": 1, "lakes": 6}}})
    assert TrainConfig.from_dict({"grpo": {"micro_batches": 4, "anchor": {"lakes": 6}}}).grpo.anchor.lakes == 6  # off
    with pytest.raises(ValueError, match="unknown.*rows"):
        TrainConfig.from_dict({"grpo": {"anchor": {"rows": 2}}})


def test_rows_of_far_wider_prompts_take_a_pass_of_their_own_with_the_same_step(setup):
    """An auxiliary batch whose rows are far wider than the GRPO rows (the engineer's 1,000-token
    prompts beside plan prompts: :func:`llm.rl.updates.apart`) goes through the layers in a
    pass of its own: the step equals the one-pass step (its prompts' extra padding masked)."""
    from llm.rl.updates import apart

    policy, tokenizer, pcfg, prompter = setup
    grpo_batch, anchor = _batches(policy, prompter)
    extra = 3 * (grpo_batch.prompt_ids.shape[1] + grpo_batch.tokens.shape[1])
    wide = anchor.replace(prompt_ids=jnp.pad(anchor.prompt_ids, ((0, 0), (extra, 0))),
                          prompt_mask=jnp.pad(anchor.prompt_mask, ((0, 0), (extra, 0))))
    assert apart(grpo_batch.sequences, wide.sequences) and not apart(grpo_batch.sequences, anchor.sequences)
    opt = optax.sgd(1.0)

    def run(aux):
        state = copy_state(policy.state)
        new, _, metrics = make_grpo_update(policy.graphdef, opt, GRPOLossConfig(), anchor_weight=0.5)(
            state, opt.init(state), grpo_batch, None, aux)
        return [np.asarray(x) for x in jax.tree_util.tree_leaves(new)], jax.device_get(metrics)

    (one, m1), (two, m2) = run(anchor), run(wide)
    for a, b in zip(one, two):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(m2["anchor_nll"], m1["anchor_nll"], rtol=1e-5)


def test_rows_of_one_prompt_run_it_once_with_the_same_logprobs_gradient_and_step(setup):
    """Auxiliary rows that all hold one prompt (the engineer self-play's answers to one context,
    ``TokenBatch(shared_prompt=True)``): :func:`llm.rl.updates.shared_prompt_forward` runs the
    prompt once into a cache and every completion after it. Its log-probs, arg-max matches and
    gradient equal the full rows' forward (the prompt's keys and values take the completions'
    gradient): the anchored update's SGD step, minus that gradient, is the same."""
    from llm.rl.updates import completion_forward, shared_prompt_forward
    from llm.training.policy import copy_state

    policy, tokenizer, pcfg, prompter = setup
    grpo_batch, anchor = _batches(policy, prompter)
    rows = 3
    one = anchor.replace(prompt_ids=jnp.broadcast_to(anchor.prompt_ids[:1], (rows,) + anchor.prompt_ids.shape[1:]),
                         prompt_mask=jnp.broadcast_to(anchor.prompt_mask[:1], (rows,) + anchor.prompt_mask.shape[1:]),
                         tokens=anchor.tokens[:rows], mask=anchor.mask[:rows],
                         weights=anchor.weights[:rows] / anchor.weights[:rows].sum())
    assert not bool(one.prompt_mask[0, 0]) and len(set(np.asarray(one.mask).sum(1).tolist())) > 1  # padded both ways
    a, _, ma = shared_prompt_forward(policy.graphdef, policy.state, *one.sequences)
    b, _, mb = completion_forward(policy.graphdef, policy.state, *one.sequences)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(ma), np.asarray(mb))
    opt = optax.sgd(1.0)  # a step of rate 1 is minus the gradient: equal steps, equal gradients

    def run(aux):
        state = copy_state(policy.state)
        new, _, metrics = make_grpo_update(policy.graphdef, opt, GRPOLossConfig(), anchor_weight=0.5)(
            state, opt.init(state), grpo_batch, None, aux)
        return [np.asarray(x) for x in jax.tree_util.tree_leaves(new)], jax.device_get(metrics)

    (full, m1), (shared, m2) = run(one), run(one.replace(shared_prompt=True))
    for x, y in zip(full, shared):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(m2["anchor_nll"], m1["anchor_nll"], rtol=1e-5)
