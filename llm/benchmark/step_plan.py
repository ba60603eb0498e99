"""The step plan: XLA's memory analysis of every phase of one GRPO step, compiled from abstract
shapes (``python -m llm.memory --plan [--tokenizer DIR] [--layers auto|full|L1,L2] <Hydra overrides>``).

The overrides of ``python -m jaxlake.run`` (e.g. ``+recipe=paper_qwen3_4b``, composed from
``jaxlake.conf``) pick the run; :func:`build_plan` compiles every phase of one of its GRPO steps
with the trainer's own functions -- each sampling phase (reasoning: think, then answer) as the
call ``generate_ids`` makes and its prefill and decode loop apart, the reference's log-probs
(``beta > 0``), the update with its micro-batches -- from ``jax.ShapeDtypeStruct`` arguments only (no
parameter is ever allocated), and prints for each what the trainer holds beside it, its
arguments, outputs, temporaries, peak and largest buffers, then a verdict for one 80 GB GPU, one
H200, one 24 GiB GPU (``XLA_PYTHON_CLIENT_MEM_FRACTION`` stated) and ``fsdp = N`` on 16 GB TPU
chips, sampling in the row blocks the sampler would choose on each (:class:`StepPlan`). Deep
models are compiled at a layer cut and extrapolated per layer (stated in the output); a 2-3
layer cut of a 4B model compiles in minutes on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from llm.benchmark.memory import GIB


#: Devices of the verdict: (name, bytes of memory, share JAX may use). GPUs take
#: ``XLA_PYTHON_CLIENT_MEM_FRACTION`` of their memory (JAX's default 0.75; the plan states
#: 0.95, the value to export for these runs); a TPU chip's HBM is the runtime's.
GPU_MEM_FRACTION = 0.95
TPU_CHIP_BYTES = 16 * GIB
TPU_FSDP = (1, 2, 4, 8, 16, 32, 64)


@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator of the verdict: its memory and the share JAX may fill."""

    name: str
    memory_bytes: int
    fraction: float

    @property
    def usable_bytes(self) -> int:
        return int(self.memory_bytes * self.fraction)


DEVICES = (
    Device("one 80 GB GPU (A100 / H100)", 80 * 10**9, GPU_MEM_FRACTION),
    Device("one H200 (141 GB)", 141 * 10**9, GPU_MEM_FRACTION),
    Device("one 24 GB GPU (24 GiB: L4, RTX 4090)", 24 * GIB, GPU_MEM_FRACTION),
)


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One buffer live at a compiled call's peak (XLA's buffer live ranges)."""

    name: str
    shape: str
    bytes: int


@dataclasses.dataclass(frozen=True)
class Phase:
    """One compiled phase of a GRPO step and its memory (bytes; XLA's ``memory_analysis()``).

    Attributes:
      name: what runs (``think: call``, ``reference log-probs``, ``update``, ...).
      calls: how many times one step runs it.
      rows: the rows of one call.
      resident_bytes: device arrays the trainer holds beside the call's arguments (AdamW
        moments while sampling, the reference while updating, ...).
      argument_bytes / output_bytes / temp_bytes: the call's arguments, outputs not written
        into donated arguments, and temporaries.
      depth_temp_bytes: the temporaries that grow with depth (per-layer slope x layers; 0
        when compiled at full depth, which does not separate them).
      layers: the depths compiled (``(L,)`` full depth, ``(1, 2)`` a cut extrapolated per layer).
      largest: the largest buffers live at the peak (of the deepest compile).
      compile_s: seconds of compilation.
      verdict_only: a sampling call at a row block, compiled for a device's verdict (not a
        row of the table).
      info: a part of a phase shown apart (the prefill and the decode loop of a sampling
        call): in the table, not in the verdict (the call it belongs to is).
    """

    name: str
    calls: int
    rows: int
    resident_bytes: int
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    depth_temp_bytes: int
    layers: tuple[int, ...]
    largest: tuple[Buffer, ...]
    compile_s: float
    verdict_only: bool = False
    info: bool = False

    @property
    def peak_bytes(self) -> int:
        return self.resident_bytes + self.argument_bytes + self.output_bytes + self.temp_bytes

    @property
    def flat_temp_bytes(self) -> int:
        """Temporaries that do not grow with depth."""
        return self.temp_bytes - self.depth_temp_bytes

    def row(self) -> dict[str, Any]:
        return {"phase": self.name, "calls": self.calls, "rows": self.rows,
                "resident_gib": _gib(self.resident_bytes), "arguments_gib": _gib(self.argument_bytes),
                "outputs_gib": _gib(self.output_bytes), "temporaries_gib": _gib(self.temp_bytes),
                "temporaries_flat_gib": _gib(self.flat_temp_bytes), "peak_gib": _gib(self.peak_bytes),
                "layers_compiled": list(self.layers), "compile_s": round(self.compile_s, 1),
                "largest": [{"name": b.name, "shape": b.shape, "gib": _gib(b.bytes)} for b in self.largest]}


def _gib(n: float) -> float:
    return round(n / GIB, 3)


def _size(n: float) -> str:
    """Bytes for the table: GiB from 1 GiB up, MiB below."""
    return f"{n / GIB:.2f}" if abs(n) >= GIB else f"{n / 2**20:.0f} MiB"


@dataclasses.dataclass(frozen=True)
class StepShapes:
    """The shapes of one GRPO step as the trainer runs it.

    ``rows = lakes_per_step x group_size`` completions after ``prompt`` prompt tokens; in
    reasoning mode a think phase of ``think`` tokens, ``forced`` forced-close tokens and an
    answer phase of ``answer`` tokens (completion ``think + forced + answer``), else one phase
    of ``answer`` tokens.
    """

    rows: int
    prompt: int
    answer: int
    think: int = 0
    forced: int = 0

    @property
    def completion(self) -> int:
        return self.think + self.forced + self.answer if self.think else self.answer


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """The memory plan of one GRPO step: the setting, the phases and the verdicts."""

    title: str
    model: Any  # Qwen3Config (full depth)
    shapes: StepShapes
    micro_batches: int
    mu: int
    beta: float
    state_bytes: int
    opt_state_bytes: int
    phases: tuple[Phase, ...]
    row_blocks: dict  # device name -> {phase name: rows per call} (sampling phases that had to be cut)
    notes: tuple[str, ...]

    def peak(self, phases: Optional[Sequence[Phase]] = None) -> int:
        """The largest peak of the phases that run (default: each at the whole batch)."""
        phases = phases or [p for p in self.phases if not (p.verdict_only or p.info)]
        return max(p.peak_bytes for p in phases)

    def fits(self, device: Device) -> tuple[bool, int]:
        """``(every phase fits, the step's peak)`` on one ``device``, sampling in the row blocks
        chosen for it."""
        phases = self.device_phases(device)
        peak = self.peak(phases)
        return peak <= device.usable_bytes, peak

    def device_phases(self, device: Device) -> list[Phase]:
        """The phases as they run on ``device``: a sampling phase cut into row blocks where
        the whole batch does not fit (:func:`llm.generation.row_blocks.choose_row_block`)."""
        cut = self.row_blocks.get(device.name, {})
        return [cut.get(p.name, p) for p in self.phases if not (p.verdict_only or p.info)]

    def tpu_fsdp(self) -> Optional[int]:
        """The smallest ``fsdp = N`` whose per-chip estimate fits a 16 GB TPU chip: every
        phase's bytes / N plus one layer's float32 weights gathered twice (the forward and
        the prefetch of the next). An estimate from the one-device compile, not a sharded
        compile."""
        layer = _layer_bytes(self.model)
        for n in TPU_FSDP:
            if all(p.peak_bytes / n + 2 * layer <= TPU_CHIP_BYTES * GPU_MEM_FRACTION
                   for p in self.phases if not (p.verdict_only or p.info)):
                return n
        return None

    def to_dict(self) -> dict[str, Any]:
        verdicts = {}
        for d in DEVICES:
            ok, peak = self.fits(d)
            verdicts[d.name] = {"fits": ok, "peak_gib": _gib(peak), "usable_gib": _gib(d.usable_bytes),
                                "row_blocks": {k: v.rows for k, v in self.row_blocks.get(d.name, {}).items()}}
        return {"title": self.title, "rows": self.shapes.rows, "prompt": self.shapes.prompt,
                "think": self.shapes.think, "forced": self.shapes.forced, "answer": self.shapes.answer,
                "micro_batches": self.micro_batches, "mu": self.mu, "beta": self.beta,
                "state_gib": _gib(self.state_bytes), "opt_state_gib": _gib(self.opt_state_bytes),
                "phases": [p.row() for p in self.phases if not p.verdict_only], "verdicts": verdicts,
                "tpu_fsdp_16gb": self.tpu_fsdp(), "gpu_mem_fraction": GPU_MEM_FRACTION, "notes": list(self.notes)}

    def table(self) -> str:
        """The plan as text: the setting, one line per phase, the verdicts, the notes."""
        s, c = self.shapes, self.model
        lines = [f"# {self.title}",
                 f"model: {c.num_hidden_layers} layers, {c.num_parameters() / 1e9:.2f} B parameters, "
                 f"{c.param_dtype} weights / {c.dtype} compute, attention {c.attention_impl}",
                 f"step: {s.rows} rows, prompt {s.prompt}, "
                 + (f"think {s.think} + forced {s.forced} + answer {s.answer}" if s.think else f"answer {s.answer}")
                 + f" tokens; update in {self.micro_batches} micro-batches x mu = {self.mu}; beta = {self.beta}",
                 f"state {_size(self.state_bytes)} (weights) + {_size(self.opt_state_bytes)} (AdamW moments)"
                 + (f" + {_size(self.state_bytes)} (reference)" if self.beta > 0 else "") + " (GiB unless marked)",
                 "",
                 "| phase | calls | rows | resident | arguments | outputs | temporaries (flat) | peak | largest buffers at the peak |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        # (rows in parentheses are parts shown apart, not in the verdict: the prefill and the decode
        # loop of the sampling call below them; a log-prob forward over one micro-batch)
        for p in self.phases:
            if p.verdict_only:
                continue
            big = ", ".join(f"{b.shape} {_size(b.bytes)}" for b in p.largest[:3])
            name = f"({p.name})" if p.info else p.name
            lines.append(f"| {name} | {p.calls} | {p.rows} | {_size(p.resident_bytes)} | {_size(p.argument_bytes)} | "
                         f"{_size(p.output_bytes)} | {_size(p.temp_bytes)} ({_size(p.flat_temp_bytes)}) | "
                         f"**{_size(p.peak_bytes)}** | {big} |")
        lines += ["", "(Rows in parentheses are parts compiled apart and left out of the verdict: the prefill "
                  "and the decode loop of the sampling call below them.)",
                  "", f"Verdict (GiB; GPUs at XLA_PYTHON_CLIENT_MEM_FRACTION={GPU_MEM_FRACTION}):", ""]
        for d in DEVICES:
            ok, peak = self.fits(d)
            cut = self.row_blocks.get(d.name, {})
            how = "" if not cut else " (sampling in row blocks: " + ", ".join(
                f"{k} {v.rows} rows x {s.rows // v.rows}" for k, v in cut.items()) + ")"
            over = [p.name for p in self.device_phases(d) if p.peak_bytes > d.usable_bytes]
            verdict = "fits" if ok else "does NOT fit (" + ", ".join(over) + ")"
            lines.append(f"- {d.name}, {_size(d.usable_bytes)} usable: {verdict}, peak {_size(peak)}{how}")
        n = self.tpu_fsdp()
        lines.append(f"- 16 GB TPU chips: fsdp = {n} (estimate: phase / N + 2 gathered layers)" if n else
                     "- 16 GB TPU chips: more than fsdp = 64")
        if self.notes:
            lines += [""] + [f"note: {x}" for x in self.notes]
        return "\n".join(lines)


def _layer_bytes(config) -> int:
    """Float32 bytes of one decoder layer's weights (what an FSDP shard gathers per layer)."""
    c = config
    emb = c.vocab_size * c.hidden_size
    head = 0 if c.tie_word_embeddings else emb
    per_layer = (c.num_parameters() - emb - head - c.hidden_size) / c.num_hidden_layers
    return int(per_layer * 4)


def _tree_bytes(tree: Any) -> int:
    return int(sum(x.size * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


# ------------------------------------------------------------------------------- compiling
@dataclasses.dataclass(frozen=True)
class _Compiled:
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    largest: tuple[Buffer, ...]
    seconds: float


def _compile(lowered, top: int = 6) -> _Compiled:
    """Compile and read XLA's memory analysis, and the largest buffers live at the peak from
    its buffer live ranges (an XLA dump of this one compilation)."""
    with tempfile.TemporaryDirectory(prefix="llm-memory-") as dump:
        t0 = time.perf_counter()
        try:
            compiled = lowered.compile(compiler_options={"xla_dump_to": dump})
        except Exception:  # noqa: BLE001 - a backend without per-compile dump options
            compiled = lowered.compile()
        seconds = time.perf_counter() - t0
        largest = _peak_buffers(Path(dump), top)
    m = compiled.memory_analysis()
    out = max(int(m.output_size_in_bytes) - int(m.alias_size_in_bytes), 0)
    return _Compiled(int(m.argument_size_in_bytes), out, int(m.temp_size_in_bytes), largest, seconds)


def _peak_buffers(dump: Path, top: int) -> tuple[Buffer, ...]:
    """The ``top`` largest buffers of XLA's "Live ranges at ... (peak)" list, with their shapes
    from the buffer assignment; empty when the dump has neither (another XLA version)."""
    import re

    ranges = sorted(dump.glob("*after_optimizations-live-range.txt"), key=lambda p: p.stat().st_size)
    assigns = sorted(dump.glob("*after_optimizations-buffer-assignment.txt"), key=lambda p: p.stat().st_size)
    if not ranges or not assigns:
        return ()
    text = ranges[-1].read_text()
    at = text.find("(peak):")
    if at < 0:
        return ()
    shapes = {}
    for m in re.finditer(r"value: <\d+ (\S+) @\d+> \(size=\d+,offset=\d+\): (\S+)", assigns[-1].read_text()):
        shapes.setdefault(m.group(1).removesuffix("{}"), m.group(2).split("{")[0])
    found = []
    for m in re.finditer(r"^\s+(\S+?): (\d+) bytes", text[at:].split("Stack trace")[0], re.M):
        name = m.group(1).removesuffix("{}")
        found.append(Buffer(name, shapes.get(name, "?"), int(m.group(2))))
    found.sort(key=lambda b: -b.bytes)
    return tuple(found[:top])


def _measure(build: Callable[[int], Any], layers: int, cut: Optional[tuple[int, int]]) -> tuple:
    """``(arguments, outputs, temporaries, depth temporaries, layers compiled, largest, seconds)``
    of ``build(depth)`` (a ``Lowered``), at full depth or extrapolated from a cut
    ``(l1, l2)``: every size grows linearly with the layers (one more layer of weights,
    cache and per-layer buffers); the slope times the depth is the part that grows."""
    if cut is None:
        c = _compile(build(layers))
        return c.argument_bytes, c.output_bytes, c.temp_bytes, 0, (layers,), c.largest, c.seconds
    l1, l2 = cut
    a, b = _compile(build(l1)), _compile(build(l2))

    def extrapolate(x1, x2):
        slope = (x2 - x1) / (l2 - l1)
        return int(round(x1 + slope * (layers - l1))), slope

    args, _ = extrapolate(a.argument_bytes, b.argument_bytes)
    outs, _ = extrapolate(a.output_bytes, b.output_bytes)
    temps, slope = extrapolate(a.temp_bytes, b.temp_bytes)
    depth = int(round(max(slope, 0.0) * layers))
    return args, outs, temps, min(depth, temps), (l1, l2), b.largest, a.seconds + b.seconds


def step_shapes(train, reasoning, prompt_tokens: int, forced_tokens: int) -> StepShapes:
    """The step's shapes from the typed settings (``TrainConfig``, ``ReasoningConfig``)."""
    gc = train.grpo
    if reasoning.enabled:
        return StepShapes(gc.rows, prompt_tokens, gc.max_new_tokens, reasoning.thinking_tokens, forced_tokens)
    return StepShapes(gc.rows, prompt_tokens, gc.max_new_tokens)


PHASE_GROUPS = ("sampling", "log-probs", "update")
SAMPLING_PARTS = ("prefill", "decode", "call")


def build_plan(model_config, train, reasoning, shapes: StepShapes, *, cut: Optional[tuple[int, int]] = None,
               title: str = "GRPO step", row_block_devices: Sequence[Device] = DEVICES,
               groups: Sequence[str] = PHASE_GROUPS, sampling_parts: Sequence[str] = SAMPLING_PARTS,
               progress: Callable[[str], None] = lambda _: None) -> StepPlan:
    """Compile every phase of one GRPO step from abstract shapes with the trainer's own
    functions and read the compiler's memory analysis of each.

    * sampling (:func:`llm.generation.lowering.lower_sampling`, the functions ``generate_ids``
      runs): each phase (reasoning: think, then answer from ``prompt + think + forced``) as
      the whole call, its prefill and its decode loop; resident beside it: the AdamW moments
      (and the reference when ``beta > 0``);
    * when ``beta > 0``, the reference's log-probs (:func:`llm.rl.updates.make_logprob_fn`
      over the step's micro-batches); resident: the moments and the policy. No old log-prob
      forward: the trainer has none (the first update is on-policy);
    * the update (the one jitted update of :class:`llm.rl.updates.GRPOIterations`, run ``mu``
      times, with the step's micro-batches; its state and moments are donated); resident:
      the reference.

    ``cut=(l1, l2)`` compiles ``l1`` and ``l2`` layers and extrapolates per layer (4B-sized
    graphs compile in seconds at 2-3 layers, minutes at full depth). A sampling phase whose
    whole batch does not fit a device of ``row_block_devices`` is compiled again at the
    divisors of the batch, largest first, until one fits (the rows the sampler's
    ``row_block=None`` picks there, :func:`llm.generation.row_blocks.choose_row_block`).
    ``groups`` (of :data:`PHASE_GROUPS`) and ``sampling_parts`` (of :data:`SAMPLING_PARTS`)
    select what is compiled (the tests compile a part).
    """
    from flax import nnx

    from llm.generation.decode import GenerationConfig, _unroll_layers
    from llm.generation.lowering import lower_sampling
    from llm.model.qwen3 import Qwen3ForCausalLM
    from llm.rl.batches import GRPOBatch
    from llm.rl.optim import make_optimizer
    from llm.generation.row_blocks import ROW_BLOCK_HEADROOM, choose_row_block
    from llm.rl.updates import GRPOIterations, make_logprob_fn

    gc, lc = train.grpo, train.grpo.loss
    layers = model_config.num_hidden_layers
    if cut is not None and not (1 <= cut[0] < cut[1] < layers):
        cut = None  # shallow enough to compile whole

    def split(depth: int):
        cfg = dataclasses.replace(model_config, num_hidden_layers=depth)
        return nnx.split(nnx.eval_shape(lambda: Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))))

    optimizer = make_optimizer(gc.optim, max(gc.steps * gc.mu, 1))
    _, full_state = split(layers)
    state_bytes = _tree_bytes(full_state)
    opt_bytes = _tree_bytes(jax.eval_shape(optimizer.init, full_state))
    ref_bytes = state_bytes if lc.use_reference else 0
    gen = GenerationConfig(max_new_tokens=gc.max_new_tokens, temperature=gc.temperature, top_k=gc.top_k,
                           top_p=gc.top_p)
    unroll = _unroll_layers(gen, full_state)
    sds = jax.ShapeDtypeStruct
    b, p, t = shapes.rows, shapes.prompt, shapes.completion
    phases: list[Phase] = []

    def add(name, calls, rows, resident, build, verdict_only=False, info=False):
        progress(name)
        args, outs, temps, depth, cuts, largest, secs = _measure(build, layers, cut)
        phase = Phase(name, calls, rows, resident, args, outs, temps, depth, cuts, largest, secs, verdict_only, info)
        if not verdict_only:
            phases.append(phase)
        return phase

    # ---- sampling
    sampling = [("sample", p, gen)] if not shapes.think else [
        ("think", p, dataclasses.replace(gen, max_new_tokens=shapes.think)),
        ("answer", p + shapes.think + shapes.forced, gen)]
    calls_of: dict[str, Any] = {}
    for label, plen, cfg in (sampling if "sampling" in groups else ()):
        for part in sampling_parts:
            def build(depth, plen=plen, cfg=cfg, part=part, rows=b):
                graphdef, state = split(depth)
                return lower_sampling(graphdef, state, rows, plen, cfg, part, unroll_layers=unroll)

            phase = add(f"{label}: {part}", 1, b, opt_bytes + ref_bytes, build, info=part != "call")
            if part == "call":
                calls_of[phase.name] = (phase, plen, cfg)

    # ---- the reference's log-probs (beta > 0); the trainer computes no old log-probs: the
    # first of the mu updates is on-policy and returns them (GRPOIterations)
    seqs = (sds((b, p), jnp.int32), sds((b, p), jnp.bool_), sds((b, t), jnp.int32), sds((b, t), jnp.bool_))
    batch_bytes = b * t * (4 + 4) + b * 4  # weights, old log-probs, advantages held beside the forward

    def logprob_build(depth):
        graphdef, state = split(depth)
        return make_logprob_fn(graphdef, temperature=gc.temperature, logprob_chunk=gc.logprob_chunk,
                               micro_batches=gc.micro_batches).lower(state, *seqs)

    if "log-probs" in groups and lc.use_reference:
        add("reference log-probs", 1, b, opt_bytes + state_bytes + batch_bytes, logprob_build)

    # ---- the mu updates: calls of GRPOIterations' one jitted update (state and moments donated;
    # it also returns the on-policy log-probs, the old log-probs of updates 2 .. mu)
    def update_build(depth):
        graphdef, state = split(depth)
        opt_state = jax.eval_shape(optimizer.init, state)
        batch = GRPOBatch(prompt_ids=seqs[0], prompt_mask=seqs[1], tokens=seqs[2], mask=seqs[3],
                          weights=sds((b, t), jnp.float32), advantages=sds((b,), jnp.float32),
                          old_logp=sds((b, t), jnp.float32),
                          ref_logp=sds((b, t), jnp.float32) if lc.use_reference else None)
        iterations = GRPOIterations(graphdef, optimizer, lc, mu=gc.mu, micro_batches=gc.micro_batches,
                                    compute_entropy=gc.compute_entropy, mesh=None, temperature=gc.temperature,
                                    logprob_chunk=gc.logprob_chunk, remat=gc.remat)
        return iterations.update.lower(state, opt_state, batch, sds((), jnp.bool_))

    if "update" in groups:
        add(f"update ({gc.micro_batches} x {b // gc.micro_batches} rows)", gc.mu, b, ref_bytes, update_build)

    # row blocks where the whole batch does not fit a device
    row_blocks: dict[str, dict[str, Phase]] = {}
    for device in row_block_devices:
        if state_bytes + opt_bytes + ref_bytes > device.usable_bytes:
            continue  # the state alone does not fit: no row block helps
        for name, (phase, plen, cfg) in calls_of.items():
            # what the sampler may fill: ROW_BLOCK_HEADROOM of the memory left beside the
            # resident arrays and the call's arguments (llm.generation.row_blocks.auto_row_block)
            budget = int((device.usable_bytes - phase.resident_bytes - phase.argument_bytes) * ROW_BLOCK_HEADROOM)
            if phase.peak_bytes - phase.resident_bytes - phase.argument_bytes <= budget:
                continue  # the whole batch in one call, as the sampler would
            tried: dict[int, Phase] = {b: phase}

            def need(rows, plen=plen, cfg=cfg, name=name, tried=tried):
                if rows not in tried:
                    def build(depth, rows=rows):
                        graphdef, state = split(depth)
                        return lower_sampling(graphdef, state, rows, plen, cfg, "call", unroll_layers=unroll)

                    tried[rows] = add(f"{name} ({rows} rows)", b // rows, rows, opt_bytes + ref_bytes, build,
                                      verdict_only=True)
                return tried[rows].peak_bytes - tried[rows].resident_bytes - tried[rows].argument_bytes

            rows = choose_row_block(b, need, budget)
            # none fits: the smallest block compiled stands for it (over the limit in the verdict)
            row_blocks.setdefault(device.name, {})[name] = tried[rows if rows is not None else min(tried)]

    notes = []
    if cut is not None:
        notes.append(f"compiled at {cut[0]} and {cut[1]} layers and extrapolated per layer to {layers} "
                     "(every size is linear in the depth); 'flat' temporaries do not grow with depth")
    if jax.default_backend() == "cpu" and model_config.dtype == "bfloat16":
        notes.append("compiled for this CPU, whose XLA computes bfloat16 dots in float32 (it adds float32 "
                     "copies of dot operands an accelerator does not make): an upper bound for a GPU")
    return StepPlan(title, model_config, shapes, gc.micro_batches, gc.mu, lc.beta, state_bytes, opt_bytes,
                    tuple(phases), row_blocks, tuple(notes))


# ------------------------------------------------------------------------------- from Hydra
def compose_config(overrides: Sequence[str]):
    """The Hydra config ``python -m jaxlake.run <overrides>`` would run with (``jaxlake.conf``);
    a required ``model.path`` left unset (``???``, the paper recipes) becomes ``None``: the
    plan needs shapes, not weights."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from jaxlake.conf import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=list(overrides))
    if "model" in cfg and OmegaConf.is_missing(cfg.model, "path"):
        with open_dict(cfg):
            cfg.model.path = None
    return cfg


def model_of(model) -> Any:
    """The :class:`llm.model.config.Qwen3Config` a stage would train (``ModelConfig``): a
    folder's ``config.json`` when ``model.path`` exists, else the group's architecture."""
    from llm.model.config import Qwen3Config

    if model.path and (Path(model.path) / "config.json").is_file():
        import json as _json

        config = Qwen3Config.from_hf_dict(_json.loads((Path(model.path) / "config.json").read_text()))
        return dataclasses.replace(config, **model.precision())
    return Qwen3Config.from_dict({**model.architecture, **model.precision()})


def plan_from_overrides(overrides: Sequence[str], *, prompt_tokens: Optional[int] = None,
                        tokenizer: Optional[str] = None, cut: Any = "auto",
                        progress: Callable[[str], None] = lambda _: None) -> StepPlan:
    """:func:`build_plan` of the run ``python -m jaxlake.run <overrides>`` would start.

    ``prompt_tokens``: the padded prompt length ``P``. Default: ``train.max_prompt_tokens``
    when set; else, with a tokenizer, the prompt the trainer fits (:class:`llm.game.prompter.
    Prompter`, bucketed by ``train.prompt_bucket``) to 64 lakes of the run's largest canvas
    (``env``'s ``max_height x max_width`` with ``max_agents``: the longest prompt any stage can
    see); without one :data:`DEFAULT_PROMPT_TOKENS`. ``tokenizer`` (a folder; default
    ``model.path``'s) also counts the forced-close tokens of reasoning mode (else
    :data:`DEFAULT_FORCED_TOKENS`, Qwen3's count).
    ``cut``: ``"auto"`` (layer cut :data:`AUTO_CUT` beyond :data:`FULL_DEPTH_MAX` layers),
    ``None`` (full depth) or ``(l1, l2)``.
    """
    from llm.training.config import StageConfig

    cfg = compose_config(overrides)
    stage = StageConfig.from_cfg(cfg)
    train = stage.train
    reasoning = train.prompt.reasoning
    model = model_of(stage.model)
    notes = []
    folder = tokenizer or stage.model.path
    tok = None
    if folder and Path(folder).is_dir():
        from llm.model.hf_io import load_tokenizer

        tok = load_tokenizer(folder)
    if prompt_tokens is None:
        prompt_tokens = train.max_prompt_tokens
    if prompt_tokens is None and tok is not None and cfg_has_env(cfg):
        try:
            prompt_tokens, canvas = longest_prompt(tok, train, cfg.env)
            notes.append(f"prompt: {prompt_tokens} tokens, the trainer's fit to 64 lakes of the largest canvas "
                         f"({canvas}) with this tokenizer")
        except (TypeError, ValueError) as err:  # an env that is not one LakeConfig (a mixture)
            notes.append(f"prompt length not measured ({err})")
    if prompt_tokens is None:
        prompt_tokens = DEFAULT_PROMPT_TOKENS
        notes.append(f"prompt length {prompt_tokens} tokens assumed (train.max_prompt_tokens is null: the "
                     "trainer fits it to the stage's longest held-out prompt); --tokenizer measures it, "
                     "--prompt-tokens sets it")
    forced = 0
    if reasoning.enabled:
        if tok is not None:
            forced = len(tok.encode(reasoning.close_text, add_special_tokens=False))
        else:
            forced = DEFAULT_FORCED_TOKENS
            notes.append(f"forced close = {forced} tokens (Qwen3's count of {reasoning.close_text!r}); "
                         "--tokenizer counts it")
    if cut == "auto":
        cut = AUTO_CUT if model.num_hidden_layers > FULL_DEPTH_MAX else None
    shapes = step_shapes(train, reasoning, prompt_tokens, forced)
    title = "python -m llm.memory --plan " + " ".join(overrides)
    plan = build_plan(model, train, reasoning, shapes, cut=cut, title=title, progress=progress)
    return dataclasses.replace(plan, notes=plan.notes + tuple(notes))


def cfg_has_env(cfg) -> bool:
    return "env" in cfg and cfg.env is not None


def longest_prompt(tokenizer, train, env_node) -> tuple[int, str]:
    """``(P, canvas)``: the padded prompt length the trainer fits (:class:`llm.game.prompter.
    Prompter`) to 64 lakes of the largest canvas of ``env`` (``max_height x max_width``,
    ``max_agents`` agents)."""
    from jaxlake.config import LakeConfig, to_plain
    from llm.game.lakes import sample_lakes
    from llm.game.prompter import Prompter

    fields = {k: v for k, v in to_plain(env_node).items() if k in LakeConfig.__dataclass_fields__}
    env = LakeConfig(**fields)
    big = LakeConfig(**{**fields, "height": env.max_height, "width": env.max_width, "num_agents": env.max_agents})
    lakes = sample_lakes(jax.random.PRNGKey(0), big, 64)
    prompter = Prompter.fit(tokenizer, train.prompt, lakes, train.max_prompt_tokens, train.prompt_bucket)
    return int(prompter.encode(lakes)[0].shape[1]), f"{big.height}x{big.width}, {big.num_agents} agents"


#: Prompt tokens assumed when the config does not fix them and no tokenizer is given (the
#: issue's shape; Qwen3's tokenizer gives 320 for the recipes' first stage, 448 at their
#: largest canvas).
DEFAULT_PROMPT_TOKENS = 384
#: Qwen3's token count of the default forced close ``"\n</think>\n\n"`` (``\n``, ``</think>``, ``\n\n``).
DEFAULT_FORCED_TOKENS = 3
#: ``cut="auto"`` compiles models of at most this many layers at full depth.
FULL_DEPTH_MAX = 8
#: The layer cut of ``cut="auto"``: 2 and 3 layers (a one-layer scan is a loop of one trip,
#: which XLA simplifies away: its buffers are not the deeper models').
AUTO_CUT = (2, 3)


def plan_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm.memory --plan",
                                     description="The memory plan of one GRPO step, compiled phase by phase.")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="padded prompt length P")
    parser.add_argument("--tokenizer", default=None,
                        help="a tokenizer folder: measures the prompt on the run's largest canvas, counts the "
                             "forced close (default: model.path's)")
    parser.add_argument("--layers", default="auto",
                        help="auto (2,3 beyond 8 layers) | full | L1,L2 (a layer cut, extrapolated per layer)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m jaxlake.run")
    args = parser.parse_args(list(argv))
    cut: Any = args.layers
    if cut == "full":
        cut = None
    elif cut != "auto":
        try:
            cut = tuple(int(x) for x in cut.split(","))
            assert len(cut) == 2 and 1 <= cut[0] < cut[1]
        except (ValueError, AssertionError):
            parser.error(f"--layers={args.layers!r} must be auto, full or two depths L1,L2 with 1 <= L1 < L2")
    if args.prompt_tokens is not None and args.prompt_tokens < 1:
        parser.error(f"--prompt-tokens={args.prompt_tokens} must be >= 1")
    plan = plan_from_overrides(args.overrides, prompt_tokens=args.prompt_tokens, tokenizer=args.tokenizer, cut=cut,
                               progress=lambda name: print(f"compiling {name} ...", file=sys.stderr, flush=True))
    plan = dataclasses.replace(plan, title="python -m llm.memory --plan " + " ".join(argv))
    print(json.dumps(plan.to_dict()) if args.json else plan.table())
    return 0
