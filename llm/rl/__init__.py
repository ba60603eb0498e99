"""llm.rl: the reinforcement-learning mathematics, independent of the game.

Imports :mod:`llm.model` and :mod:`llm.generation` only (and nothing of ``jaxlake``).

* :mod:`llm.rl.grpo` -- group advantages and the clipped GRPO / DAPO loss with its KL term;
* :mod:`llm.rl.optim` -- ``OptimConfig``, AdamW with warmup, clipping and weight decay by
  parameter role, gradient application in the FSDP layout;
* :mod:`llm.rl.batches` -- the typed batch records of the updates;
* :mod:`llm.rl.updates` -- the jitted update over micro-batches (GRPO and the supervised
  warm start), the ``mu`` inner updates of a sampled batch, the log-prob forward;
* :mod:`llm.rl.dynamic` -- DAPO's dynamic sampling: which sampled groups fill a batch.
"""
