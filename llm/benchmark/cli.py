"""``python -m llm.benchmark [generate | train | grpo | pack | prefetch] ...``: the model's speed and memory,
each rate beside the hardware's limit (:mod:`llm.benchmark.roofline`) and, for generation, beside
``transformers`` on the same weights.

* no mode: ours against transformers' ``generate`` for the tiny and ~100M presets
  (:func:`llm.benchmark.generate.compare_main`);
* ``generate``: prefill / decode tok/s with roofline fractions, compile time, peak memory,
  transformers' dynamic and static caches as peers, rows finishing early, or only the memory
  analysis (:func:`llm.benchmark.generate.generate_main`);
* ``train``: one GRPO update's tokens/s, MFU, compile time and peak memory
  (:func:`llm.benchmark.train.train_main`);
* ``grpo``: one whole GRPO step with the time split between sampling, log-probs and updates
  (:func:`llm.benchmark.train.grpo_main`);
* ``pack``: the warm start's update on pretraining's batches, padded against packed rows
  (:func:`llm.benchmark.pack.pack_main`);
* ``prefetch``: the warm start's whole step, its batch prepared in line against on a thread
  while the step before updates (:func:`llm.benchmark.prefetch.prefetch_main`).

``python -m llm.benchmark <mode> --help`` lists each mode's options; docs/performance.md has
the tables and the commands that made them, ``docs/gpu/*.sh`` the GPU scripts.
"""

from __future__ import annotations

import sys
from typing import Any

from llm.benchmark.generate import compare_main, generate_main
from llm.benchmark.pack import pack_main
from llm.benchmark.prefetch import prefetch_main
from llm.benchmark.train import grpo_main, train_main

#: Each mode: its entry point and the line ``python -m llm.benchmark --help`` shows for it.
_MODES = (
    ("generate", generate_main, "prefill / decode tok/s beside the roofline, transformers' caches as peers"),
    ("train", train_main, "one GRPO update: tokens/s, MFU, compile time, peak memory"),
    ("grpo", grpo_main, "one whole GRPO step, its time split between sampling, log-probs and updates"),
    ("pack", pack_main, "the warm start's update on pretraining's batches, padded against packed rows"),
    ("prefetch", prefetch_main, "the warm start's whole step, its batch prepared in line against on a thread"),
)
MODES = {name: fn for name, fn, _ in _MODES}


def modes_help() -> str:
    """The modes, one line each: the epilog of ``python -m llm.benchmark --help``."""
    width = max(len(name) for name in MODES)
    lines = [f"  {name:<{width}}  {line}" for name, _, line in _MODES]
    return "\n".join(["modes (python -m llm.benchmark <mode> --help lists a mode's options):", *lines])


def main(argv: list[str] | None = None) -> list[Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in MODES:
        return MODES[argv[0]](argv[1:])
    return compare_main(argv, modes=modes_help())


if __name__ == "__main__":
    main()
