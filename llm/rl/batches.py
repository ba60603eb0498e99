"""Typed batch records of the trainer's updates (pytrees, ``flax.struct`` dataclasses).

Both records hold one row per completion; ``B`` rows, prompts left-padded to ``P`` tokens,
completions right-padded to ``T`` tokens. As pytrees they pass through ``jax.jit``,
``jax.tree_util.tree_map`` (micro-batch splits, :func:`llm.model.sharding.shard_batch`) and
``jax.eval_shape`` (leaves may be ``jax.ShapeDtypeStruct``), and ``.replace(...)`` gives a
changed copy. A field left ``None`` (``GRPOBatch.ref_logp`` without a reference,
``GRPOBatch.old_logp`` of an on-policy batch) is an empty subtree.

* :class:`TokenBatch` -- the supervised warm start's batch (:func:`llm.training.warmstart.
  make_sft_update`);
* :class:`GRPOBatch` -- the GRPO update's batch (:func:`llm.rl.updates.make_grpo_update`).
"""

from __future__ import annotations

from typing import Any, Optional

from flax import struct


@struct.dataclass
class TokenBatch:
    """Rows of ``[prompt | completion]`` tokens with per-token loss weights.

    Attributes:
      prompt_ids: ``[B, P]`` int32, the prompt token ids, left-padded.
      prompt_mask: ``[B, P]`` bool, True on prompt tokens.
      tokens: ``[B, T]`` int32, the completion token ids, right-padded.
      mask: ``[B, T]`` bool, True on completion tokens.
      weights: ``[B, T]`` float32, each token's weight in the loss (0 off the mask); the
        weights of the global batch sum to 1, so micro-batch losses add up to the batch's.
      shared_prompt: static; True promises that every row holds the same prompt (the
        engineer self-play's answers to one context): the GRPO update then runs that prompt
        once and each completion after it (:func:`llm.rl.updates.shared_prompt_forward`),
        not every row's copy of it.
    """

    prompt_ids: Any
    prompt_mask: Any
    tokens: Any
    mask: Any
    weights: Any
    shared_prompt: bool = struct.field(pytree_node=False, default=False)

    @property
    def sequences(self) -> tuple[Any, Any, Any, Any]:
        """``(prompt_ids, prompt_mask, tokens, mask)``: a forward's inputs."""
        return self.prompt_ids, self.prompt_mask, self.tokens, self.mask

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])


@struct.dataclass
class GRPOBatch:
    """One GRPO step's completions, scored, with the log-probs the loss compares against.

    Attributes:
      prompt_ids / prompt_mask / tokens / mask: as :class:`TokenBatch` (``[B, P]`` int32 /
        bool, ``[B, T]`` int32 / bool).
      weights: ``[B, T]`` float32, the global aggregation weights of the tokens
        (:func:`llm.rl.grpo.token_weights`: 0 off the mask and on dropped sequences).
      advantages: ``[B]`` float32, each completion's group-normalised advantage.
      old_logp: ``[B, T]`` float32, the behaviour policy's log-probs of ``tokens`` at the
        sampling temperature, 0 off the mask; or ``None`` for an *on-policy* batch, one whose
        update gets the state that sampled it: the loss then takes the stop-gradient of the
        update's own log-probs (:func:`llm.rl.grpo.grpo_loss`), with no forward of its own.
        (The trainer's :class:`llm.rl.updates.GRPOIterations` passes a placeholder and a
        traced ``on_policy`` flag instead, so its ``mu`` updates share one compilation.)
      ref_logp: ``[B, T]`` float32, the reference policy's, or ``None`` when the loss has no KL
        term (``beta == 0``).
    """

    prompt_ids: Any
    prompt_mask: Any
    tokens: Any
    mask: Any
    weights: Any
    advantages: Any
    old_logp: Optional[Any] = None
    ref_logp: Optional[Any] = None

    @property
    def sequences(self) -> tuple[Any, Any, Any, Any]:
        """``(prompt_ids, prompt_mask, tokens, mask)``: a forward's inputs."""
        return self.prompt_ids, self.prompt_mask, self.tokens, self.mask

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])
