"""Which token ids end a completion, and which id pads a row.

Any ``transformers`` tokenizer works: Qwen3's own, or the game tokenizer of the embedded planner.
"""

from __future__ import annotations

from typing import Any

#: Qwen's end-of-text token; the pad token of Qwen3 tokenizers and of the game tokenizer.
ENDOFTEXT = "<|endoftext|>"


def eos_and_pad(tokenizer: Any) -> tuple[tuple[int, ...], int]:
    """The ids that end a completion and the pad id of a ``transformers`` tokenizer.

    End ids: the EOS (end of turn), ``<|endoftext|>`` and the pad token, those that exist,
    sorted. Pad: the tokenizer's pad id, else its EOS id, else 0. ``None`` (token-id prompts
    without a tokenizer) gives ``((), 0)``.
    """
    if tokenizer is None:
        return (), 0
    eos_id = getattr(tokenizer, "eos_token_id", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    ends = {int(i) for i in (eos_id, pad, vocab.get(ENDOFTEXT)) if i is not None}
    if pad is None:
        pad = eos_id if eos_id is not None else 0
    return tuple(sorted(ends)), int(pad)
