"""Prompts of one fixed token length for a whole stage (fixed shapes: no recompilation)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional

import numpy as np

from llm.game import prompts
from llm.game.prompts import PromptConfig


@dataclasses.dataclass
class Prompter:
    """Renders and pads prompts to one fixed length ``P`` for the whole stage."""

    tokenizer: Any
    config: PromptConfig
    length: int
    bucket: int = 16

    @classmethod
    def fit(cls, tokenizer, config: PromptConfig, probe_lakes, max_tokens: Optional[int], bucket: int) -> "Prompter":
        """Fixed length: ``max_tokens`` or the longest probe prompt rounded up to ``bucket``."""
        if max_tokens is not None:
            return cls(tokenizer, config, int(max_tokens), bucket)
        texts = prompts.render_prompts(probe_lakes, tokenizer, config)
        longest = max(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts)
        return cls(tokenizer, config, -(-(longest + 1) // bucket) * bucket, bucket)

    def encode(self, lakes) -> tuple[np.ndarray, np.ndarray]:
        texts = prompts.render_prompts(lakes, self.tokenizer, self.config)
        try:
            return prompts.encode_prompts(texts, self.tokenizer, self.length)
        except prompts.PromptError:
            longest = max(len(self.tokenizer.encode(t, add_special_tokens=False)) for t in texts)
            new = -(-(longest + 1) // self.bucket) * self.bucket
            print(f"[train] a prompt has {longest} tokens > prompt length {self.length}; growing it to {new} "
                  "(one recompilation)", file=sys.stderr)
            self.length = new
            return prompts.encode_prompts(texts, self.tokenizer, self.length)

