"""The embedded default model folder (llm/game/default.py): offline build, cache, atomicity, use."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np
import pytest

from llm.game import default
from llm.generation.decode import GenerationConfig
from llm.generation.text import generate
from llm.model.config import Qwen3Config


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache_a")
    return root, Path(default.default_model_dir(root))


@pytest.fixture(scope="module")
def loaded(built):
    root, _ = built
    return default.load_default(cache_dir=root)


def test_folder_is_a_complete_hf_folder(built):
    root, path = built
    assert path.parent == root and path.name.startswith("tiny-qwen3-")
    names = set(os.listdir(path))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names
    assert os.listdir(root) == [path.name]  # no staging folders left behind


def test_second_call_uses_the_cache(built, monkeypatch):
    root, path = built
    stamp = (path / "model.safetensors").stat().st_mtime_ns

    def boom(*a, **k):
        raise AssertionError("rebuilt a cached folder")

    monkeypatch.setattr(default, "build_default_folder", boom)
    assert default.default_model_dir(root) == str(path)
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp


def test_cache_root_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv(default.CACHE_ENV, str(tmp_path / "x"))
    assert default.cache_root() == tmp_path / "x"
    monkeypatch.delenv(default.CACHE_ENV)
    assert default.cache_root() == Path.home() / ".cache" / "jaxlake"


def test_broken_leftover_is_rebuilt_deterministically(built, tmp_path):
    _, good = built
    broken = tmp_path / good.name
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # an interrupted foreign write
    path = Path(default.default_model_dir(tmp_path))
    assert path == broken and default._is_complete(path)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (path / name).read_bytes() == (good / name).read_bytes(), name
    assert sorted(os.listdir(tmp_path)) == [good.name]


def test_loaded_model_matches_tiny_yaml(loaded):
    model, tok = loaded
    yaml_cfg = Qwen3Config.from_yaml(default.MODEL_CONF_DIR / "tiny.yaml")
    cfg = model.config
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "rope_theta", "tie_word_embeddings"):
        assert getattr(cfg, field) == getattr(yaml_cfg, field), field
    assert cfg.vocab_size == max(yaml_cfg.vocab_size, len(tok))
    assert cfg.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert cfg.pad_token_id == tok.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.chat_template and tok.padding_side == "left"


def test_transformers_reads_the_config(built):
    from transformers import AutoConfig, AutoTokenizer

    _, path = built
    hf_cfg = AutoConfig.from_pretrained(str(path), local_files_only=True)
    assert hf_cfg.model_type == "qwen3" and hf_cfg.eos_token_id == 2
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    assert tok.decode(tok.encode("A . . ~ b")) == "A . . ~ b"


def test_default_model_generates(loaded):
    model, tok = loaded
    prompt = tok.apply_chat_template([{"role": "user", "content": "A . . ~ b\n. B ~ a ."}], tokenize=False,
                                     add_generation_prompt=True)
    cfg = GenerationConfig(max_new_tokens=6, temperature=1.0, top_p=0.95)
    r = generate(model, tok, [prompt, "A: R"], cfg, key=jax.random.PRNGKey(0))
    assert r.tokens.shape == (2, 6) and len(r.texts) == 2
    assert all(isinstance(t, str) for t in r.texts)
    assert np.isfinite(np.asarray(r.logprobs)).all() and (np.asarray(r.logprobs) <= 0).all()
    assert ((np.asarray(r.tokens) >= 0) & (np.asarray(r.tokens) < model.config.vocab_size)).all()
