"""llm: a Flax NNX Qwen3 policy, GRPO training and the environment engineer.

The public face of the package (``llm.__all__``), all re-exported from their modules::

    llm.Qwen3Config, llm.Qwen3ForCausalLM        # the model (llm.model.qwen3)
    llm.from_pretrained(path), llm.save_pretrained(model, tokenizer, path)
                                                 # Hugging Face folders, offline (llm.model.hf_io)
    llm.load_default(), llm.default_model_dir()  # the embedded tiny model + game tokenizer (llm.game.default)
    llm.GenerationConfig, llm.GenerationResult   # decoding settings and result (llm.generation.decode)

Everything else is reached through its module, and every module name means the module
(no function in this namespace shadows one): ``llm.generation.text.generate(model, tokenizer,
prompts, config)`` decodes text, ``llm.training.stage.train_stage`` trains a stage, ``llm.training.evaluate``
scores a policy on the held-out suite, ``llm.engineer.local`` holds the local LLM environment engineers (prompts in ``llm.engineer.prompt``,
constrained decoding in ``llm.engineer.constrained``, the HTTP endpoint in ``llm.engineer.external``),
``llm.game.tokenizer`` the game tokenizer, ``llm.game.prompts`` / ``llm.game.rewards`` / ``llm.rl.grpo`` the
pieces of the GRPO loop. ``tests/test_public_api.py`` checks both rules.
"""

from llm.game.default import default_model_dir, load_default
from llm.generation.decode import GenerationConfig, GenerationResult
from llm.model.hf_io import from_pretrained, save_pretrained
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM

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
