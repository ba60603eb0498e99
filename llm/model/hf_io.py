"""Hugging Face Qwen3 folders <-> :class:`llm.model.qwen3.Qwen3ForCausalLM`, offline and without torch.

A folder holds ``config.json``, the weights as ``model.safetensors`` or as shards listed in
``model.safetensors.index.json``, and (optionally) tokenizer files. Weights are read with the
``safetensors`` numpy API one tensor at a time, so peak memory is about the model plus one
stacked tensor. Tied checkpoints carry no ``lm_head.weight`` (one that is present anyway is
ignored).

Public entry points: :func:`from_pretrained`, :func:`save_pretrained`, :func:`check_pretrained`
(the same checks as a load, reading no tensor data); the pieces they are
built from (:func:`load_config`, :func:`load_model`, :func:`hf_tensor_shapes`,
:func:`model_to_hf_tensors`, :func:`portable_tokenizer_config`,
:func:`make_tokenizer_folder_portable`) are public too. What is written reads the same in
transformers 4.57 and 5 (``config.json`` carries both RoPE spellings, ``tokenizer_config.json``
the class name and special-token list both know).

Sharded (FSDP) layout: ``from_pretrained(..., mesh=mesh)`` builds every parameter with
``jax.make_array_from_callback`` in its :func:`llm.model.sharding.state_shardings` layout; each
device's callback reads only its own block of the tensor from the safetensors file
(``get_slice``), so no device, and no host buffer, ever holds the whole model.
:func:`save_pretrained` of a sharded model gathers one tensor at a time to the host
(:func:`llm.model.sharding.to_host`) and writes the same bytes as the unsharded model.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from llm.model import sharding as shd
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")

# Per-layer tensors: HF name suffix -> (path in ``model.layers`` state, transpose?).
_LAYER_TENSORS: dict[str, tuple[tuple[str, ...], bool]] = {
    "input_layernorm.weight": (("input_layernorm", "weight"), False),
    "post_attention_layernorm.weight": (("post_attention_layernorm", "weight"), False),
    "self_attn.q_proj.weight": (("self_attn", "q_proj", "kernel"), True),
    "self_attn.k_proj.weight": (("self_attn", "k_proj", "kernel"), True),
    "self_attn.v_proj.weight": (("self_attn", "v_proj", "kernel"), True),
    "self_attn.o_proj.weight": (("self_attn", "o_proj", "kernel"), True),
    "self_attn.q_norm.weight": (("self_attn", "q_norm", "weight"), False),
    "self_attn.k_norm.weight": (("self_attn", "k_norm", "weight"), False),
    "mlp.gate_proj.weight": (("mlp", "gate_proj", "kernel"), True),
    "mlp.up_proj.weight": (("mlp", "up_proj", "kernel"), True),
    "mlp.down_proj.weight": (("mlp", "down_proj", "kernel"), True),
}
# Global tensors: HF name -> (path in the model state, transpose?).
_GLOBAL_TENSORS: dict[str, tuple[tuple[str, ...], bool]] = {
    "model.embed_tokens.weight": (("embed_tokens", "embedding"), False),
    "model.norm.weight": (("norm", "weight"), False),
    "lm_head.weight": (("lm_head", "kernel"), True),
}


class CheckpointError(ValueError):
    """A checkpoint folder is readable but its contents do not fit the model, or one of its
    files is corrupt (the message names the file)."""


def _safe_open(path: Path) -> Any:
    """``safetensors.safe_open`` of one weights file; a truncated or corrupt file raises
    :class:`CheckpointError` naming it (safetensors' own error names no file)."""
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="np")
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - SafetensorError is not importable under one stable name
        raise CheckpointError(f"{str(path)!r} is not a valid safetensors file (truncated or corrupt?): {err}") from None


# --------------------------------------------------------------------------- shapes / names
def hf_tensor_shapes(config: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor name a transformers Qwen3 checkpoint of ``config`` holds, with its shape."""
    c = config
    h, hd = c.hidden_size, c.head_dim
    per_layer = {
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (c.num_attention_heads * hd, h),
        "self_attn.k_proj.weight": (c.num_key_value_heads * hd, h),
        "self_attn.v_proj.weight": (c.num_key_value_heads * hd, h),
        "self_attn.o_proj.weight": (h, c.num_attention_heads * hd),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
        "mlp.gate_proj.weight": (c.intermediate_size, h),
        "mlp.up_proj.weight": (c.intermediate_size, h),
        "mlp.down_proj.weight": (h, c.intermediate_size),
    }
    shapes = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(c.num_hidden_layers):
        for suffix, shape in per_layer.items():
            shapes[f"model.layers.{i}.{suffix}"] = shape
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    return shapes


# --------------------------------------------------------------------------- reading
def _require_dir(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"checkpoint folder {str(p)!r} does not exist")
    if not p.is_dir():
        raise NotADirectoryError(f"checkpoint path {str(p)!r} is not a folder")
    return p


def load_config(path: str | os.PathLike) -> Qwen3Config:
    """Read ``<path>/config.json`` into a :class:`Qwen3Config` (see ``Qwen3Config.from_hf_dict``)."""
    p = _require_dir(path) / CONFIG_FILE
    if not p.is_file():
        raise FileNotFoundError(f"missing {CONFIG_FILE} in checkpoint folder {str(p.parent)!r}")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{str(p)!r} is not valid JSON: {err}") from err
    return Qwen3Config.from_hf_dict(d)


def weight_files(path: str | os.PathLike) -> dict[str, Path]:
    """Map every tensor name to the safetensors file holding it (single file or index)."""
    root = _require_dir(path)
    index = root / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise CheckpointError(f"{str(index)!r} is not a valid safetensors index: {err!r}") from err
        files: dict[str, Path] = {}
        for name, fname in weight_map.items():
            f = root / fname
            if not f.is_file():
                raise FileNotFoundError(f"missing shard {fname!r} (listed in {INDEX_FILE}) in {str(root)!r}")
            files[name] = f
        return files
    single = root / WEIGHTS_FILE
    if not single.is_file():
        raise FileNotFoundError(f"missing {WEIGHTS_FILE} (or {INDEX_FILE}) in checkpoint folder {str(root)!r}")
    with _safe_open(single) as fh:
        return {name: single for name in fh.keys()}


class _TensorReader:
    """Reads named tensors lazily from a set of safetensors files (kept open)."""

    def __init__(self, files: Mapping[str, Path]):
        self._files = dict(files)
        self._handles = {f: _safe_open(f) for f in sorted(set(self._files.values()))}

    def names(self) -> set[str]:
        return set(self._files)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._files[name]].get_slice(name).get_shape())

    def get(self, name: str) -> np.ndarray:
        return self._handles[self._files[name]].get_tensor(name)

    def get_part(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The block ``tensor[index]`` read from the file without loading the rest."""
        return self._handles[self._files[name]].get_slice(name)[index]


def _check_tensors(config: Qwen3Config, reader: _TensorReader) -> None:
    expected = hf_tensor_shapes(config)
    present = reader.names()
    missing = sorted(set(expected) - present)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        hint = " (config.json says tie_word_embeddings=false)" if "lm_head.weight" in missing else ""
        raise CheckpointError(f"checkpoint lacks tensor(s) {missing[:5]}{more}{hint}")
    unexpected = sorted(present - set(expected) - {"lm_head.weight"})
    if unexpected:
        more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        warnings.warn(f"ignoring tensor(s) the Qwen3 model does not use: {unexpected[:5]}{more}", stacklevel=3)
    for name, shape in expected.items():
        got = reader.shape(name)
        if got != shape:
            raise CheckpointError(
                f"tensor {name!r} has shape {got} in the checkpoint but config.json implies {shape}"
            )


def _set_path(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def abstract_model(config: Qwen3Config) -> Qwen3ForCausalLM:
    """A model of ``config`` with shapes and dtypes but no arrays (``nnx.eval_shape``): the
    skeleton that loaded weights fill (``nnx.replace_by_pure_dict``)."""
    return nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)))


def _sharded_tensor(shape: tuple[int, ...], sharding: Any, dtype: Any, name: str | None, layer_name: str | None,
                    num_layers: int, transpose: bool, read: Callable[[str, tuple[slice, ...]], np.ndarray]) -> jax.Array:
    """One parameter built block by block: each device's callback reads only its block.

    ``name`` is a global tensor, ``layer_name`` (with ``{i}`` for the layer) a stacked one whose
    leading axis runs over ``num_layers`` layers; ``transpose`` says the file holds the
    ``[out, in]`` transpose of the ``[in, out]`` kernel.
    """

    def block(index: tuple[slice, ...]) -> np.ndarray:
        index = tuple(index) + (slice(None),) * (len(shape) - len(index))
        if layer_name is None:
            inner = index[::-1] if transpose else index
            arr = np.asarray(read(name, inner))
            return (arr.T if transpose else arr).astype(dtype, copy=False)
        rest = index[1:][::-1] if transpose else index[1:]
        parts = []
        for i in range(num_layers)[index[0]]:
            arr = np.asarray(read(layer_name.format(i=i), rest))
            parts.append((arr.T if transpose else arr).astype(dtype, copy=False))
        return np.stack(parts)

    return jax.make_array_from_callback(shape, sharding, block)


def _model_sharded(config: Qwen3Config, read: Callable[[str, tuple[slice, ...]], np.ndarray], mesh: Any) -> Qwen3ForCausalLM:
    dtype = np.dtype(config.jnp_param_dtype)
    graphdef, state = nnx.split(abstract_model(config))
    pure = nnx.to_pure_dict(state)
    shardings = shd.state_shardings(pure, mesh)

    def at(tree: dict, path: tuple[str, ...]) -> Any:
        for key in path:
            tree = tree[key]
        return tree

    out: dict = {}
    for name, (path, transpose) in _GLOBAL_TENSORS.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        _set_path(out, path, _sharded_tensor(tuple(at(pure, path).shape), at(shardings, path), dtype, name, None, 0,
                                             transpose, read))
    for suffix, (path, transpose) in _LAYER_TENSORS.items():
        full = ("layers",) + path
        _set_path(out, full, _sharded_tensor(tuple(at(pure, full).shape), at(shardings, full), dtype, None,
                                             "model.layers.{i}." + suffix, config.num_hidden_layers, transpose, read))
    nnx.replace_by_pure_dict(state, out)
    return nnx.merge(graphdef, state)


def model_from_hf_tensors(config: Qwen3Config, get: Callable[[str], np.ndarray], *, mesh: Any = None,
                          get_part: Callable[[str, tuple[slice, ...]], np.ndarray] | None = None) -> Qwen3ForCausalLM:
    """Build a model of ``config`` from HF-named tensors returned by ``get(name)``.

    Shapes are not checked here (see :func:`load_model`); tensors are cast to
    ``config.param_dtype``. No random initialisation happens.

    With ``mesh``, every parameter is created in its FSDP layout
    (:func:`llm.model.sharding.state_shardings`) block by block; ``get_part(name, index)`` reads one
    block of a tensor (default: ``get(name)[index]``, which reads the whole tensor first).
    """
    if mesh is not None:
        read = get_part if get_part is not None else (lambda name, index: np.asarray(get(name))[index])
        return _model_sharded(config, read, mesh)
    dtype = config.jnp_param_dtype
    graphdef, state = nnx.split(abstract_model(config))
    pure: dict = {}
    for name, (path, transpose) in _GLOBAL_TENSORS.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        arr = np.asarray(get(name))
        _set_path(pure, path, jnp.asarray((arr.T if transpose else arr).astype(dtype, copy=False)))
    for suffix, (path, transpose) in _LAYER_TENSORS.items():
        per_layer = []
        for i in range(config.num_hidden_layers):
            arr = np.asarray(get(f"model.layers.{i}.{suffix}"))
            per_layer.append((arr.T if transpose else arr).astype(dtype, copy=False))
        _set_path(pure, ("layers",) + path, jnp.asarray(np.stack(per_layer)))
        del per_layer
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)


def load_model(path: str | os.PathLike, *, dtype: str | None = None, param_dtype: str | None = None,
               mesh: Any = None) -> Qwen3ForCausalLM:
    """Load the model of a Hugging Face Qwen3 folder (no tokenizer).

    ``dtype`` (``"float32"`` / ``"bfloat16"``) sets the compute dtype and, unless
    ``param_dtype`` is given, the parameter dtype too; by default both follow the
    checkpoint's ``dtype`` in config.json (float16 and unknown become float32). ``mesh``: load
    straight into the FSDP layout on that mesh (each device reads only its blocks).
    """
    import dataclasses

    config = load_config(path)
    overrides = {}
    if dtype is not None:
        overrides.update(dtype=dtype, param_dtype=dtype)
    if param_dtype is not None:
        overrides["param_dtype"] = param_dtype
    if overrides:
        config = dataclasses.replace(config, **overrides)
    reader = _TensorReader(weight_files(path))
    _check_tensors(config, reader)
    return model_from_hf_tensors(config, reader.get, mesh=mesh, get_part=reader.get_part)


#: ``tokenizer_class`` that transformers 5 writes for a tokenizer without a model-specific class;
#: transformers 4.x knows it as ``PreTrainedTokenizerFast`` (the same ``tokenizer.json`` wrapper).
_V5_GENERIC_TOKENIZER = "TokenizersBackend"
_GENERIC_TOKENIZER = "PreTrainedTokenizerFast"


def portable_tokenizer_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A ``tokenizer_config.json`` mapping that transformers 4.57 and 5 both read the same way.

    transformers 5 writes the generic class as ``TokenizersBackend`` (4.x has no such class) and
    the extra special tokens as a list under ``extra_special_tokens`` (4.x reads that key as a
    mapping of named tokens and fails on a list). Both read ``PreTrainedTokenizerFast`` and the
    list under ``additional_special_tokens``, so those are written instead; a mapping under
    ``extra_special_tokens`` (named tokens, the form both read) is kept.
    """
    out = dict(cfg)
    if out.get("tokenizer_class") == _V5_GENERIC_TOKENIZER:
        out["tokenizer_class"] = _GENERIC_TOKENIZER
    extra = out.get("extra_special_tokens")
    if isinstance(extra, (list, tuple)):
        merged = list(out.get("additional_special_tokens") or [])
        merged += [t for t in extra if t not in merged]
        out["additional_special_tokens"] = merged
        del out["extra_special_tokens"]
    return out


def make_tokenizer_folder_portable(path: str | os.PathLike) -> None:
    """Rewrite ``<path>/tokenizer_config.json`` with :func:`portable_tokenizer_config` (if present)."""
    p = Path(path) / "tokenizer_config.json"
    if not p.is_file():
        return
    cfg = json.loads(p.read_text(encoding="utf-8"))
    new = portable_tokenizer_config(cfg)
    if new != cfg:
        p.write_text(json.dumps(new, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def load_tokenizer(path: str | os.PathLike) -> Any:
    """``transformers.AutoTokenizer`` from the folder's tokenizer files, offline.

    Under transformers 4.x a folder written by transformers 5 (this project's older exports:
    ``TokenizersBackend``, ``extra_special_tokens`` as a list) is read as
    :func:`portable_tokenizer_config` describes, without changing the folder.

    A folder is read once per process: later calls return the same instance (a stage loads
    its tokenizer for the policy, the evaluation and the engineer; each read takes about half a
    second). The cache key holds the folder's files' sizes and modification times, so a
    rewritten folder is read again. The instance is shared: treat it as read-only.
    """
    root = _require_dir(path)
    if not any((root / f).is_file() for f in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {str(root)!r}; "
            "pass tokenizer=False to load the model alone"
        )
    stamp = tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in sorted(root.iterdir()) if f.is_file())
    return _load_tokenizer_cached(str(root.resolve()), stamp)


@functools.lru_cache(maxsize=8)
def _load_tokenizer_cached(root: str, stamp: tuple) -> Any:
    """:func:`load_tokenizer`'s read; ``stamp`` (the folder's files, sizes and times) is only
    part of the cache key."""
    del stamp
    root = Path(root)
    import transformers
    from transformers import AutoTokenizer

    cfg_file = root / "tokenizer_config.json"
    if int(transformers.__version__.split(".")[0]) < 5 and cfg_file.is_file():
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        fixed = portable_tokenizer_config(cfg)
        if fixed != cfg:
            overrides = {k: fixed[k] for k in ("additional_special_tokens",) if k in fixed}
            if "extra_special_tokens" in cfg and "extra_special_tokens" not in fixed:
                overrides["extra_special_tokens"] = {}
            if cfg.get("tokenizer_class") == _V5_GENERIC_TOKENIZER:
                return transformers.PreTrainedTokenizerFast.from_pretrained(str(root), local_files_only=True,
                                                                           **overrides)
            return AutoTokenizer.from_pretrained(str(root), local_files_only=True, **overrides)
    return AutoTokenizer.from_pretrained(str(root), local_files_only=True)


def check_pretrained(path: str | os.PathLike, *, tokenizer: bool = True) -> Qwen3Config:
    """Check that :func:`from_pretrained` can load the folder, without loading it: ``config.json``
    is valid, every weights file is present and readable (each safetensors header is parsed and
    its length checked against the file's size, so a truncated shard is found) and holds the
    tensors ``config.json`` implies, and (``tokenizer``) tokenizer files are there. Reads no
    tensor data; raises ``FileNotFoundError`` / :class:`CheckpointError` naming the file."""
    config = load_config(path)
    _check_tensors(config, _TensorReader(weight_files(path)))
    if tokenizer and not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {str(path)!r}")
    return config


def from_pretrained(
    path: str | os.PathLike,
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    tokenizer: bool = True,
    mesh: Any = None,
) -> tuple[Qwen3ForCausalLM, Any]:
    """Load ``(model, tokenizer)`` from a Hugging Face Qwen3 folder, offline.

    ``dtype="bfloat16"`` loads in bf16 (see :func:`load_model`); ``tokenizer=False`` skips the
    tokenizer and returns ``None`` in its place; ``mesh`` loads into the FSDP layout on it.
    """
    model = load_model(path, dtype=dtype, param_dtype=param_dtype, mesh=mesh)
    if not tokenizer:
        return model, None
    tok = load_tokenizer(path)
    if len(tok) > model.config.vocab_size:
        raise CheckpointError(
            f"the tokenizer in {str(path)!r} has {len(tok)} tokens but the model's vocab_size is "
            f"{model.config.vocab_size}: token ids past the embedding would be invalid"
        )
    return model, tok


# --------------------------------------------------------------------------- writing
def model_to_hf_tensors(model: Qwen3ForCausalLM) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hf_name, array)`` for every tensor of the model, in transformers' layout.

    Arrays keep the parameter dtype (bfloat16 arrays are ``ml_dtypes.bfloat16``). A sharded
    parameter is gathered to the host one tensor (one layer's slice) at a time
    (:func:`llm.model.sharding.to_host`: works across processes too).
    """
    config = model.config
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))

    def at(path: tuple[str, ...]) -> Any:
        node = pure
        for key in path:
            node = node[key]
        return node

    for name, (path, transpose) in _GLOBAL_TENSORS.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        arr = shd.to_host(at(path))
        yield name, np.ascontiguousarray(arr.T if transpose else arr)
    for i in range(config.num_hidden_layers):
        for suffix, (path, transpose) in _LAYER_TENSORS.items():
            arr = shd.to_host(at(("layers",) + path)[i])
            yield f"model.layers.{i}.{suffix}", np.ascontiguousarray(arr.T if transpose else arr)


def _write_weights(tensors: Mapping[str, np.ndarray], folder: Path, max_shard_bytes: int | None) -> None:
    from safetensors.numpy import save_file

    meta = {"format": "pt"}
    names = list(tensors)
    if max_shard_bytes is None or sum(tensors[n].nbytes for n in names) <= max_shard_bytes:
        save_file(dict(tensors), str(folder / WEIGHTS_FILE), metadata=meta)
        return
    shards: list[list[str]] = [[]]
    size = 0
    for n in names:
        nbytes = tensors[n].nbytes
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(n)
        size += nbytes
    weight_map = {}
    for k, shard in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in shard}, str(folder / fname), metadata=meta)
        weight_map.update({n: fname for n in shard})
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _default_permissions(folder: Path) -> None:
    """Give ``folder`` (made 0700 by mkdtemp) and its files the usual umask permissions."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for f in folder.rglob("*"):
        os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~umask)


def _replace_dir(tmp: Path, target: Path) -> None:
    """Move the finished ``tmp`` folder to ``target``, replacing an old one only at the end."""
    if target.exists():
        if not target.is_dir():
            raise NotADirectoryError(f"{str(target)!r} exists and is not a folder")
        old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-"))
        os.rmdir(old)
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, target)


def save_pretrained(
    model: Qwen3ForCausalLM,
    tokenizer: Any,
    path: str | os.PathLike,
    *,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write ``model`` (and ``tokenizer`` unless None) as a Hugging Face Qwen3 folder.

    Writes ``config.json``, ``generation_config.json``, the weights (``model.safetensors``,
    or shards of at most ``max_shard_bytes`` plus ``model.safetensors.index.json``) and the
    tokenizer files (``tokenizer.save_pretrained``, then :func:`make_tokenizer_folder_portable`
    so that transformers 4.57 reads them too). Everything is written to a temporary
    sibling folder that is renamed into place at the end, so a failure leaves no
    half-written folder (and an existing folder at ``path`` is only replaced on success).
    Returns the folder path.
    """
    target = Path(path).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    try:
        config = model.config
        (tmp / CONFIG_FILE).write_text(json.dumps(config.to_hf_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        gen = {k: getattr(config, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        gen = {k: v for k, v in gen.items() if v is not None}
        gen["transformers_version"] = config.to_hf_dict()["transformers_version"]
        (tmp / GENERATION_CONFIG_FILE).write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        _write_weights(dict(model_to_hf_tensors(model)), tmp, max_shard_bytes)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
            make_tokenizer_folder_portable(tmp)
        _default_permissions(tmp)
        _replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
