"""llm.benchmark: speed and memory of the model against the hardware and against transformers.

The top layer of ``llm``: it may import every other subpackage. ``python -m llm.benchmark``
runs :mod:`llm.benchmark.cli`; ``python -m llm.memory`` runs :mod:`llm.benchmark.memory`.

* :mod:`llm.benchmark.generate` -- generation throughput, the transformers comparison;
* :mod:`llm.benchmark.train` -- one GRPO update and one whole GRPO step;
* :mod:`llm.benchmark.pack` -- the warm start's update, padded against packed rows;
* :mod:`llm.benchmark.prefetch` -- the warm start's whole step, its batch in line against on a thread;
* :mod:`llm.benchmark.roofline` -- accelerator peaks, measured bandwidth, MFU and roofline;
* :mod:`llm.benchmark.memory` -- XLA's memory analysis of one update, compiled from abstract shapes;
* :mod:`llm.benchmark.step_plan` -- the same for every phase of one GRPO step of a run (``--plan``).
"""
