"""Training throughput, MFU and memory (see ``--help`` and docs/performance.md "Training"):

``python -m llm.benchmark train ...`` (:func:`train_main`): the jitted update of
:func:`llm.rl.updates.make_grpo_update` for a preset (random weights), ``rows`` completions of
``prompt + completion`` tokens in ``micro_batches`` accumulated micro-batches, a
rematerialisation policy and a log-prob chunk: **tokens/s** = ``rows x (prompt + completion) /
t`` (``t`` the best of ``--repeats`` calls of the compiled update, device work awaited);
**MFU** = ``6 x params x tokens / t / peak`` (the usual ``6N`` FLOPs per trained token: no
attention term, no rematerialisation recompute) against a known accelerator's dense bf16 peak
(:data:`ACCELERATORS`), a stated ``--peak-tflops`` or a measured matmul peak
(:func:`measure_peak_flops`); **compile time**; **peak memory** from XLA's
``memory_analysis()`` (arguments + outputs + temporaries - aliased, and the temporaries alone)
and, where the backend reports it (GPU, TPU), the device's ``peak_bytes_in_use``.

``python -m llm.benchmark grpo ...`` (:func:`grpo_main`): one whole GRPO step as
:func:`llm.training.grpo_loop.run_grpo` runs it on the device -- sampling ``lakes x group_size``
completions (:func:`llm.generation.decode.generate_ids`, temperature sampling, EOS off so every row
decodes ``new_tokens``: a step's worst case), with ``beta > 0`` the reference's log-probs
(:func:`llm.rl.updates.make_logprob_fn`, in ``micro_batches`` blocks), then the ``mu`` updates
of :class:`llm.rl.updates.GRPOIterations` (on-policy: no old log-prob forward) -- with the
time split between them. The old log-prob forward the trainer no longer runs is timed apart,
after each step (``old_logp_s``), and ``old_logp_saved`` is its share of the step that would
still run it (``old_logp_s / (step_s + old_logp_s)``). Prompts are random ids and advantages
random numbers: the simulator's rewards and the text decoding (host work; ``python -m
jaxlake.bench`` measures the simulator) are not timed, nor are dynamic sampling's extra
rounds (each one is another sampling part). The first step compiles every piece; the report
is the best of ``--repeats`` later steps, part by part, and the compile time the first
step's excess over it.

``docs/gpu/train.sh`` runs both on one GPU; ``--models tiny`` runs them on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Any

import numpy as np

from jaxlake.io import write_json
from llm.game.default import preset_config
from llm.benchmark.roofline import csv_ints, csv_names, device_peak_bytes, resolve_peak, sync


def _model_state(config, seed: int):
    from flax import nnx

    from llm.model.qwen3 import Qwen3ForCausalLM

    return nnx.split(Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed)))


def _optimizer():
    """AdamW at a constant 1e-6 (no warmup: the first update already moves the weights)."""
    from llm.rl.optim import make_optimizer
    from llm.training.config import OptimConfig

    return make_optimizer(OptimConfig(lr=1e-6, warmup_steps=0), 1000)


def _random_batch(rng: np.random.RandomState, vocab: int, rows: int, prompt_len: int, completion_len: int):
    """Host arrays of a full batch: random prompt and completion ids, every token real."""
    return {
        "prompt_ids": rng.randint(3, vocab, size=(rows, prompt_len)).astype(np.int32),
        "prompt_mask": np.ones((rows, prompt_len), bool),
        "tokens": rng.randint(3, vocab, size=(rows, completion_len)).astype(np.int32),
        "mask": np.ones((rows, completion_len), bool),
    }


def _check_positive(**values: int) -> None:
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{k}={v!r} must be an integer >= 1")


@dataclasses.dataclass
class TrainRow:
    """One ``train``-mode measurement (times in seconds, memory in bytes)."""

    model: str
    params: int
    param_dtype: str
    dtype: str
    layers: int
    rows: int
    prompt_len: int
    completion_len: int
    micro_batches: int
    remat: str
    logprob_chunk: int | None
    update_s: float  # best of the repeats
    tokens_per_s: float  # rows x (prompt + completion) / update_s
    mfu: float  # 6 x params x tokens / update_s / peak_flops
    peak_flops: float
    compile_s: float
    argument_bytes: int
    temp_bytes: int
    peak_bytes: int  # arguments + outputs + temporaries - aliased (XLA memory_analysis)
    device_peak_bytes: int | None  # the backend's peak_bytes_in_use (None on the CPU)
    loss: float
    grad_norm: float  # of the last update: > 0 when gradients flow

    @property
    def tokens(self) -> int:
        return self.rows * (self.prompt_len + self.completion_len)


def bench_train(name: str, *, rows: int, prompt_len: int, completion_len: int, micro_batches: int = 1,
                remat: str = "full", logprob_chunk: int | None = 128, param_dtype: str | None = None,
                dtype: str | None = None, layers: int | None = None, entropy: bool = True,
                repeats: int = 3, peak_flops: float, seed: int = 0) -> TrainRow:
    """Time one GRPO update of preset ``name`` (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    from llm.rl import grpo
    from llm.rl.grpo import GRPOLossConfig
    from llm.model.config import REMAT_POLICIES
    from llm.rl.batches import GRPOBatch
    from llm.rl.updates import make_grpo_update

    _check_positive(rows=rows, prompt_len=prompt_len, completion_len=completion_len, micro_batches=micro_batches,
                    repeats=repeats)
    if rows % micro_batches:
        raise ValueError(f"rows={rows} must be divisible by micro_batches={micro_batches}")
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat={remat!r} not in {REMAT_POLICIES}")
    config = preset_config(name, param_dtype=param_dtype, dtype=dtype, layers=layers)
    graphdef, state = _model_state(config, seed)
    optimizer = _optimizer()
    opt_state = optimizer.init(state)
    rng = np.random.RandomState(seed)
    host = _random_batch(rng, config.vocab_size, rows, prompt_len, completion_len)
    seq = {k: jnp.asarray(v) for k, v in host.items()}
    loss_config = GRPOLossConfig()
    batch = GRPOBatch(
        **seq,
        weights=grpo.token_weights(seq["mask"], jnp.ones((rows,), bool), loss_config.aggregation),
        advantages=jnp.asarray(rng.randn(rows).astype(np.float32)),
        # the values do not change the work; a uniform-policy guess keeps the ratios moderate
        old_logp=jnp.full((rows, completion_len), -float(np.log(config.vocab_size)), jnp.float32),
    )
    update = make_grpo_update(graphdef, optimizer, loss_config, micro_batches=micro_batches,
                              compute_entropy=entropy, logprob_chunk=logprob_chunk, remat=remat)
    t0 = time.perf_counter()
    compiled = update.lower(state, opt_state, batch).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    state, opt_state, metrics = sync(compiled(state, opt_state, batch))  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, opt_state, metrics = sync(compiled(state, opt_state, batch))
        best = min(best, time.perf_counter() - t0)
    metrics = jax.device_get(metrics)
    params = int(config.num_parameters())
    tokens = rows * (prompt_len + completion_len)
    arg = int(mem.argument_size_in_bytes) if mem is not None else 0
    temp = int(mem.temp_size_in_bytes) if mem is not None else 0
    peak = (arg + int(mem.output_size_in_bytes) + temp - int(mem.alias_size_in_bytes)) if mem is not None else 0
    return TrainRow(
        model=name, params=params, param_dtype=config.param_dtype, dtype=config.dtype,
        layers=config.num_hidden_layers, rows=rows, prompt_len=prompt_len, completion_len=completion_len,
        micro_batches=micro_batches, remat=remat, logprob_chunk=logprob_chunk, update_s=best,
        tokens_per_s=tokens / best, mfu=6.0 * params * tokens / best / peak_flops, peak_flops=peak_flops,
        compile_s=compile_s, argument_bytes=arg, temp_bytes=temp, peak_bytes=peak,
        device_peak_bytes=device_peak_bytes(), loss=float(metrics["loss"]), grad_norm=float(metrics["grad_norm"]),
    )


def format_train(rows: list[TrainRow]) -> str:
    """Markdown table of :func:`bench_train` rows."""
    head = ("| model | params | dtypes (param / compute) | rows x (P + C) | micro | remat | update s | tokens/s "
            "| MFU | compile s | XLA peak GiB | temporaries GiB | device peak GiB |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        dev = "" if r.device_peak_bytes is None else f"{r.device_peak_bytes / 2**30:.1f}"
        lines.append(
            f"| {r.model} ({r.layers} layers) | {r.params / 1e6:.1f}M | {r.param_dtype} / {r.dtype} "
            f"| {r.rows} x ({r.prompt_len} + {r.completion_len}) | {r.micro_batches} | {r.remat} | {r.update_s:.3f} "
            f"| {r.tokens_per_s:,.0f} | {r.mfu:.1%} | {r.compile_s:.1f} | {r.peak_bytes / 2**30:.2f} "
            f"| {r.temp_bytes / 2**30:.2f} | {dev} |"
        )
    return "\n".join(lines)


@dataclasses.dataclass
class StepRow:
    """One ``grpo``-mode measurement: a whole GRPO step and its parts (seconds)."""

    model: str
    params: int
    param_dtype: str
    dtype: str
    layers: int
    lakes: int
    group_size: int
    prompt_len: int
    new_tokens: int
    micro_batches: int
    mu: int
    beta: float
    remat: str
    logprob_chunk: int | None
    step_s: float  # best whole step (sampling + reference log-probs + updates)
    sample_s: float  # best of each part
    old_logp_s: float  # the old log-prob forward the step skips, timed apart (not in step_s)
    ref_logp_s: float  # 0 when beta == 0 (no reference forward)
    update_s: float  # all mu updates
    compile_s: float  # first step - best step
    sample_tokens_per_s: float  # rows x new_tokens / sample_s
    update_mfu: float  # 6 x params x mu x rows x (prompt + new) / update_s / peak
    peak_flops: float
    device_peak_bytes: int | None
    grad_norm: float

    @property
    def rows(self) -> int:
        return self.lakes * self.group_size

    @property
    def old_logp_saved(self) -> float:
        """Share of a step with the explicit old log-prob forward that skipping it saves."""
        return self.old_logp_s / (self.step_s + self.old_logp_s)


def bench_grpo_step(name: str, *, lakes: int, group_size: int, prompt_len: int, new_tokens: int,
                    micro_batches: int = 1, mu: int = 1, beta: float = 0.0, remat: str = "full",
                    logprob_chunk: int | None = 128, temperature: float = 1.0, kv_block: int = 64,
                    param_dtype: str | None = None, dtype: str | None = None, layers: int | None = None,
                    repeats: int = 2, peak_flops: float, seed: int = 0) -> StepRow:
    """Time one whole GRPO step of preset ``name`` (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    from llm.rl import grpo
    from llm.generation.decode import GenerationConfig, generate_ids
    from llm.rl.grpo import GRPOLossConfig
    from llm.model.config import REMAT_POLICIES
    from llm.training.policy import copy_state
    from llm.rl.batches import GRPOBatch
    from llm.rl.updates import GRPOIterations, make_logprob_fn

    _check_positive(lakes=lakes, group_size=group_size, prompt_len=prompt_len, new_tokens=new_tokens,
                    micro_batches=micro_batches, mu=mu, repeats=repeats)
    if group_size < 2:
        raise ValueError(f"group_size={group_size} must be >= 2 (GRPO compares completions within a group)")
    rows = lakes * group_size
    if rows % micro_batches:
        raise ValueError(f"lakes x group_size = {rows} must be divisible by micro_batches={micro_batches}")
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat={remat!r} not in {REMAT_POLICIES}")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0 (GRPO samples)")
    config = preset_config(name, param_dtype=param_dtype, dtype=dtype, layers=layers)
    graphdef, state = _model_state(config, seed)
    ref_state = copy_state(state) if beta > 0 else None
    optimizer = _optimizer()
    opt_state = optimizer.init(state)
    loss_config = GRPOLossConfig(beta=beta)
    iterations = GRPOIterations(graphdef, optimizer, loss_config, mu=mu, micro_batches=micro_batches,
                                temperature=temperature, logprob_chunk=logprob_chunk, remat=remat)
    logprob_fn = make_logprob_fn(graphdef, temperature=temperature, logprob_chunk=logprob_chunk,
                                 micro_batches=micro_batches)
    gen = GenerationConfig(max_new_tokens=new_tokens, temperature=temperature, eos_token_ids=(), pad_token_id=0,
                           kv_block=kv_block)
    rng = np.random.RandomState(seed)
    # one prompt per lake, repeated group_size times (as the trainer does)
    prompts = rng.randint(3, config.vocab_size, size=(lakes, prompt_len)).astype(np.int32)
    ids = jnp.asarray(np.repeat(prompts, group_size, axis=0))
    pmask = jnp.ones(ids.shape, bool)
    key = jax.random.PRNGKey(seed)

    def step(state, opt_state, i: int):
        t0 = time.perf_counter()
        tokens, cmask, _, _, _ = sync(generate_ids((graphdef, state), ids, pmask, jax.random.fold_in(key, i), gen))
        t1 = time.perf_counter()
        seq = (ids, pmask, tokens, cmask)
        ref_logp = sync(logprob_fn(ref_state, *seq)) if ref_state is not None else None
        t2 = time.perf_counter()
        batch = GRPOBatch(prompt_ids=ids, prompt_mask=pmask, tokens=tokens, mask=cmask,
                          weights=grpo.token_weights(cmask, jnp.ones((rows,), bool), loss_config.aggregation),
                          advantages=jnp.asarray(rng.randn(rows).astype(np.float32)), ref_logp=ref_logp)
        # the old log-prob forward the trainer skips (its first update is on-policy), timed apart
        t_old = time.perf_counter()
        sync(logprob_fn(state, *seq))
        old_s = time.perf_counter() - t_old
        t3 = time.perf_counter()
        state, opt_state, metrics = iterations(state, opt_state, batch)
        metrics = jax.device_get(sync(metrics[-1]))
        t4 = time.perf_counter()
        times = dict(step=t4 - t0 - old_s, sample=t1 - t0, old=old_s, ref=t2 - t1, update=t4 - t3)
        return state, opt_state, times, metrics

    state, opt_state, first, metrics = step(state, opt_state, 0)
    best = {k: float("inf") for k in first}
    for i in range(1, repeats + 1):
        state, opt_state, times, metrics = step(state, opt_state, i)
        best = {k: min(best[k], v) for k, v in times.items()}
    params = int(config.num_parameters())
    trained = mu * rows * (prompt_len + new_tokens)
    return StepRow(
        model=name, params=params, param_dtype=config.param_dtype, dtype=config.dtype,
        layers=config.num_hidden_layers, lakes=lakes, group_size=group_size, prompt_len=prompt_len,
        new_tokens=new_tokens, micro_batches=micro_batches, mu=mu, beta=beta, remat=remat,
        logprob_chunk=logprob_chunk, step_s=best["step"], sample_s=best["sample"], old_logp_s=best["old"],
        ref_logp_s=best["ref"] if ref_state is not None else 0.0, update_s=best["update"],
        compile_s=max(first["step"] - best["step"], 0.0), sample_tokens_per_s=rows * new_tokens / best["sample"],
        update_mfu=6.0 * params * trained / best["update"] / peak_flops, peak_flops=peak_flops,
        device_peak_bytes=device_peak_bytes(), grad_norm=float(metrics["grad_norm"]),
    )


def format_grpo(rows: list[StepRow]) -> str:
    """Markdown table of :func:`bench_grpo_step` rows (shares of the best step in brackets; the
    skipped old log-prob forward's share is of a step that would run it)."""
    head = ("| model | lakes x G | P + N | micro | mu | beta | step s | sampling s | ref log-probs s "
            "| update s | skipped old log-probs s (saved) | sampled tokens/s | update MFU | compile s |")
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        sample, ref, upd = (f"{x:.3f} ({x / r.step_s:.0%})" for x in (r.sample_s, r.ref_logp_s, r.update_s))
        lines.append(
            f"| {r.model} ({r.dtype}) | {r.lakes} x {r.group_size} | {r.prompt_len} + {r.new_tokens} "
            f"| {r.micro_batches} | {r.mu} | {r.beta:g} | {r.step_s:.3f} | {sample} | {ref} | {upd} "
            f"| {r.old_logp_s:.3f} ({r.old_logp_saved:.0%}) "
            f"| {r.sample_tokens_per_s:,.0f} | {r.update_mfu:.1%} | {r.compile_s:.1f} |"
        )
    return "\n".join(lines)


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="tiny", help="comma-separated conf/model names (or 'tiny')")
    parser.add_argument("--param-dtype", choices=("float32", "bfloat16"), default=None,
                        help="override the preset's parameter (master) dtype")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="override the preset's compute dtype")
    parser.add_argument("--layers", type=int, default=None, help="override num_hidden_layers (quick looks)")
    parser.add_argument("--logprob-chunk", default="128",
                        help="completion tokens per LM-head chunk; 'full' = full-vocabulary logits")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak TFLOP/s for the MFU (default: a known accelerator's dense bf16 figure, "
                             "else a measured 1024^3 matmul in the compute dtype)")
    parser.add_argument("--out", default=None, help="write rows and machine figures as JSON here")


def _chunk(text: str) -> int | None:
    return None if text == "full" else int(text)


def _header(args, peak: float, source: str) -> dict[str, Any]:
    import jax

    kind = jax.devices()[0].device_kind
    print(f"jax {jax.__version__} on {kind} ({jax.device_count()} device(s)); "
          f"peak {peak / 1e12:.3f} TFLOP/s [{source}]", flush=True)
    return {"device_kind": kind, "jax": jax.__version__, "peak_flops": peak, "peak_source": source,
            "argv": vars(args)}


def _write(path: str | None, meta: dict[str, Any], rows: list) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_json(path, {**meta, "rows": [dataclasses.asdict(r) for r in rows]}, indent=2)


def _peak_dtype(args) -> str:
    return args.dtype or preset_config(csv_names(args.models)[0]).dtype


def train_main(argv: list[str] | None = None) -> list[TrainRow]:
    """``python -m llm.benchmark train ...`` (see ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m llm.benchmark train",
        description="One GRPO update: tokens/s, MFU, compile time and peak memory (XLA memory analysis).")
    _train_arguments(parser)
    parser.add_argument("--rows", type=int, default=8, help="completions in the update")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--micro-batches", default="1", help="comma-separated gradient-accumulation counts")
    parser.add_argument("--remat", default="full", help="comma-separated: none | full | save_matmuls")
    parser.add_argument("--no-entropy", action="store_true", help="skip the token entropies (metrics only)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    peak, source = resolve_peak(args.peak_tflops, _peak_dtype(args))
    meta = _header(args, peak, source)
    rows: list[TrainRow] = []
    for name in csv_names(args.models):
        for micro in csv_ints(args.micro_batches):
            for remat in csv_names(args.remat):
                t0 = time.perf_counter()
                rows.append(bench_train(
                    name, rows=args.rows, prompt_len=args.prompt_len, completion_len=args.completion_len,
                    micro_batches=micro, remat=remat, logprob_chunk=_chunk(args.logprob_chunk),
                    param_dtype=args.param_dtype, dtype=args.dtype, layers=args.layers,
                    entropy=not args.no_entropy, repeats=args.repeats, peak_flops=peak))
                print(f"  {name} micro={micro} remat={remat}: measured in {time.perf_counter() - t0:.0f}s", flush=True)
    print(format_train(rows))
    _write(args.out, meta, rows)
    return rows


def grpo_main(argv: list[str] | None = None) -> list[StepRow]:
    """``python -m llm.benchmark grpo ...`` (see ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m llm.benchmark grpo",
        description="One whole GRPO step (sampling, old/reference log-probs, updates) with the time split.")
    _train_arguments(parser)
    parser.add_argument("--lakes", type=int, default=4, help="groups (prompts) per step")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt (G)")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per completion (EOS off)")
    parser.add_argument("--micro-batches", type=int, default=1,
                        help="gradient accumulation; the reference (and timed-apart old) log-prob forward uses the same blocks")
    parser.add_argument("--mu", type=int, default=1, help="updates per sampled batch")
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient (> 0 adds the reference forward)")
    parser.add_argument("--remat", default="full", help="none | full | save_matmuls")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--kv-block", type=int, default=64, help="GenerationConfig.kv_block")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps after the compiling one")
    args = parser.parse_args(argv)
    peak, source = resolve_peak(args.peak_tflops, _peak_dtype(args))
    meta = _header(args, peak, source)
    rows: list[StepRow] = []
    for name in csv_names(args.models):
        t0 = time.perf_counter()
        rows.append(bench_grpo_step(
            name, lakes=args.lakes, group_size=args.group_size, prompt_len=args.prompt_len,
            new_tokens=args.new_tokens, micro_batches=args.micro_batches, mu=args.mu, beta=args.beta,
            remat=args.remat, logprob_chunk=_chunk(args.logprob_chunk), temperature=args.temperature,
            kv_block=args.kv_block, param_dtype=args.param_dtype, dtype=args.dtype, layers=args.layers,
            repeats=args.repeats, peak_flops=peak))
        print(f"  {name}: measured in {time.perf_counter() - t0:.0f}s", flush=True)
    print(format_grpo(rows))
    _write(args.out, meta, rows)
    return rows
