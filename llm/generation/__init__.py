"""llm.generation: decoding text from a model.

Imports :mod:`llm.model` only (and nothing of ``jaxlake``).

* :mod:`llm.generation.decode` -- ``generate_ids``: batched prefill + KV-cache decoding in one
  jitted loop, prompt buckets, early exit; ``GenerationConfig``, ``GenerationResult``;
* :mod:`llm.generation.text` -- ``generate``: text in, text out around ``generate_ids``
  (tokenizing, padding, decoding the texts, stop strings);
* :mod:`llm.generation.logprobs` -- ``sequence_logprobs``: full-forward log-probs of given
  completions (the GRPO loss);
* :mod:`llm.generation.lowering` -- ``lower_sampling``: the sampling functions lowered from
  abstract shapes (the step plan);
* :mod:`llm.generation.sampling` -- the sampling head (temperature, top-k, top-p, min-p);
* :mod:`llm.generation.reasoning` -- the think-then-answer phases of a reasoning model;
* :mod:`llm.generation.stops` -- which token ids end a completion, and the pad id;
* :mod:`llm.generation.row_blocks` -- rows per sampling call, sized from XLA's memory analysis.
"""
