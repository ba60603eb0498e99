"""The small game tokenizer, built offline.

The embedded default model (``llm.game.default``) needs a tokenizer that exists without any
download. :func:`build_game_tokenizer` trains a **byte-level BPE** with the ``tokenizers``
library on a deterministic synthetic corpus of the game's text: rendered grids
(``.``, ``~``, ``A``-``Z``, ``a``-``z``), plans (``A: U U R D``), digits, JSON
configurations with every :class:`jaxlake.config.LakeConfig` key, and the words of the
policy and engineer prompts. Because the initial alphabet is the 256-symbol byte-level
alphabet, **any** text (any unicode) encodes and decodes back exactly; the merges just make
game text short.

The pipeline mirrors Qwen2/Qwen3's (the same style of split regex, byte-level pre-tokeniser
and decoder) and the special tokens are Qwen's (``<|endoftext|>``, ``<|im_start|>``,
``<|im_end|>``), so the folder written by :func:`save_game_tokenizer` is a standard Hugging
Face tokenizer folder (``tokenizer.json``, ``tokenizer_config.json``, chat template) that
``transformers.AutoTokenizer.from_pretrained`` reads, and a Qwen-style chat template makes
``apply_chat_template`` work. Unlike Qwen there is **no NFC normaliser**, so even text that is
not in NFC form decodes back byte for byte; ``tokenizer_config.json`` therefore names the
generic ``PreTrainedTokenizerFast`` (``Qwen2Tokenizer`` would re-insert NFC on load).

Public API:

* :data:`SPECIAL_TOKENS`, :data:`CHAT_TEMPLATE`
* :func:`game_corpus` -> list of training texts (deterministic)
* :func:`build_game_tokenizer` -> ``tokenizers.Tokenizer``
* :func:`to_hf_tokenizer` -> ``transformers`` fast tokenizer (with chat template)
* :func:`save_game_tokenizer` / :func:`load_tokenizer`
* :func:`eos_and_pad` -> the end ids and pad id that generation and training use
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from jaxlake.config import FIELD_BOUNDS, LakeConfig
from jaxlake.text import FROZEN_SYMBOL, HOLE_SYMBOL
from jaxlake.types import ACTION_LETTERS, STATUS_NAMES
from llm.generation import stops

#: End of text / padding, start of a chat turn, end of a chat turn (the chat EOS).
ENDOFTEXT = stops.ENDOFTEXT
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
#: Ordinary added tokens (Qwen3 keeps them as single tokens, not special).
THINK_TOKENS = ("<think>", "</think>")

#: Target vocabulary size (specials, the 256 byte symbols and the think tokens included).
#: The trainer stops earlier when the corpus has no more pairs worth merging.
DEFAULT_VOCAB_SIZE = 1024

#: Bump whenever the corpus or the training settings change (the default-model cache key).
#: 2: holes are ``~`` (lake text format 2, docs/rules.md#format-history), no longer ``O``.
TOKENIZER_VERSION = 2

#: Split regex in the style of GPT-4 / Qwen2: contractions, words with an optional leading
#: non-letter, single digits, punctuation runs with their newlines, whitespace.
_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)

#: A Qwen-style chat template (ChatML turns; optional empty think block when
#: ``enable_thinking=False`` is passed, as Qwen3's template does).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

#: Words of the policy and engineer prompts and of the behaviour summaries.
PROMPT_WORDS = """
You are a planner for a multi agent path finding game on a frozen lake grid. Each agent must
reach its goal without falling into a hole. The grid has one line per row and cells are
separated by one space. Legend: frozen cell, hole, capital letter agent, lower case letter goal
of the agent with the same letter. Rows are numbered from the top, row 0 at the top, columns
from the left. Actions: S stay, U up, D down, L left, R right. Write one line per agent with the
agent letter, a colon and its moves, for example. Agents move at the same time. Two agents that
move into the same cell or swap cells are stopped. An agent blocked by another agent that does
not move stays where it is. Moves into a wall leave the agent in place. The ice is slippery: a
move may slip to a perpendicular direction with some probability. The episode ends after max
steps or when every agent has arrived. Answer with the plan only, no explanation. Plan:
You are the environment engineer of a training curriculum. After each stage you read a
summary of the policy's behaviour, its failure cases and the environment statistics, and you
propose the configuration of the next stage as a JSON object with the fields below. Keep every
value within its allowed range. Make the environment harder when the success rate is high and
easier when it is low. Reply with a single JSON object and nothing else.
Stage summary: success rate, arrival rate, fall rate, timeout rate, malformed plan rate, mean
reward, mean episode length, vertex conflicts, swap conflicts, blocked moves, achieved hole
density, achieved conflict density, mean path length, failure case, current configuration,
previous configuration, allowed range, minimum, maximum, integer, number, true, false, null,
stay, vanish, on goal, slip probability, horizon, steps, agents, lakes, episodes, group,
samples, advantage, reward, loss, policy, reference, step, epoch, batch, tokens, score.
The agent fell into a hole. The agent timed out. The agent arrived at its goal. The plan was
malformed. Unknown agent letter. Repeated agent. Stray text. Conflict between agents.
""".split()


def _random_grid(rng: np.random.RandomState) -> str:
    """One rendered lake (docs/rules.md#lake-grid format; only the symbols matter here)."""
    h, w = int(rng.randint(2, 13)), int(rng.randint(2, 13))
    cells = np.where(rng.rand(h, w) < rng.uniform(0.0, 0.5), HOLE_SYMBOL, FROZEN_SYMBOL).astype(object)
    n = int(rng.randint(1, min(26, h * w // 2) + 1))
    spots = rng.permutation(h * w)[: 2 * n]
    for i in range(n):
        cells.flat[spots[2 * i]] = chr(ord("A") + i)
        cells.flat[spots[2 * i + 1]] = chr(ord("a") + i)
    return "\n".join(" ".join(row) for row in cells)


def _random_plan(rng: np.random.RandomState) -> str:
    n = int(rng.randint(1, 27))
    lines = []
    for i in range(n):
        steps = rng.choice(list(ACTION_LETTERS), size=int(rng.randint(0, 20)))
        sep = " " if rng.rand() < 0.8 else ""
        lines.append(f"{chr(ord('A') + i)}: " + sep.join(steps))
    return "\n".join(lines)


def _random_agent_lines(rng: np.random.RandomState) -> str:
    """Agent position lines of the policy prompt (``A: row 3 col 4, goal a row 1 col 2``)."""
    lines = []
    for i in range(int(rng.randint(1, 27))):
        r, c, gr, gc = (int(x) for x in rng.randint(0, 64, size=4))
        lines.append(f"{chr(ord('A') + i)}: row {r} col {c}, goal {chr(ord('a') + i)} row {gr} col {gc}")
    return "\n".join(lines)


def _random_config_json(rng: np.random.RandomState) -> str:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(LakeConfig):
        if f.name == "on_goal":
            values[f.name] = ["vanish", "stay"][int(rng.randint(2))]
            continue
        lo, hi = FIELD_BOUNDS[f.name]
        if isinstance(f.default, float):
            values[f.name] = round(float(rng.uniform(lo, hi)), int(rng.randint(1, 4)))
        else:
            values[f.name] = int(rng.randint(int(lo), int(min(hi, 64)) + 1))
    if rng.rand() < 0.2:
        values["max_dist"] = None
    indent = None if rng.rand() < 0.5 else 2
    return json.dumps(values, indent=indent)


def _random_summary(rng: np.random.RandomState) -> str:
    keys = ["success_rate", "fall_rate", "timeout_rate", "malformed_rate", "mean_reward",
            "mean_length", "vertex_conflicts", "swap_conflicts", "blocked"]
    parts = [f"{k}: {rng.uniform(0, 1):.3f}" for k in keys if rng.rand() < 0.6]
    status = " ".join(rng.choice(list(STATUS_NAMES), size=4))
    return "Stage " + str(int(rng.randint(0, 20))) + " summary\n" + "\n".join(parts) + "\n" + status


def game_corpus(num_examples: int = 600, seed: int = 0) -> list[str]:
    """Deterministic training texts covering the game's vocabulary.

    Args:
      num_examples: number of synthetic examples of each kind (grid, plan, config, summary).
      seed: numpy seed; the same arguments always give the same corpus.
    """
    rng = np.random.RandomState(seed)
    words = " ".join(PROMPT_WORDS)
    texts = [words, words.lower(), " ".join(w.capitalize() for w in PROMPT_WORDS)]
    texts += [f"{IM_START}{role}\n" for role in ("system", "user", "assistant")] * 200
    letters = [chr(ord("A") + i) for i in range(26)] + [chr(ord("a") + i) for i in range(26)]
    texts += [" ".join([FROZEN_SYMBOL, HOLE_SYMBOL] + letters)] * 50  # every cell symbol, after a space
    for name in [f.name for f in dataclasses.fields(LakeConfig)]:
        texts.append(f'"{name}": ')
    for _ in range(num_examples):
        grid, plan = _random_grid(rng), _random_plan(rng)
        texts.append(f"{IM_START}user\n{words[: int(rng.randint(50, len(words)))]}\n{grid}\n"
                     f"{_random_agent_lines(rng)}{IM_END}\n"
                     f"{IM_START}assistant\n{plan}{IM_END}\n")
        texts.append(_random_config_json(rng))
        texts.append(_random_summary(rng))
        texts.append(" ".join(str(int(x)) for x in rng.randint(0, 1000, size=8)))
    return texts


def build_game_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int = 0) -> Tokenizer:
    """Train the byte-level BPE game tokenizer (offline, deterministic).

    Ids ``0, 1, 2`` are ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``; then the 256
    byte symbols; then merges; ``<think>`` / ``</think>`` are appended as the last two ids.

    Args:
      vocab_size: upper bound on the whole vocabulary (specials, bytes, merges and the two
        think tokens); at least 262.
      seed: corpus seed.
    """
    low = len(SPECIAL_TOKENS) + 256 + len(THINK_TOKENS) + 1
    if vocab_size < low:
        raise ValueError(f"vocab_size={vocab_size} not in [{low}, inf)")
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(THINK_TOKENS),
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # The trainer does not split out added tokens: cut the corpus at them so that no merges
    # are wasted on pieces like "<|".
    specials = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + THINK_TOKENS))
    pieces = [p for text in game_corpus(seed=seed) for p in specials.split(text) if p]
    tok.train_from_iterator(pieces, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return tok


def to_hf_tokenizer(tok: Tokenizer):
    """Wrap a ``tokenizers.Tokenizer`` as a ``transformers`` fast tokenizer with chat template.

    EOS is ``<|im_end|>`` (the end of an assistant turn, as in Qwen3 chat checkpoints), PAD is
    ``<|endoftext|>``, there is no BOS (Qwen adds none).
    """
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def save_game_tokenizer(path: str | os.PathLike, vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int = 0):
    """Build the game tokenizer and save it as a Hugging Face tokenizer folder at ``path``.

    Returns the ``transformers`` tokenizer. ``tokenizer_config.json`` names the generic
    ``PreTrainedTokenizerFast`` so ``AutoTokenizer`` uses ``tokenizer.json`` as is, and lists the
    special tokens under ``additional_special_tokens``
    (:func:`llm.model.hf_io.portable_tokenizer_config`): transformers 4.57 and 5 read it alike.
    """
    from llm.model.hf_io import portable_tokenizer_config

    hf = to_hf_tokenizer(build_game_tokenizer(vocab_size=vocab_size, seed=seed))
    os.makedirs(path, exist_ok=True)
    hf.save_pretrained(str(path))
    cfg_path = os.path.join(str(path), "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["padding_side"] = "left"
    cfg = portable_tokenizer_config(cfg)  # the special tokens as transformers 4.57 reads them too
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
    return hf


def load_tokenizer(path: str | os.PathLike):
    """``transformers.AutoTokenizer.from_pretrained(path)`` for a local folder (no network)."""
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer folder {str(path)!r} does not exist")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
