"""What the hardware can do and what a model step must cost: the figures beside every rate of
``python -m llm.benchmark``.

* :data:`ACCELERATORS`: data-sheet memory bandwidth and dense bf16 peak of known devices;
  :func:`resolve_bandwidth` / :func:`resolve_peak` take a stated figure, else the data sheet,
  else a measurement (:func:`measure_bandwidth`, :func:`measure_peak_flops`).
* :func:`decode_bytes_per_step` (weights once + the filled K/V prefix) and
  :func:`prefill_flops`: the roofline numerators.
* :func:`timed`, :func:`best_of`, :func:`sync`, :func:`device_peak_bytes`: timing and memory
  probes shared by the benchmark modes (and :func:`csv_names` / :func:`csv_ints` for their
  comma-separated options).
"""

from __future__ import annotations

import time
from typing import Any, Callable

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


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """``(wall seconds, process CPU seconds, result)`` of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def best_of(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def sync(tree: Any) -> Any:
    import jax

    return jax.block_until_ready(tree)


def measure_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Read bandwidth (B/s) of the JAX default device: best time of a jitted sum over a
    ``megabytes`` float32 array (each element read once)."""
    import jax
    import jax.numpy as jnp

    n = megabytes * 2**20 // 4
    x = jnp.ones((n,), jnp.float32)
    f = jax.jit(lambda a: jnp.sum(a))
    jax.block_until_ready(f(x))
    best = min(timed(lambda: jax.block_until_ready(f(x)))[0] for _ in range(repeats))
    return 4 * n / best


def measure_peak_flops(dtype: str = "float32", size: int = 1024, repeats: int = 5) -> float:
    """Achieved FLOP/s of a jitted ``size``-cubed matmul in ``dtype`` (an achievable peak, not
    the data-sheet one)."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((size, size), dtype)
    f = jax.jit(lambda x: x @ x)
    jax.block_until_ready(f(a))
    best = min(timed(lambda: jax.block_until_ready(f(a)))[0] for _ in range(repeats))
    return 2 * size**3 / best


def resolve_peak(peak_tflops: float | None, dtype: str) -> tuple[float, str]:
    """Peak FLOP/s for the MFU and where it comes from: stated, the data sheet of a known
    accelerator (dense bf16), or a measured 1024^3 matmul in ``dtype``."""
    if peak_tflops is not None:
        if not peak_tflops > 0:
            raise ValueError(f"--peak-tflops={peak_tflops} must be > 0")
        return peak_tflops * 1e12, "stated (--peak-tflops)"
    kind, known = known_accelerator()
    if known is not None:
        return known[1], f"data sheet dense bf16 ({kind})"
    return measure_peak_flops(dtype), f"measured (1024^3 {dtype} matmul)"

def resolve_bandwidth(bandwidth: float | None) -> tuple[float, str]:
    """Memory bandwidth (B/s) for the decode roofline and where it comes from: stated, the
    data sheet of a known accelerator, or a measured jitted 256 MiB sum."""
    if bandwidth is not None:
        if not bandwidth > 0:
            raise ValueError(f"--bandwidth={bandwidth / 1e9} GB/s must be > 0")
        return bandwidth, "stated (--bandwidth)"
    kind, known = known_accelerator()
    if known is not None:
        return known[0], f"data sheet ({kind})"
    return measure_bandwidth(), "measured (jitted 256 MiB sum)"


def known_accelerator() -> tuple[str, tuple[float, float] | None]:
    """``(device_kind, (bandwidth B/s, dense bf16 FLOP/s) or None)`` of the first JAX device."""
    import jax

    kind = jax.devices()[0].device_kind
    return kind, next((v for k, v in ACCELERATORS.items() if k.lower() in kind.lower()), None)


def device_peak_bytes() -> int | None:
    """``peak_bytes_in_use`` of the first device, where the backend reports it (not the CPU)."""
    import jax

    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory statistics
        return None
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return int(stats["peak_bytes_in_use"])


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


def csv_names(text: str) -> list[str]:
    """``"a, b,"`` -> ``["a", "b"]``: the comma-separated lists of the benchmark command lines."""
    return [x.strip() for x in str(text).split(",") if x.strip()]


def csv_ints(text: str) -> list[int]:
    """``"4,16"`` -> ``[4, 16]``."""
    return [int(x) for x in csv_names(text)]
