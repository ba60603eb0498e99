"""llm.training: one stage of training, and scoring a policy.

Imports every lower layer (:mod:`llm.model`, :mod:`llm.generation`, :mod:`llm.rl`,
:mod:`llm.game`) and ``jaxlake``; never :mod:`llm.engineer` or :mod:`llm.benchmark`.

* :mod:`llm.training.stage` -- ``train_stage``: warm start then GRPO for one stage;
* :mod:`llm.training.config` -- ``StageConfig`` / ``TrainConfig`` / ``ModelConfig``, resolved
  once from Hydra at the entry point;
* :mod:`llm.training.warmstart`, :mod:`llm.training.grpo_loop` -- the two phases;
* :mod:`llm.training.phase` -- resumable phase checkpoints;
* :mod:`llm.training.policy` -- a policy's model, tokenizer and state, from any source;
* :mod:`llm.training.completions`, :mod:`llm.training.examples`,
  :mod:`llm.training.heldout` -- sampling, worked examples, held-out checks;
* :mod:`llm.training.evaluate` -- a policy on the held-out suite (``python -m llm.evaluate``);
* :mod:`llm.training.plots` -- training curves.
"""
