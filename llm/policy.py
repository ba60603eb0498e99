"""The policy being trained: a Qwen3 model split into a static graph and its parameters.

:class:`Policy` holds ``graphdef`` (static under ``jit``), ``state`` (the parameter pytree
the updates take and return) and the tokenizer; :func:`load_policy` builds a stage's starting
policy from a Hugging Face folder, an orbax checkpoint of a previous stage or the embedded
default model.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlake.config import cfg_get


@dataclasses.dataclass
class Policy:
    """A model split for jitted training: static ``graphdef`` and the parameter ``state``."""

    graphdef: Any
    state: Any
    tokenizer: Any

    @classmethod
    def from_model(cls, model: nnx.Module, tokenizer: Any) -> "Policy":
        graphdef, state = nnx.split(model)
        kinds = {type(v).__name__ for v in jax.tree_util.tree_leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))}
        if kinds - {"Param"}:
            raise ValueError(f"the model holds non-parameter variables {sorted(kinds - {'Param'})}; "
                             "the trainer expects parameters only")
        return cls(graphdef, state, tokenizer)

    def module(self) -> nnx.Module:
        return nnx.merge(self.graphdef, self.state)

    @property
    def config(self):
        return self.module().config



def copy_state(tree: Any) -> Any:
    """Fresh device buffers for every leaf (safe to donate)."""
    return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tree)


def load_policy(model_cfg: Any, init_from: Optional[str | os.PathLike] = None, seed: int = 0) -> Policy:
    """The starting policy of a stage.

    * ``init_from``: a Hugging Face folder (has ``config.json``) or an orbax checkpoint
      directory of a previous stage (``llm.checkpoint`` format; the tokenizer then comes from
      ``model_cfg``);
    * else ``model_cfg.path``: a Hugging Face Qwen3 folder (model and tokenizer);
    * else the embedded default (``llm.default.load_default()``).

    Raises ``FileNotFoundError`` when ``init_from`` does not exist.
    """
    tokenizer = None
    path = cfg_get(model_cfg, "path")
    if init_from is not None:
        init = Path(init_from)
        if not init.exists():
            raise FileNotFoundError(f"checkpoint {str(init)!r} does not exist")
        if (init / "config.json").is_file():
            from llm.hf_io import from_pretrained

            model, tokenizer = from_pretrained(init, **_precision(model_cfg))
            return Policy.from_model(model, tokenizer)
        from llm.checkpoint import restore_checkpoint

        restored = restore_checkpoint(init)
        return Policy.from_model(restored.model, _tokenizer_for(model_cfg))
    if path:
        from llm.hf_io import from_pretrained

        model, tokenizer = from_pretrained(path, **_precision(model_cfg))
        return Policy.from_model(model, tokenizer)
    from llm import default as default_model
    from llm.model import Qwen3Config, Qwen3ForCausalLM

    model, tokenizer = default_model.load_default()
    arch = {f.name: cfg_get(model_cfg, f.name) for f in dataclasses.fields(Qwen3Config)}
    arch = {k: v for k, v in arch.items() if v is not None and k not in ("bos_token_id", "eos_token_id", "pad_token_id")}
    base = model.config
    if any(getattr(base, k) != v for k, v in arch.items() if k != "vocab_size") or arch.get("vocab_size", 0) > base.vocab_size:
        # another architecture than the embedded default: fresh weights, the game tokenizer
        config = dataclasses.replace(base, **{**arch, "vocab_size": max(int(arch.get("vocab_size", 0)), len(tokenizer))})
        model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed))
    return Policy.from_model(model, tokenizer)


def _precision(model_cfg: Any) -> dict[str, str]:
    """``dtype`` / ``param_dtype`` overrides of a Hugging Face load from the model config.

    ``dtype`` is the compute dtype, ``param_dtype`` the storage (master) dtype of the
    parameters, which the AdamW moments follow: the ``qwen3_*`` presets train bfloat16
    compute on float32 master weights and moments (12 bytes per parameter of state, see the
    README's Precision section); unset fields follow the checkpoint's ``config.json``.
    """
    out = {k: cfg_get(model_cfg, k) for k in ("dtype", "param_dtype")}
    return {k: str(v) for k, v in out.items() if v}


def _tokenizer_for(model_cfg: Any):
    """The tokenizer of ``model_cfg`` (its ``path`` folder, else the embedded default's),
    without building a model."""
    from llm import default as default_model
    from llm.hf_io import load_tokenizer

    return load_tokenizer(cfg_get(model_cfg, "path") or default_model.default_model_dir())
