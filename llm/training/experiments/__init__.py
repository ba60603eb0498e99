"""Experiments of the trainer: options that are off by default and that were measured inside the
noise (README's research notes), kept runnable behind the GRPO loop's hooks (:mod:`llm.training.hooks`)
and the warm start's selectors, out of the core loop's code. Their config keys are unchanged.

* :mod:`~llm.training.experiments.screen` -- greedy screening of GRPO's lakes (``train.grpo.screen``;
  a lake picker);
* :mod:`~llm.training.experiments.detour` -- warm-start lakes whose reference path detours
  (``train.warmstart.detour_share``);
* :mod:`~llm.training.experiments.traces` -- the ``summary`` and ``paths`` warm-start traces
  (``prompt.reasoning.warmstart_style``);
* :mod:`~llm.training.experiments.suite_env` -- the warm start on the held-out suite's cells
  (``pipeline.warmstart_env=suite``);
* :mod:`~llm.training.experiments.registry` -- the hooks a configuration asks for.

This package's ``__init__`` imports nothing, so that the warm start can import a selector without
loading the GRPO hooks.
"""
