"""llm: a Flax NNX Qwen3 policy, GRPO training and the environment engineer.

The public face of the package (``llm.__all__``), all re-exported from their modules::

    llm.Qwen3Config, llm.Qwen3ForCausalLM        # the model (llm.model)
    llm.from_pretrained(path), llm.save_pretrained(model, tokenizer, path)
                                                 # Hugging Face folders, offline (llm.hf_io)
    llm.load_default(), llm.default_model_dir()  # the embedded tiny model + game tokenizer (llm.default)
    llm.GenerationConfig, llm.GenerationResult   # decoding settings and result (llm.generate)

Everything else is reached through its module, and every module name means the module
(no function in this namespace shadows one): ``llm.generate.generate(model, tokenizer,
prompts, config)`` decodes text, ``llm.train.train_stage`` trains a stage, ``llm.evaluate``
scores a policy on the held-out suite, ``llm.engineer`` holds the local LLM environment engineers (prompts in ``llm.engineer_prompt``,
constrained decoding in ``llm.constrained``, the HTTP endpoint in ``llm.external_engineer``),
``llm.tokenizer`` the game tokenizer, ``llm.prompts`` / ``llm.rewards`` / ``llm.grpo`` the
pieces of the GRPO loop. ``tests/test_public_api.py`` checks both rules.
"""

from llm.default import default_model_dir, load_default
from llm.generate import GenerationConfig, GenerationResult
from llm.hf_io import from_pretrained, save_pretrained
from llm.model import Qwen3Config, Qwen3ForCausalLM

__all__ = [
    "GenerationConfig",
    "GenerationResult",
    "Qwen3Config",
    "Qwen3ForCausalLM",
    "default_model_dir",
    "from_pretrained",
    "load_default",
    "save_pretrained",
]
