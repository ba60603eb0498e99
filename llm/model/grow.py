"""Deepening a trained Qwen3 without changing what it computes: block expansion.

:func:`expand_blocks` inserts new decoder layers into a model's stack, each a copy of the layer
before it with its two output projections (attention's ``o_proj`` and the MLP's ``down_proj``)
set to zero. A pre-norm layer adds its attention and MLP outputs to the residual stream, so a
layer whose output projections are zero passes the stream through unchanged: the deeper model's
logits are the original's, exactly, and training starts from the original's behaviour with the
added layers' capacity (Wu et al. 2024, *LLaMA Pro: progressive LLaMA with block expansion*).
The zeroed projections get gradients at once (their inputs are the copied layer's activations),
so the new layers start learning on the first step.

Layout of the expansion (:func:`expansion_plan`): the ``L`` layers are cut into ``added`` groups
of consecutive layers, as equal as whole layers allow, and each group is followed by one new
layer copied from the group's last. ``4 -> 8`` doubles every layer; ``4 -> 6`` adds a layer
after layers 2 and 4 (1-based).

Command line, a Hugging Face folder in, a deeper one out (tokenizer files copied)::

    python -m llm.model.grow llm/game/planner /tmp/planner_8 --layers 8
    python -m jaxlake.pretrain experiment=deep +model.path=/tmp/planner_8 ...   # then train it
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from llm.model.errors import ModelConfigError
from llm.model.hf_io import abstract_model
from llm.model.qwen3 import Qwen3ForCausalLM

#: The output projections of a decoder layer (paths in ``nnx.state(model)["layers"]``): zero in
#: an inserted layer, so the layer adds nothing to the residual stream.
OUTPUT_PROJECTIONS = (("self_attn", "o_proj", "kernel"), ("mlp", "down_proj", "kernel"))


def expansion_plan(num_layers: int, target: int) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """Where each layer of the expanded stack comes from.

    Returns ``(source, inserted)``, each of length ``target``: ``source[j]`` is the index of the
    original layer that layer ``j`` copies, ``inserted[j]`` whether ``j`` is a new layer (its
    output projections zeroed). The original layers keep their order; ``target - num_layers``
    new layers follow the ends of as many groups of consecutive layers, as equal as they can be.
    Raises :class:`ModelConfigError` unless ``num_layers < target <= 2 * num_layers``.
    """
    if not (isinstance(target, int) and num_layers < target <= 2 * num_layers):
        raise ModelConfigError(f"--layers={target} must be more than the model's {num_layers} layers and at most "
                               f"twice as many ({2 * num_layers}): each new layer follows an original one")
    added = target - num_layers
    ends = {round((g + 1) * num_layers / added) - 1 for g in range(added)}  # 0-based last layer of each group
    source, inserted = [], []
    for i in range(num_layers):
        source.append(i)
        inserted.append(False)
        if i in ends:
            source.append(i)
            inserted.append(True)
    assert len(source) == target, (num_layers, target, ends)
    return tuple(source), tuple(inserted)


def expand_blocks(model: Qwen3ForCausalLM, target: int) -> Qwen3ForCausalLM:
    """A new model of ``target`` layers computing the same function as ``model``
    (:func:`expansion_plan`; ``model`` is left as it was).

    Every stacked layer parameter ``[L, ...]`` becomes ``[target, ...]`` by gathering its
    source layers; the inserted layers' :data:`OUTPUT_PROJECTIONS` are zero. Embeddings, the
    final norm and the head are shared by value. The config differs only in
    ``num_hidden_layers``.
    """
    config = model.config
    source, inserted = expansion_plan(config.num_hidden_layers, target)
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    index = jnp.asarray(source)
    keep = jnp.asarray([not x for x in inserted])

    def grow(path: tuple, leaf: jnp.ndarray) -> jnp.ndarray:
        out = jnp.take(leaf, index, axis=0)
        if tuple(k.key for k in path) in OUTPUT_PROJECTIONS:
            out = out * keep.astype(out.dtype).reshape((-1,) + (1,) * (out.ndim - 1))
        return out

    pure["layers"] = jax.tree_util.tree_map_with_path(grow, pure["layers"])
    graphdef, state = nnx.split(abstract_model(dataclasses.replace(config, num_hidden_layers=target)))
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llm.model.grow",
        description="Deepen a Hugging Face Qwen3 folder by block expansion (new layers that start as the identity).")
    parser.add_argument("source", help="a Hugging Face Qwen3 folder (config.json, safetensors, tokenizer)")
    parser.add_argument("target", help="the folder to write (must not exist)")
    parser.add_argument("--layers", type=int, required=True, help="layers of the deeper model (more than the source's, "
                                                                  "at most twice as many)")
    args = parser.parse_args(argv)
    from pathlib import Path

    from llm.model.hf_io import CheckpointError, from_pretrained, save_pretrained

    if Path(args.target).exists():
        print(f"llm.model.grow: {args.target} exists; choose a new folder", file=sys.stderr)
        return 2
    try:
        model, tokenizer = from_pretrained(args.source)
        deeper = expand_blocks(model, args.layers)
    except (OSError, CheckpointError, ModelConfigError, ValueError) as err:
        print(f"llm.model.grow: {err}", file=sys.stderr)
        return 2
    save_pretrained(deeper, tokenizer, args.target)
    source, inserted = expansion_plan(model.config.num_hidden_layers, args.layers)
    print(f"{args.source}: {model.config.num_hidden_layers} layers -> {args.target}: {args.layers} layers "
          f"(new layers after original layers {[s + 1 for s, new in zip(source, inserted) if new]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
