"""Sequence packing for the supervised warm start: several lakes' sequences in one row.

The warm start's padded layout gives every lake a row of the widest prompt plus the whole
completion budget (:class:`llm.rl.batches.TokenBatch`: ``[B, P + T]``). The tiny planner's
pretraining fills 41 % of those positions (prompts of 30 to 112 tokens, left-padded to 112;
completions of 20 to 144, right-padded to 144): the rest is padding that every layer still
computes. Packing lays the ``B`` sequences (each lake's real prompt tokens, then its real
completion tokens) one after another into ``R`` rows of ``L`` positions, first fit
decreasing (the longest first):

* ``segments [R, L]`` (int32) numbers the sequences of a row from 1 (0: padding); a token
  attends only to the earlier tokens of its own segment (``segment_ids`` of
  :meth:`llm.model.qwen3.Qwen3ForCausalLM.hidden_states`);
* ``positions [R, L]`` restart at 0 at each segment's first token, so every sequence sees the
  RoPE positions of its own unpacked row (its left padding shifted nothing: the unpacked
  forward numbers real tokens from 0 too, :func:`llm.generation.decode.left_pad_positions`);
* ``targets [R, L]``: position ``j`` predicts the next token of its segment, with
  ``weights [R, L]`` the completion token's loss weight there (0 on prompt tokens, on a
  segment's last token and on padding).

So the packed loss is the padded loss of the same lakes, term by term (tests/llm/training/
test_packing.py). ``R`` and ``L`` are static (one compilation): a lake that fits in no row is
left out of the step (``packed_dropped`` in the metrics); the weights of the lakes kept are
renormalised to sum to 1. Host-side numpy; the update is the warm start's own
(:func:`llm.training.warmstart.make_sft_update` takes either batch).
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from llm.model import logprobs as logprobs_mod


@struct.dataclass
class PackedBatch:
    """``R`` packed rows of ``L`` positions (see the module docstring).

    Attributes:
      ids: ``[R, L]`` int32 token ids (pad id on padding).
      positions: ``[R, L]`` int32 RoPE positions, from 0 in each segment.
      segments: ``[R, L]`` int32 segment number in its row, from 1; 0 on padding.
      targets: ``[R, L]`` int32, the next token of the segment (0 where none).
      weights: ``[R, L]`` float32 loss weights of those targets; they sum to 1 over the batch.
    """

    ids: Any
    positions: Any
    segments: Any
    targets: Any
    weights: Any

    @property
    def rows(self) -> int:
        return int(self.ids.shape[0])


def pack_batch(prompt_ids: np.ndarray, prompt_mask: np.ndarray, tokens: np.ndarray, mask: np.ndarray,
               scale: np.ndarray, *, rows: int, length: int, pad_id: int) -> tuple[PackedBatch, int]:
    """Pack a padded warm-start batch into ``rows`` rows of ``length`` positions.

    Args:
      prompt_ids, prompt_mask: ``[B, P]`` left-padded prompts.
      tokens, mask: ``[B, T]`` right-padded completion targets (a lake without a target has
        an empty mask and is skipped).
      scale: ``[B, T]`` float loss weights before normalisation (:func:`llm.training.warmstart.token_weights`).
      rows, length: the packed shape ``R x L``.
      pad_id: the tokenizer's pad id.

    Returns ``(batch, dropped)``: ``dropped`` counts the lakes with a target that fit in no row.
    """
    prompt_mask, mask = np.asarray(prompt_mask, bool), np.asarray(mask, bool)
    b = prompt_ids.shape[0]
    chex.assert_shape([prompt_mask], prompt_ids.shape)
    chex.assert_shape([mask, scale], tokens.shape)
    if rows < 1 or length < 2:
        raise ValueError(f"pack_batch: rows={rows} and length={length} must be >= 1 and >= 2")
    ids = np.full((rows, length), int(pad_id), np.int32)
    positions = np.zeros((rows, length), np.int32)
    segments = np.zeros((rows, length), np.int32)
    targets = np.zeros((rows, length), np.int32)
    weights = np.zeros((rows, length), np.float32)
    used = np.zeros((rows,), np.int64)
    count = np.zeros((rows,), np.int32)
    dropped = 0
    # first fit decreasing: the longest sequences first (ties in batch order), so the short
    # ones fill the gaps the long ones leave and a lake is dropped only when the rows are full
    lengths = prompt_mask.sum(axis=1) + mask.sum(axis=1)
    for i in np.argsort(-lengths, kind="stable"):
        if not mask[i].any():
            continue
        prompt = np.asarray(prompt_ids[i])[prompt_mask[i]]
        completion = np.asarray(tokens[i])[mask[i]]
        w = np.asarray(scale[i], np.float32)[mask[i]]
        seq = np.concatenate([prompt, completion]).astype(np.int32)
        n, p = seq.shape[0], prompt.shape[0]
        fits = np.flatnonzero(used + n <= length)
        if fits.size == 0:
            dropped += 1
            continue
        r = int(fits[0])
        at = int(used[r])
        count[r] += 1
        ids[r, at: at + n] = seq
        positions[r, at: at + n] = np.arange(n, dtype=np.int32)
        segments[r, at: at + n] = count[r]
        targets[r, at: at + n - 1] = seq[1:]
        # position p - 1 + k predicts completion token k
        weights[r, at + p - 1: at + n - 1] = w
        used[r] += n
    total = float(weights.sum())
    if total > 0:
        weights /= total
    return PackedBatch(ids=ids, positions=positions, segments=segments, targets=targets, weights=weights), dropped


def packed_forward(graphdef: Any, state: Any, batch: PackedBatch, *, chunk: int | None = logprobs_mod.DEFAULT_CHUNK,
                   remat: str = "none") -> tuple[jax.Array, jax.Array]:
    """``(logp [R, L], greedy_match [R, L])`` of the packed targets (0 / False off the weights)."""
    model = nnx.merge(graphdef, state)
    segments = batch.segments.astype(jnp.int32)
    hidden = model.hidden_states(batch.ids.astype(jnp.int32), batch.positions.astype(jnp.int32), segments > 0,
                                 remat=remat, segment_ids=segments)
    weight, tied = logprobs_mod.head_weight(model)
    logp, _, match = logprobs_mod.token_logprobs(hidden, weight, batch.targets.astype(jnp.int32), tied=tied,
                                                 chunk=chunk, entropy=False)
    valid = batch.weights > 0
    return jnp.where(valid, logp, 0.0), match & valid
