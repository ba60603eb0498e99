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

from llm.training.config import ModelConfig


@dataclasses.dataclass
class Policy:
    """A model split for jitted training: static ``graphdef`` and the parameter ``state``.

    ``owned``: nobody else holds ``state``'s arrays, so a training phase may take them as
    its starting state and donate them to its updates (:meth:`llm.training.phase.Checkpoints.start`)
    instead of copying them: :func:`llm.training.stage.train_stage` marks the policies it loads
    or a phase hands it. ``False`` (the default, e.g. a policy a caller passes in): the phase
    copies, and the caller's arrays stay valid.
    """

    graphdef: Any
    state: Any
    tokenizer: Any
    owned: bool = False

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


def _buffers(tree: Any) -> set:
    return {(s.device.id, s.data.unsafe_buffer_pointer())
            for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array) and not x.is_deleted()
            for s in x.addressable_shards}


def shares_buffers(a: Any, b: Any) -> bool:
    """Whether any device buffer of the arrays of ``a`` is also one of ``b``'s (donating one
    would delete the other's)."""
    return not _buffers(a).isdisjoint(_buffers(b))


def load_policy(model: Optional[ModelConfig] = None, init_from: Optional[str | os.PathLike] = None,
                seed: int = 0, mesh: Any = None) -> Policy:
    """The starting policy of a stage.

    * ``init_from``: a Hugging Face folder (has ``config.json``) or an orbax checkpoint
      directory of a previous stage (``llm.model.checkpoint`` format; the tokenizer then comes from
      ``model``);
    * else ``model.path``: a Hugging Face Qwen3 folder (model and tokenizer);
    * else the pretrained tiny policy shipped in the package that ``model.shipped`` names
      (``model.pretrained``, the default; :func:`llm.game.default.shipped_dir`), or the embedded default's fresh weights
      (``model.pretrained=false``: from scratch; ``llm.game.default.load_default()``), or fresh
      weights (``seed``) when ``model.architecture`` differs from the default's.

    ``model`` (default ``ModelConfig()``: the embedded model) is resolved from the ``model``
    group once, by the caller (:meth:`llm.training.config.ModelConfig.from_dict`). A Hugging Face
    load takes its ``dtype`` / ``param_dtype``. Raises ``FileNotFoundError`` when
    ``init_from`` does not exist.

    ``mesh``: Hugging Face folders and orbax checkpoints load straight into the FSDP layout
    on it (:mod:`llm.model.sharding`: each device reads only its blocks, none holds the whole model).
    """
    if model is None:
        model = ModelConfig()
    if not isinstance(model, ModelConfig):
        raise TypeError(f"load_policy takes a ModelConfig (llm.training.config.ModelConfig.from_dict of the model "
                        f"group), not {type(model).__name__}")
    if init_from is not None:
        init = Path(init_from)
        if not init.exists():
            raise FileNotFoundError(f"checkpoint {str(init)!r} does not exist")
        if (init / "config.json").is_file():
            from llm.model.hf_io import from_pretrained

            module, tokenizer = from_pretrained(init, **model.precision(), mesh=mesh)
            return Policy.from_model(module, tokenizer)
        from llm.model.checkpoint import restore_checkpoint

        restored = restore_checkpoint(init, mesh=mesh)
        return Policy.from_model(restored.model, model_tokenizer(model))
    if model.path:
        from llm.model.hf_io import from_pretrained

        module, tokenizer = from_pretrained(model.path, **model.precision(), mesh=mesh)
        return Policy.from_model(module, tokenizer)
    from llm.game import default as default_model
    from llm.model.qwen3 import Qwen3ForCausalLM

    source = start_source(model)
    if source == "fresh":
        # another architecture than the embedded default: fresh weights, the game tokenizer
        arch = model.fresh_architecture()
        base = default_model.default_config()
        tokenizer = model_tokenizer(model)
        config = dataclasses.replace(base, **{**arch, "vocab_size": max(int(arch.get("vocab_size", 0)), len(tokenizer))})
        return Policy.from_model(Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed)), tokenizer)
    if source == "shipped":
        # the default architecture: a pretrained tiny policy shipped in the package
        from llm.model.hf_io import from_pretrained

        module, tokenizer = from_pretrained(default_model.shipped_dir(model.shipped), **model.precision(), mesh=mesh)
    else:
        module, tokenizer = default_model.load_default()
    return Policy.from_model(module, tokenizer)


def start_source(model: ModelConfig) -> str:
    """Where :func:`load_policy` without ``init_from`` takes the weights: ``"path"``
    (``model.path``), ``"fresh"`` (an architecture other than the embedded default's: fresh
    weights), ``"shipped"`` (the pretrained tiny policy ``model.shipped`` of the package) or
    ``"default"`` (the embedded default's fresh weights, ``model.pretrained=false``)."""
    from llm.game import default as default_model

    if model.path:
        return "path"
    arch = model.fresh_architecture()
    base = default_model.default_config()  # the embedded default's architecture (conf/model/tiny.yaml)
    if any(getattr(base, k) != v for k, v in arch.items() if k != "vocab_size") or arch.get("vocab_size", 0) > base.vocab_size:
        return "fresh"
    return "shipped" if model.pretrained and default_model.shipped_dir(model.shipped) is not None else "default"


def model_tokenizer(model: ModelConfig):
    """The tokenizer of ``model`` (its ``path`` folder, else the embedded default's), without
    building a model."""
    from llm.game import default as default_model
    from llm.model.hf_io import load_tokenizer

    return load_tokenizer(model.path or default_model.default_model_dir())
