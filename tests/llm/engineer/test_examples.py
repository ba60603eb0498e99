"""Engineer examples (llm/engineer/examples.py): the answer is written exactly as constrained
decoding writes it, the prompt exactly as the policy engineer builds it, and the rows put the
loss on the answer alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlake.config import LakeConfig, to_plain
from jaxlake.engineers import ConfigSpace, EditRules, edit_from_obj
from jaxlake.engineers.contexts import ContextPool
from jaxlake.engineers.edits import Edit
from jaxlake.mixture import Mixture
from jaxlake.suite import build_suite, load_eval_conf
from llm.engineer.examples import answer_text, check_answer, example_rows, make_examples
from llm.engineer.local import PolicyEngineer
from llm.engineer.prompt import chat_text
from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM

BASE = LakeConfig(height=4, width=4, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=12,
                  max_height=5, max_width=5, max_agents=3)
NODE = {"editable": ["height", "width", "num_agents", "hole_density", "conflict_density"],
        "values": {"height": [3, 4, 5], "width": [3, 4, 5], "hole_density": [0.0, 0.1, 0.2, 0.3],
                   "conflict_density": [0.0, 0.5, 1.0]}}
SPACE = ConfigSpace(BASE, editable=tuple(NODE["editable"]), values=NODE["values"], edits=EditRules())


@st.composite
def edits(draw):
    n = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 10_000)))
    configs = []
    while len(configs) < n:
        c = SPACE.sample(rng)
        if c not in configs:
            configs.append(c)
    current = Mixture.of([(1.0 / n, c) for c in configs])
    kind = draw(st.sampled_from(SPACE.edits.kinds(n)))
    if kind == "keep":
        return current, Edit("keep")
    if kind == "reweight":
        return current, Edit("reweight", weights=tuple(draw(st.sampled_from(SPACE.edits.weights)) for _ in range(n)))
    drop = (draw(st.integers(0, n - 1)),)
    if kind == "drop":
        return current, Edit("drop", drop=drop)
    k = draw(st.integers(1, SPACE.edits.max_add))
    add = tuple((draw(st.sampled_from(SPACE.edits.shares)), SPACE.sample(rng)) for _ in range(k))
    return current, Edit(kind, drop=drop if kind == "replace" else (), add=add)


@settings(max_examples=60, deadline=None)
@given(edits())
def test_constrained_decoding_writes_every_answer_back_and_it_reads_as_the_edit(case):
    current, edit = case
    text = answer_text(edit, SPACE)
    check_answer(text, SPACE, len(current))
    assert edit_from_obj(json.loads(text), current, BASE) == edit


def test_an_answer_constrained_decoding_cannot_write_is_refused():
    with pytest.raises(ValueError, match="cannot write the teacher's answer"):
        check_answer(answer_text(Edit("add", add=((0.3, BASE),)), SPACE), SPACE, 1)  # 0.3 is not an offered share
    with pytest.raises(ValueError, match="cannot write"):
        check_answer(answer_text(Edit("drop", drop=(0,)), SPACE), SPACE, 1)  # one component: nothing to drop


@pytest.fixture(scope="module")
def setup():
    tokenizer = to_hf_tokenizer(build_game_tokenizer())
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048)
    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))
    pool = ContextPool(build_suite(to_plain(load_eval_conf("tiny")), solve=True), SPACE, mixtures=2,
                       current_env_lakes=4, env_stats_lakes=4, k_failures=2, seed=1)
    return tokenizer, model, pool


def test_an_example_is_the_engineers_own_prompt_and_the_teachers_answer(setup):
    tokenizer, model, pool = setup
    engineer = PolicyEngineer(space=NODE)
    [ex] = make_examples(pool, engineer, model, tokenizer, [4])
    ctx, label = pool.context(4)
    assert ex["prompt"] == chat_text(tokenizer, *engineer.prompt_turns(ctx, model, tokenizer), False)
    assert ex["answer"] == answer_text(label["edit"], SPACE) and ex["read"] == label["read"]
    assert "on the training environment" in ex["prompt"] and ex["shows"]
    # a budget that cuts the summary away: the example says it does not show the line
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        [blind] = make_examples(pool, PolicyEngineer(space=NODE, max_prompt_tokens=300), model, tokenizer, [4])
    assert not blind["shows"] and "on the training environment" not in blind["prompt"]


def test_rows_put_the_loss_on_the_answer_and_its_end(setup):
    tokenizer, model, pool = setup
    exs = make_examples(pool, PolicyEngineer(space=NODE), model, tokenizer, [0, 1, 2])
    rows = example_rows(exs, tokenizer, 2048, 96)
    assert rows.prompt_ids.shape == (3, 2048) and rows.tokens.shape == (3, 96)
    for r, ex in enumerate(exs):
        p = tokenizer.encode(ex["prompt"], add_special_tokens=False)
        a = tokenizer.encode(ex["answer"], add_special_tokens=False) + [tokenizer.eos_token_id]
        assert rows.prompt_mask[r].sum() == len(p) and not rows.prompt_mask[r, : 2048 - len(p)].any()
        assert list(rows.prompt_ids[r, 2048 - len(p):]) == p
        assert rows.mask[r].sum() == len(a) and list(rows.tokens[r, : len(a)]) == a
    assert rows.weights.sum() == pytest.approx(1.0) and (rows.weights[~rows.mask] == 0).all()
    short = example_rows(exs[:1], tokenizer, 64, 96)  # a prompt longer than the room keeps its end
    assert list(short.prompt_ids[0]) == tokenizer.encode(exs[0]["prompt"], add_special_tokens=False)[-64:]


def test_a_reasoning_engineers_example_thinks_the_teachers_analysis_first(setup):
    from jaxlake.engineers.teacher import teacher_analysis

    tokenizer, model, pool = setup
    engineer = PolicyEngineer(space=NODE, reasoning={"enabled": True, "thinking_tokens": 96})
    [ex] = make_examples(pool, engineer, model, tokenizer, [4])
    ctx, label = pool.context(4)
    system, user = engineer.prompt_turns(ctx, model, tokenizer)
    assert ex["prompt"] == chat_text(tokenizer, system, user, True) + "<think>\n"  # as write_analysis opens it
    analysis, json_part = ex["answer"].split("\n</think>\n\n")
    assert analysis == teacher_analysis(label["read"]) and json_part == answer_text(label["edit"], SPACE)
    line = analysis.splitlines()[0]  # the summary's line, word for word: a copy of the prompt's
    assert line.startswith("on the training environment (") and f"\n{line}\n" in user
    assert f"success {label['read']['success']:.2f}" in line


def test_a_small_models_prompt_is_brief_and_shows_the_line_the_teacher_reads(setup):
    """An eight-component mixture: the full prompt does not fit a 2,048-token model beside a
    reasoning answer (the summary is cut before the line the teacher reads); the brief one
    (``prompt: auto`` below 8,192 tokens) keeps it."""
    tokenizer, model, _ = setup
    configs = [SPACE.snap(BASE.replace(height=h, width=w, num_agents=n))
               for h in (3, 5) for w in (3, 5) for n in (1, 2)]
    pool = ContextPool(build_suite(to_plain(load_eval_conf("tiny")), solve=True), SPACE,
                       mixtures=[Mixture.of([(1 / 8, c) for c in configs])], current_env_lakes=8, env_stats_lakes=4,
                       k_failures=4, seed=1)
    reasoning = {"enabled": True, "thinking_tokens": 256}
    auto = PolicyEngineer(space=NODE, reasoning=reasoning)
    assert auto.brief(model)
    [brief] = make_examples(pool, auto, model, tokenizer, [0])
    assert brief["shows"] and "## Current environment\n#0 weight 0.125: 3x3, 1 agent" in brief["prompt"]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        [full] = make_examples(pool, PolicyEngineer(space=NODE, reasoning=reasoning, prompt="full"), model, tokenizer, [0])
    assert not full["shows"]
    with pytest.raises(Exception, match="engineer.prompt"):
        PolicyEngineer(space=NODE, prompt="short")
