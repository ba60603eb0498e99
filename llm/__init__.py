"""llm: a Flax NNX Qwen3 policy, GRPO training and the environment engineer."""

from llm.hf_io import from_pretrained
from llm.hf_io import save_pretrained
from llm.model import KVCache
from llm.model import Qwen3Config
from llm.model import Qwen3ForCausalLM
from llm.default import default_model_dir
from llm.default import load_default
from llm.generate import GenerationConfig
from llm.generate import GenerationResult
from llm.generate import generate
from llm.generate import sequence_logprobs
