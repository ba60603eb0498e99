"""Sampling lowered from abstract shapes: what the step plan compiles without allocating.

Public API: :func:`lower_sampling` (the ``jax.stages.Lowered`` of the compiled sampling call
of :func:`llm.generation.decode.generate_ids`, or of its prefill or decode loop alone) and
:func:`abstract_core_args` (the ``ShapeDtypeStruct`` arguments it lowers them with). The step
plan (:mod:`llm.benchmark.step_plan`, ``python -m llm.memory --plan``) reads their memory
analyses.

Layout: this module imports :mod:`llm.generation.decode` (the jitted functions it lowers and
:func:`~llm.generation.decode.core_statics`, their static arguments) and nothing in
``llm.generation`` imports it. It does not sit beside the row-block sizing in
:mod:`llm.generation.row_blocks`: :mod:`llm.generation.decode` imports that module, so
these functions, which need decode's jitted functions, would make an import cycle there.
The row-block plumbing that :func:`~llm.generation.decode.generate_ids` runs on every call
(``core_statics``, ``_row_slice``, ``_auto_row_block``) stays in :mod:`llm.generation.decode`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from llm.generation.decode import (
    MAX_EOS_IDS,
    GenerationConfig,
    _decode_core,
    _generate_core,
    _prefill_core,
    core_statics,
)

__all__ = ["abstract_core_args", "lower_sampling"]


def abstract_core_args(state: Any, rows: int, prompt_len: int) -> tuple:
    """``ShapeDtypeStruct`` arguments of :func:`llm.generation.decode._generate_core` for
    ``rows`` prompts of ``prompt_len`` tokens (``state`` may itself be abstract): what the step
    plan compiles."""
    sds = jax.ShapeDtypeStruct
    return (state, sds((rows, prompt_len), jnp.int32), sds((rows, prompt_len), jnp.bool_),
            jax.eval_shape(lambda: jax.random.PRNGKey(0)), sds((), jnp.float32), sds((), jnp.float32),
            sds((MAX_EOS_IDS,), jnp.int32), sds((), jnp.int32), sds((rows,), jnp.int32))


def lower_sampling(graphdef: Any, state: Any, rows: int, prompt_len: int, config: GenerationConfig,
                   part: str = "call", unroll_layers: bool | None = None):
    """``jax.stages.Lowered`` of one compiled sampling function of
    :func:`llm.generation.decode.generate_ids` for ``rows`` prompts of ``prompt_len`` tokens,
    from abstract arguments (nothing allocated):
    ``part="call"`` the whole call (:func:`_generate_core`: what runs), ``"prefill"`` its
    prefill alone, ``"decode"`` its decode loop alone (from a filled cache; the cache is
    donated, as it is carried inside the whole call). The step plan (:mod:`llm.benchmark.step_plan`)
    reads their memory analyses. ``unroll_layers`` overrides the config's choice (the plan
    compiles depth cuts of a model whose full depth decides it)."""
    statics = core_statics(config, state)
    if unroll_layers is not None:
        statics["unroll_layers"] = bool(unroll_layers)
    args = abstract_core_args(state, rows, prompt_len)
    if part == "call":
        return _generate_core.lower(graphdef, *args, **statics)
    if part == "prefill":
        return _prefill_core.lower(graphdef, state, args[1], args[2], max_new_tokens=statics["max_new_tokens"],
                                   prefill_block=None, unroll_layers=statics["unroll_layers"])
    if part == "decode":
        logits, cache = jax.eval_shape(
            lambda st, i, m: _prefill_core(graphdef, st, i, m, max_new_tokens=statics["max_new_tokens"],
                                           unroll_layers=statics["unroll_layers"]), state, args[1], args[2])
        return _decode_core.lower(graphdef, state, cache, logits, args[2], *args[3:], **statics)
    raise ValueError(f"part={part!r} not in ('call', 'prefill', 'decode')")
