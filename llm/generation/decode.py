"""Jitted, batched KV-cache generation and full-forward sequence log-probs.

How a call runs (:func:`generate`):

1. **Host**: prompts (strings, token-id lists, or already padded arrays) are **left-padded**
   to a bucketed length ``P`` (the longest prompt rounded up to a multiple of
   ``GenerationConfig.prompt_bucket``), so calls with similar prompts reuse one compiled
   function.
2. **Device, one jitted function** (:func:`generate_ids`): prefill the whole padded prompt
   into an empty cache of capacity ``P + max_new_tokens`` (attention over the ``P`` prompt
   slots only), sample the first token, then decode one token per iteration of
   ``lax.while_loop`` segments that exit early when every row has hit EOS. Segment ``j``
   attends over the first ``P + (j + 1) * kv_block`` cache slots (a static bound), so a step
   reads the weights once plus the *filled* prefix of the cache rounded up to a block, not
   the capacity. The cache is carried through the loops and the layer scan and updated in
   place (``dynamic_update_slice`` on the carry); finished rows keep their batch slot (they
   still cost a step until every row is done; the batch is not refilled). No host
   synchronisation happens inside the loop. The compiled function is cached by
   ``jax.jit`` per ``(model graphdef, B, P, max_new_tokens, greedy, top_k, top_p < 1, kv_block,
   unroll_layers)``; the
   parameter *state* is an ordinary argument (``nnx.split``), so GRPO calls it with new
   parameters every step without recompiling; temperature, top-p mass, EOS ids, the pad
   id and per-row budgets (``max_lengths``) are traced too (only greedy-or-not, ``top_k``
   and whether top-p is on are static).
3. **Host**: decode texts, apply **stop strings** (see below), build a
   :class:`GenerationResult`.

Conventions:

* ``tokens`` ``[B, max_new_tokens]``: sampled ids; after a row's end they hold the pad id.
* ``mask`` ``[B, max_new_tokens]`` bool: True for the completion's tokens, **including the
  EOS token** that ended it (GRPO must learn to emit it) and including the tokens that
  complete a stop string. ``lengths`` = ``mask.sum(-1)``.
* ``logprobs`` ``[B, max_new_tokens]`` float32: log-probability of each sampled token under
  the **unmodified model distribution** (``log_softmax`` of the raw logits, temperature 1, no
  top-k/top-p), which is what the GRPO loss recomputes with :func:`sequence_logprobs`. It is
  *not* the log-prob under the temperature-scaled / filtered distribution that drew the token.
  0 where ``mask`` is False.
* **Stop strings are applied on the host after the loop**: the text is decoded
  (``skip_special_tokens=True``), the earliest occurrence of any stop string is found, and the
  completion is truncated to the fewest tokens whose decoded text contains it (binary search
  over prefixes). The returned text ends right after the stop string (it is included). The
  device loop itself does not stop on stop strings (it stops on EOS or ``max_new_tokens``), so
  tokens after a stop string cost compute but are discarded.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from llm.generation import sampling
from llm.generation.stops import eos_and_pad
from llm.generation.sampling import validate_sampling

__all__ = [
    "GenerationConfig",
    "GenerationResult",
    "generate",
    "generate_ids",
    "pad_prompts",
    "sequence_logprobs",
    "split_model",
    "trace_count",
]

_TRACES = {"generate": 0}


def trace_count() -> int:
    """How many times the generation core has been traced (compiled) in this process."""
    return _TRACES["generate"]


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Generation settings (frozen; ``max_new_tokens``, greedy-or-not, ``top_k`` and
    ``top_p < 1`` select the compiled function, the other values are traced).

    Attributes:
      max_new_tokens: completion capacity ``N`` (>= 1).
      temperature: 0 means greedy; otherwise logits are divided by it before sampling.
      top_k: keep the ``k`` most likely tokens (0 disables).
      top_p: nucleus mass in ``(0, 1]`` (1 disables).
      eos_token_ids: ids that end a completion; ``None`` takes the tokenizer's EOS plus
        ``<|endoftext|>`` / its pad token when they exist; ``()`` never stops early.
      stop_strings: texts that end a completion (applied on the host, see module doc).
      prompt_bucket: prompts are left-padded to a multiple of this length (>= 1).
      pad_token_id: id written after a completion's end and used for left padding;
        ``None`` takes the tokenizer's pad id (else its EOS id, else 0).
      kv_block: decode attention reads the cache up to the filled prefix rounded up to a
        multiple of this many slots (at most :data:`MAX_DECODE_SEGMENTS` blocks per call; the
        block grows when ``max_new_tokens`` needs more), not the whole capacity (>= 1; static).
      unroll_layers: run the layers of each decode step as an unrolled loop over per-layer
        weight buffers made once per call (see
        ``Qwen3ForCausalLM.layer_states``) instead of the layer ``scan``: steps stop
        copying each layer's weights out of the stacked arrays (XLA materialises that
        dynamic slice), at the price of compile time growing with depth and one extra copy
        of the layer weights per call. ``None`` (default) unrolls when the layer weights
        reach :data:`UNROLL_MIN_BYTES` (real models), and keeps the scan for tiny ones.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    eos_token_ids: tuple[int, ...] | None = None
    stop_strings: tuple[str, ...] = ()
    prompt_bucket: int = 32
    pad_token_id: int | None = None
    kv_block: int = 64
    unroll_layers: bool | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} not an integer in [1, inf)")
        validate_sampling(self.temperature, self.top_k, self.top_p)
        if not (isinstance(self.prompt_bucket, int) and self.prompt_bucket >= 1):
            raise ValueError(f"prompt_bucket={self.prompt_bucket!r} not an integer in [1, inf)")
        if not (isinstance(self.kv_block, int) and self.kv_block >= 1):
            raise ValueError(f"kv_block={self.kv_block!r} not an integer in [1, inf)")
        if self.unroll_layers is not None and not isinstance(self.unroll_layers, bool):
            raise ValueError(f"unroll_layers={self.unroll_layers!r} must be None, True or False")
        if self.eos_token_ids is not None:
            object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))
        if isinstance(self.stop_strings, str):
            object.__setattr__(self, "stop_strings", (self.stop_strings,))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise ValueError(f"stop_strings={self.stop_strings!r} must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclasses.dataclass
class GenerationResult:
    """Output of :func:`generate` (arrays on device; ``texts``/``finish_reasons`` host lists).

    Attributes:
      tokens: ``[B, N]`` int32 completion ids, pad id after each row's end.
      mask: ``[B, N]`` bool, True on completion tokens (EOS / stop-string tokens included).
      lengths: ``[B]`` int32 completion lengths (``mask.sum(-1)``).
      logprobs: ``[B, N]`` float32 raw-model (temperature 1, unfiltered) log-probs of
        ``tokens``; 0 where ``mask`` is False.
      prompt_ids: ``[B, P]`` int32 left-padded prompts that were fed to the model.
      prompt_mask: ``[B, P]`` bool, True on real prompt tokens.
      texts: decoded completions (special tokens skipped; cut after a stop string), or
        ``None`` when no tokenizer was given.
      finish_reasons: per row ``"eos"``, ``"stop"`` (stop string) or ``"length"``.
    """

    tokens: jax.Array
    mask: jax.Array
    lengths: jax.Array
    logprobs: jax.Array
    prompt_ids: jax.Array
    prompt_mask: jax.Array
    texts: list[str] | None
    finish_reasons: list[str]


# ----------------------------------------------------------------------------- helpers
def split_model(model: Any) -> tuple[Any, Any]:
    """``(graphdef, state)`` from an ``nnx.Module`` or an existing ``(graphdef, state)`` pair."""
    if isinstance(model, nnx.Module):
        return nnx.split(model)
    if isinstance(model, (tuple, list)) and len(model) == 2:
        return model[0], model[1]
    raise TypeError(f"model must be an nnx.Module or a (graphdef, state) pair, got {type(model).__name__}")


def _as_module(model: Any) -> nnx.Module:
    if isinstance(model, nnx.Module):
        return model
    graphdef, state = split_model(model)
    return nnx.merge(graphdef, state)


def left_pad_positions(mask: jax.Array) -> jax.Array:
    """RoPE positions of a left-padded batch: ``cumsum(mask) - 1`` clipped at 0."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int, bucket: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token-id lists to the longest one rounded up to a multiple of ``bucket``.

    Returns ``(ids [B, P] int32, mask [B, P] bool)``. Raises ``ValueError`` on an empty batch
    or an empty prompt (the first completion token needs a previous token).
    """
    if len(prompts) == 0:
        raise ValueError("prompts is empty; need at least one prompt")
    lengths = [len(p) for p in prompts]
    if min(lengths) == 0:
        raise ValueError(f"prompt {lengths.index(0)} is empty; every prompt needs at least one token")
    width = -(-max(lengths) // bucket) * bucket
    ids = np.full((len(prompts), width), pad_id, dtype=np.int32)
    mask = np.zeros((len(prompts), width), dtype=bool)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = np.asarray(p, dtype=np.int32)
        mask[row, width - len(p):] = True
    return ids, mask


# ----------------------------------------------------------------------------- device core
def _prefill_all_but_last(model, input_ids, prompt_mask, capacity: int):
    """Write the KV cache of every prompt token but the last; return ``(cache, positions)``.

    The logits of this call are unused, so XLA drops the ``[B, P-1, vocab]`` LM-head
    product (the most expensive part of a prefill for large vocabularies); the caller runs
    the last prompt token (and, for :func:`sequence_logprobs`, the completion) through the
    cache to get exactly the logits it needs.
    """
    batch, prompt_len = input_ids.shape
    positions = left_pad_positions(prompt_mask)
    cache = model.init_cache(batch, capacity)
    if prompt_len > 1:
        _, cache = model(input_ids[:, :-1], positions=positions[:, :-1], attention_mask=prompt_mask[:, :-1],
                         cache=cache)
    return cache, positions


#: EOS ids travel as a fixed-size int32 array (padded with -1) so that changing them does
#: not recompile; at most this many.
MAX_EOS_IDS = 8


#: ``GenerationConfig.unroll_layers=None`` unrolls the layers when their stacked weights take
#: at least this many bytes (the ~100M preset's 8 layers take 100 MB; the test models < 1 MB).
UNROLL_MIN_BYTES = 32 * 2**20


def _unroll_layers(config: GenerationConfig, state: Any) -> bool:
    if config.unroll_layers is not None:
        return config.unroll_layers
    layers = state["layers"] if "layers" in state else {}
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(layers)) >= UNROLL_MIN_BYTES


#: At most this many decode segments (separately compiled loop bodies) per call: the
#: attention bound of a segment is static, so more segments read less of the cache but
#: compile longer. ``kv_block`` is enlarged when ``max_new_tokens`` would need more.
MAX_DECODE_SEGMENTS = 4


def decode_segments(prompt_len: int, max_new_tokens: int, kv_block: int) -> list[tuple[int, int, int]]:
    """Static plan of the decode loop: ``[(first_step, end_step, kv_len), ...]``.

    Step ``s`` (``1 <= s < max_new_tokens``) feeds token ``s - 1`` into cache slot
    ``prompt_len + s - 1``, so its attention needs ``prompt_len + s`` slots; a segment
    covering steps ``[a, b)`` reads ``kv_len = prompt_len + b - 1`` (its last step's need,
    rounded up by the block size, capped at the capacity ``prompt_len + max_new_tokens``).
    """
    steps = max_new_tokens - 1
    if steps <= 0:
        return []
    block = max(kv_block, -(-steps // MAX_DECODE_SEGMENTS))
    plan, first = [], 1
    while first <= steps:
        end = min(first + block, steps + 1)
        plan.append((first, end, prompt_len + end - 1))
        first = end
    return plan


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "greedy", "top_k", "use_top_p",
                                             "kv_block", "unroll_layers"))
def _generate_core(graphdef, state, input_ids, prompt_mask, key, temperature, top_p, eos, pad_id, budget=None, *,
                   max_new_tokens, greedy, top_k, use_top_p, kv_block=64, unroll_layers=True):
    """Prefill + segmented ``lax.while_loop`` decode. ``temperature``, ``top_p``,
    ``eos [MAX_EOS_IDS]``, ``pad_id`` and ``budget [B]`` (per-row token limits, ``None``: all
    ``max_new_tokens``) are traced; the static arguments select the code path."""
    _TRACES["generate"] += 1  # runs only while tracing
    batch, prompt_len = input_ids.shape
    n = max_new_tokens
    model = nnx.merge(graphdef, state)
    # per-layer weight buffers for the decode loop, sliced once here rather than at every step
    layers = model.layer_states() if unroll_layers else None

    def choose(step, logits):
        # one arg-max over the vocabulary (filters as a per-row threshold from a bounded
        # candidate set); the log-prob is logit - logsumexp (no [B, V] log-prob array)
        return sampling.choose_tokens(jax.random.fold_in(key, step), logits, greedy=greedy, temperature=temperature,
                                      top_k=top_k, top_p=top_p, use_top_p=use_top_p)

    def is_eos(tok):
        return jnp.any(tok[:, None] == eos[None, :], axis=-1)

    # prefill: the whole prompt into the cache, attention over the prompt slots only, the LM
    # head only at the last position; the layer scan (its weight slices are amortised over
    # the P prompt tokens, unlike a decode step's)
    positions = left_pad_positions(prompt_mask)
    logits, cache = model(input_ids, positions=positions, attention_mask=prompt_mask,
                          cache=model.init_cache(batch, prompt_len + n), logits_to_keep=1, kv_len=prompt_len)
    tok, logp = choose(0, logits[:, -1])
    limit = jnp.full((batch,), n, jnp.int32) if budget is None else jnp.clip(budget.astype(jnp.int32), 1, n)
    done = is_eos(tok) | (limit <= 1)
    tokens = jnp.full((batch, n), pad_id, jnp.int32).at[:, 0].set(tok)
    logps = jnp.zeros((batch, n), jnp.float32).at[:, 0].set(logp)
    lengths = jnp.ones((batch,), jnp.int32)
    next_pos = jnp.sum(prompt_mask.astype(jnp.int32), axis=-1)

    def segment(end, kv_len):
        def cond(carry):
            step, _, _, done, *_ = carry
            return (step < end) & ~jnp.all(done)

        def body(carry):
            step, cache, prev, done, tokens, logps, lengths = carry
            m = nnx.merge(graphdef, state)
            pos = (next_pos + step - 1)[:, None]
            logits, cache = m(prev[:, None], positions=pos, cache=cache, kv_len=kv_len, layer_states=layers)
            tok, logp = choose(step, logits[:, -1])
            tok = jnp.where(done, pad_id, tok)
            logp = jnp.where(done, 0.0, logp)
            tokens = jax.lax.dynamic_update_slice(tokens, tok[:, None], (0, step))
            logps = jax.lax.dynamic_update_slice(logps, logp[:, None], (0, step))
            lengths = lengths + (~done).astype(jnp.int32)
            done = done | is_eos(tok) | (lengths >= limit)
            return step + 1, cache, tok, done, tokens, logps, lengths

        return cond, body

    carry = (jnp.asarray(1, jnp.int32), cache, tok, done, tokens, logps, lengths)
    for _, end, kv_len in decode_segments(prompt_len, n, kv_block):
        cond, body = segment(end, kv_len)
        carry = jax.lax.while_loop(cond, body, carry)
    _, _, _, _, tokens, logps, lengths = carry
    mask = jnp.arange(n)[None, :] < lengths[:, None]
    # a row ended by EOS has it as its last token (a budget stop is a "length" finish)
    hit_eos = is_eos(jnp.take_along_axis(tokens, lengths[:, None] - 1, axis=-1)[:, 0])
    return tokens, mask, lengths, logps, hit_eos


def generate_ids(model: Any, input_ids, prompt_mask, key: jax.Array | None, config: GenerationConfig, *,
                 eos_token_ids: Sequence[int] = (), pad_token_id: int = 0, max_lengths=None):
    """Device part of generation on already left-padded arrays (no tokenizer, no stop strings).

    Compiled once per ``(graphdef, B, P, max_new_tokens, greedy, top_k, top_p < 1, kv_block,
    unroll_layers)``;
    parameters, prompts, key, temperature, top-p mass, EOS ids and pad id are traced.

    Args:
      model: ``nnx.Module`` or ``(graphdef, state)``.
      input_ids: ``[B, P]`` int32 left-padded prompts.
      prompt_mask: ``[B, P]`` bool/int, 1 on real tokens; every row needs at least one.
      key: PRNG key (may be ``None`` for greedy).
      config: sampling settings (``eos_token_ids``/``pad_token_id`` there win over the
        keyword arguments when set).
      eos_token_ids, pad_token_id: used when the config leaves them ``None``.
      max_lengths: optional ``[B]`` int per-row completion budgets in ``[1, max_new_tokens]``
        (traced: new budgets do not recompile). A row stops after that many tokens as if it
        had hit its length limit; the loop exits once every row has stopped (the benchmark's
        reproducible early-finish schedule, ``python -m llm.benchmark generate --eos-after``).

    Returns:
      ``(tokens [B, N] int32, mask [B, N] bool, lengths [B] int32, logprobs [B, N] float32,
      hit_eos [B] bool)``.
    """
    graphdef, state = split_model(model)
    input_ids = jnp.asarray(input_ids, jnp.int32)
    prompt_mask = jnp.asarray(prompt_mask).astype(bool)
    chex.assert_rank(input_ids, 2)
    chex.assert_equal_shape([input_ids, prompt_mask])
    if key is None:
        if not config.greedy:
            raise ValueError(f"key is None but temperature={config.temperature}; sampling needs a PRNG key")
        key = jax.random.PRNGKey(0)
    eos = config.eos_token_ids if config.eos_token_ids is not None else tuple(int(i) for i in eos_token_ids)
    eos = sorted(set(eos))
    if len(eos) > MAX_EOS_IDS:
        raise ValueError(f"eos_token_ids has {len(eos)} ids; at most {MAX_EOS_IDS} are supported")
    eos_arr = jnp.asarray(eos + [-1] * (MAX_EOS_IDS - len(eos)), jnp.int32)
    pad = config.pad_token_id if config.pad_token_id is not None else int(pad_token_id)
    budget = jnp.full((input_ids.shape[0],), config.max_new_tokens, jnp.int32)
    if max_lengths is not None:
        if isinstance(max_lengths, (list, tuple, np.ndarray)):
            arr = np.asarray(max_lengths)
            if arr.shape != (input_ids.shape[0],) or arr.min() < 1 or arr.max() > config.max_new_tokens:
                raise ValueError(f"max_lengths must be [B={input_ids.shape[0]}] integers in "
                                 f"[1, max_new_tokens={config.max_new_tokens}], got {arr.tolist()}")
        budget = jnp.asarray(max_lengths, jnp.int32)
        chex.assert_shape(budget, (input_ids.shape[0],))
    return _generate_core(
        graphdef, state, input_ids, prompt_mask, key,
        jnp.asarray(config.temperature if config.temperature > 0 else 1.0, jnp.float32),
        jnp.asarray(config.top_p, jnp.float32), eos_arr, jnp.asarray(pad, jnp.int32), budget,
        max_new_tokens=config.max_new_tokens, greedy=config.greedy, top_k=int(config.top_k),
        use_top_p=config.top_p < 1.0, kv_block=int(config.kv_block), unroll_layers=_unroll_layers(config, state),
    )


# ----------------------------------------------------------------------------- host wrapper
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


# ----------------------------------------------------------------------------- log-probs
def sequence_logprobs(model: Any, prompt_ids, prompt_mask, completion_ids, completion_mask, *,
                      temperature: float = 1.0) -> jax.Array:
    """Per-token log-probs of completions under the model, in one pass over the sequence.

    Pure and differentiable (no ``jit`` inside; call it inside the GRPO loss). The prompt is
    left-padded and the completion right-padded, exactly as :func:`generate` returns them,
    so positions (``cumsum(mask) - 1``) match the cached decoding.

    The pass runs the prompt (all but its last token) into a KV cache, then the last prompt
    token and the completion through that cache: numerically the full causal forward, but the
    LM head is evaluated only at the ``T`` positions that predict completion tokens (no
    ``[B, P, vocab]`` logits, which dominate memory for real Qwen3 vocabularies).

    Args:
      model: ``nnx.Module`` or ``(graphdef, state)``.
      prompt_ids, prompt_mask: ``[B, P]`` left-padded prompts and their mask (the last
        column must be a real token in every row, as left padding guarantees).
      completion_ids, completion_mask: ``[B, T]`` completions and their mask.
      temperature: divide logits by it first (1 = the raw model distribution, the one
        :func:`generate` reports).

    Returns:
      ``[B, T]`` float32 log-probs, 0 where ``completion_mask`` is False.
    """
    chex.assert_rank([prompt_ids, completion_ids], 2)
    chex.assert_equal_shape([prompt_ids, prompt_mask])
    chex.assert_equal_shape([completion_ids, completion_mask])
    chex.assert_equal_shape_prefix([prompt_ids, completion_ids], 1)
    module = _as_module(model)
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    completion_ids = jnp.asarray(completion_ids, jnp.int32)
    pmask = jnp.asarray(prompt_mask).astype(bool)
    cmask = jnp.asarray(completion_mask).astype(bool)
    t = completion_ids.shape[1]
    cache, positions = _prefill_all_but_last(module, prompt_ids, pmask, prompt_ids.shape[1] + t)
    # inputs that predict the completion: last prompt token, then completion[:, :-1]
    ids = jnp.concatenate([prompt_ids[:, -1:], completion_ids[:, :-1]], axis=1)
    mask = jnp.concatenate([pmask[:, -1:], cmask[:, :-1]], axis=1)
    pos = positions[:, -1:] + jnp.cumsum(mask.astype(jnp.int32), axis=1) - mask[:, :1].astype(jnp.int32)
    logits, _ = module(ids, positions=pos, attention_mask=mask, cache=cache)
    logits = logits.astype(jnp.float32)
    if temperature != 1.0:
        logits = logits / temperature
    logp = jax.nn.log_softmax(logits, axis=-1)
    out = jnp.take_along_axis(logp, completion_ids[..., None], axis=-1)[..., 0]
    return jnp.where(cmask, out, 0.0)
