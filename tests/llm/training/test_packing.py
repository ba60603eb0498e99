"""Sequence packing of the warm start (llm/training/packing.py): the packed loss and gradient are the
padded ones, lake by lake; the layout; lakes that fit nowhere are left out and counted."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlake.config import LakeConfig
from llm.game.lakes import sample_lakes
from llm.game.prompter import Prompter
from llm.game.prompts import load_prompt_config
from llm.rl.batches import TokenBatch
from llm.rl.optim import make_optimizer
from llm.training import warmstart as ws
from llm.training.config import OptimConfig
from llm.training.packing import PackedBatch, pack_batch
from llm.training.policy import copy_state
from tests.support import small_policy

ENV = LakeConfig(height=4, width=4, num_agents=2, hole_density=0.2, max_steps=10, max_height=5, max_width=5,
                 max_agents=2)


@pytest.fixture(scope="module")
def setup():
    policy, tokenizer = small_policy()
    pcfg = load_prompt_config("planner")
    r = pcfg.reasoning
    lakes = sample_lakes(jax.random.PRNGKey(2), ENV, 6)
    prompter = Prompter.fit(tokenizer, pcfg, lakes, None, 16)
    ids, pmask = prompter.encode(lakes)
    tokens, mask, solved, _ = ws.plan_targets(lakes, tokenizer, 24 + r.thinking_tokens, r.thinking_tokens,
                                              style=r.warmstart_style, cell=pcfg.cell)
    assert solved.all()
    scale = ws.token_weights(tokens, mask, tokenizer, 3.0)  # the marks weighted: weights are not uniform
    return policy, tokenizer, ids, pmask, tokens, mask, scale


def test_the_layout_restarts_positions_and_weighs_only_completion_targets(setup):
    policy, tokenizer, ids, pmask, tokens, mask, scale = setup
    lengths = pmask.sum(1) + mask.sum(1)
    packed, dropped = pack_batch(ids, pmask, tokens, mask, scale, rows=4, length=int(lengths.max()) * 2,
                                 pad_id=tokenizer.pad_token_id)
    assert dropped == 0 and packed.segments.max() == 2  # two lakes a row
    np.testing.assert_allclose(packed.weights.sum(), 1.0, rtol=1e-6)
    # first fit decreasing: the longest lake opens row 0 at position 0
    i = int(np.argmax(lengths))
    n0, p0 = int(lengths[i]), int(pmask[i].sum())
    np.testing.assert_array_equal(packed.ids[0, :n0], np.concatenate([ids[i][pmask[i]], tokens[i][mask[i]]]))
    np.testing.assert_array_equal(packed.positions[0, :n0], np.arange(n0))
    assert (packed.segments[0, :n0] == 1).all()
    assert (packed.weights[0, : p0 - 1] == 0).all() and (packed.weights[0, p0 - 1: n0 - 1] > 0).all()
    assert packed.weights[0, n0 - 1] == 0  # the segment's last token predicts nothing
    np.testing.assert_array_equal(packed.targets[0, p0 - 1: n0 - 1], tokens[i][mask[i]])
    # where a second segment starts, positions restart
    starts = np.flatnonzero(np.diff(packed.segments[0]) == 1) + 1
    assert packed.positions[0, starts[0]] == 0
    # too little room: the lakes that fit nowhere are counted, the rest renormalised
    packed, dropped = pack_batch(ids, pmask, tokens, mask, scale, rows=1, length=int(lengths.max()),
                                 pad_id=tokenizer.pad_token_id)
    assert dropped == 5 and packed.segments.max() == 1
    np.testing.assert_allclose(packed.weights.sum(), 1.0, rtol=1e-6)


def test_the_packed_loss_and_gradient_are_the_padded_ones(setup):
    """Two layers, so a token that saw another segment would change the loss: the packed update's
    loss, token accuracy and new parameters equal the padded update's on the same lakes."""
    policy, tokenizer, ids, pmask, tokens, mask, scale = setup
    weights = (scale / scale.sum()).astype(np.float32)
    padded = jax.tree_util.tree_map(jnp.asarray, TokenBatch(prompt_ids=ids, prompt_mask=pmask, tokens=tokens,
                                                            mask=mask, weights=weights))
    lengths = pmask.sum(1) + mask.sum(1)
    packed, dropped = pack_batch(ids, pmask, tokens, mask, scale, rows=2, length=int(lengths.max()) * 3 + 5,
                                 pad_id=tokenizer.pad_token_id)
    assert dropped == 0 and packed.segments.max() == 3
    packed = jax.tree_util.tree_map(jnp.asarray, packed)
    opt = optax.sgd(1.0)  # new parameters = old - gradient: compares the gradients (Adam's first step is sign-like)
    s1 = copy_state(policy.state)
    a_state, _, a = ws.make_sft_update(policy.graphdef, opt)(s1, opt.init(s1), padded)
    s2 = copy_state(policy.state)
    b_state, _, b = ws.make_sft_update(policy.graphdef, opt, micro_batches=2)(s2, opt.init(s2), packed)
    np.testing.assert_allclose(float(b["nll"]), float(a["nll"]), rtol=1e-5)
    np.testing.assert_allclose(float(b["token_acc"]), float(a["token_acc"]), rtol=1e-5)
    np.testing.assert_allclose(float(b["grad_norm"]), float(a["grad_norm"]), rtol=1e-4)
    for x, y in zip(jax.tree_util.tree_leaves(a_state), jax.tree_util.tree_leaves(b_state)):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-5, atol=1e-7)


def test_the_warm_start_update_takes_only_its_two_batch_layouts(setup):
    from llm.rl.batches import GRPOBatch

    policy = setup[0]
    opt = make_optimizer(OptimConfig(lr=1e-2, warmup_steps=0), 5)
    with pytest.raises(TypeError, match="PackedBatch"):
        z = np.zeros((2, 3), np.int32)
        state = copy_state(policy.state)
        ws.make_sft_update(policy.graphdef, opt)(state, opt.init(state), GRPOBatch(z, z > 0, z, z > 0, z * 1.0, z[:, 0] * 1.0))
    assert PackedBatch(ids=np.zeros((3, 4)), positions=0, segments=0, targets=0, weights=0).rows == 3


def test_pack_rows_errors_name_the_field():
    from llm.training.config import WarmStartConfig

    with pytest.raises(ValueError, match="warmstart.pack_rows=40 must be at most batch_size=32"):
        WarmStartConfig(pack_rows=40)
    with pytest.raises(ValueError, match="divisible by micro_batches=2"):
        WarmStartConfig(pack_rows=3, micro_batches=2)
    with pytest.raises(ValueError, match="warmstart.pack_rows"):
        WarmStartConfig(pack_rows=-1)
    assert WarmStartConfig(pack_rows=16).pack_rows == 16
