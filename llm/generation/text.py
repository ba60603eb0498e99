"""Text in, text out: the host wrapper around the jitted generation core.

Public API: :func:`generate` (``generate(model, tokenizer, prompts, config, *, key, decode)``
-> :class:`~llm.generation.decode.GenerationResult`). A call runs in three parts:

1. **Host**: prompts (strings, token-id lists, or already padded arrays) are **left-padded**
   to a bucketed length ``P`` (the longest prompt rounded up to a multiple of
   ``GenerationConfig.prompt_bucket``, :func:`llm.generation.decode.pad_prompts`), so calls
   with similar prompts reuse one compiled function.
2. **Device**: :func:`llm.generation.decode.generate_ids`, prefill and KV-cache decoding in
   one jitted loop per block of rows (see :mod:`llm.generation.decode` for how it runs and
   for the conventions of ``tokens``, ``mask`` and ``logprobs``).
3. **Host**: decode texts, apply **stop strings** (below), build a
   :class:`~llm.generation.decode.GenerationResult`.

**Stop strings are applied on the host after the loop**: the text is decoded
(``skip_special_tokens=True``), the earliest occurrence of any stop string is found, and the
completion is truncated to the fewest tokens whose decoded text contains it (binary search
over prefixes). The returned text ends right after the stop string (it is included), and the
result's ``mask`` / ``lengths`` include the tokens that complete it. The device loop itself
does not stop on stop strings (it stops on EOS or ``max_new_tokens``), so tokens after a
stop string cost compute but are discarded.

The stop-string helpers (``_first_stop``, ``_apply_stop``) live here rather than in
:mod:`llm.generation.stops`: they work on decoded text with the tokenizer, are used by
:func:`generate` alone and are the host half this module documents, while
:mod:`llm.generation.stops` holds the token ids that end a completion on the device (and is
imported by the game tokenizer, which needs no text helpers).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from llm.generation.decode import GenerationConfig, GenerationResult, generate_ids, pad_prompts, split_model
from llm.generation.stops import eos_and_pad

__all__ = ["generate"]


def _first_stop(text: str, stops: Sequence[str]) -> int:
    """End index of the earliest-ending stop string occurrence in ``text``, or -1."""
    ends = [text.find(s) + len(s) for s in stops if s in text]
    return min(ends) if ends else -1


def _apply_stop(tokenizer, ids: list[int], stops: Sequence[str]) -> tuple[int, str] | None:
    """Fewest leading tokens of ``ids`` whose text holds a stop string, and the cut text."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if _first_stop(text, stops) < 0:
        return None
    lo, hi = 1, len(ids)  # invariant: prefix of length hi contains a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if _first_stop(tokenizer.decode(ids[:mid], skip_special_tokens=True), stops) >= 0:
            hi = mid
        else:
            lo = mid + 1
    cut_text = tokenizer.decode(ids[:hi], skip_special_tokens=True)
    return hi, cut_text[: _first_stop(cut_text, stops)]


def generate(model: Any, tokenizer: Any, prompts: Any, config: GenerationConfig | None = None, *,
             key: jax.Array | None = None, decode: bool = True) -> GenerationResult:
    """Generate completions for a batch of prompts.

    Args:
      model: ``nnx.Module`` or ``(graphdef, state)`` (from ``nnx.split``); the state is a
        traced argument, so new parameters of the same structure reuse the compiled function.
      tokenizer: a ``transformers`` tokenizer (for string prompts, default EOS/pad ids and
        texts), or ``None`` with token-id prompts.
      prompts: list of strings (encoded as is: apply the chat template first), list of
        token-id lists, or a pair ``(ids [B, P], mask [B, P])`` already left-padded (used as
        is, no bucketing).
      config: :class:`GenerationConfig` (default: ``GenerationConfig()``).
      key: PRNG key; required unless greedy. The same key gives the same samples.
      decode: build ``texts`` (needs a tokenizer); stop strings need it too.

    Returns:
      :class:`GenerationResult`.
    """
    config = config or GenerationConfig()
    default_eos, default_pad = eos_and_pad(tokenizer)
    pad = config.pad_token_id if config.pad_token_id is not None else default_pad
    if isinstance(prompts, tuple) and len(prompts) == 2 and hasattr(prompts[0], "shape"):
        ids, mask = np.asarray(prompts[0], np.int32), np.asarray(prompts[1]).astype(bool)
        if not mask.any(axis=-1).all():
            raise ValueError("every prompt row needs at least one real token (prompt_mask row is all False)")
    else:
        prompts = list(prompts)
        if prompts and isinstance(prompts[0], str):
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer")
            prompts = list(tokenizer(prompts)["input_ids"])
        ids, mask = pad_prompts(prompts, pad, config.prompt_bucket)
    if config.stop_strings and tokenizer is None:
        raise ValueError(f"stop_strings={config.stop_strings!r} need a tokenizer")

    tokens, out_mask, lengths, logps, hit_eos = generate_ids(
        (split_model(model)), ids, mask, key, config, eos_token_ids=default_eos, pad_token_id=pad)

    reasons = ["eos" if e else "length" for e in np.asarray(hit_eos).tolist()]
    texts = None
    if (decode or config.stop_strings) and tokenizer is not None:
        tok_np, len_np = np.asarray(tokens), np.asarray(lengths)
        seqs = [tok_np[b, : len_np[b]].tolist() for b in range(tok_np.shape[0])]
        texts = list(tokenizer.batch_decode(seqs, skip_special_tokens=True))
        if config.stop_strings:
            tok_np, len_np, lp_np = tok_np.copy(), len_np.copy(), np.asarray(logps).copy()
            changed = False
            for b, seq in enumerate(seqs):
                cut = _apply_stop(tokenizer, seq, config.stop_strings)
                if cut is None:
                    continue
                n_tok, texts[b] = cut
                reasons[b] = "stop"
                tok_np[b, n_tok:] = pad
                lp_np[b, n_tok:] = 0.0
                len_np[b] = n_tok
                changed = True
            if changed:
                tokens, lengths, logps = jnp.asarray(tok_np), jnp.asarray(len_np), jnp.asarray(lp_np)
                out_mask = jnp.arange(tok_np.shape[1])[None, :] < lengths[:, None]
    return GenerationResult(
        tokens=tokens, mask=out_mask, lengths=lengths, logprobs=logps,
        prompt_ids=jnp.asarray(ids), prompt_mask=jnp.asarray(mask), texts=texts, finish_reasons=reasons,
    )
