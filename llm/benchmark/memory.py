"""XLA's memory analysis compiled from abstract shapes (no accelerator): ``python -m llm.memory``.

**One update** (``python -m llm.memory --preset qwen3_4b --rows 16 --prompt 256 --completion
1024``): the jitted update of :func:`llm.rl.updates.make_grpo_update` for a model preset
(``conf/model/<preset>.yaml``) and one micro-batch, and XLA's ``memory_analysis()``:
arguments (parameters, optimizer state, batch), outputs and temporaries (activations,
gradients, logits).

**The whole step** (``python -m llm.memory --plan ...``): :mod:`llm.benchmark.step_plan`, every
phase of one GRPO step of a run, with a verdict per accelerator.

Compiling a 4B-shaped graph for the CPU takes seconds at a 2-3 layer cut and minutes at full
depth; nothing runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Bytes of one compiled update (``memory_analysis()`` fields) and the setting."""

    preset: str
    rows: int
    prompt: int
    completion: int
    param_dtype: str
    dtype: str
    logprob_chunk: Optional[int]
    remat: str
    attention_impl: str
    anchor_rows: int
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    compile_s: float

    def row(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for k in ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes"):
            out[k.replace("_bytes", "_gib")] = round(out.pop(k) / GIB, 2)
        out["compile_s"] = round(self.compile_s, 1)
        return out


def abstract_update_args(model_config, optimizer, rows: int, prompt: int, completion: int, beta: float = 0.0,
                         anchor_rows: int = 0):
    """``(graphdef, state, opt_state, batch, anchor)`` with ``ShapeDtypeStruct`` leaves (nothing
    allocated); ``anchor`` is ``None`` unless ``anchor_rows > 0``."""
    from flax import nnx

    from llm.model.qwen3 import Qwen3ForCausalLM
    from llm.rl.batches import GRPOBatch, TokenBatch

    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(model_config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    opt_state = jax.eval_shape(optimizer.init, state)
    sds = jax.ShapeDtypeStruct
    batch = GRPOBatch(
        prompt_ids=sds((rows, prompt), jnp.int32),
        prompt_mask=sds((rows, prompt), jnp.bool_),
        tokens=sds((rows, completion), jnp.int32),
        mask=sds((rows, completion), jnp.bool_),
        weights=sds((rows, completion), jnp.float32),
        advantages=sds((rows,), jnp.float32),
        old_logp=sds((rows, completion), jnp.float32),
        ref_logp=sds((rows, completion), jnp.float32) if beta > 0 else None,
    )
    anchor = None
    if anchor_rows:
        anchor = TokenBatch(prompt_ids=sds((anchor_rows, prompt), jnp.int32),
                            prompt_mask=sds((anchor_rows, prompt), jnp.bool_),
                            tokens=sds((anchor_rows, completion), jnp.int32),
                            mask=sds((anchor_rows, completion), jnp.bool_),
                            weights=sds((anchor_rows, completion), jnp.float32))
    return graphdef, state, opt_state, batch, anchor


def analyse_update(
    preset: str = "qwen3_4b",
    rows: int = 16,
    prompt: int = 256,
    completion: int = 1024,
    *,
    param_dtype: Optional[str] = None,
    dtype: Optional[str] = None,
    logprob_chunk: Optional[int] = 0,
    compute_entropy: bool = True,
    remat: str = "full",
    overrides: Optional[dict[str, Any]] = None,
    anchor_rows: int = 0,
) -> MemoryReport:
    """Compile the GRPO update of ``preset`` for one micro-batch and read its memory analysis.

    Args:
      preset: a file name of ``conf/model`` (without ``.yaml``).
      rows / prompt / completion: the batch: ``rows`` completions of ``completion`` tokens
        after ``prompt`` prompt tokens, all in one micro-batch.
      param_dtype / dtype: override the preset's parameter (master) and compute dtypes.
      logprob_chunk: sequence chunk of the completion log-probs (:mod:`llm.model.logprobs`);
        ``None`` is the full-vocabulary path (``[B, T, V]`` float32 logits), ``0`` the
        trainer's default.
      remat: per-layer rematerialisation (:data:`llm.model.config.REMAT_POLICIES`).
      overrides: further :class:`llm.model.config.Qwen3Config` fields (e.g. a smaller
        ``num_hidden_layers`` for a quick look).
      anchor_rows: > 0: the update with the supervised anchor (``train.grpo.anchor``), a
        :class:`llm.rl.batches.TokenBatch` of that many rows of the same prompt and completion
        widths, through the same pass of the layers as the GRPO rows
        (:func:`llm.rl.updates.joint_forward`).
    """
    from llm.rl.grpo import GRPOLossConfig
    from llm.game.default import preset_config
    from llm.rl.optim import make_optimizer
    from llm.training.config import OptimConfig
    from llm.rl.updates import make_grpo_update

    config = preset_config(preset, param_dtype=param_dtype, dtype=dtype, **(overrides or {}))
    optimizer = make_optimizer(OptimConfig(lr=1e-6), 100)
    graphdef, state, opt_state, batch, anchor = abstract_update_args(config, optimizer, rows, prompt, completion,
                                                                     anchor_rows=anchor_rows)
    from llm.model.logprobs import DEFAULT_CHUNK

    chunk = DEFAULT_CHUNK if logprob_chunk == 0 else logprob_chunk
    update = make_grpo_update(graphdef, optimizer, GRPOLossConfig(), micro_batches=1,
                              compute_entropy=compute_entropy, logprob_chunk=chunk, remat=remat,
                              anchor_weight=1.0 if anchor_rows else 0.0)
    extra = () if anchor is None else (None, anchor)
    t0 = time.perf_counter()
    compiled = update.lower(state, opt_state, batch, *extra).compile()
    seconds = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    return MemoryReport(
        preset=preset, rows=rows, prompt=prompt, completion=completion, param_dtype=config.param_dtype,
        dtype=config.dtype, logprob_chunk=chunk, remat=remat, attention_impl=config.attention_impl,
        anchor_rows=int(anchor_rows), argument_bytes=int(mem.argument_size_in_bytes),
        output_bytes=int(mem.output_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
        alias_bytes=int(mem.alias_size_in_bytes), compile_s=seconds,
    )



def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m llm.memory", description=__doc__.split("\n\n")[0],
                                     epilog="--plan [options] <Hydra overrides>: the memory plan of a whole GRPO "
                                            "step (python -m llm.memory --plan --help)")
    parser.add_argument("--preset", default="qwen3_4b")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--completion", type=int, default=1024)
    parser.add_argument("--param-dtype", default=None, help="float32 | bfloat16 (default: the preset's)")
    parser.add_argument("--dtype", default=None, help="compute dtype float32 | bfloat16 (default: the preset's)")
    parser.add_argument("--logprob-chunk", default="0",
                        help="tokens per log-prob chunk; 'full' = full-vocabulary logits; 0 = trainer default")
    parser.add_argument("--remat", default="full", help="none | full | save_matmuls")
    parser.add_argument("--layers", type=int, default=None, help="override num_hidden_layers (quick looks)")
    parser.add_argument("--attention-impl", default=None,
                        help="auto | xla | cudnn | chunked (default: the preset's, auto = chunked on the CPU)")
    parser.add_argument("--anchor-rows", type=int, default=0,
                        help="> 0: the update with GRPO's supervised anchor of that many rows (train.grpo.anchor)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    chunk = None if args.logprob_chunk == "full" else int(args.logprob_chunk)
    overrides = {} if args.layers is None else {"num_hidden_layers": args.layers}
    if args.attention_impl is not None:
        overrides["attention_impl"] = args.attention_impl
    report = analyse_update(args.preset, args.rows, args.prompt, args.completion, param_dtype=args.param_dtype,
                            dtype=args.dtype, logprob_chunk=chunk, remat=args.remat, overrides=overrides,
                            anchor_rows=args.anchor_rows)
    row = report.row()
    if args.json:
        print(json.dumps(row))
    else:
        width = max(len(k) for k in row)
        for k, v in row.items():
            print(f"{k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
