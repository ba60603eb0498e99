"""llm: a Flax NNX Qwen3 policy, GRPO training and the environment engineer."""
