"""Generation throughput: ours (jitted JAX KV-cache loop) against ``transformers``' PyTorch
``generate`` on the same weights, device and lengths.

``python -m llm.benchmark generate ...`` (:func:`generate_main`, see ``--help`` and
docs/performance.md "Generation"): one preset and batch sizes, ours against transformers
with a dynamic and a static cache, timings interleaved per repeat, wall and process-CPU
seconds, the fraction of the roofline beside each rate (decode: bytes a step must read /
bandwidth; prefill: FLOPs / peak; :mod:`llm.benchmark.roofline`), compile time and XLA peak memory of
ours; ``--eos-after`` adds ours' useful tok/s with rows finishing early, ``--memory`` only
compiles from abstract shapes and prints XLA's memory analysis.

``python -m llm.benchmark`` with no mode (:func:`compare_main`) measures, for the tiny default
config and the ~100M config (``conf/model/tiny.yaml``, ``conf/model/small_100m.yaml``), on the
same machine in the same run, with the same weights (ours are copied into the torch model),
batch, prompt length and number of new tokens, greedy decoding with EOS disabled (every row
makes every token):

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
from llm.game.default import preset_config
from llm.model.attention import ATTENTION_IMPLS
from llm.benchmark.roofline import (best_of, csv_ints, csv_names, decode_bytes_per_step, prefill_flops, resolve_bandwidth,
                          resolve_peak, timed)


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


def _ours(model, ids: np.ndarray, new_tokens: int, repeats: int) -> tuple[float, float, np.ndarray]:
    import jax
    from flax import nnx

    from llm.generation.decode import GenerationConfig, generate_ids

    graphdef, state = nnx.split(model)
    mask = np.ones_like(ids, dtype=bool)

    def run(n: int):
        cfg = GenerationConfig(max_new_tokens=n, temperature=0.0, eos_token_ids=())
        out = generate_ids((graphdef, state), ids, mask, None, cfg)
        return jax.block_until_ready(out)[0]

    run(1), run(new_tokens)  # compile
    t1, _ = best_of(lambda: run(1), repeats)
    tn, tokens = best_of(lambda: run(new_tokens), repeats)
    return t1, tn, np.asarray(tokens)


def _theirs(model, ids: np.ndarray, new_tokens: int, repeats: int, device: str = "cpu") -> tuple[float, float, np.ndarray]:
    import torch

    from llm.model.hf_io import model_to_hf_tensors

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
    t1, _ = best_of(lambda: run(1), repeats)
    tn, out = best_of(lambda: run(new_tokens), repeats)
    return t1, tn, out[:, ids.shape[1]:].cpu().numpy()


def bench_model(name: str, batch: int, prompt_len: int, new_tokens: int, repeats: int, seed: int = 0,
                device: str = "cpu") -> Row:
    """Measure one config (see the module docstring)."""
    from flax import nnx

    from llm.model.qwen3 import Qwen3ForCausalLM

    config = preset_config(name)
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


def _ours_generate(model, ids: np.ndarray, new_tokens: int, kv_block: int, unroll: bool | None = None):
    """Compile ours (greedy, EOS off) for 1 and N new tokens ahead of time; return
    ``(run, compile_s, peak_bytes)`` where ``run(n)`` calls the compiled executable (the
    jitted ``_generate_core`` behind ``generate_ids``) and returns the tokens. ``compile_s``
    and ``peak_bytes`` (XLA ``memory_analysis``: arguments + outputs + temporaries - aliased)
    are those of the N-token function."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from llm.generation.decode import MAX_EOS_IDS, GenerationConfig, _generate_core, _unroll_layers

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

    from llm.model.hf_io import model_to_hf_tensors

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

    from llm.model.qwen3 import Qwen3ForCausalLM

    if new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens} must be >= 2 (decode is timed as tN - t1)")
    config = preset_config(name, dtype=dtype, param_dtype=dtype, attention_impl=attention)
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
            t1, c1, _ = timed(lambda: run(1))
            tn, cn, out = timed(lambda: run(new_tokens))
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

    from llm.generation.decode import GenerationConfig, generate_ids
    from llm.model.qwen3 import Qwen3ForCausalLM

    if not schedule or min(schedule) < 1 or max(schedule) > new_tokens:
        raise ValueError(f"--eos-after={schedule} must be integers in [1, new_tokens={new_tokens}]")
    config = preset_config(name, dtype=dtype, param_dtype=dtype, attention_impl=attention)
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
            best[w] = min(best[w], timed(lambda: run(w))[0])
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

    from llm.generation.decode import MAX_EOS_IDS, GenerationConfig, _generate_core, _unroll_layers
    from llm.model.qwen3 import Qwen3ForCausalLM

    config = preset_config(name, dtype=dtype, param_dtype=dtype, attention_impl=attention)
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
    parser.add_argument("--attention", choices=ATTENTION_IMPLS, default=None,
                        help="Qwen3Config.attention_impl of ours (default: the preset's): the prefill's causal "
                             "kernel; xla / cudnn also send the decode steps through jax.nn.dot_product_attention")
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
        for name in csv_names(args.models):
            for batch in csv_ints(args.batch):
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
    bandwidth, bw_src = resolve_bandwidth(None if args.bandwidth is None else args.bandwidth * 1e9)
    peak, pk_src = resolve_peak(args.peak_tflops, args.dtype or preset_config(csv_names(args.models)[0]).dtype)
    where = torch.cuda.get_device_name(0) if args.device == "gpu" else f"cpu, {threads} threads"
    print(f"jax {jax.__version__} on {kind}; torch {torch.__version__} on {where}")
    print(f"bandwidth {bandwidth / 1e9:.1f} GB/s [{bw_src}]; peak {peak / 1e12:.3f} TFLOP/s [{pk_src}]", flush=True)
    peers = tuple(csv_names(args.peers))
    rows: list[GenRow] = []
    for name in csv_names(args.models):
        for batch in csv_ints(args.batch):
            t0 = time.perf_counter()
            rows += bench_generate(name, batch=batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                                   repeats=args.repeats, peers=peers, dtype=args.dtype, bandwidth=bandwidth,
                                   peak_flops=peak, kv_block=args.kv_block, device=args.device,
                                   also_scan=args.also_scan, attention=args.attention)
            print(f"  {name} B={batch}: measured in {time.perf_counter() - t0:.0f}s", flush=True)
    print(format_generate(rows))
    early: list[EarlyFinishRow] = []
    if args.eos_after:
        schedule = csv_ints(args.eos_after)
        for name in csv_names(args.models):
            for batch in csv_ints(args.batch):
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


def compare_main(argv: list[str] | None = None, modes: str | None = None) -> list[Row]:
    """``python -m llm.benchmark`` with no mode: prefill and decode tok/s of ours against
    transformers' dynamic-cache ``generate`` for the tiny and ~100M presets (module docstring).
    ``modes``: the other modes, shown after the options by ``--help``
    (:func:`llm.benchmark.cli.modes_help`)."""
    parser = argparse.ArgumentParser(
        prog="python -m llm.benchmark", usage="%(prog)s [MODE] [options]", epilog=modes,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="With no MODE: ours against transformers generate, greedy, EOS off, for the tiny and\n"
                    "~100M presets; the options below are this comparison's.")
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
    for name in csv_names(args.models):
        t0 = time.perf_counter()
        rows.append(bench_model(name, args.batch, args.prompt_len, args.new_tokens, args.repeats, device=args.device))
        print(f"  {name}: measured in {time.perf_counter() - t0:.0f}s", flush=True)
    print(format_table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump([dict(dataclasses.asdict(r), prefill_ratio=r.prefill_ratio, decode_ratio=r.decode_ratio)
                       for r in rows], f, indent=2)
    return rows
