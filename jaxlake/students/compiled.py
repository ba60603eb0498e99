"""How the student room compiles its programs: :func:`jit` is ``jax.jit`` with the XLA options
the IPPO programs need (:data:`COMPILER_OPTIONS`).

XLA's CPU runtime (jaxlib 0.10) can wedge while it runs the UED trainer vmapped over seeds:
every worker thread parks waiting for work, the process stops using the CPU and the result
never comes (``jax.device_get`` waits for good). Measured on the 2-core CPU machine with
``python -m jaxlake.students.study study.seeds=4`` (robust PLR, four seeds in one program):
it hung in 3 runs out of 3 with the default options (one of them with Eigen's intra-op pool
off, ``--xla_cpu_multi_thread_eigen=false``, one with XNNPACK off), each within its first 35
CPU seconds of the PLR unit; with the concurrency-optimised scheduler off
(``xla_cpu_enable_concurrency_optimized_scheduler=False``, this module's option, given there in
``XLA_FLAGS``) that unit ran to its end alone and again inside the study's eight-seed rerun,
whose twelve units all finished (docs/research/ued-study.md). The option
orders a program's operations for the CPU runtime's concurrency; it is an ``xla_cpu_`` option,
so it changes nothing on a GPU or a TPU.

Scoped to the room's programs (the trainer, its chunks, the evaluation, the suite's plays)
through ``jax.jit(compiler_options=...)``, not set in ``XLA_FLAGS``: the other programs of a
process compile as they would, and an ``XLA_FLAGS`` of your own still applies to these.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

__all__ = ["COMPILER_OPTIONS", "jit"]

#: XLA options of every program the room compiles (module docstring: the CPU runtime's wedge).
COMPILER_OPTIONS: dict[str, Any] = {"xla_cpu_enable_concurrency_optimized_scheduler": False}


def jit(fn: Callable, **kwargs: Any) -> Callable:
    """``jax.jit(fn, **kwargs)`` compiled with :data:`COMPILER_OPTIONS` (yours in
    ``compiler_options`` win)."""
    options = {**COMPILER_OPTIONS, **(kwargs.pop("compiler_options", None) or {})}
    return jax.jit(fn, compiler_options=options, **kwargs)
