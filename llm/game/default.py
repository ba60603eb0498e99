"""The embedded default policy: a tiny Qwen3-shaped model and the game tokenizer, built offline.

:func:`default_model_dir` returns a cached Hugging Face folder (``config.json``,
``generation_config.json``, ``model.safetensors``, tokenizer files with chat template) holding

* the game tokenizer of :mod:`llm.game.tokenizer` (byte-level BPE, 1024 tokens), and
* a randomly initialised Qwen3 of ``conf/model/tiny.yaml`` (seed :data:`DEFAULT_SEED`),
  with ``eos_token_id = <|im_end|>`` and ``pad_token_id = <|endoftext|>``. When the YAML's
  ``vocab_size`` is smaller than the tokenizer, the tokenizer's size is used (an embedding
  row per token is required); a larger YAML value is kept (spare rows, as Qwen has).

The folder lives under ``$JAXLAKE_CACHE`` (default ``~/.cache/jaxlake``) in
``tiny-qwen3-<hash>``, the hash covering the model config, the seed and the tokenizer
version, so editing ``tiny.yaml`` yields a new folder instead of a stale one. It is created
atomically: written in full to a private staging folder next to it, then renamed into place;
if another process won the race, its folder is used and the staging folder discarded. Nothing
is downloaded. :func:`load_default` reads it back with the same code path as any checkpoint
(:func:`llm.model.hf_io.from_pretrained`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any
from jaxlake.conf import CONF_DIR

#: ``conf/model``: the model presets shipped in the package.
MODEL_CONF_DIR = CONF_DIR / "model"
#: Seed of the default model's random initialisation.
DEFAULT_SEED = 0
#: Bump when the folder layout or the way it is built changes.
#: 2: config.json has the top-level rope_theta, tokenizer_config.json the special tokens as
#: transformers 4.57 reads them (llm.model.hf_io.portable_tokenizer_config).
FORMAT_VERSION = 2
#: Environment variable overriding the cache root.
CACHE_ENV = "JAXLAKE_CACHE"


def cache_root() -> Path:
    """``$JAXLAKE_CACHE`` or ``~/.cache/jaxlake``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "jaxlake"


def default_config(tokenizer_size: int | None = None):
    """The tiny :class:`llm.model.config.Qwen3Config` from ``conf/model/tiny.yaml``, token ids set.

    Args:
      tokenizer_size: vocabulary size of the game tokenizer (default: its nominal size).
    """
    from llm.game import tokenizer as game_tokenizer
    from llm.model.config import Qwen3Config

    path = MODEL_CONF_DIR / "tiny.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"the tiny model config {str(path)!r} is missing (conf/model/tiny.yaml)")
    config = Qwen3Config.from_yaml(path)
    size = game_tokenizer.DEFAULT_VOCAB_SIZE if tokenizer_size is None else int(tokenizer_size)
    return dataclasses.replace(
        config,
        vocab_size=max(config.vocab_size, size),
        bos_token_id=None,
        eos_token_id=game_tokenizer.SPECIAL_TOKENS.index(game_tokenizer.IM_END),
        pad_token_id=game_tokenizer.SPECIAL_TOKENS.index(game_tokenizer.ENDOFTEXT),
    )


def preset_config(name: str, *, layers: int | None = None, **overrides: Any):
    """The :class:`llm.model.config.Qwen3Config` of a model preset: ``"tiny"`` is the embedded default
    (:func:`default_config`, token ids set), any other name a file of ``conf/model``.
    ``overrides`` replace config fields (``None`` values are skipped: "the preset's");
    ``layers`` replaces ``num_hidden_layers`` (quick looks at a deep model)."""
    from llm.model.config import Qwen3Config

    if name == "tiny":
        config = default_config()
    else:
        path = MODEL_CONF_DIR / f"{name}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in MODEL_CONF_DIR.glob("*.yaml"))
            raise ValueError(f"model preset {name!r} is not one of {known} (conf/model)")
        config = Qwen3Config.from_yaml(path)
    changes = {k: v for k, v in overrides.items() if v is not None}
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise ValueError(f"layers={layers!r} must be an integer >= 1")
        changes["num_hidden_layers"] = layers
    return dataclasses.replace(config, **changes) if changes else config


def _fingerprint(config, seed: int) -> str:
    from llm.game import tokenizer as game_tokenizer

    payload = json.dumps(
        {"format": FORMAT_VERSION, "tokenizer": game_tokenizer.TOKENIZER_VERSION,
         "vocab": game_tokenizer.DEFAULT_VOCAB_SIZE, "seed": seed, "config": config.to_dict()},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))


def build_default_folder(path: str | os.PathLike, seed: int = DEFAULT_SEED) -> Path:
    """Write the default model + tokenizer as a Hugging Face folder at ``path`` (overwrites).

    Deterministic: the same code and ``seed`` give the same weights and tokenizer.
    """
    from flax import nnx

    from llm.game import tokenizer as game_tokenizer
    from llm.model.hf_io import save_pretrained
    from llm.model.qwen3 import Qwen3ForCausalLM

    config = default_config()
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed))
    # save_pretrained writes atomically; the tokenizer files then come from the game
    # tokenizer's own writer (which names the portable PreTrainedTokenizerFast class).
    folder = save_pretrained(model, None, path)
    hf = game_tokenizer.save_game_tokenizer(folder)
    if len(hf) > config.vocab_size:
        raise ValueError(f"tokenizer has {len(hf)} tokens but vocab_size={config.vocab_size}")
    return folder


def default_model_dir(cache_dir: str | os.PathLike | None = None, seed: int = DEFAULT_SEED) -> str:
    """Path of the cached default model folder, building it (offline) on first use.

    Args:
      cache_dir: cache root (default :func:`cache_root`).
      seed: initialisation seed (each seed has its own folder).
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    target = root / f"tiny-qwen3-{_fingerprint(default_config(), seed)}"
    if _is_complete(target):
        return str(target)
    root.mkdir(parents=True, exist_ok=True)
    staging_parent = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name}.build-"))
    try:
        staged = build_default_folder(staging_parent / "model", seed=seed)
        try:
            os.rename(staged, target)
        except OSError:
            if not _is_complete(target):  # not a lost race: a broken leftover, replace it
                shutil.rmtree(target, ignore_errors=True)
                os.rename(staged, target)
    finally:
        shutil.rmtree(staging_parent, ignore_errors=True)
    return str(target)


#: The pretrained tiny policies shipped in the package, by name (``model.shipped``): Hugging Face
#: folders of the default architecture and tokenizer, each trained by ``python -m jaxlake.pretrain``
#: (its ``pretrain.json`` records the command, the settings and the suite curve).
#:
#: * ``novice`` -- the default start: a plan-only policy (``prompt=compact``, no think block)
#:   pretrained briefly, so that its suite score leaves room to learn and GRPO stages improve it;
#: * ``planner`` -- the expert: the reference planner imitated to its optimum with a traced
#:   think block (``prompt=planner``), the imitation ceiling of the tables (``start=planner``).
SHIPPED_DIRS = {name: Path(str(importlib.resources.files("llm.game") / name)) for name in ("novice", "planner")}
#: The expert planner's folder (``model.shipped=planner``).
PLANNER_DIR = SHIPPED_DIRS["planner"]
#: What a run without ``model.path`` starts from (``conf/start/novice.yaml``).
DEFAULT_SHIPPED = "novice"


def check_shipped(name: str) -> str:
    """``name`` if it names a shipped policy, else a ``ValueError`` naming the field."""
    if name not in SHIPPED_DIRS:
        raise ValueError(f"model.shipped={name!r} not in {sorted(SHIPPED_DIRS)}")
    return name


def shipped_dir(name: str = DEFAULT_SHIPPED) -> str | None:
    """The shipped policy ``name``'s folder (:data:`SHIPPED_DIRS`), or ``None`` when this
    installation lacks it (a checkout before its ``python -m jaxlake.pretrain pretrain.ship=true``)."""
    path = SHIPPED_DIRS[check_shipped(name)]
    return str(path) if _is_complete(path) else None


def shipped_fingerprint(name: str = DEFAULT_SHIPPED) -> str | None:
    """A shipped policy's identity: the first 16 hex digits of its weights' SHA-256, or
    ``None`` without it. A run records it, so a folder made from one policy is never resumed
    from another."""
    import hashlib

    if shipped_dir(name) is None:
        return None
    return hashlib.sha256((SHIPPED_DIRS[name] / "model.safetensors").read_bytes()).hexdigest()[:16]


def planner_dir() -> str | None:
    """The expert planner's folder (``shipped_dir("planner")``), or ``None``."""
    return shipped_dir("planner")


def planner_fingerprint() -> str | None:
    """The expert planner's fingerprint (``shipped_fingerprint("planner")``)."""
    return shipped_fingerprint("planner")


def load_default(*, dtype: str | None = None, cache_dir: str | os.PathLike | None = None,
                 seed: int = DEFAULT_SEED) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the embedded default, via :func:`llm.model.hf_io.from_pretrained`."""
    from llm.model.hf_io import from_pretrained

    path = default_model_dir(cache_dir, seed=seed)
    return from_pretrained(path, dtype=dtype) if dtype else from_pretrained(path)
