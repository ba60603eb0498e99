"""Jitted, batched KV-cache generation on left-padded token ids: the device core.

This module holds what runs on the device and what it is compiled from: the settings
(:class:`GenerationConfig`), the result (:class:`GenerationResult`), prompt padding
(:func:`pad_prompts`), the prefill (:func:`prefill`), the segmented decode loop and
:func:`generate_ids`, which runs them. The rest of generation lives beside it:

* :mod:`llm.generation.text` -- :func:`~llm.generation.text.generate`, text in, text out: pads
  the prompts, calls :func:`generate_ids`, decodes the texts and applies the **stop strings**;
* :mod:`llm.generation.logprobs` -- :func:`~llm.generation.logprobs.sequence_logprobs`, the
  full-forward log-probs of given completions (what the GRPO loss recomputes);
* :mod:`llm.generation.lowering` -- :func:`~llm.generation.lowering.lower_sampling`, the same
  compiled functions lowered from abstract shapes for the step plan;
* :mod:`llm.generation.row_blocks` -- how many rows one compiled call may take.

How :func:`generate_ids` runs: **one jitted function per block of rows** (the whole batch
unless ``GenerationConfig.row_block`` says otherwise or, by default, the device's free
memory does not hold the compiled call: :func:`llm.generation.row_blocks.choose_row_block`).
The prompts come **left-padded** to a length ``P`` (:func:`pad_prompts` rounds the longest
prompt up to a multiple of ``GenerationConfig.prompt_bucket``, so calls with similar prompts
reuse one compiled function). The weights are read through one compute-dtype copy made per
call (:func:`sampling_state`). Prefill the whole padded prompt into an empty cache of
capacity ``P + max_new_tokens`` (:func:`prefill`: the causal self-attention of the prompt by
the model's ``attention_impl``, no dense score tensor, in blocks of rows), sample the first
token, then decode one token per iteration of ``lax.while_loop`` segments that exit early
when every row has hit EOS. Segment ``j`` attends over the first ``P + (j + 1) * kv_block``
cache slots (a static bound), so a step reads the weights once plus the *filled* prefix of
the cache rounded up to a block, not the capacity. The cache (stacked for the layer scan,
one head-major buffer per layer for the unrolled layers) is carried through the loops and
updated in place (``dynamic_update_slice`` on the carry); finished rows keep their batch
slot (they still cost a step until every row is done; the batch is not refilled). No host
synchronisation happens inside the loop. The compiled function is cached by ``jax.jit`` per
``(model graphdef, B, P, max_new_tokens, greedy, top_k, top_p < 1, kv_block,
unroll_layers)``; the parameter *state* is an ordinary argument (``nnx.split``), so GRPO
calls it with new parameters every step without recompiling; temperature, top-p mass, EOS
ids, the pad id and per-row budgets (``max_lengths``) are traced too (only greedy-or-not,
``top_k`` and whether top-p is on are static).

Conventions:

* ``tokens`` ``[B, max_new_tokens]``: sampled ids; after a row's end they hold the pad id.
* ``mask`` ``[B, max_new_tokens]`` bool: True for the completion's tokens, **including the
  EOS token** that ended it (GRPO must learn to emit it) and, after
  :func:`llm.generation.text.generate` has applied them, including the tokens that complete
  a stop string. ``lengths`` = ``mask.sum(-1)``.
* ``logprobs`` ``[B, max_new_tokens]`` float32: log-probability of each sampled token under
  the **unmodified model distribution** (``log_softmax`` of the raw logits, temperature 1, no
  top-k/top-p), which is what the GRPO loss recomputes with
  :func:`llm.generation.logprobs.sequence_logprobs`. It is *not* the log-prob under the
  temperature-scaled / filtered distribution that drew the token. 0 where ``mask`` is False.
* The device loop stops on EOS or ``max_new_tokens`` only; stop strings are applied on the
  host afterwards (:mod:`llm.generation.text`).
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

from llm.generation import row_blocks, sampling
from llm.generation.sampling import validate_sampling

__all__ = [
    "GenerationConfig",
    "GenerationResult",
    "generate_ids",
    "pad_prompts",
    "prefill",
    "sampling_state",
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
      stop_strings: texts that end a completion (applied on the host by
        :func:`llm.generation.text.generate`, see that module's doc).
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
      row_block: rows per compiled sampling call (a divisor of the batch; the calls run one
        after the other, block ``i`` with the key ``fold_in(key, i)``). ``None`` (default)
        chooses it from the compiler's memory analysis where the device reports its memory
        (GPU, TPU): the whole batch when the call's temporaries and outputs fit the free
        memory, else the largest divisor that fits (:func:`choose_row_block`); the whole
        batch on the CPU.
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
    row_block: int | None = None

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
        if self.row_block is not None and (isinstance(self.row_block, bool) or not isinstance(self.row_block, int)
                                           or self.row_block < 1):
            raise ValueError(f"row_block={self.row_block!r} must be None or an integer in [1, batch]")
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
    """Output of :func:`llm.generation.text.generate` (arrays on device; ``texts``/``finish_reasons``
    host lists).

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


#: Prompt tokens per block of rows of a prefill (:func:`prefill_rows`): the prefill's
#: activations (the MLP's ``[rows, P, intermediate]`` pair, the attention tiles) scale with
#: the rows of one block, not with the batch. 32768 tokens of Qwen3-4B: 1.2 GiB of MLP
#: activations per block.
PREFILL_TOKENS = 32768


def prefill_rows(batch: int, prompt_len: int, tokens: int = PREFILL_TOKENS) -> int:
    """Rows per prefill block: the largest divisor of ``batch`` whose block holds at most
    ``tokens`` prompt tokens (at least one row)."""
    best = 1
    for rows in range(1, batch + 1):
        if batch % rows == 0 and rows * prompt_len <= tokens:
            best = rows
    return best


def sampling_state(config: Any, state: Any) -> Any:
    """The parameters the sampler reads: floating leaves cast to the compute dtype when it is
    narrower than the storage dtype (float32 masters, bfloat16 compute: a bfloat16 copy, half
    the bytes, made once per sampling call). The layers cast every weight to the compute
    dtype before using it, so the values are the same; each decode step then reads half the
    bytes. Other leaves and same-width dtypes pass through (no copy)."""
    target = jnp.dtype(config.jnp_dtype)

    def cast(x):
        if jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(x.dtype).itemsize > target.itemsize:
            return x.astype(target)
        return x

    return jax.tree.map(cast, state)


def prefill(model, input_ids, prompt_mask, capacity: int, *, block_rows: int | None = None,
            layer_states: list | None = None):
    """The whole left-padded prompt into one empty KV cache of ``capacity`` slots.

    Returns ``(logits [B, V] float32 at each row's last prompt position, cache)``; the cache
    holds slots ``[0, P)`` (index ``P``). Attention is the causal self-attention of the
    prompt by ``config.attention_impl`` (``kv_len == P``: no dense ``[B, heads, P, P]``
    scores), the LM head runs at the last position only. ``block_rows`` (static, a divisor
    of ``B``; default :func:`prefill_rows`) prefills that many rows at a time, a
    ``fori_loop`` writing each block's rows of the one cache in place: the activations are a
    block's, the cache is allocated once. ``layer_states`` (``model.layer_states()``) runs
    the layers unrolled into a per-layer cache (``init_cache(per_layer=True)``, what the
    unrolled decode loop reads); ``None``: the layer scan and a stacked cache.
    """
    batch, prompt_len = input_ids.shape
    positions = left_pad_positions(prompt_mask)
    cache = model.init_cache(batch, capacity, per_layer=layer_states is not None)
    rows = prefill_rows(batch, prompt_len) if block_rows is None else int(block_rows)
    if rows < 1 or batch % rows:
        raise ValueError(f"block_rows={block_rows!r} must divide the batch B={batch}")
    if rows == batch:
        logits, cache = model(input_ids, positions=positions, attention_mask=prompt_mask, cache=cache,
                              logits_to_keep=1, kv_len=prompt_len, layer_states=layer_states)
        return logits[:, -1], cache
    vocab = model.config.vocab_size

    def block(i, carry):
        k, v, mask, out = carry
        r0 = i * rows
        take = lambda x: jax.lax.dynamic_slice_in_dim(x, r0, rows, axis=0)  # noqa: E731
        sub = type(cache)(k=k, v=v, mask=mask, index=jnp.zeros((), jnp.int32))
        logits, sub = model(take(input_ids), positions=take(positions), attention_mask=take(prompt_mask), cache=sub,
                            logits_to_keep=1, kv_len=prompt_len, row_start=r0, layer_states=layer_states)
        out = jax.lax.dynamic_update_slice_in_dim(out, logits[:, -1], r0, axis=0)
        return sub.k, sub.v, sub.mask, out

    init = (cache.k, cache.v, cache.mask, jnp.zeros((batch, vocab), jnp.float32))
    k, v, mask, logits = jax.lax.fori_loop(0, batch // rows, block, init)
    return logits, type(cache)(k=k, v=v, mask=mask, index=jnp.asarray(prompt_len, jnp.int32))


def _sampler(key, greedy, temperature, top_k, top_p, use_top_p):
    def choose(step, logits):
        # one arg-max over the vocabulary (filters as a per-row threshold from a bounded
        # candidate set); the log-prob is logit - logsumexp (no [B, V] log-prob array)
        return sampling.choose_tokens(jax.random.fold_in(key, step), logits, greedy=greedy, temperature=temperature,
                                      top_k=top_k, top_p=top_p, use_top_p=use_top_p)

    return choose


def _first_token(choose, logits, prompt_mask, eos, pad_id, budget, n):
    """The decode loop's starting carry after the prefill: token 0 and the buffers."""
    batch = logits.shape[0]
    tok, logp = choose(0, logits)
    limit = jnp.full((batch,), n, jnp.int32) if budget is None else jnp.clip(budget.astype(jnp.int32), 1, n)
    done = _is_eos(tok, eos) | (limit <= 1)
    tokens = jnp.full((batch, n), pad_id, jnp.int32).at[:, 0].set(tok)
    logps = jnp.zeros((batch, n), jnp.float32).at[:, 0].set(logp)
    lengths = jnp.ones((batch,), jnp.int32)
    next_pos = jnp.sum(prompt_mask.astype(jnp.int32), axis=-1)
    return (jnp.asarray(1, jnp.int32), tok, done, tokens, logps, lengths), limit, next_pos


def _is_eos(tok, eos):
    return jnp.any(tok[:, None] == eos[None, :], axis=-1)


def _decode_loop(graphdef, state, layers, cache, carry, limit, next_pos, choose, eos, pad_id, *, prompt_len, n,
                 kv_block):
    """The segmented ``lax.while_loop`` decode from the first token's carry to the end."""
    step, tok, done, tokens, logps, lengths = carry

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
            done = done | _is_eos(tok, eos) | (lengths >= limit)
            return step + 1, cache, tok, done, tokens, logps, lengths

        return cond, body

    loop = (step, cache, tok, done, tokens, logps, lengths)
    for _, end, kv_len in decode_segments(prompt_len, n, kv_block):
        cond, body = segment(end, kv_len)
        loop = jax.lax.while_loop(cond, body, loop)
    _, cache, _, _, tokens, logps, lengths = loop
    mask = jnp.arange(n)[None, :] < lengths[:, None]
    # a row ended by EOS has it as its last token (a budget stop is a "length" finish)
    hit_eos = _is_eos(jnp.take_along_axis(tokens, lengths[:, None] - 1, axis=-1)[:, 0], eos)
    return (tokens, mask, lengths, logps, hit_eos), cache


#: The static arguments of the compiled sampling functions (:func:`_generate_core`,
#: :func:`_prefill_core`, :func:`_decode_core`).
CORE_STATIC = ("graphdef", "max_new_tokens", "greedy", "top_k", "use_top_p", "kv_block", "unroll_layers",
               "prefill_block")


@functools.partial(jax.jit, static_argnames=CORE_STATIC)
def _generate_core(graphdef, state, input_ids, prompt_mask, key, temperature, top_p, eos, pad_id, budget=None, *,
                   max_new_tokens, greedy, top_k, use_top_p, kv_block=64, unroll_layers=True, prefill_block=None):
    """Prefill + segmented ``lax.while_loop`` decode. ``temperature``, ``top_p``,
    ``eos [MAX_EOS_IDS]``, ``pad_id`` and ``budget [B]`` (per-row token limits, ``None``: all
    ``max_new_tokens``) are traced; the static arguments select the code path. The weights
    are read through :func:`sampling_state` (one compute-dtype copy per call)."""
    _TRACES["generate"] += 1  # runs only while tracing
    prompt_len = input_ids.shape[1]
    n = max_new_tokens
    # per-layer weight buffers for the decode loop, sliced (and cast) once here rather than at
    # every step
    state, model, layers = _sampling_model(graphdef, state, unroll_layers)
    choose = _sampler(key, greedy, temperature, top_k, top_p, use_top_p)
    # prefill: the whole prompt into the one cache (per layer when the layers are unrolled),
    # causal self-attention over the prompt (the configured kernel), the LM head only at the
    # last position, in blocks of rows
    logits, cache = prefill(model, input_ids, prompt_mask, prompt_len + n, block_rows=prefill_block, layer_states=layers)
    carry, limit, next_pos = _first_token(choose, logits, prompt_mask, eos, pad_id, budget, n)
    return _decode_loop(graphdef, state, layers, cache, carry, limit, next_pos, choose, eos, pad_id,
                        prompt_len=prompt_len, n=n, kv_block=kv_block)[0]


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "prefill_block", "unroll_layers"))
def _prefill_core(graphdef, state, input_ids, prompt_mask, *, max_new_tokens, prefill_block=None, unroll_layers=True):
    """The prefill of :func:`_generate_core` alone (its own functions): ``(logits [B, V],
    cache)``; compiled by the step plan (:mod:`llm.benchmark.step_plan`) to see the phase apart."""
    _, model, layers = _sampling_model(graphdef, state, unroll_layers)
    return prefill(model, input_ids, prompt_mask, input_ids.shape[1] + max_new_tokens, block_rows=prefill_block,
                   layer_states=layers)


@functools.partial(jax.jit, static_argnames=CORE_STATIC, donate_argnames=("cache",))
def _decode_core(graphdef, state, cache, logits, prompt_mask, key, temperature, top_p, eos, pad_id, budget=None, *,
                 max_new_tokens, greedy, top_k, use_top_p, kv_block=64, unroll_layers=True, prefill_block=None):
    """The decode loop of :func:`_generate_core` alone, from a filled cache (donated: it comes
    back, updated in place, after the call's outputs) and the prefill's last logits (the step
    plan's decode phase; same functions, same compute-dtype copy)."""
    del prefill_block
    n = max_new_tokens
    state, model, layers = _sampling_model(graphdef, state, unroll_layers)
    choose = _sampler(key, greedy, temperature, top_k, top_p, use_top_p)
    carry, limit, next_pos = _first_token(choose, logits, prompt_mask, eos, pad_id, budget, n)
    return _decode_loop(graphdef, state, layers, cache, carry, limit, next_pos, choose, eos, pad_id,
                        prompt_len=prompt_mask.shape[1], n=n, kv_block=kv_block)


def _sampling_model(graphdef, state, unroll_layers: bool):
    """``(state, model, layers)`` the sampler runs on: :func:`sampling_state` of a split
    model, and, with ``unroll_layers``, the per-layer weights (``layer_states``) each cast
    from its own slice of the stacked masters (the stacked compute-dtype copy never exists:
    one copy of the layer weights per call, in the compute dtype)."""
    config = nnx.merge(graphdef, state).config
    if not unroll_layers:
        state = sampling_state(config, state)
        return state, nnx.merge(graphdef, state), None
    layers = [sampling_state(config, s) for s in nnx.merge(graphdef, state).layer_states()]

    def cast_outside_layers(path, x):
        top = getattr(path[0], "key", None) if path else None
        return x if top == "layers" else sampling_state(config, x)

    state = jax.tree_util.tree_map_with_path(cast_outside_layers, state)
    return state, nnx.merge(graphdef, state), layers


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
    dynamic = (state, input_ids, prompt_mask, key,
               jnp.asarray(config.temperature if config.temperature > 0 else 1.0, jnp.float32),
               jnp.asarray(config.top_p, jnp.float32), eos_arr, jnp.asarray(pad, jnp.int32), budget)
    statics = core_statics(config, state)
    batch = input_ids.shape[0]
    rows = config.row_block
    if rows is None:
        rows = _auto_row_block(graphdef, dynamic, statics)
    if batch % rows:
        raise ValueError(f"row_block={rows} must divide the batch B={batch}")
    if rows == batch:
        return _generate_core(graphdef, *dynamic, **statics)
    parts = []
    for b, start in enumerate(range(0, batch, rows)):
        block = _row_slice(dynamic, start, rows)
        block = (block[0], block[1], block[2], jax.random.fold_in(key, b)) + block[4:]
        parts.append(_generate_core(graphdef, *block, **statics))
    return tuple(jnp.concatenate(xs, axis=0) for xs in zip(*parts))


# The row-block plumbing of generate_ids stays here, beside the core it compiles: core_statics,
# _row_slice and _auto_row_block run on every generate_ids call and need _generate_core, so
# moving them to llm.generation.row_blocks (imported by this module) would make an import
# cycle, and moving them to llm.generation.lowering (which imports this module) would need a
# lazy import back. Only the lowering from abstract shapes (abstract_core_args,
# lower_sampling), which nothing here calls, lives in llm.generation.lowering.
def core_statics(config: GenerationConfig, state: Any) -> dict[str, Any]:
    """The static arguments :func:`generate_ids` compiles :func:`_generate_core` with."""
    return dict(max_new_tokens=config.max_new_tokens, greedy=config.greedy, top_k=int(config.top_k),
                use_top_p=config.top_p < 1.0, kv_block=int(config.kv_block),
                unroll_layers=_unroll_layers(config, state), prefill_block=None)


def _row_slice(dynamic: tuple, start: int, rows: int) -> tuple:
    """Rows ``[start, start + rows)`` of the per-row arguments (prompts, mask, budget)."""
    state, ids, mask, key, temperature, top_p, eos, pad, budget = dynamic
    cut = lambda x: x[start:start + rows]  # noqa: E731
    return (state, cut(ids), cut(mask), key, temperature, top_p, eos, pad, cut(budget))


def _auto_row_block(graphdef: Any, dynamic: tuple, statics: dict) -> int:
    """``row_block=None``: :func:`llm.generation.row_blocks.auto_row_block` on the compiled calls'
    memory analyses (the choice is kept per graph, shapes and static arguments)."""
    leaves = jax.tree.leaves(dynamic)
    key = (graphdef, tuple((x.shape, str(x.dtype)) for x in leaves), tuple(sorted(statics.items())))

    def need(rows):
        block = _row_slice(dynamic, 0, rows)
        return row_blocks.call_bytes(_generate_core.lower(graphdef, *block, **statics).compile())

    return row_blocks.auto_row_block(key, dynamic[1].shape[0], dynamic[1], need)
