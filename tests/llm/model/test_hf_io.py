"""Hugging Face folders: load what transformers writes, write what transformers loads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip(
    "torch", reason="the live PyTorch checks need the `torch` extra: pip install -e \".[dev,torch]\" (a CPU-only machine: README, Development)")
transformers = pytest.importorskip("transformers")

import llm  # noqa: E402
from llm.model.errors import ModelConfigError  # noqa: E402
from llm.model.hf_io import (  # noqa: E402
    INDEX_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    check_pretrained,
    hf_tensor_shapes,
    load_config,
    model_to_hf_tensors,
)

VOCAB = 61


def make_torch_model(seed: int, tied: bool):
    cfg = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=tied,
        # rope_parameters for transformers 5, rope_theta for 4.x (which ignores rope_parameters)
        rope_parameters={"rope_type": "default", "rope_theta": 2000.0}, rope_theta=2000.0,
        eos_token_id=1, bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.5 if name.endswith("norm.weight") else 0.15
            p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + scale * torch.randn_like(p))
    return model


def make_tokenizer(size: int = VOCAB):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(size - 2)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} <eos> {% endfor %}"
    return fast


def torch_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(np.asarray(ids), dtype=torch.long)).logits.float().numpy()


@nnx.jit
def forward(model, ids):
    return model(ids)[0]


IDS = np.random.RandomState(0).randint(0, VOCAB, (2, 8)).astype(np.int32)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Folders written by transformers: tied and untied fp32, plus a tokenizer in each."""
    tokenizer = make_tokenizer()
    out = {}
    for tied in (True, False):
        tm = make_torch_model(3 if tied else 4, tied)
        d = tmp_path_factory.mktemp(f"hf_{'tied' if tied else 'untied'}")
        tm.save_pretrained(d)
        tokenizer.save_pretrained(d)
        out[tied] = (d, tm)
    return out


def flat_params(model) -> dict:
    return {k: np.asarray(v) for k, v in model_to_hf_tensors(model)}


@pytest.mark.parametrize("tied", [True, False])
def test_load_transformers_folder_gives_same_weights_and_logits(hf_dirs, tied):
    d, tm = hf_dirs[tied]
    model, tokenizer = llm.from_pretrained(d)
    assert isinstance(model, llm.Qwen3ForCausalLM)
    assert model.config.tie_word_embeddings is tied and model.config.rope_theta == 2000.0
    assert (model.lm_head is None) is tied
    ours = flat_params(model)
    theirs = {k: v.numpy() for k, v in tm.state_dict().items() if not (tied and k == "lm_head.weight")}
    assert set(ours) == set(theirs) == set(hf_tensor_shapes(model.config))
    for k in theirs:
        np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)
    np.testing.assert_allclose(np.asarray(forward(model, jnp.asarray(IDS))), torch_logits(tm, IDS), atol=1e-4, rtol=0)
    assert tokenizer("w3 w5 w7")["input_ids"] == [5, 7, 9]
    assert tokenizer.eos_token_id == 1


@pytest.mark.parametrize("tied", [True, False])
def test_export_loads_in_transformers_with_same_logits(hf_dirs, tmp_path, tied):
    d, _ = hf_dirs[tied]
    model, tokenizer = llm.from_pretrained(d)
    out = llm.save_pretrained(model, tokenizer, tmp_path / "export")
    names = set(os.listdir(out))
    assert {"config.json", WEIGHTS_FILE, "tokenizer.json", "tokenizer_config.json"} <= names
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no temp folders left
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["rope_parameters"]["rope_theta"] == 2000.0
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(torch_logits(reloaded, IDS), np.asarray(forward(model, jnp.asarray(IDS))), atol=1e-4, rtol=0)
    tok2 = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tok2("w1 w2")["input_ids"] == tokenizer("w1 w2")["input_ids"]
    assert tok2.apply_chat_template([{"role": "user", "content": "w4"}], tokenize=False) == "w4 <eos> "


def test_safetensors_round_trip_is_bit_exact(hf_dirs, tmp_path):
    d, _ = hf_dirs[False]
    model, tokenizer = llm.from_pretrained(d)
    llm.save_pretrained(model, tokenizer, tmp_path / "a")
    again, _ = llm.from_pretrained(tmp_path / "a")
    assert again.config == model.config
    a, b = nnx.to_pure_dict(nnx.state(model)), nnx.to_pure_dict(nnx.state(again))
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_sharded_checkpoint_written_by_hand(hf_dirs, tmp_path):
    from safetensors.numpy import save_file

    src, tm = hf_dirs[False]
    sd = {k: v.numpy() for k, v in tm.state_dict().items()}
    names = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    d = tmp_path / "sharded"
    d.mkdir()
    for fname, keys in shards.items():
        save_file({k: sd[k] for k in keys}, str(d / fname), metadata={"format": "pt"})
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (d / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (d / "config.json").write_text((src / "config.json").read_text())
    model, tok = llm.from_pretrained(d, tokenizer=False)
    assert tok is None
    single, _ = llm.from_pretrained(src, tokenizer=False)
    for k, v in flat_params(single).items():
        np.testing.assert_array_equal(flat_params(model)[k], v, err_msg=k)


def test_save_sharded_loads_in_both(hf_dirs, tmp_path):
    d, tm = hf_dirs[True]
    model, _ = llm.from_pretrained(d, tokenizer=False)
    out = llm.save_pretrained(model, None, tmp_path / "shards", max_shard_bytes=20_000)
    index = json.loads((out / INDEX_FILE).read_text())
    files = set(index["weight_map"].values())
    assert len(files) >= 2 and not (out / WEIGHTS_FILE).exists()
    assert files == {n for n in os.listdir(out) if n.endswith(".safetensors")}
    again, _ = llm.from_pretrained(out, tokenizer=False)
    for k, v in flat_params(model).items():
        np.testing.assert_array_equal(flat_params(again)[k], v, err_msg=k)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(torch_logits(reloaded, IDS), torch_logits(tm, IDS), atol=1e-5, rtol=0)


def test_bfloat16_checkpoint_and_dtype_choice(hf_dirs, tmp_path):
    d, tm = hf_dirs[True]
    # fp32 folder loaded as bf16 on request
    m16, _ = llm.from_pretrained(d, dtype="bfloat16", tokenizer=False)
    assert m16.config.dtype == m16.config.param_dtype == "bfloat16"
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(m16)))
    # a bf16 folder written by transformers loads in bf16 by default, bit-exact
    tm16 = make_torch_model(3, True).to(torch.bfloat16)
    tm16.save_pretrained(tmp_path / "bf16")
    assert load_config(tmp_path / "bf16").param_dtype == "bfloat16"
    m, _ = llm.from_pretrained(tmp_path / "bf16", tokenizer=False)
    ours = flat_params(m)
    for k, v in tm16.state_dict().items():
        if k != "lm_head.weight":
            np.testing.assert_array_equal(ours[k].astype(np.float32), v.float().numpy(), err_msg=k)
    ref = torch_logits(tm, IDS)
    got = np.asarray(forward(m, jnp.asarray(IDS)))
    assert np.isfinite(got).all() and np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
    # and it exports as bf16 that transformers reads back
    out = llm.save_pretrained(m, None, tmp_path / "bf16_out")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype="auto")  # 5's default, 4.x's is fp32
    assert back.model.embed_tokens.weight.dtype == torch.bfloat16
    for k, v in tm16.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v, atol=0, rtol=0)


def test_old_style_config_with_top_level_rope_theta(hf_dirs, tmp_path):
    d, tm = hf_dirs[True]
    old = tmp_path / "old"
    old.mkdir()
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.pop("dtype")
    cfg.update(rope_theta=2000.0, torch_dtype="float32", transformers_version="4.51.0")
    (old / "config.json").write_text(json.dumps(cfg))
    os.link(d / WEIGHTS_FILE, old / WEIGHTS_FILE)
    model, _ = llm.from_pretrained(old, tokenizer=False)
    assert model.config.rope_theta == 2000.0
    np.testing.assert_allclose(np.asarray(forward(model, jnp.asarray(IDS))), torch_logits(tm, IDS), atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- errors
def copy_folder(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for n in os.listdir(src):
        (dst / n).write_bytes((src / n).read_bytes())
    return dst


def test_missing_files_are_named(hf_dirs, tmp_path):
    d, _ = hf_dirs[True]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        llm.from_pretrained(tmp_path / "nope")
    c = copy_folder(d, tmp_path / "noconfig")
    (c / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        llm.from_pretrained(c)
    w = copy_folder(d, tmp_path / "noweights")
    (w / WEIGHTS_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        llm.from_pretrained(w)
    t = copy_folder(d, tmp_path / "notok")
    for n in ("tokenizer.json", "tokenizer_config.json"):
        (t / n).unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        llm.from_pretrained(t)
    s = copy_folder(d, tmp_path / "noshard")
    (s / WEIGHTS_FILE).rename(s / "model-00001-of-00002.safetensors")
    (s / INDEX_FILE).write_text(json.dumps({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        llm.from_pretrained(s)


def test_a_truncated_or_corrupt_shard_is_named(hf_dirs, tmp_path):
    """safetensors' own error names no file; the load (and check_pretrained, which reads no
    tensor data) name the shard."""
    d, _ = hf_dirs[True]
    assert check_pretrained(d) == load_config(d)
    for name, damage in (("cut", lambda b: b[: len(b) // 2]), ("garbage", lambda b: b"{" * 64)):
        c = copy_folder(d, tmp_path / name)
        f = c / WEIGHTS_FILE
        f.write_bytes(damage(f.read_bytes()))
        for load in (check_pretrained, llm.from_pretrained):
            with pytest.raises(CheckpointError, match=f"'{f}' is not a valid safetensors file"):
                load(c)


def test_unsupported_architecture_is_named(hf_dirs, tmp_path):
    d, _ = hf_dirs[True]
    c = copy_folder(d, tmp_path / "llama")
    cfg = json.loads((c / "config.json").read_text())
    cfg.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (c / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="LlamaForCausalLM.*Qwen3ForCausalLM"):
        llm.from_pretrained(c)


def test_shape_mismatch_names_tensor_and_shapes(hf_dirs, tmp_path):
    d, _ = hf_dirs[True]
    c = copy_folder(d, tmp_path / "bad")
    cfg = json.loads((c / "config.json").read_text())
    cfg["intermediate_size"] = 40
    (c / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.gate_proj\.weight'.*\(48, 32\).*\(40, 32\)"):
        llm.from_pretrained(c)


def test_untied_config_without_lm_head_is_an_error(hf_dirs, tmp_path):
    d, _ = hf_dirs[True]
    c = copy_folder(d, tmp_path / "nohead")
    cfg = json.loads((c / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (c / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        llm.from_pretrained(c)


class ExplodingTokenizer:
    def save_pretrained(self, path):
        (Path(path) / "tokenizer.json").write_text("{")
        raise OSError("disk full")


def test_failed_save_leaves_nothing_and_keeps_old_folder(hf_dirs, tmp_path):
    d, _ = hf_dirs[True]
    model, tokenizer = llm.from_pretrained(d)
    with pytest.raises(OSError, match="disk full"):
        llm.save_pretrained(model, ExplodingTokenizer(), tmp_path / "new")
    assert os.listdir(tmp_path) == []
    old = llm.save_pretrained(model, tokenizer, tmp_path / "old")
    before = sorted(os.listdir(old))
    with pytest.raises(OSError, match="disk full"):
        llm.save_pretrained(model, ExplodingTokenizer(), old)
    assert sorted(os.listdir(tmp_path)) == ["old"] and sorted(os.listdir(old)) == before
    # overwriting succeeds and leaves no temp or backup folders
    llm.save_pretrained(model, None, old)
    assert sorted(os.listdir(tmp_path)) == ["old"]
    assert "tokenizer.json" not in os.listdir(old)


def test_tokenizer_larger_than_vocab_is_an_error(hf_dirs, tmp_path):
    d, _ = hf_dirs[True]
    c = copy_folder(d, tmp_path / "bigtok")
    make_tokenizer(VOCAB + 5).save_pretrained(c)
    with pytest.raises(CheckpointError, match=f"{VOCAB + 5} tokens.*vocab_size is {VOCAB}"):
        llm.from_pretrained(c)


def test_unexpected_tensors_warn(hf_dirs, tmp_path):
    from safetensors.numpy import load_file, save_file

    d, _ = hf_dirs[True]
    c = copy_folder(d, tmp_path / "extra")
    tensors = load_file(str(c / WEIGHTS_FILE))
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    save_file(tensors, str(c / WEIGHTS_FILE), metadata={"format": "pt"})
    with pytest.warns(UserWarning, match=r"q_proj\.bias"):
        llm.from_pretrained(c, tokenizer=False)


def test_a_tokenizer_folder_is_read_once_until_it_changes(tmp_path):
    import shutil

    from llm.game.default import default_model_dir
    from llm.model.hf_io import load_tokenizer

    folder = tmp_path / "tok"
    shutil.copytree(default_model_dir(), folder)
    first = load_tokenizer(folder)
    assert load_tokenizer(folder) is first and load_tokenizer(str(folder) + "/") is first
    cfg = folder / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    data["model_max_length"] = 77
    cfg.write_text(json.dumps(data))  # a rewritten folder is read again
    again = load_tokenizer(folder)
    assert again is not first and again.model_max_length == 77 and len(again) == len(first)
