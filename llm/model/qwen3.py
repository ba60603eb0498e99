"""The Qwen3 decoder in Flax NNX.

Architecture (identical to ``transformers``' ``Qwen3ForCausalLM``): token embedding, a stack of
decoder layers (pre-RMSNorm, grouped-query attention with per-head RMSNorm on q and k applied
*before* rotary position embedding, pre-RMSNorm SwiGLU MLP, residuals), a final RMSNorm and a
tied or untied LM head. ``head_dim`` is independent of ``hidden_size / num_attention_heads``.

The decoder layers are stored *stacked*: every parameter of ``model.layers`` has a leading
axis of size ``num_hidden_layers`` and the forward pass is one ``jax.lax.scan`` over it, so
compile time does not grow with depth. The KV cache is stacked the same way.

Shapes (B batch, T new tokens, S cache capacity, L layers, V vocab)::

    input_ids       [B, T]  int32
    positions       [B, T]  int32   RoPE positions
    attention_mask  [B, T]  bool    True = real token, False = (left) padding
    logits          [B, T, V] float32
    KVCache.k / .v  [L, B, S, num_key_value_heads, head_dim]  compute dtype (stacked), or
                    L x [B, kv, S, head_dim] (per layer, for the unrolled decode layers)
    KVCache.mask    [B, S]  bool
    KVCache.index   []      int32
"""

from __future__ import annotations

import math
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
from flax import nnx

from llm.model.attention import causal_attention, grouped_attention
from llm.model.config import INIT_STD, REMAT_POLICIES, Qwen3Config

#: Up to this many rows (B * T) the tied LM head is computed as ``table @ x.T`` (see __call__).
_SMALL_HEAD_ROWS = 64


@flax.struct.dataclass
class KVCache:
    """Key/value cache for batched decoding.

    ``k``/``v`` are ``[L, B, S, num_key_value_heads, head_dim]`` in the compute dtype (S is the
    capacity), stacked over the layers (the layer ``scan`` carries them), or tuples of ``L``
    per-layer head-major ``[B, num_key_value_heads, S, head_dim]`` arrays
    (``init_cache(per_layer=True)``, for the unrolled layers of ``layer_states``: each
    layer's write updates its own buffer in place, where XLA copies a stacked buffer that
    several layers of one loop iteration write, and a decode step's attention reads each
    head's slots as one contiguous matrix, with no transposed copy); ``mask[b, s]`` is True where slot ``s`` holds a real (non-pad) token of row ``b``;
    ``index`` is the next slot to write, shared by the whole batch. Keys are stored after
    RoPE. Writing past the capacity is not detected inside ``jit``: callers size
    ``S >= prompt length + new tokens``.
    """

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    index: jax.Array


def _normal_init() -> Any:
    return nnx.initializers.normal(stddev=INIT_STD)


class RMSNorm(nnx.Module):
    """Root-mean-square norm over the last axis, computed in float32 like transformers."""

    def __init__(self, dim: int, eps: float, *, param_dtype: Any):
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        in_dtype = x.dtype
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(in_dtype) * xf.astype(in_dtype)


def _linear(n_in: int, n_out: int, config: Qwen3Config, rngs: nnx.Rngs) -> nnx.Linear:
    """Bias-free projection; kernel stored ``[in, out]`` (transpose of torch's weight)."""
    return nnx.Linear(
        n_in,
        n_out,
        use_bias=False,
        dtype=config.jnp_dtype,
        param_dtype=config.jnp_param_dtype,
        kernel_init=_normal_init(),
        rngs=rngs,
    )


def rope_cos_sin(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """``cos, sin`` of shape ``[B, T, head_dim]`` (float32) for integer ``positions [B, T]``.

    Frequencies ``theta ** (-2i / head_dim)``, duplicated over both halves (the
    ``rotate_half`` convention of transformers).
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x [B, T, heads, head_dim]`` by ``cos/sin [B, T, head_dim]`` (rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


class Attention(nnx.Module):
    """Grouped-query self-attention with per-head q/k RMSNorm before RoPE."""

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        c = config
        self.num_heads = c.num_attention_heads
        self.num_kv_heads = c.num_key_value_heads
        self.head_dim = c.head_dim
        self.attention_impl = c.attention_impl
        self.q_proj = _linear(c.hidden_size, c.num_attention_heads * c.head_dim, c, rngs)
        self.k_proj = _linear(c.hidden_size, c.num_key_value_heads * c.head_dim, c, rngs)
        self.v_proj = _linear(c.hidden_size, c.num_key_value_heads * c.head_dim, c, rngs)
        self.o_proj = _linear(c.num_attention_heads * c.head_dim, c.hidden_size, c, rngs)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype=c.jnp_param_dtype)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype=c.jnp_param_dtype)

    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        allowed: jax.Array,
        cache_kv: tuple[jax.Array, ...] | None,
        index: jax.Array | None,
        kv_len: int | None = None,
        key_mask: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """``x [B, T, H]``; ``allowed [B, T, K]`` (K = T without cache, ``kv_len`` with one).

        ``allowed=None`` and ``key_mask [B, T]`` (False on padding) select causal
        self-attention over the ``T`` new tokens by the config's ``attention_impl``
        (:mod:`llm.model.attention`): the forward without a cache, and a prefill into an
        empty cache (``kv_len == T``: the new tokens are all the keys there are).

        With a cache, ``cache_kv = (k_all, v_all, layer[, row_start])``: the *whole* stacked
        cache ``[L, B_cache, S, kv, d]`` and this layer's index, or (``layer=None``) this
        layer's own head-major ``[B_cache, kv, S, d]`` buffers, and the first cache row of this
        call's ``B`` rows (default 0; a row-blocked prefill writes one block of rows). The new
        keys/values are written in place at ``[layer, rows, index:index+T]`` and attention
        reads slots ``[0, kv_len)`` of those rows of this layer only (``kv_len`` static,
        ``>= index + T``); the updated stacked arrays are returned so they can stay in the
        layer scan's carry (no per-step cache copy).
        """
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        new_kv = None
        if cache_kv is not None:
            k_all, v_all, layer = cache_kv[:3]
            zero = jnp.zeros((), jnp.int32)
            row0 = cache_kv[3].astype(jnp.int32) if len(cache_kv) > 3 else zero
            slot = index.astype(jnp.int32)
            fresh = allowed is None  # prefill into an empty cache: the new keys are all the keys
            if layer is None:  # this layer's own head-major [B_cache, kv, S, d] buffers
                span = k_all.shape[2] if kv_len is None else kv_len
                k_all = jax.lax.dynamic_update_slice(k_all, k.transpose(0, 2, 1, 3).astype(k_all.dtype),
                                                     (row0, zero, slot, zero))
                v_all = jax.lax.dynamic_update_slice(v_all, v.transpose(0, 2, 1, 3).astype(v_all.dtype),
                                                     (row0, zero, slot, zero))
                if not fresh:
                    size = (b, self.num_kv_heads, span, self.head_dim)
                    read = (row0, zero, zero, zero)
                    k = jax.lax.dynamic_slice(k_all, read, size).transpose(0, 2, 1, 3).astype(q.dtype)
                    v = jax.lax.dynamic_slice(v_all, read, size).transpose(0, 2, 1, 3).astype(q.dtype)
            else:  # the stacked [L, B_cache, S, kv, d] buffers, this layer's slice
                span = k_all.shape[2] if kv_len is None else kv_len
                li = layer.astype(jnp.int32)
                at = (li, row0, slot, zero, zero)
                k_all = jax.lax.dynamic_update_slice(k_all, k[None].astype(k_all.dtype), at)
                v_all = jax.lax.dynamic_update_slice(v_all, v[None].astype(v_all.dtype), at)
                if not fresh:
                    size = (1, b, span, self.num_kv_heads, self.head_dim)
                    read = (li, row0, zero, zero, zero)
                    k = jax.lax.dynamic_slice(k_all, read, size)[0].astype(q.dtype)
                    v = jax.lax.dynamic_slice(v_all, read, size)[0].astype(q.dtype)
            new_kv = (k_all, v_all)
        if allowed is None:
            out = causal_attention(q, k, v, key_mask, impl=self.attention_impl, segment_ids=segment_ids)
        elif self.attention_impl in ("xla", "cudnn"):
            # cached path (prefill into a cache, decode steps) through jax.nn.dot_product_attention
            # when the config names an implementation: the mask is this call's [B, T, kv_len]
            out = jax.nn.dot_product_attention(q, k, v, mask=allowed[:, None],
                                               implementation=self.attention_impl).astype(v.dtype)
        else:
            out = grouped_attention(q, k, v, allowed, self.num_kv_heads)
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim)), new_kv


class MLP(nnx.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        c = config
        self.gate_proj = _linear(c.hidden_size, c.intermediate_size, c, rngs)
        self.up_proj = _linear(c.hidden_size, c.intermediate_size, c, rngs)
        self.down_proj = _linear(c.intermediate_size, c.hidden_size, c, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """Pre-norm attention block and pre-norm MLP block, each with a residual."""

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        c = config
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, param_dtype=c.jnp_param_dtype)
        self.self_attn = Attention(c, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, param_dtype=c.jnp_param_dtype)
        self.mlp = MLP(c, rngs=rngs)

    def __call__(self, x, cos, sin, allowed, cache_kv, index, kv_len=None, key_mask=None, segment_ids=None):
        h, new_kv = self.self_attn(self.input_layernorm(x), cos, sin, allowed, cache_kv, index, kv_len, key_mask,
                                   segment_ids)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, new_kv


class Qwen3ForCausalLM(nnx.Module):
    """Qwen3 causal language model (see the module docstring for shapes and layout).

    Parameter paths mirror transformers' names: ``embed_tokens.embedding`` (``[V, H]``),
    ``layers.<module>.<name>`` stacked over layers (linear kernels ``[L, in, out]``),
    ``norm.weight`` and, when untied, ``lm_head.kernel`` (``[H, V]``).
    """

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        self.config = config
        c = config
        self.embed_tokens = nnx.Embed(
            c.vocab_size,
            c.hidden_size,
            dtype=c.jnp_dtype,
            param_dtype=c.jnp_param_dtype,
            embedding_init=_normal_init(),
            rngs=rngs,
        )

        @nnx.split_rngs(splits=c.num_hidden_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make_layers(r: nnx.Rngs) -> DecoderLayer:
            return DecoderLayer(c, rngs=r)

        self.layers = make_layers(rngs)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, param_dtype=c.jnp_param_dtype)
        self.lm_head = None if c.tie_word_embeddings else _linear(c.hidden_size, c.vocab_size, c, rngs)

    def layer_states(self) -> list[Any]:
        """The stacked layer parameters as ``L`` separate per-layer states (for ``layer_states``).

        Call it inside ``jit`` *outside* a decode loop: each layer's weights become their own
        buffer once per call, so the loop runs the layers without slicing the stacked
        ``[L, ...]`` arrays at every step (XLA:CPU materialises such a slice as a copy of the
        layer's weights, which triples the weight traffic of a decode step).
        """
        _, state = nnx.split(self.layers)
        return [jax.tree.map(lambda a, i=i: a[i], state) for i in range(self.config.num_hidden_layers)]

    def init_cache(self, batch_size: int, capacity: int, *, per_layer: bool = False) -> KVCache:
        """An empty cache: zero keys/values, mask all False, index 0; stacked ``[L, B, S, kv,
        d]`` keys and values, or (``per_layer``) tuples of ``L`` head-major ``[B, kv, S, d]``
        arrays for the unrolled layers (``layer_states``)."""
        c = self.config
        shape = (batch_size, capacity, c.num_key_value_heads, c.head_dim)
        if per_layer:
            heads_first = (batch_size, c.num_key_value_heads, capacity, c.head_dim)
            k = tuple(jnp.zeros(heads_first, c.jnp_dtype) for _ in range(c.num_hidden_layers))
            v = tuple(jnp.zeros(heads_first, c.jnp_dtype) for _ in range(c.num_hidden_layers))
        else:
            k = jnp.zeros((c.num_hidden_layers,) + shape, c.jnp_dtype)
            v = jnp.zeros((c.num_hidden_layers,) + shape, c.jnp_dtype)
        return KVCache(k=k, v=v, mask=jnp.zeros((batch_size, capacity), bool), index=jnp.zeros((), jnp.int32))

    def _layer_scan(self, x: jax.Array, cos: jax.Array, sin: jax.Array, key_mask: jax.Array, remat: str,
                    segment_ids: jax.Array | None = None) -> jax.Array:
        """The decoder layers without a cache: one ``lax.scan`` over the stacked weights, the
        body wrapped in ``jax.checkpoint`` with the ``remat`` policy (:data:`REMAT_POLICIES`)."""
        graphdef, layer_state = nnx.split(self.layers)

        def body(h, state):
            h, _ = nnx.merge(graphdef, state)(h, cos, sin, None, None, None, None, key_mask, segment_ids)
            return h, None

        if remat == "full":
            body = jax.checkpoint(body, prevent_cse=False)
        elif remat == "save_matmuls":
            body = jax.checkpoint(body, prevent_cse=False, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
        elif remat != "none":
            raise ValueError(f"remat={remat!r} not in {REMAT_POLICIES}")
        x, _ = jax.lax.scan(body, x, layer_state)
        return x

    def hidden_states(
        self,
        input_ids: jax.Array,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        *,
        last: int | None = None,
        remat: str = "none",
        segment_ids: jax.Array | None = None,
    ) -> jax.Array:
        """Final (normed) hidden states ``[B, last or T, H]`` in the compute dtype: the causal
        forward without a cache and without the LM head (what :meth:`__call__` computes before
        the head; the training log-probs apply the head chunk by chunk, :mod:`llm.model.logprobs`).

        ``positions`` / ``attention_mask`` as in :meth:`__call__` (defaults ``arange(T)`` / all
        True); ``last=k`` keeps the last ``k`` positions (before the final norm, like
        ``logits_to_keep``); ``remat`` (one of :data:`REMAT_POLICIES`) wraps the layer-scan body
        in ``jax.checkpoint``: same values and gradients, less memory for the backward pass.
        ``segment_ids [B, T]`` (int) marks packed rows: a token attends only to the earlier
        tokens of its own segment (:func:`llm.model.attention.causal_attention`), and
        ``positions`` should restart at each segment's first token.
        """
        if remat not in REMAT_POLICIES:
            raise ValueError(f"remat={remat!r} not in {REMAT_POLICIES}")
        c = self.config
        chex.assert_rank(input_ids, 2)
        b, t = input_ids.shape
        if last is not None and not (isinstance(last, int) and 1 <= last <= t):
            raise ValueError(f"last={last!r} must be an int in [1, T={t}]")
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), bool)
        chex.assert_shape([positions, attention_mask], (b, t))
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta)
        x = self.embed_tokens(input_ids.astype(jnp.int32)).astype(c.jnp_dtype)
        x = self._layer_scan(x, cos, sin, attention_mask.astype(bool), remat, segment_ids)
        if last is not None:
            x = x[:, t - last :]
        return self.norm(x)

    def __call__(
        self,
        input_ids: jax.Array,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        cache: KVCache | None = None,
        *,
        logits_to_keep: int | None = None,
        kv_len: int | None = None,
        layer_states: list[Any] | None = None,
        row_start: jax.Array | None = None,
        hidden_only: bool = False,
        branches: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Logits ``[B, T, V]`` (float32) and the updated cache (``None`` without one);
        ``hidden_only=True``: the final (normed) hidden states ``[B, T, H]`` instead of the
        logits, in the compute dtype (the training log-probs apply the head chunk by chunk,
        :mod:`llm.model.logprobs`; :func:`llm.rl.updates.shared_prompt_forward` runs a prompt
        into a cache and its completions after it).

        Without a cache: causal attention over the T tokens, pad keys masked out. With a
        cache: the new keys/values go to slots ``[index, index + T)``, the cache mask there
        is set from ``attention_mask`` and each query attends to masked-in slots up to its
        own. ``positions`` defaults to ``index + arange(T)`` (``arange(T)`` without a
        cache); for left-padded batches pass ``clip(cumsum(attention_mask) - 1, 0)``.
        Padded query rows get finite but meaningless logits.

        ``logits_to_keep=k`` (a static int) computes the LM head for the last ``k`` positions
        only and returns ``[B, k, V]``: with left padding, ``k=1`` after a prefill gives every
        row's next-token logits without the ``[B, T, V]`` cost.

        ``kv_len`` (a static int, cache only) bounds the attention to cache slots
        ``[0, kv_len)``: the caller promises ``index + T <= kv_len <= S`` (not checked inside
        ``jit``), so a decode step reads the filled prefix of the cache, not its capacity.
        ``None`` reads all ``S`` slots. The cache travels through the layer scan as part of
        the carry and is updated with ``dynamic_update_slice``, which XLA performs in place.
        ``kv_len == T`` is a **prefill into an empty cache** (``index`` is then 0): the new
        tokens are every key there is, so attention is the causal self-attention of the
        forward without a cache, by ``config.attention_impl`` (the chunked kernel on the CPU
        and the TPU, cuDNN on a GPU: no ``[B, heads, T, T]`` score tensor), and the keys and
        values are written to the cache on the way.

        ``row_start`` (traced int, cache only): this call's ``B`` rows are rows
        ``[row_start, row_start + B)`` of a cache with at least ``B`` rows; only those rows'
        keys, values and mask are written and read (a prefill in blocks of rows fills one
        cache, :func:`llm.generation.decode.prefill`). ``None``: the cache has exactly ``B``
        rows.

        ``layer_states`` (from :meth:`layer_states`, same values as ``self.layers``) runs the
        layers as an unrolled Python loop over those per-layer states instead of the
        ``lax.scan`` over the stacked weights (same numerics; used by the decode loop, see
        :meth:`layer_states`). The default scan keeps one layer body whatever the depth.

        ``branches [B, T]`` (int, cache only): independent continuations of one context in one
        row. A token of branch 0 attends as above; a token of branch ``k > 0`` attends to the
        cache's earlier slots and the call's earlier branch-0 tokens and, among the call's other
        tokens, only to those of its own branch: the constrained decoder scores all candidates
        of a choice after the answer so far in one row, without a copy of the cache per
        candidate (:class:`llm.engineer.constrained.ChoiceScorer`). The caller gives each
        branch's ``positions`` (they restart where the branches fork).
        """
        c = self.config
        chex.assert_rank(input_ids, 2)
        b, t = input_ids.shape
        start = jnp.zeros((), jnp.int32) if cache is None else cache.index.astype(jnp.int32)
        if positions is None:
            positions = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (b, t))
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), bool)
        chex.assert_shape([positions, attention_mask], (b, t))
        attention_mask = attention_mask.astype(bool)

        row0 = jnp.zeros((), jnp.int32) if row_start is None else jnp.asarray(row_start, jnp.int32)
        if cache is None:
            if row_start is not None:
                raise ValueError("row_start needs a cache")
            if branches is not None:
                raise ValueError("branches need a cache")
            allowed = None  # causal + attention_mask, by config.attention_impl (llm.model.attention)
        else:
            per_layer = isinstance(cache.k, (tuple, list))
            if per_layer:
                if layer_states is None:
                    raise ValueError("a per-layer cache (init_cache(per_layer=True)) needs layer_states")
                if len(cache.k) != c.num_hidden_layers or len(cache.v) != c.num_hidden_layers:
                    raise ValueError(f"the per-layer cache has {len(cache.k)} layers; need {c.num_hidden_layers}")
                rows = cache.k[0].shape[0] if row_start is not None else b
                chex.assert_shape(list(cache.k) + list(cache.v), (rows, c.num_key_value_heads, None, c.head_dim))
            else:
                rows = cache.k.shape[1] if row_start is not None else b
                chex.assert_shape(cache.k, (c.num_hidden_layers, rows, None, c.num_key_value_heads, c.head_dim))
            if rows < b:
                raise ValueError(f"the cache has {rows} rows, fewer than the call's B={b}")
            capacity = cache.mask.shape[1]
            span = capacity if kv_len is None else kv_len
            if not (isinstance(span, int) and t <= span <= capacity):
                raise ValueError(f"kv_len={kv_len!r} must be an int in [T={t}, capacity={capacity}]")
            key_mask = jax.lax.dynamic_update_slice(cache.mask, attention_mask, (row0, start))
            if span == t and branches is None:
                # prefill into an empty cache (index + T <= kv_len = T: index is 0): causal
                # self-attention over the new tokens, by attention_impl (no dense scores)
                allowed = None
            else:
                q_slot = start + jnp.arange(t, dtype=jnp.int32)
                causal = jnp.arange(span, dtype=jnp.int32)[None, :] <= q_slot[:, None]
                own = jax.lax.dynamic_slice_in_dim(key_mask, row0, b, axis=0) if row_start is not None else key_mask
                allowed = causal[None] & own[:, None, :span]
                if branches is not None:
                    chex.assert_shape(branches, (b, t))
                    q_branch = branches.astype(jnp.int32)
                    k_branch = jax.lax.dynamic_update_slice(jnp.zeros((b, span), jnp.int32), q_branch, (0, start))
                    allowed = allowed & ((k_branch[:, None, :] == 0) | (k_branch[:, None, :] == q_branch[:, :, None]))

        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta)
        x = self.embed_tokens(input_ids.astype(jnp.int32)).astype(c.jnp_dtype)

        graphdef, layer_state = nnx.split(self.layers)

        if layer_states is not None:
            if len(layer_states) != c.num_hidden_layers:
                raise ValueError(f"layer_states has {len(layer_states)} entries; need {c.num_hidden_layers}")
            k_new = None if cache is None else cache.k
            v_new = None if cache is None else cache.v
            if cache is not None and isinstance(k_new, (tuple, list)):  # each layer its own buffers
                ks, vs = list(k_new), list(v_new)
                for i, state in enumerate(layer_states):
                    kv = (ks[i], vs[i], None, row0)
                    x, (ks[i], vs[i]) = nnx.merge(graphdef, state)(x, cos, sin, allowed, kv, start, span,
                                                                   attention_mask)
                k_new, v_new = tuple(ks), tuple(vs)
            else:
                for i, state in enumerate(layer_states):
                    layer = nnx.merge(graphdef, state)
                    if cache is None:
                        x, _ = layer(x, cos, sin, None, None, None, None, attention_mask)
                    else:
                        kv = (k_new, v_new, jnp.asarray(i, jnp.int32), row0)
                        x, (k_new, v_new) = layer(x, cos, sin, allowed, kv, start, span, attention_mask)
        elif cache is None:
            x = self._layer_scan(x, cos, sin, attention_mask, "none")
        else:

            def cached_body(carry, xs):
                h, k_all, v_all = carry
                state, layer_index = xs
                layer = nnx.merge(graphdef, state)
                h, (k_all, v_all) = layer(h, cos, sin, allowed, (k_all, v_all, layer_index, row0), start, span,
                                          attention_mask)
                return (h, k_all, v_all), None

            layer_ids = jnp.arange(c.num_hidden_layers, dtype=jnp.int32)
            (x, k_new, v_new), _ = jax.lax.scan(cached_body, (x, cache.k, cache.v), (layer_state, layer_ids))
        if logits_to_keep is not None:
            if not 1 <= logits_to_keep <= t:
                raise ValueError(f"logits_to_keep={logits_to_keep} must be in [1, T={t}]")
            x = x[:, t - logits_to_keep :]
        x = self.norm(x)
        new_cache = None
        if cache is not None:
            new_cache = KVCache(k=k_new, v=v_new, mask=key_mask, index=start + t)
        if hidden_only:
            return x, new_cache
        if self.lm_head is None:
            table = self.embed_tokens.embedding[...].astype(c.jnp_dtype)
            if x.shape[0] * x.shape[1] <= _SMALL_HEAD_ROWS:
                # Decode-sized batches: XLA:CPU runs the [V, H] x [H, rows] form ~1.3-1.6x faster.
                logits = jnp.einsum("vh,bth->vbt", table, x, preferred_element_type=jnp.float32)
                logits = logits.transpose(1, 2, 0)
            else:
                logits = jnp.einsum("bth,vh->btv", x, table, preferred_element_type=jnp.float32)
        else:
            kernel = self.lm_head.kernel[...].astype(c.jnp_dtype)
            logits = jnp.einsum("bth,hv->btv", x, kernel, preferred_element_type=jnp.float32)
        logits = logits.astype(jnp.float32)
        return logits, new_cache


def count_params(model: nnx.Module) -> int:
    """Number of scalars in the model's ``nnx.Param`` variables."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
