"""Sampled (or greedy) completions of a policy for a batch of encoded prompts, decoded.

The one sampling entry point of training, evaluation and the examples: plain decoding with
the KV-cache generator (:func:`llm.generation.decode.generate_ids`) or, in reasoning mode, a think
phase first (:func:`llm.generation.reasoning.generate_with_thinking`).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np
from flax import struct

from llm.generation import reasoning as reasoning_mod
from llm.model import sharding as shd
from llm.generation.decode import GenerationConfig, generate_ids
from llm.training.policy import Policy
from llm.generation.reasoning import ReasoningConfig
from llm.model.sharding import to_host
from llm.generation.stops import eos_and_pad


@struct.dataclass
class Completions:
    """One completion per prompt row (``B`` rows, ``T`` = the generation budget).

    Array fields (pytree leaves):
      tokens: ``[B, T]`` int32, the completion token ids (device arrays, sharded like the
        prompts), right-padded.
      mask: ``[B, T]`` bool, True on the completion's tokens (forced ones included).
      lengths: ``[B]`` int32 (host), tokens per completion.
      logp: ``[B, T]`` float32, the sampler's log-probs of ``tokens``.
      hit_eos: ``[B]`` bool (host), whether the row ended with an end-of-turn token.
      tokens_np: ``[B, T]`` int32, ``tokens`` on the host.
      loss_mask: ``[B, T]`` bool, ``mask`` without the forced tokens (reasoning mode), else
        ``None``.

    Static fields: ``texts`` (the decoded completions, think block included), ``answers``
    (reasoning mode: the text after ``</think>``, else ``None``) and ``thinking`` (reasoning
    mode: the :class:`llm.generation.reasoning` sample, else ``None``).
    """

    tokens: Any
    mask: Any
    lengths: Any
    logp: Any
    hit_eos: Any
    tokens_np: Any
    loss_mask: Optional[Any] = None
    texts: list = struct.field(pytree_node=False, default_factory=list)
    answers: Optional[list] = struct.field(pytree_node=False, default=None)
    thinking: Any = struct.field(pytree_node=False, default=None)

    @property
    def plans(self) -> list:
        """The text a plan is read from: ``answers`` in reasoning mode, else ``texts``."""
        return self.texts if self.answers is None else self.answers

    @property
    def train_mask(self) -> Any:
        """The tokens that take a policy-gradient loss: ``loss_mask`` if given, else ``mask``."""
        return self.mask if self.loss_mask is None else self.loss_mask


def sample_completions(policy: Policy, ids: np.ndarray, mask: np.ndarray, key: jax.Array,
                       gen: GenerationConfig, mesh, reasoning: Optional[ReasoningConfig] = None) -> Completions:
    """Sample one completion per prompt row; arrays sharded over the mesh, texts decoded.

    With ``reasoning.enabled`` the rows think first (:func:`llm.generation.reasoning.generate_with_thinking`:
    ``gen.max_new_tokens`` is the answer budget), ``texts`` are the whole completions (think
    block included) and the :class:`Completions` also hold ``answers`` (the text after
    ``</think>``), ``loss_mask`` (the mask without forced tokens) and ``thinking`` (the sample).
    """
    eos, pad = eos_and_pad(policy.tokenizer)
    ids_d, mask_d = shd.shard_batch((ids, mask), mesh) if mesh is not None else (ids, mask)
    if reasoning is not None and reasoning.enabled:
        close = reasoning_mod.close_token_id(policy.tokenizer)
        forced = policy.tokenizer.encode(reasoning.close_text, add_special_tokens=False)
        place = (lambda x: shd.shard_batch(x, mesh)) if mesh is not None else (lambda x: x)
        s = reasoning_mod.generate_with_thinking((policy.graphdef, policy.state), ids_d, mask_d, key, gen, reasoning,
                                                 close_id=close, forced_ids=forced, eos_token_ids=eos,
                                                 pad_token_id=pad, place=place, to_host=to_host)
        texts = policy.tokenizer.batch_decode([s.tokens[b, : s.lengths[b]].tolist() for b in range(s.tokens.shape[0])],
                                              skip_special_tokens=True)
        return Completions(tokens=s.tokens, mask=s.mask, loss_mask=s.loss_mask, lengths=s.lengths, logp=s.logprobs,
                           hit_eos=s.hit_eos, texts=texts, answers=[reasoning_mod.strip_thinking(t) for t in texts],
                           tokens_np=s.tokens, thinking=s)
    tokens, cmask, lengths, logp, hit_eos = generate_ids((policy.graphdef, policy.state), ids_d, mask_d, key, gen,
                                                         eos_token_ids=eos, pad_token_id=pad)
    tok_np, len_np = to_host(tokens), to_host(lengths)
    texts = policy.tokenizer.batch_decode([tok_np[b, : len_np[b]].tolist() for b in range(tok_np.shape[0])],
                                          skip_special_tokens=True)
    return Completions(tokens=tokens, mask=cmask, lengths=len_np, logp=logp, hit_eos=to_host(hit_eos), texts=texts,
                       tokens_np=tok_np)

