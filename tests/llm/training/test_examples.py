"""llm.training.examples: completions played in the simulator, verdicts, and rates that match the rewards."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from jaxlake.text import parse_lake, parse_plan
from llm.training import examples as ex
from llm.game import rewards
from llm.game.default import load_default
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM
from llm.game.prompts import PromptConfig
from llm.training.policy import Policy

# Three hand-made lakes on one canvas (3 x 4, 2 agent slots, 6 steps): one rollout compile.
GRIDS = ("A . ~ a\n. . . .\nB . . b",   # A walks into the hole on its first R
         "A . . a\nB . . b\n. . . .",   # side by side, free corridors
         ". B . .\nA . . a\n. b . .")   # B crosses A's row
CAP = dict(max_height=3, max_width=4, max_agents=2, max_steps=6)


def stack(grids):
    lakes = [parse_lake(g, **CAP) for g in grids]
    return jax.tree.map(lambda *xs: np.stack(xs), *lakes)


LAKES = stack(GRIDS)
KEY = jax.random.key(0)


def test_verdicts_by_hand():
    texts = ["A: R R R\nB: R R R",          # A falls at step 2, B arrives
             "A: R R R\nB: R R",            # B stops one short: times out, A arrives
             "A: R R R\nB: S D D\nC: U"]    # B waits, then follows A through the centre; C is off format
    got = ex.play_texts(LAKES, texts, KEY)
    assert [e.completion for e in got] == texts
    assert ex.outcome_text(got[0]) == "A fell"
    assert ex.outcome_text(got[1]) == "B timed out"
    assert got[2].success and got[2].malformed and ex.outcome_text(got[2]) == "success; malformed"
    assert any("'C'" in r for r in got[2].reasons)
    assert not got[0].malformed and got[0].reasons == ()
    for e, text in zip(got, texts):  # the stored plan is the parsed text, padded to the capacity
        acts, _ = parse_plan(text, e.num_agents, 6)
        np.testing.assert_array_equal(e.plan[: e.num_agents], acts)
        assert e.trajectory.pos.shape == (6, 2, 2)


def test_cancelled_moves_are_counted():
    # both agents head for (1,1) at step 1 (vertex conflict), then nothing else moves
    lakes = stack([". B . .\nA . . a\n. b . ."])
    got = ex.play_texts(lakes, ["A: R\nB: D"], KEY)[0]
    assert int(got.outcome.vertex_conflicts.sum()) == 2
    assert ex.outcome_text(got) == "A B timed out; 2 moves cancelled"


def test_failure_rates_match_the_training_metrics():
    texts = ["A: R R R\nB: R R R", "A: R R R\nB: R R", "A: R R R\nB: S D D\nC: U", "nonsense",
             "A: R\nB: D", ""]
    lakes = stack([GRIDS[0], GRIDS[1], GRIDS[2], GRIDS[0], GRIDS[2], GRIDS[1]])
    mine = ex.failure_rates(ex.play_texts(lakes, texts, KEY))
    res = rewards.compute_rewards(lakes, texts, KEY, rewards.RewardConfig(), ref_soc=np.full(6, -1), horizon=6)
    theirs = rewards.reward_metrics(res)
    for k, v in mine.items():
        assert v == pytest.approx(theirs[k]), k
    assert mine["malformed_rate"] == pytest.approx(2 / 6)
    with pytest.raises(ValueError, match="at least one"):
        ex.failure_rates([])


def test_mismatched_lengths_are_errors():
    with pytest.raises(ValueError, match="2 texts for 3 lakes"):
        ex.play_texts(LAKES, ["", ""], KEY)
    with pytest.raises(ValueError, match="1 prompts for 3 texts"):
        ex.play_texts(LAKES, ["", "", ""], KEY, prompts=["x"])


def test_policy_examples_decode_and_play_what_the_policy_wrote():
    _, tokenizer = load_default()
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    policy = Policy.from_model(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), tokenizer)
    got = ex.policy_examples(policy, LAKES, KEY, prompt_config=PromptConfig(), max_new_tokens=6)
    assert len(got) == 3
    for e, grid in zip(got, GRIDS):
        assert grid in e.prompt  # the rendered lake is in the prompt the policy read
        acts, bad = parse_plan(e.completion, e.num_agents, 6)
        np.testing.assert_array_equal(e.plan[: e.num_agents], acts)
        assert e.malformed == bad
    again = ex.policy_examples(policy, LAKES, KEY, prompt_config=PromptConfig(), max_new_tokens=6)
    assert [e.completion for e in again] == [e.completion for e in got]  # greedy: deterministic


def test_a_reasoning_policy_thinks_and_its_answer_is_played():
    """With the planner prompt (reasoning on) the policy thinks first, as in training; the
    example keeps the whole completion and plays the answer after ``</think>``."""
    import dataclasses

    from llm.game.prompts import load_prompt_config
    from llm.generation.reasoning import strip_thinking

    _, tokenizer = load_default()
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    policy = Policy.from_model(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), tokenizer)
    planner = load_prompt_config("planner")
    prompt = dataclasses.replace(planner, reasoning=dataclasses.replace(planner.reasoning, thinking_tokens=4))
    got = ex.policy_examples(policy, LAKES, KEY, prompt_config=prompt, max_new_tokens=6)
    for e in got:
        assert "</think>" in e.completion  # a random model is closed at its 4-token budget
        acts, bad = parse_plan(strip_thinking(e.completion), e.num_agents, 6)
        np.testing.assert_array_equal(e.plan[: e.num_agents], acts)
        assert e.malformed == bad
