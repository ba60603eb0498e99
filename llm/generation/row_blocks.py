"""How many rows one sampling call may take: sized from the compiler's memory analysis.

A sampling call's device memory beyond its arguments (:func:`call_bytes` of its compilation)
grows with its rows; where the device reports its free memory (GPU, TPU), the sampler samples a
batch that does not fit in the largest divisor of it that does (:func:`choose_row_block`,
:func:`auto_row_block`); the step plan (:mod:`llm.benchmark.step_plan`) asks the same function
with the memory a device would have free. Used by :func:`llm.generation.decode.generate_ids`
(``GenerationConfig.row_block=None``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax

def call_bytes(compiled: Any) -> int:
    """Device bytes a compiled call needs on top of its arguments: temporaries plus the
    outputs not written into donated arguments (XLA's ``memory_analysis()``)."""
    m = compiled.memory_analysis()
    return int(m.temp_size_in_bytes) + max(int(m.output_size_in_bytes) - int(m.alias_size_in_bytes), 0)


def choose_row_block(batch: int, need_bytes: Any, free_bytes: int) -> Optional[int]:
    """Rows per sampling call: ``batch`` when ``need_bytes(batch) <= free_bytes``, else the
    largest divisor of ``batch`` whose need fits, trying the divisors from large to small
    (``need_bytes(rows)``: a call's bytes beyond its arguments, :func:`call_bytes` of its
    compilation); ``None`` when none does.

    A call's bytes are taken to be linear in its rows (a part that does not depend on them
    plus one that grows with them), which bounds a smaller divisor's need from below without
    compiling it: by the whole batch's need scaled to its rows, and, once a divisor has
    failed, by the part that does not depend on the rows (the line through the two
    measurements); a divisor under a bound above ``free_bytes`` is not tried. The sampler
    calls it with the free device memory; the step plan with the memory a device would have
    free."""
    whole = need_bytes(batch)
    if whole <= free_bytes:
        return batch
    floor = 0.0
    for rows in sorted((r for r in range(1, batch) if batch % r == 0), reverse=True):
        if max(whole * rows / batch, floor) > free_bytes:
            continue
        need = need_bytes(rows)
        if need <= free_bytes:
            return rows
        floor = max(floor, need - (whole - need) / (batch - rows) * rows)  # the row-free part
    return None


#: Share of the device's free memory a sampling call may plan to fill (allocator slack).
ROW_BLOCK_HEADROOM = 0.95
_ROW_BLOCKS: dict = {}


def free_device_bytes(x: Any) -> int | None:
    """Free bytes of the device holding ``x`` (``bytes_limit - bytes_in_use``), or ``None``
    where the backend reports no memory statistics (the CPU)."""
    try:
        device = next(iter(x.devices())) if hasattr(x, "devices") else jax.devices()[0]
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory statistics
        return None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def auto_row_block(key: Any, batch: int, probe: Any, need_bytes: Callable[[int], int]) -> int:
    """Rows per sampling call for ``row_block=None``: the whole ``batch`` where the device holding
    ``probe`` reports no memory statistics (the CPU), else :func:`choose_row_block` against
    :data:`ROW_BLOCK_HEADROOM` of its free memory -- one row at a time when nothing fits (the
    allocator then says how far off it is). The choice is kept per ``key`` (the caller's graph,
    shapes and static arguments), so each compiled call is measured once."""
    free = free_device_bytes(probe)
    if free is None:
        return batch
    if key not in _ROW_BLOCKS:
        _ROW_BLOCKS[key] = choose_row_block(batch, need_bytes, int(free * ROW_BLOCK_HEADROOM)) or 1
    return _ROW_BLOCKS[key]
