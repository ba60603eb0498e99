"""Generation throughput: ours (jitted JAX KV-cache loop) vs ``transformers``' PyTorch ``generate``.

Two modes. ``python -m llm.benchmark generate ...`` (:func:`generate_main`, see ``--help`` and
docs/performance.md "Generation"): one preset and batch sizes, ours against transformers
with a dynamic and a static cache, timings interleaved per repeat, wall and process-CPU
seconds, the fraction of the roofline beside each rate (decode: bytes a step must read /
bandwidth; prefill: FLOPs / peak; figures stated on the command line, from
:data:`ACCELERATORS`, or measured), compile time and XLA peak memory of ours.

Two training modes (see ``--help`` and docs/performance.md "Training"):

``python -m llm.benchmark train ...`` (:func:`train_main`): the jitted update of
:func:`llm.updates.make_grpo_update` for a preset (random weights), ``rows`` completions of
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
:func:`llm.grpo_loop.run_grpo` runs it on the device -- sampling ``lakes x group_size``
completions (:func:`llm.generate.generate_ids`, temperature sampling, EOS off so every row
decodes ``new_tokens``: a step's worst case), the behaviour log-probs and, with ``beta > 0``,
the reference's (:func:`llm.updates.make_logprob_fn`), then ``mu`` updates -- with the time
split between them. Prompts are random ids and advantages random numbers: the simulator's
rewards and the text decoding (host work; ``python -m jaxlake.bench`` measures the simulator)
are not timed. The first step compiles every piece; the report is the best of ``--repeats``
later steps, part by part, and the compile time the first step's excess over it.

``docs/gpu/train.sh`` runs both on one GPU; ``--models tiny`` runs them on a CPU.

``python -m llm.benchmark`` (the older comparison, below):

``python -m llm.benchmark`` measures, for the tiny default config and the ~100M config
(``conf/model/tiny.yaml``, ``conf/model/small_100m.yaml``), on the same machine in the same
run, with the same weights (ours are copied into the torch model), batch, prompt length and
number of new tokens, greedy decoding with EOS disabled (every row makes every token):

* **prefill tokens/s** = ``B * P / t1`` with ``t1`` the time of a 1-new-token generation
  (prefill + first token);
* **decode tokens/s** = ``B * (N - 1) / (tN - t1)`` with ``tN`` the time of an N-token
  generation.

Each timing is the best of ``--repeats`` runs after a warm-up (compilation excluded for JAX;
torch gets the same warm-up). Torch uses ``torch.set_num_threads(os.cpu_count())``. The
table reports ``ours / theirs`` ratios (> 1 means ours is faster) and the share of greedy
tokens on which both agree (same weights, so a sanity check, not a score). These are
measurements, not tests: the numbers vary with the machine and its load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from typing import Any, Callable

import numpy as np

from jaxlake.io import write_json


@dataclasses.dataclass
class Row:
    model: str
    params_m: float
    batch: int
    prompt_len: int
    new_tokens: int
    ours_prefill: float
    theirs_prefill: float
    ours_decode: float
    theirs_decode: float
    agreement: float

    @property
    def prefill_ratio(self) -> float:
        return self.ours_prefill / self.theirs_prefill

    @property
    def decode_ratio(self) -> float:
        return self.ours_decode / self.theirs_decode


def _best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _model_config(name: str):
    from llm.default import MODEL_CONF_DIR, default_config
    from llm.model import Qwen3Config

    if name == "tiny":
        return default_config()
    return Qwen3Config.from_yaml(MODEL_CONF_DIR / f"{name}.yaml")


def _ours(model, ids: np.ndarray, new_tokens: int, repeats: int) -> tuple[float, float, np.ndarray]:
    import jax
    from flax import nnx

    from llm.generate import GenerationConfig, generate_ids

    graphdef, state = nnx.split(model)
    mask = np.ones_like(ids, dtype=bool)

    def run(n: int):
        cfg = GenerationConfig(max_new_tokens=n, temperature=0.0, eos_token_ids=())
        out = generate_ids((graphdef, state), ids, mask, None, cfg)
        return jax.block_until_ready(out)[0]

    run(1), run(new_tokens)  # compile
    t1, _ = _best(lambda: run(1), repeats)
    tn, tokens = _best(lambda: run(new_tokens), repeats)
    return t1, tn, np.asarray(tokens)


def _theirs(model, ids: np.ndarray, new_tokens: int, repeats: int, device: str = "cpu") -> tuple[float, float, np.ndarray]:
    import torch

    from llm.hf_io import model_to_hf_tensors

    from transformers import Qwen3Config as HFConfig
    from transformers import Qwen3ForCausalLM as HFModel

    hf_cfg = HFConfig(**{k: v for k, v in model.config.to_hf_dict().items() if k not in ("architectures",)})
    torch.manual_seed(0)
    tmodel = HFModel(hf_cfg).eval().to(torch.float32)
    state = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in model_to_hf_tensors(model)}
    missing, unexpected = tmodel.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"weight copy failed: missing={missing} unexpected={unexpected}")
    torch_device = torch.device("cuda" if device == "gpu" else "cpu")
    tmodel = tmodel.to(torch_device)
    input_ids = torch.from_numpy(ids.astype(np.int64)).to(torch_device)
    attention = torch.ones_like(input_ids)

    def run(n: int):
        with torch.inference_mode():
            out = tmodel.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=True)
        if torch_device.type == "cuda":
            torch.cuda.synchronize()
        return out

    run(1), run(min(new_tokens, 4))  # warm-up (no compilation to amortise)
    t1, _ = _best(lambda: run(1), repeats)
    tn, out = _best(lambda: run(new_tokens), repeats)
    return t1, tn, out[:, ids.shape[1]:].cpu().numpy()


def bench_model(name: str, batch: int, prompt_len: int, new_tokens: int, repeats: int, seed: int = 0,
                device: str = "cpu") -> Row:
    """Measure one config (see the module docstring)."""
    from flax import nnx

    from llm.model import Qwen3ForCausalLM

    config = _model_config(name)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed))
    params = config.num_parameters() / 1e6
    ids = np.random.RandomState(seed).randint(3, config.vocab_size, size=(batch, prompt_len)).astype(np.int32)
    o1, on, ours_tok = _ours(model, ids, new_tokens, repeats)
    h1, hn, their_tok = _theirs(model, ids, new_tokens, repeats, device)
    decode = batch * (new_tokens - 1)
    return Row(
        model=name, params_m=params, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
        ours_prefill=batch * prompt_len / o1, theirs_prefill=batch * prompt_len / h1,
        ours_decode=decode / max(on - o1, 1e-9), theirs_decode=decode / max(hn - h1, 1e-9),
        agreement=float((ours_tok == their_tok).mean()),
    )


def format_table(rows: list[Row]) -> str:
    head = (f"{'model':<11}{'params':>8}{'B':>4}{'P':>5}{'N':>5} | {'prefill tok/s ours':>18}{'theirs':>10}"
            f"{'ratio':>7} | {'decode tok/s ours':>17}{'theirs':>10}{'ratio':>7} | {'agree':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.model:<11}{r.params_m:>7.1f}M{r.batch:>4}{r.prompt_len:>5}{r.new_tokens:>5} | "
            f"{r.ours_prefill:>18.0f}{r.theirs_prefill:>10.0f}{r.prefill_ratio:>7.2f} | "
            f"{r.ours_decode:>17.0f}{r.theirs_decode:>10.0f}{r.decode_ratio:>7.2f} | {r.agreement:>6.2f}"
        )
    return "\n".join(lines)


# ============================================================================ generate mode
#: Known accelerators: (memory bandwidth B/s, dense bf16 peak FLOP/s), matched by a substring
#: of ``jax.devices()[0].device_kind``. Vendor data-sheet figures (dense, no sparsity).
ACCELERATORS: dict[str, tuple[float, float]] = {
    "H200": (4.8e12, 989e12),
    "H100": (3.35e12, 989e12),
    "A100": (2.039e12, 312e12),
    "L4": (0.3e12, 121e12),
    "TPU v5 lite": (0.819e12, 197e12),
    "TPU v5p": (2.765e12, 459e12),
    "TPU v4": (1.2e12, 275e12),
}


@dataclasses.dataclass
class GenRow:
    """One ``generate``-mode measurement (rates in tokens/s; times in seconds)."""

    engine: str  # "ours", "transformers (dynamic cache)", "transformers (static cache)"
    model: str
    dtype: str
    batch: int
    prompt_len: int
    new_tokens: int
    prefill_s: float  # wall time of prefill + first token (best of the repeats)
    step_s: float  # wall time of one decode step (best (tN - t1) / (N - 1))
    prefill_tok_s: float
    decode_tok_s: float
    prefill_cpu_s: float  # process CPU seconds of the same runs (all threads)
    step_cpu_s: float
    prefill_roofline: float  # prefill FLOPs / peak / prefill_s
    decode_roofline: float  # bytes that must be read per step / bandwidth / step_s
    compile_s: float | None = None
    peak_memory_bytes: int | None = None
    agreement: float | None = None  # share of greedy tokens equal to ours


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """``(wall seconds, process CPU seconds, result)`` of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def measure_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Read bandwidth (B/s) of the JAX default device: best time of a jitted sum over a
    ``megabytes`` float32 array (each element read once)."""
    import jax
    import jax.numpy as jnp

    n = megabytes * 2**20 // 4
    x = jnp.ones((n,), jnp.float32)
    f = jax.jit(lambda a: jnp.sum(a))
    jax.block_until_ready(f(x))
    best = min(_timed(lambda: jax.block_until_ready(f(x)))[0] for _ in range(repeats))
    return 4 * n / best


def measure_peak_flops(dtype: str = "float32", size: int = 1024, repeats: int = 5) -> float:
    """Achieved FLOP/s of a jitted ``size``-cubed matmul in ``dtype`` (an achievable peak, not
    the data-sheet one)."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((size, size), dtype)
    f = jax.jit(lambda x: x @ x)
    jax.block_until_ready(f(a))
    best = min(_timed(lambda: jax.block_until_ready(f(a)))[0] for _ in range(repeats))
    return 2 * size**3 / best


def decode_bytes_per_step(config, batch: int, prompt_len: int, new_tokens: int) -> float:
    """Bytes a decode step must read: every weight once (the tied table once, as the head;
    the embedding lookup reads only ``B`` rows) plus the keys and values of the filled
    prefix, averaged over the ``N - 1`` decode steps (mean filled length ``P + N / 2``)."""
    import numpy as _np

    pbytes = _np.dtype(config.jnp_param_dtype).itemsize
    cbytes = _np.dtype(config.jnp_dtype).itemsize
    weights = config.num_parameters() * pbytes
    filled = prompt_len + new_tokens / 2
    kv = 2 * config.num_hidden_layers * batch * filled * config.num_key_value_heads * config.head_dim * cbytes
    return weights + kv


def prefill_flops(config, batch: int, prompt_len: int) -> float:
    """FLOPs of a prefill: ``2 x`` non-embedding weights per token, causal attention
    (``QK^T`` and ``PV`` over half the ``P x P`` square) and the head at one position per row."""
    c = config
    emb = c.vocab_size * c.hidden_size
    body = c.num_parameters() - emb - (0 if c.tie_word_embeddings else emb)
    attention = 2 * 2 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * prompt_len * prompt_len / 2
    head = 2 * emb
    return batch * (2 * body * prompt_len + attention + head)


def _ours_generate(model, ids: np.ndarray, new_tokens: int, kv_block: int, unroll: bool | None = None):
    """Compile ours (greedy, EOS off) for 1 and N new tokens ahead of time; return
    ``(run, compile_s, peak_bytes)`` where ``run(n)`` calls the compiled executable (the
    jitted ``_generate_core`` behind ``generate_ids``) and returns the tokens. ``compile_s``
    and ``peak_bytes`` (XLA ``memory_analysis``: arguments + outputs + temporaries - aliased)
    are those of the N-token function."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from llm.generate import MAX_EOS_IDS, GenerationConfig, _generate_core, _unroll_layers

    graphdef, state = nnx.split(model)
    unroll = _unroll_layers(GenerationConfig(unroll_layers=unroll), state)  # None: generate_ids' default
    args = (state, jnp.asarray(ids), jnp.ones(ids.shape, bool), jax.random.PRNGKey(0), jnp.float32(1.0),
            jnp.float32(1.0), jnp.full((MAX_EOS_IDS,), -1, jnp.int32), jnp.int32(0))
    compiled, compile_s, peak = {}, 0.0, 0
    for n in (1, new_tokens):
        t0 = time.perf_counter()
        compiled[n] = _generate_core.lower(graphdef, *args, max_new_tokens=n, greedy=True, top_k=0,
                                           use_top_p=False, kv_block=kv_block, unroll_layers=unroll).compile()
        compile_s = time.perf_counter() - t0
        mem = compiled[n].memory_analysis()
        if mem is not None:
            peak = int(mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
                       - mem.alias_size_in_bytes)

    def run(n: int):
        return np.asarray(jax.block_until_ready(compiled[n](*args))[0])

    run(1), run(new_tokens)  # warm-up
    return run, compile_s, peak


def _torch_model(model, device: str):
    import torch

    from llm.hf_io import model_to_hf_tensors

    from transformers import Qwen3Config as HFConfig
    from transformers import Qwen3ForCausalLM as HFModel

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[model.config.dtype]
    target = torch.device("cuda" if device == "gpu" else "cpu")
    hf_cfg = HFConfig(**{k: v for k, v in model.config.to_hf_dict().items() if k not in ("architectures",)})
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build (and randomly initialise) in the target dtype, on the target
    try:
        with target:
            tmodel = HFModel(hf_cfg).eval()
    finally:
        torch.set_default_dtype(default)
    state = {k: torch.from_numpy(np.array(v, np.float32)).to(target, dtype) for k, v in model_to_hf_tensors(model)}
    missing, unexpected = tmodel.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"weight copy failed: missing={missing} unexpected={unexpected}")
    if model.config.tie_word_embeddings:
        tmodel.tie_weights()
    return tmodel


def _theirs_generate(tmodel, ids: np.ndarray, cache: str):
    """A runner for transformers ``generate`` with a ``dynamic`` or ``static`` cache."""
    import torch

    input_ids = torch.from_numpy(ids.astype(np.int64)).to(tmodel.device)
    attention = torch.ones_like(input_ids)
    extra = {"cache_implementation": "static"} if cache == "static" else {}

    def run(n: int):
        with torch.inference_mode():
            out = tmodel.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=True, **extra)
        if input_ids.is_cuda:
            torch.cuda.synchronize()
        return out[:, ids.shape[1]:].cpu().numpy()

    return run


def bench_generate(name: str, *, batch: int, prompt_len: int, new_tokens: int, repeats: int = 3,
                   peers: tuple[str, ...] = ("dynamic", "static"), dtype: str | None = None, bandwidth: float,
                   peak_flops: float, kv_block: int = 64, device: str = "cpu", seed: int = 0,
                   also_scan: bool = False, attention: str | None = None) -> list[GenRow]:
    """Ours and the ``transformers`` peers on one preset, timings interleaved per repeat.

    Every engine runs a 1-token and an N-token greedy generation (EOS off) ``repeats`` times in
    turn (ours, peer 1, peer 2, ours, ...), so load on a shared machine hits all alike; each
    figure is the best repeat. Prefill = the 1-token run; a decode step = ``(tN - t1) / (N-1)``.
    """
    from flax import nnx

    from llm.model import Qwen3ForCausalLM

    if new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens} must be >= 2 (decode is timed as tN - t1)")
    config = _model_config(name)
    if dtype is not None:
        config = dataclasses.replace(config, dtype=dtype, param_dtype=dtype)
    if attention is not None:
        config = dataclasses.replace(config, attention_impl=attention)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed))
    ids = np.random.RandomState(seed).randint(3, config.vocab_size, size=(batch, prompt_len)).astype(np.int32)
    ours_run, compile_s, peak = _ours_generate(model, ids, new_tokens, kv_block)
    engines: dict[str, Callable[[int], np.ndarray]] = {"ours": ours_run}
    compiles, peaks = {"ours": compile_s}, {"ours": peak}
    if also_scan:
        run, compiles["ours (layer scan)"], peaks["ours (layer scan)"] = _ours_generate(
            model, ids, new_tokens, kv_block, unroll=False)
        engines["ours (layer scan)"] = run
    if peers:
        tmodel = _torch_model(model, device)
        for cache in peers:
            run = _theirs_generate(tmodel, ids, cache)
            run(1), run(min(new_tokens, 4))  # warm-up (torch has nothing to compile)
            engines[f"transformers ({cache} cache)"] = run
    best: dict[str, dict[str, list[float]]] = {e: {"t1": [], "c1": [], "tn": [], "cn": []} for e in engines}
    tokens: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for engine, run in engines.items():
            t1, c1, _ = _timed(lambda: run(1))
            tn, cn, out = _timed(lambda: run(new_tokens))
            b = best[engine]
            b["t1"].append(t1), b["c1"].append(c1), b["tn"].append(tn), b["cn"].append(cn)
            tokens[engine] = out
    need_bytes = decode_bytes_per_step(config, batch, prompt_len, new_tokens)
    flops = prefill_flops(config, batch, prompt_len)
    rows = []
    for engine, b in best.items():
        t1, tn = min(b["t1"]), min(b["tn"])
        c1, cn = min(b["c1"]), min(b["cn"])
        # (tN - t1) <= 0 happens only when timing noise exceeds the decode time (tiny runs)
        step = (tn - t1) / (new_tokens - 1) if tn > t1 else float("nan")
        rows.append(GenRow(
            engine=engine, model=name, dtype=config.dtype, batch=batch, prompt_len=prompt_len,
            new_tokens=new_tokens, prefill_s=t1, step_s=step, prefill_tok_s=batch * prompt_len / t1,
            decode_tok_s=batch / step, prefill_cpu_s=c1, step_cpu_s=max(cn - c1, 0.0) / (new_tokens - 1),
            prefill_roofline=flops / peak_flops / t1, decode_roofline=need_bytes / bandwidth / step,
            compile_s=compiles.get(engine), peak_memory_bytes=peaks.get(engine),
            agreement=float((tokens[engine] == tokens["ours"]).mean()),
        ))
    return rows


@dataclasses.dataclass
class EarlyFinishRow:
    """Ours with rows that finish early (``--eos-after``) against the same run without."""

    model: str
    batch: int
    prompt_len: int
    new_tokens: int
    schedule: list[int]  # per-row completion lengths (the schedule cycled over the batch)
    useful_tokens: int  # sum of the schedule: the tokens a caller keeps
    steps: int  # loop steps the early-finishing run makes: the longest row
    full_s: float  # every row runs to new_tokens (EOS off): what finished rows cost before the early exit
    early_s: float  # the same compiled function with the per-row budgets (the loop exits at the longest)
    full_useful_tok_s: float  # useful_tokens / full_s
    early_useful_tok_s: float  # useful_tokens / early_s


def bench_early_finish(name: str, *, batch: int, prompt_len: int, new_tokens: int, schedule: list[int],
                       repeats: int = 3, dtype: str | None = None, kv_block: int = 64, seed: int = 0,
                       attention: str | None = None) -> EarlyFinishRow:
    """Useful tokens/s when rows finish early, with and without the early exit.

    Row ``b`` stops after ``schedule[b % len(schedule)]`` tokens (``generate_ids``'
    ``max_lengths``: a reproducible stand-in for EOS, which random weights emit at random).
    Both runs use one compiled function (the budgets are traced) and are interleaved; each
    time is the best repeat. Without the early exit every row would run all ``new_tokens``
    steps, which is the ``full`` run; the ``early`` run's loop ends when its longest row does.
    Finished rows still occupy their batch slot until then (no compaction or refill).
    """
    import jax
    from flax import nnx

    from llm.generate import GenerationConfig, generate_ids
    from llm.model import Qwen3ForCausalLM

    if not schedule or min(schedule) < 1 or max(schedule) > new_tokens:
        raise ValueError(f"--eos-after={schedule} must be integers in [1, new_tokens={new_tokens}]")
    config = _model_config(name)
    if dtype is not None:
        config = dataclasses.replace(config, dtype=dtype, param_dtype=dtype)
    if attention is not None:
        config = dataclasses.replace(config, attention_impl=attention)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed))
    split = nnx.split(model)
    ids = np.random.RandomState(seed).randint(3, config.vocab_size, size=(batch, prompt_len)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    cfg = GenerationConfig(max_new_tokens=new_tokens, temperature=0.0, eos_token_ids=(), kv_block=kv_block)
    lengths = np.asarray([schedule[b % len(schedule)] for b in range(batch)], np.int32)
    budgets = {"full": np.full((batch,), new_tokens, np.int32), "early": lengths}

    def run(which: str):
        return jax.block_until_ready(generate_ids(split, ids, mask, None, cfg, max_lengths=budgets[which]))

    got = {w: run(w) for w in budgets}  # compile (once: the budgets are traced) and warm up
    if np.asarray(got["early"][2]).tolist() != lengths.tolist():
        raise RuntimeError("the early-finish run did not stop rows at their budgets")
    best = {w: float("inf") for w in budgets}
    for _ in range(repeats):
        for w in budgets:
            best[w] = min(best[w], _timed(lambda: run(w))[0])
    useful = int(lengths.sum())
    return EarlyFinishRow(model=name, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
                          schedule=lengths.tolist(), useful_tokens=useful, steps=int(lengths.max()),
                          full_s=best["full"], early_s=best["early"], full_useful_tok_s=useful / best["full"],
                          early_useful_tok_s=useful / best["early"])


def format_early_finish(rows: list[EarlyFinishRow]) -> str:
    """Markdown table of :func:`bench_early_finish` rows."""
    lines = ["| model | B | P | N | rows finish after | useful tokens | loop steps | useful tok/s, all rows to N "
             "| useful tok/s, early exit | gain |", "|" + "---|" * 10]
    for r in rows:
        sched = ",".join(str(x) for x in sorted(set(r.schedule)))
        lines.append(f"| {r.model} | {r.batch} | {r.prompt_len} | {r.new_tokens} | {sched} | {r.useful_tokens} "
                     f"| {r.steps} | {r.full_useful_tok_s:,.1f} | {r.early_useful_tok_s:,.1f} "
                     f"| {r.early_useful_tok_s / r.full_useful_tok_s:.2f}x |")
    return "\n".join(lines)


def generate_memory(name: str, *, batch: int, prompt_len: int, new_tokens: int, dtype: str | None = None,
                    kv_block: int = 64, unroll: bool | None = None, attention: str | None = None) -> dict[str, Any]:
    """XLA memory analysis of ours' compiled generation from abstract shapes (nothing is
    allocated: ``nnx.eval_shape`` parameters, ``ShapeDtypeStruct`` prompts), for the default
    backend. ``peak`` = arguments + outputs + temporaries - aliased, as in the timed table;
    ``kv_cache`` is the ``[L, B, P + N, kv, d]`` keys and values it must hold."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from llm.generate import MAX_EOS_IDS, GenerationConfig, _generate_core, _unroll_layers
    from llm.model import Qwen3ForCausalLM

    config = _model_config(name)
    if dtype is not None:
        config = dataclasses.replace(config, dtype=dtype, param_dtype=dtype)
    if attention is not None:
        config = dataclasses.replace(config, attention_impl=attention)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))))
    unroll = _unroll_layers(GenerationConfig(unroll_layers=unroll), state)
    sds = jax.ShapeDtypeStruct
    args = (state, sds((batch, prompt_len), jnp.int32), sds((batch, prompt_len), jnp.bool_),
            jax.eval_shape(lambda: jax.random.PRNGKey(0)), sds((), jnp.float32), sds((), jnp.float32),
            sds((MAX_EOS_IDS,), jnp.int32), sds((), jnp.int32), sds((batch,), jnp.int32))
    t0 = time.perf_counter()
    compiled = _generate_core.lower(graphdef, *args, max_new_tokens=new_tokens, greedy=True, top_k=0,
                                    use_top_p=False, kv_block=kv_block, unroll_layers=unroll).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    c = config
    cbytes = np.dtype(c.jnp_dtype).itemsize
    kv = 2 * c.num_hidden_layers * batch * (prompt_len + new_tokens) * c.num_key_value_heads * c.head_dim * cbytes
    out = dict(model=name, dtype=c.dtype, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
               unroll_layers=unroll, backend=jax.default_backend(), compile_s=compile_s,
               weights=c.num_parameters() * np.dtype(c.jnp_param_dtype).itemsize, kv_cache=kv)
    for field in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes"):
        out[field] = int(getattr(mem, field))
    out["peak"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"] + out["temp_size_in_bytes"]
                   - out["alias_size_in_bytes"])
    return out


def format_generate(rows: list[GenRow]) -> str:
    """Markdown table of :func:`bench_generate` rows; ratios are ours / that engine."""
    ours = {(r.model, r.batch, r.prompt_len, r.new_tokens): r for r in rows if r.engine == "ours"}
    head = ("| model | engine | B | P | N | prefill tok/s | roofline | decode tok/s | roofline | step ms "
            "| CPU-s/step | ours / it (prefill, decode) | compile s | peak MiB | agree |")
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        o = ours.get((r.model, r.batch, r.prompt_len, r.new_tokens), r)
        ratio = f"{o.prefill_tok_s / r.prefill_tok_s:.2f}, {o.decode_tok_s / r.decode_tok_s:.2f}"
        comp = "" if r.compile_s is None else f"{r.compile_s:.1f}"
        mem = "" if r.peak_memory_bytes is None else f"{r.peak_memory_bytes / 2**20:.0f}"
        lines.append(
            f"| {r.model} ({r.dtype}) | {r.engine} | {r.batch} | {r.prompt_len} | {r.new_tokens} "
            f"| {r.prefill_tok_s:,.0f} | {r.prefill_roofline:.1%} | {r.decode_tok_s:,.0f} | {r.decode_roofline:.1%} "
            f"| {1e3 * r.step_s:.2f} | {r.step_cpu_s:.3f} | {ratio} | {comp} | {mem} | {r.agreement:.2f} |"
        )
    return "\n".join(lines)


def generate_main(argv: list[str] | None = None) -> list[GenRow]:
    """``python -m llm.benchmark generate ...`` (see ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m llm.benchmark generate",
        description="Prefill/decode tok/s of ours and transformers generate, with roofline fractions.")
    parser.add_argument("--models", default="small_100m", help="comma-separated conf/model names (or 'tiny')")
    parser.add_argument("--batch", default="4", help="comma-separated batch sizes")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="override the preset's param_dtype and dtype")
    parser.add_argument("--kv-block", type=int, default=64, help="GenerationConfig.kv_block")
    parser.add_argument("--attention", choices=("auto", "xla", "cudnn", "chunked"), default=None,
                        help="Qwen3Config.attention_impl of ours (default: the preset's); xla / cudnn send the "
                             "cached prefill and the decode steps through jax.nn.dot_product_attention")
    parser.add_argument("--also-scan", action="store_true",
                        help="also time ours with unroll_layers=False (the layer scan inside the decode loop)")
    parser.add_argument("--eos-after", default=None,
                        help="comma-separated completion lengths cycled over the batch rows: adds a table of "
                             "ours' useful tok/s with rows finishing early against every row running to "
                             "--new-tokens (ours only; e.g. 4,16 or 16)")
    parser.add_argument("--peers", default="dynamic,static",
                        help="transformers cache implementations to compare ('' for none)")
    parser.add_argument("--bandwidth", type=float, default=None,
                        help="memory bandwidth in GB/s for the decode roofline (default: the known "
                             "accelerator's figure, else measured with a jitted 256 MiB sum)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak TFLOP/s for the prefill roofline (default: known accelerator's dense "
                             "bf16 figure, else a measured 1024^3 matmul in the model dtype)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where torch runs")
    parser.add_argument("--out", default=None, help="write rows and machine figures as JSON here")
    parser.add_argument("--memory", action="store_true",
                        help="only compile ours from abstract shapes and print XLA's memory analysis (no "
                             "weights allocated, nothing timed): e.g. --models qwen3_4b --dtype bfloat16 "
                             "--batch 256 --prompt-len 256 --new-tokens 256")
    parser.add_argument("--unroll", choices=("auto", "yes", "no"), default="auto",
                        help="with --memory: GenerationConfig.unroll_layers (auto: by layer bytes)")
    args = parser.parse_args(argv)

    if args.memory:
        unroll = {"auto": None, "yes": True, "no": False}[args.unroll]
        found = []
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            for batch in [int(b) for b in args.batch.split(",") if b.strip()]:
                m = generate_memory(name, batch=batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                                    dtype=args.dtype, kv_block=args.kv_block, unroll=unroll, attention=args.attention)
                gib = {k: m[k] / 2**30 for k in ("peak", "argument_size_in_bytes", "temp_size_in_bytes",
                                                  "output_size_in_bytes", "weights", "kv_cache")}
                print(f"{name} ({m['dtype']}) B={batch} P={args.prompt_len} N={args.new_tokens} "
                      f"unroll_layers={m['unroll_layers']} [{m['backend']}]: peak {gib['peak']:.2f} GiB = arguments "
                      f"{gib['argument_size_in_bytes']:.2f} + outputs {gib['output_size_in_bytes']:.3f} + temporaries "
                      f"{gib['temp_size_in_bytes']:.2f} (weights {gib['weights']:.2f}, K/V cache "
                      f"{gib['kv_cache']:.2f}); compiled in {m['compile_s']:.0f}s", flush=True)
                found.append(m)
        if args.out:
            write_json(args.out, found, indent=2)
        return []

    import jax
    import torch

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    kind = jax.devices()[0].device_kind
    known = next((v for k, v in ACCELERATORS.items() if k.lower() in kind.lower()), None)
    if args.bandwidth is not None:
        bandwidth, bw_src = args.bandwidth * 1e9, "stated (--bandwidth)"
    elif known is not None:
        bandwidth, bw_src = known[0], f"data sheet ({kind})"
    else:
        bandwidth, bw_src = measure_bandwidth(), "measured (jitted 256 MiB sum)"
    dtype_for_peak = args.dtype or _model_config(args.models.split(",")[0].strip()).dtype
    if args.peak_tflops is not None:
        peak, pk_src = args.peak_tflops * 1e12, "stated (--peak-tflops)"
    elif known is not None:
        peak, pk_src = known[1], f"data sheet dense bf16 ({kind})"
    else:
        peak, pk_src = measure_peak_flops(dtype_for_peak), f"measured (1024^3 {dtype_for_peak} matmul)"
    where = torch.cuda.get_device_name(0) if args.device == "gpu" else f"cpu, {threads} threads"
    print(f"jax {jax.__version__} on {kind}; torch {torch.__version__} on {where}")
    print(f"bandwidth {bandwidth / 1e9:.1f} GB/s [{bw_src}]; peak {peak / 1e12:.3f} TFLOP/s [{pk_src}]", flush=True)
    peers = tuple(p.strip() for p in args.peers.split(",") if p.strip())
    rows: list[GenRow] = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        for batch in [int(b) for b in args.batch.split(",") if b.strip()]:
            t0 = time.perf_counter()
            rows += bench_generate(name, batch=batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                                   repeats=args.repeats, peers=peers, dtype=args.dtype, bandwidth=bandwidth,
                                   peak_flops=peak, kv_block=args.kv_block, device=args.device,
                                   also_scan=args.also_scan, attention=args.attention)
            print(f"  {name} B={batch}: measured in {time.perf_counter() - t0:.0f}s", flush=True)
    print(format_generate(rows))
    early: list[EarlyFinishRow] = []
    if args.eos_after:
        schedule = [int(x) for x in args.eos_after.split(",") if x.strip()]
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            for batch in [int(b) for b in args.batch.split(",") if b.strip()]:
                early.append(bench_early_finish(name, batch=batch, prompt_len=args.prompt_len,
                                                new_tokens=args.new_tokens, schedule=schedule, repeats=args.repeats,
                                                dtype=args.dtype, kv_block=args.kv_block, attention=args.attention))
        print(format_early_finish(early))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        write_json(args.out, {"bandwidth": bandwidth, "bandwidth_source": bw_src, "peak_flops": peak,
                              "peak_source": pk_src, "device_kind": kind, "jax": jax.__version__,
                              "torch": torch.__version__, "rows": [dataclasses.asdict(r) for r in rows],
                              "early_finish": [dataclasses.asdict(r) for r in early]}, indent=2)
    return rows


def _preset_config(name: str, *, param_dtype: str | None, dtype: str | None, layers: int | None):
    """The :class:`llm.model.Qwen3Config` of preset ``name`` with dtype / depth overrides."""
    config = _model_config(name)
    changes: dict[str, Any] = {}
    if param_dtype is not None:
        changes["param_dtype"] = param_dtype
    if dtype is not None:
        changes["dtype"] = dtype
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers={layers} must be >= 1")
        changes["num_hidden_layers"] = layers
    return dataclasses.replace(config, **changes) if changes else config


def _model_state(config, seed: int):
    from flax import nnx

    from llm.model import Qwen3ForCausalLM

    return nnx.split(Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed)))


def _optimizer():
    """AdamW at a constant 1e-6 (no warmup: the first update already moves the weights)."""
    from llm.optim import make_optimizer
    from llm.train_config import OptimConfig

    return make_optimizer(OptimConfig(lr=1e-6, warmup_steps=0), 1000)


def _device_peak_bytes() -> int | None:
    """``peak_bytes_in_use`` of the first device, where the backend reports it (not the CPU)."""
    import jax

    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory statistics
        return None
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return int(stats["peak_bytes_in_use"])


def _sync(tree: Any) -> Any:
    import jax

    return jax.block_until_ready(tree)


def resolve_peak(peak_tflops: float | None, dtype: str) -> tuple[float, str]:
    """Peak FLOP/s for the MFU and where it comes from: stated, the data sheet of a known
    accelerator (dense bf16), or a measured 1024^3 matmul in ``dtype``."""
    import jax

    if peak_tflops is not None:
        if not peak_tflops > 0:
            raise ValueError(f"--peak-tflops={peak_tflops} must be > 0")
        return peak_tflops * 1e12, "stated (--peak-tflops)"
    kind = jax.devices()[0].device_kind
    known = next((v for k, v in ACCELERATORS.items() if k.lower() in kind.lower()), None)
    if known is not None:
        return known[1], f"data sheet dense bf16 ({kind})"
    return measure_peak_flops(dtype), f"measured (1024^3 {dtype} matmul)"


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


# ============================================================================ train mode (one GRPO update)
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

    from llm import grpo
    from llm.grpo import GRPOLossConfig
    from llm.model import REMAT_POLICIES
    from llm.updates import make_grpo_update

    _check_positive(rows=rows, prompt_len=prompt_len, completion_len=completion_len, micro_batches=micro_batches,
                    repeats=repeats)
    if rows % micro_batches:
        raise ValueError(f"rows={rows} must be divisible by micro_batches={micro_batches}")
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat={remat!r} not in {REMAT_POLICIES}")
    config = _preset_config(name, param_dtype=param_dtype, dtype=dtype, layers=layers)
    graphdef, state = _model_state(config, seed)
    optimizer = _optimizer()
    opt_state = optimizer.init(state)
    rng = np.random.RandomState(seed)
    host = _random_batch(rng, config.vocab_size, rows, prompt_len, completion_len)
    batch = {k: jnp.asarray(v) for k, v in host.items()}
    loss_config = GRPOLossConfig()
    batch["weights"] = grpo.token_weights(batch["mask"], jnp.ones((rows,), bool), loss_config.aggregation)
    batch["advantages"] = jnp.asarray(rng.randn(rows).astype(np.float32))
    # the values do not change the work; a uniform-policy guess keeps the ratios moderate
    batch["old_logp"] = jnp.full((rows, completion_len), -float(np.log(config.vocab_size)), jnp.float32)
    update = make_grpo_update(graphdef, optimizer, loss_config, micro_batches=micro_batches,
                              compute_entropy=entropy, logprob_chunk=logprob_chunk, remat=remat)
    t0 = time.perf_counter()
    compiled = update.lower(state, opt_state, batch).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    state, opt_state, metrics = _sync(compiled(state, opt_state, batch))  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, opt_state, metrics = _sync(compiled(state, opt_state, batch))
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
        device_peak_bytes=_device_peak_bytes(), loss=float(metrics["loss"]), grad_norm=float(metrics["grad_norm"]),
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


# ============================================================================ grpo mode (one whole GRPO step)
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
    step_s: float  # best whole step
    sample_s: float  # best of each part
    old_logp_s: float
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


def bench_grpo_step(name: str, *, lakes: int, group_size: int, prompt_len: int, new_tokens: int,
                    micro_batches: int = 1, mu: int = 1, beta: float = 0.0, remat: str = "full",
                    logprob_chunk: int | None = 128, temperature: float = 1.0, kv_block: int = 64,
                    param_dtype: str | None = None, dtype: str | None = None, layers: int | None = None,
                    repeats: int = 2, peak_flops: float, seed: int = 0) -> StepRow:
    """Time one whole GRPO step of preset ``name`` (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    from llm import grpo
    from llm.generate import GenerationConfig, generate_ids
    from llm.grpo import GRPOLossConfig
    from llm.model import REMAT_POLICIES
    from llm.policy import copy_state
    from llm.updates import make_grpo_update, make_logprob_fn

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
    config = _preset_config(name, param_dtype=param_dtype, dtype=dtype, layers=layers)
    graphdef, state = _model_state(config, seed)
    ref_state = copy_state(state) if beta > 0 else None
    optimizer = _optimizer()
    opt_state = optimizer.init(state)
    loss_config = GRPOLossConfig(beta=beta)
    update = make_grpo_update(graphdef, optimizer, loss_config, micro_batches=micro_batches,
                              temperature=temperature, logprob_chunk=logprob_chunk, remat=remat)
    logprob_fn = make_logprob_fn(graphdef, temperature=temperature, logprob_chunk=logprob_chunk)
    gen = GenerationConfig(max_new_tokens=new_tokens, temperature=temperature, eos_token_ids=(), pad_token_id=0,
                           kv_block=kv_block)
    rng = np.random.RandomState(seed)
    # one prompt per lake, repeated group_size times (as the trainer does)
    prompts = rng.randint(3, config.vocab_size, size=(lakes, prompt_len)).astype(np.int32)
    ids = jnp.asarray(np.repeat(prompts, group_size, axis=0))
    pmask = jnp.ones(ids.shape, bool)
    key = jax.random.PRNGKey(seed)

    def step(state, opt_state, i: int):
        times = {}
        t0 = time.perf_counter()
        tokens, cmask, _, _, _ = _sync(generate_ids((graphdef, state), ids, pmask, jax.random.fold_in(key, i), gen))
        t1 = time.perf_counter()
        seq = (ids, pmask, tokens, cmask)
        batch = {"prompt_ids": ids, "prompt_mask": pmask, "tokens": tokens, "mask": cmask,
                 "old_logp": _sync(logprob_fn(state, *seq))}
        t2 = time.perf_counter()
        if ref_state is not None:
            batch["ref_logp"] = _sync(logprob_fn(ref_state, *seq))
        t3 = time.perf_counter()
        batch["advantages"] = jnp.asarray(rng.randn(rows).astype(np.float32))
        batch["weights"] = grpo.token_weights(cmask, jnp.ones((rows,), bool), loss_config.aggregation)
        metrics = None
        for _ in range(mu):
            state, opt_state, metrics = update(state, opt_state, batch)
        metrics = jax.device_get(_sync(metrics))
        t4 = time.perf_counter()
        times.update(step=t4 - t0, sample=t1 - t0, old=t2 - t1, ref=t3 - t2, update=t4 - t3)
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
        device_peak_bytes=_device_peak_bytes(), grad_norm=float(metrics["grad_norm"]),
    )


def format_grpo(rows: list[StepRow]) -> str:
    """Markdown table of :func:`bench_grpo_step` rows (shares of the best step in brackets)."""
    head = ("| model | lakes x G | P + N | micro | mu | beta | step s | sampling s | old log-probs s "
            "| ref log-probs s | update s | sampled tokens/s | update MFU | compile s |")
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        sample, old, ref, upd = (f"{x:.3f} ({x / r.step_s:.0%})" for x in (r.sample_s, r.old_logp_s, r.ref_logp_s,
                                                                              r.update_s))
        lines.append(
            f"| {r.model} ({r.dtype}) | {r.lakes} x {r.group_size} | {r.prompt_len} + {r.new_tokens} "
            f"| {r.micro_batches} | {r.mu} | {r.beta:g} | {r.step_s:.3f} | {sample} | {old} | {ref} | {upd} "
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


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in str(text).split(",") if x.strip()]


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
    return args.dtype or _model_config(_names(args.models)[0]).dtype


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
    for name in _names(args.models):
        for micro in _ints(args.micro_batches):
            for remat in _names(args.remat):
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
    parser.add_argument("--micro-batches", type=int, default=1)
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
    for name in _names(args.models):
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


def main(argv: list[str] | None = None) -> list[Row] | list[GenRow] | list[TrainRow] | list[StepRow]:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["generate"]:
        return generate_main(argv[1:])
    if argv[:1] == ["train"]:
        return train_main(argv[1:])
    if argv[:1] == ["grpo"]:
        return grpo_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] + " (modes 'generate', 'train' and "
                                     "'grpo': see python -m llm.benchmark <mode> --help)")
    parser.add_argument("--models", default="tiny,small_100m", help="comma-separated conf/model names")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="where torch runs; JAX uses its default backend (set JAX_PLATFORMS)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)

    import jax
    import torch

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    where = torch.cuda.get_device_name(0) if args.device == "gpu" else f"cpu, {threads} threads"
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; torch {torch.__version__} on {where}")
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        t0 = time.perf_counter()
        rows.append(bench_model(name, args.batch, args.prompt_len, args.new_tokens, args.repeats, device=args.device))
        print(f"  {name}: measured in {time.perf_counter() - t0:.0f}s", flush=True)
    print(format_table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump([dict(dataclasses.asdict(r), prefill_ratio=r.prefill_ratio, decode_ratio=r.decode_ratio)
                       for r in rows], f, indent=2)
    return rows


if __name__ == "__main__":
    main()
