"""llm.model: the Qwen3 network and what reads, writes and shards it.

The lowest layer of ``llm``: it imports no other ``llm`` subpackage and nothing of ``jaxlake``
(a language model knows nothing of the game).

* :mod:`llm.model.config` -- ``Qwen3Config``: the architecture's settings, validated;
* :mod:`llm.model.qwen3` -- ``Qwen3ForCausalLM`` (Flax NNX), the KV cache, the layer scan and its
  remat policy;
* :mod:`llm.model.attention` -- the attention kernels (dense, chunked flash-style, cuDNN);
* :mod:`llm.model.logprobs` -- per-token log-probabilities in vocabulary chunks;
* :mod:`llm.model.hf_io` -- Hugging Face folders (safetensors + tokenizer), offline;
* :mod:`llm.model.checkpoint` -- orbax checkpoints of a model;
* :mod:`llm.model.grow` -- block expansion: a deeper model that starts computing the same function
  (``python -m llm.model.grow SRC DST --layers N``);
* :mod:`llm.model.sharding` -- meshes, FSDP layouts and the multi-process switch;
* :mod:`llm.model.errors` -- ``ModelConfigError``, the one-line error of a bad model or mesh
  setting.
"""
