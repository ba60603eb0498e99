"""Grouped-query attention kernels: the dense reference, a chunked (flash-style) one, cuDNN,
a TPU Pallas (splash) one.

Every function here takes queries ``q [B, T, heads, d]`` and keys/values ``k, v [B, K, kv, d]``
with ``heads`` a multiple of ``kv`` (grouped-query attention): query head ``n * (heads / kv) +
i`` reads key/value head ``n``, and no function repeats the keys or values per query head.
Scores and softmax are float32 whatever the input dtype; outputs are ``[B, T, heads, d]`` in
``v``'s dtype.

- :func:`grouped_attention` -- the reference: the whole ``[B, heads, T, K]`` float32 score
  tensor under an arbitrary ``allowed [B, T, K]`` mask (the KV-cache decode path uses it;
  ``impl="dense"`` for causal self-attention). Autodiff keeps the scores and the softmax for
  the backward pass: for Qwen3-4B, 16 rows x 1280 tokens, that is 3.4 GB per buffer per layer.
- :func:`chunked_attention` -- causal self-attention (``K = T``) with a key padding mask,
  computed over ``[q_block, k_block]`` tiles with an online softmax (``lax.scan`` over query
  blocks, a loop over the key blocks a query block can see, so tiles above the diagonal cost
  nothing). A ``jax.custom_vjp`` keeps only the output and the per-row log-sum-exp
  ``[B, heads, T]`` for the backward pass, which recomputes each tile's probabilities
  (FlashAttention-2's backward): memory is ``O(T)`` per row instead of ``O(T^2)``. Pure JAX:
  the reference of the fused kernels on the CPU.
- :func:`fused_attention` -- ``jax.nn.dot_product_attention`` with its own causal mask and
  sequence lengths (``is_causal``, ``query_seq_lengths``, ``key_value_seq_lengths``), no
  mask or bias tensor: each row's real tokens are moved to the front (the trainer's
  ``[left-padded prompt | right-padded completion]`` rows become right-padded; RoPE positions
  were applied before, from the mask), attended, and moved back (:func:`left_align`).
  ``implementation="cudnn"`` is cuDNN's fused flash attention on NVIDIA GPUs (bfloat16 /
  float16; causal tiles are skipped, no bias gradient is computed), ``"xla"`` JAX's dense
  path, the CPU stand-in of the same layout transform.
- :func:`splash_attention` -- the TPU: Pallas' splash attention
  (``jax.experimental.pallas.ops.tpu.splash_attention``) with a causal mask and segment ids
  (real tokens 1, padding 0), imported when called (the module imports on any backend).

:func:`causal_attention` picks one by name (:data:`ATTENTION_IMPLS`, the model config's
``attention_impl``); ``"auto"`` is ``"cudnn"`` on a GPU with a 16-bit compute dtype,
``"splash"`` on a TPU (``head_dim`` a multiple of 128), ``"chunked"`` everywhere else.

Padding: ``dense``, ``chunked`` and ``splash`` take any key mask. ``cudnn`` / ``xla`` need
each row's real tokens to be one contiguous run (left padding, right padding or both: every
layout of the trainer and the sampler); a mask with holes is attended as its run from the
first to the last real token.

Rows with no allowed key at all (left-padding query rows: their own key is masked out) are
meaningless and differ between implementations: the reference averages every value (all
scores equal), :func:`chunked_attention` returns zeros and passes them no gradient. Callers
mask those rows out of any loss; every real token can at least see itself.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import chex
import jax
import jax.numpy as jnp

#: Attention implementations of the forward without a KV cache (training, scoring, prefill).
ATTENTION_IMPLS = ("auto", "dense", "xla", "cudnn", "chunked", "splash")

#: Query and key tile of :func:`splash_attention` (the sequence is padded to a multiple).
SPLASH_BLOCK = 128

#: Default query and key tile of :func:`chunked_attention`: a ``[B, heads, 256, 256]``
#: float32 tile is 128 MiB for 16 rows of Qwen3-4B (32 heads).
DEFAULT_BLOCK = 256

_NEG = float(jnp.finfo(jnp.float32).min)


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, num_kv_heads: int) -> jax.Array:
    """Grouped-query attention without repeating keys/values (the dense reference).

    ``q [B, T, heads, d]``, ``k, v [B, K, kv, d]``, ``allowed [B, T, K]`` bool. The query heads
    are viewed as ``[kv, heads / kv]`` groups so each key/value head is read once; scores and
    softmax in float32, masked scores at ``finfo(float32).min`` (as transformers' eager path).
    Returns ``[B, T, heads, d]`` in ``v``'s dtype.
    """
    b, t, heads, d = q.shape
    groups = heads // num_kv_heads
    qg = q.reshape(b, t, num_kv_heads, groups, d)
    scores = jnp.einsum("btngd,bsnd->bngts", qg, k, preferred_element_type=jnp.float32)
    scores = scores * (d**-0.5)
    scores = jnp.where(allowed[:, None, None, :, :], scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bngts,bsnd->btngd", probs, v)
    return out.reshape(b, t, heads, d)


def resolve_impl(impl: str, dtype: Any, backend: Optional[str] = None, head_dim: int = 128) -> str:
    """The implementation ``impl`` names on ``backend`` (default: JAX's) for ``dtype``.

    ``"auto"`` becomes ``"cudnn"`` on a GPU when ``dtype`` is bfloat16 or float16 (cuDNN's
    fused attention has no float32 kernel) and ``head_dim`` is a multiple of 8 up to 128 (its
    limit before Hopper), ``"splash"`` on a TPU when ``head_dim`` is a multiple of 128 (the
    kernel's lane width), and ``"chunked"`` otherwise; the others are kept.
    """
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl={impl!r} not in {ATTENTION_IMPLS}")
    if impl != "auto":
        return impl
    backend = jax.default_backend() if backend is None else backend
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    if backend in ("gpu", "cuda") and half and head_dim % 8 == 0 and head_dim <= 128:
        return "cudnn"
    if backend == "tpu" and head_dim % 128 == 0:
        return "splash"
    return "chunked"


def causal_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    *,
    impl: str = "auto",
    block: int = DEFAULT_BLOCK,
    segment_ids: Optional[jax.Array] = None,
) -> jax.Array:
    """Causal self-attention of ``T`` tokens with a key padding mask, by implementation name.

    Args:
      q: ``[B, T, heads, d]`` queries (after RoPE).
      k, v: ``[B, T, kv, d]`` keys (after RoPE) and values.
      key_mask: ``[B, T]`` bool, False on padding keys (one contiguous run of real tokens
        per row for ``"cudnn"`` / ``"xla"``, see the module doc).
      impl: one of :data:`ATTENTION_IMPLS` (see :func:`resolve_impl`).
      block: query/key tile of the ``"chunked"`` implementation.
      segment_ids: ``[B, T]`` int, packed rows (several sequences one after another in a
        row, :mod:`llm.training.packing`): a query attends only to keys of its own segment.
        Always the dense masked path (:func:`grouped_attention`), whatever ``impl``: packing
        is for short rows, where the ``[B, T, T]`` mask is small.

    Query ``t`` attends to keys ``s <= t`` with ``key_mask[:, s]`` (and, with ``segment_ids``,
    ``segment_ids[:, s] == segment_ids[:, t]``). Returns ``[B, T, heads, d]``.
    """
    chex.assert_rank([q, k, v, key_mask], [4, 4, 4, 2])
    chex.assert_equal_shape([k, v])
    chex.assert_equal_shape_prefix([q, k, key_mask], 2)
    if segment_ids is not None:
        chex.assert_shape(segment_ids, key_mask.shape)
        t = q.shape[1]
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        allowed = jnp.tril(jnp.ones((t, t), bool))[None] & key_mask.astype(bool)[:, None, :] & same
        return grouped_attention(q, k, v, allowed, k.shape[2])
    impl = resolve_impl(impl, q.dtype, head_dim=q.shape[-1])
    if impl == "chunked":
        return chunked_attention(q, k, v, key_mask, q_block=block, k_block=block)
    if impl in ("cudnn", "xla"):
        return fused_attention(q, k, v, key_mask, implementation=impl)
    if impl == "splash":
        return splash_attention(q, k, v, key_mask)
    t = q.shape[1]
    allowed = jnp.tril(jnp.ones((t, t), bool))[None] & key_mask.astype(bool)[:, None, :]
    return grouped_attention(q, k, v, allowed, k.shape[2])


def real_run(key_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(start [B], length [B])`` int32 of each row's run of real tokens: the first True
    column (0 for a row without any) and the number of True columns."""
    m = key_mask.astype(bool)
    return jnp.argmax(m, axis=-1).astype(jnp.int32), jnp.sum(m, axis=-1, dtype=jnp.int32)


def left_align(x: jax.Array, start: jax.Array, inverse: bool = False) -> jax.Array:
    """Rotate each row of ``x [B, T, ...]`` left by ``start[b]`` positions (``inverse``:
    right): a row whose real tokens begin at ``start`` then has them at the front, in order
    (the trainer's left-padded-prompt-then-completion rows become right-padded). A gather
    along ``T`` (its gradient, the scatter of the inverse rotation)."""
    t = x.shape[1]
    shift = -start if inverse else start
    index = (jnp.arange(t, dtype=jnp.int32)[None, :] + shift[:, None]) % t
    index = index.reshape(index.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)


def fused_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, *, implementation: str = "cudnn"
) -> jax.Array:
    """Causal self-attention through ``jax.nn.dot_product_attention`` with its causal mask
    and sequence lengths, no mask or bias tensor.

    Each row's real tokens (one contiguous run, :func:`real_run`) are rotated to the front
    (:func:`left_align`), so the rows are right-padded: ``is_causal=True`` with
    ``query_seq_lengths = key_value_seq_lengths =`` the run's length is exactly the causal
    self-attention of the real tokens (their order is kept; RoPE positions were applied
    before). The output is rotated back; padding rows are meaningless (as in every
    implementation). Grouped-query heads are passed as they are (the kernel reads each
    key/value head once). ``implementation``: ``"cudnn"`` on NVIDIA GPUs (flash attention:
    the tiles above the diagonal and past the lengths are skipped), ``"xla"`` anywhere
    (JAX's dense path, the CPU check of the layout).
    """
    start, length = real_run(key_mask)
    length = jnp.maximum(length, 1)  # a row without real tokens: meaningless, kept finite
    qs, ks, vs = (left_align(x, start) for x in (q, k, v.astype(q.dtype)))
    out = jax.nn.dot_product_attention(qs, ks, vs, is_causal=True, query_seq_lengths=length,
                                       key_value_seq_lengths=length, implementation=implementation)
    return left_align(out, start, inverse=True).astype(v.dtype)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, *,
                     block: int = SPLASH_BLOCK, interpret: bool = False) -> jax.Array:
    """Causal self-attention with Pallas' TPU splash attention kernel and segment ids.

    Real tokens get segment id 1, padding 0: a real query attends the real keys at or before
    it (the causal mask), never a padding key, whatever the padding layout. ``T`` is padded
    to a multiple of ``block`` (padding of segment 0). Each key/value head's ``heads / kv``
    query heads go through the MQA kernel (one kernel reads one key/value head); rows and
    key/value heads are ``vmap``-ed. Queries are scaled by ``d ** -0.5`` first (the kernel
    does not scale). The kernel module is imported here, so this module imports on any
    backend; ``interpret=True`` runs the kernel in Pallas' interpreter (any backend, slow).
    One device per call: under a multi-device mesh XLA does not partition the Pallas call
    (a ``shard_map`` over the batch would; not wired).
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    chex.assert_rank([q, k, v, key_mask], [4, 4, 4, 2])
    b, t, heads, d = q.shape
    kv = k.shape[2]
    groups = heads // kv
    padded = -(-t // block) * block
    widths = ((0, 0), (0, padded - t), (0, 0), (0, 0))
    q, k, v = (jnp.pad(x, widths) for x in (q, k, v))
    segments = jnp.pad(key_mask.astype(jnp.int32), ((0, 0), (0, padded - t)))
    mask = sm.MultiHeadMask([sm.CausalMask((padded, padded)) for _ in range(groups)])
    sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    kernel = sk.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)
    qg = (q * jnp.asarray(d**-0.5, q.dtype)).reshape(b, padded, kv, groups, d).transpose(0, 2, 3, 1, 4)
    kt, vt = k.transpose(0, 2, 1, 3), v.astype(q.dtype).transpose(0, 2, 1, 3)  # [B, kv, T, d]

    def row(qb, kb, vb, seg):  # one row: [kv, G, T, d], [kv, T, d], [T]
        ids = sk.SegmentIds(q=seg, kv=seg)
        return jax.vmap(lambda qi, ki, vi: kernel(qi, ki, vi, segment_ids=ids))(qb, kb, vb)

    out = jax.vmap(row)(qg, kt, vt, segments)  # [B, kv, G, T, d]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, padded, heads, d)[:, :t].astype(v.dtype)


# --------------------------------------------------------------------------- chunked (flash)


def chunked_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    *,
    q_block: int = DEFAULT_BLOCK,
    k_block: int = DEFAULT_BLOCK,
) -> jax.Array:
    """Causal self-attention over tiles with an online softmax and a recomputing backward.

    Same arguments and result as :func:`causal_attention` (``q [B, T, heads, d]``, ``k, v
    [B, T, kv, d]``, ``key_mask [B, T]``). ``q_block`` / ``k_block`` (static ints ``>= 1``)
    are clipped to ``T``; ``T`` is padded up to a multiple of both with masked keys. Peak
    extra memory is a few ``[B, heads, q_block, k_block]`` float32 tiles in both passes; the
    backward keeps ``q, k, v``, the output and a ``[B, heads, T]`` float32 log-sum-exp.
    """
    for name, value in (("q_block", q_block), ("k_block", k_block)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    chex.assert_rank([q, k, v, key_mask], [4, 4, 4, 2])
    chex.assert_equal_shape([k, v])
    chex.assert_equal_shape_prefix([q, k, key_mask], 2)
    b, t, heads, d = q.shape
    kv = k.shape[2]
    if heads % kv:
        raise ValueError(f"query heads {heads} must be a multiple of key/value heads {kv}")
    qb, kb = min(q_block, t), min(k_block, t)
    unit = qb * kb // _gcd(qb, kb)
    padded = -(-t // unit) * unit
    key_mask = key_mask.astype(bool)
    if padded != t:
        widths = ((0, 0), (0, padded - t), (0, 0), (0, 0))
        q, k, v = jnp.pad(q, widths), jnp.pad(k, widths), jnp.pad(v, widths)
        key_mask = jnp.pad(key_mask, ((0, 0), (0, padded - t)))
    qg = q.reshape(b, padded, kv, heads // kv, d)
    out = _flash(qg, k, v, key_mask, qb, kb)
    return out.reshape(b, padded, heads, d)[:, :t]


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _tile_scores(qi, kj, key_mask_j, q_start, k_start):
    """Masked float32 scores ``[B, kv, G, qb, kb]`` of one tile (causal and padding)."""
    qb, kb, d = qi.shape[1], kj.shape[1], qi.shape[-1]
    s = jnp.einsum("bqngd,bknd->bngqk", qi, kj, preferred_element_type=jnp.float32) * (d**-0.5)
    q_pos = q_start + jnp.arange(qb, dtype=jnp.int32)
    k_pos = k_start + jnp.arange(kb, dtype=jnp.int32)
    allowed = (k_pos[None, :] <= q_pos[:, None])[None] & key_mask_j[:, None, :]  # [B, qb, kb]
    return jnp.where(allowed[:, None, None], s, _NEG)


def _key_tile(k, v, key_mask, start, kb):
    """Keys, values and key mask of the key tile ``[start, start + kb)`` (axis 1)."""
    return tuple(jax.lax.dynamic_slice_in_dim(x, start, kb, axis=1) for x in (k, v, key_mask))


def _flash_forward(q, k, v, key_mask, qb, kb):
    """``(out [B, T, kv, G, d], lse [B, kv, G, T])``; ``T`` a multiple of ``qb`` and ``kb``."""
    b, t, kv, g, d = q.shape
    nq = t // qb

    def query_block(_, i):
        q_start = i * qb
        qi = jax.lax.dynamic_slice_in_dim(q, q_start, qb, axis=1)

        def key_block(j, carry):
            m, l, acc = carry
            k_start = j * kb
            kj, vj, mj = _key_tile(k, v, key_mask, k_start, kb)
            s = _tile_scores(qi, kj, mj, q_start, k_start)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.exp(s - m_new[..., None])
            corr = jnp.exp(m - m_new)
            l = l * corr + jnp.sum(p, axis=-1)
            pv = jnp.einsum("bngqk,bknd->bngqd", p.astype(v.dtype), vj, preferred_element_type=jnp.float32)
            return m_new, l, acc * corr[..., None] + pv

        init = (
            jnp.full((b, kv, g, qb), _NEG, jnp.float32),
            jnp.zeros((b, kv, g, qb), jnp.float32),
            jnp.zeros((b, kv, g, qb, d), jnp.float32),
        )
        visible = (q_start + qb - 1) // kb + 1  # key blocks holding a key <= the block's last query
        m, l, acc = jax.lax.fori_loop(0, visible, key_block, init)
        # A row that saw no allowed key still has m = _NEG (every score masked): output 0, and
        # lse = 0 makes its backward probabilities exp(_NEG - 0) = 0.
        seen = m > _NEG
        out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
        return None, (jnp.moveaxis(out, 3, 1).astype(v.dtype), lse)  # out [B, qb, kv, G, d]

    _, (out, lse) = jax.lax.scan(query_block, None, jnp.arange(nq, dtype=jnp.int32))
    out = jnp.moveaxis(out, 0, 1).reshape(b, t, kv, g, d)
    lse = jnp.moveaxis(lse, 0, 3).reshape(b, kv, g, t)
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q, k, v, key_mask, qb, kb):
    return _flash_forward(q, k, v, key_mask, qb, kb)[0]


def _flash_fwd(q, k, v, key_mask, qb, kb):
    out, lse = _flash_forward(q, k, v, key_mask, qb, kb)
    return out, (q, k, v, key_mask, out, lse)


def _flash_bwd(qb, kb, residuals, d_out):
    q, k, v, key_mask, out, lse = residuals
    b, t, kv, g, d = q.shape
    nk = t // kb
    scale = d**-0.5
    # D_i = sum_d dO * O: the softmax backward's row term, [B, kv, G, T].
    delta = jnp.einsum("btngd,btngd->bngt", d_out.astype(jnp.float32), out.astype(jnp.float32))

    def key_block(dq, j):
        k_start = j * kb
        kj, vj, mj = _key_tile(k, v, key_mask, k_start, kb)

        def query_block(i, carry):
            dq, dk, dv = carry
            q_start = i * qb
            qi = jax.lax.dynamic_slice_in_dim(q, q_start, qb, axis=1)
            doi = jax.lax.dynamic_slice_in_dim(d_out, q_start, qb, axis=1)
            lse_i = jax.lax.dynamic_slice_in_dim(lse, q_start, qb, axis=3)
            delta_i = jax.lax.dynamic_slice_in_dim(delta, q_start, qb, axis=3)
            p = jnp.exp(_tile_scores(qi, kj, mj, q_start, k_start) - lse_i[..., None])
            dv = dv + jnp.einsum("bngqk,bqngd->bknd", p.astype(doi.dtype), doi, preferred_element_type=jnp.float32)
            dp = jnp.einsum("bqngd,bknd->bngqk", doi, vj, preferred_element_type=jnp.float32)
            ds = p * (dp - delta_i[..., None]) * scale
            dq_i = jnp.einsum("bngqk,bknd->bqngd", ds.astype(kj.dtype), kj, preferred_element_type=jnp.float32)
            dq = jax.lax.dynamic_update_slice_in_dim(
                dq, jax.lax.dynamic_slice_in_dim(dq, q_start, qb, axis=1) + dq_i, q_start, axis=1
            )
            dk = dk + jnp.einsum("bngqk,bqngd->bknd", ds.astype(qi.dtype), qi, preferred_element_type=jnp.float32)
            return dq, dk, dv

        zeros = jnp.zeros((b, kb, kv, d), jnp.float32)
        first = k_start // qb  # the first query block with a query >= this block's first key
        dq, dk, dv = jax.lax.fori_loop(first, t // qb, query_block, (dq, zeros, zeros))
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(key_block, jnp.zeros(q.shape, jnp.float32), jnp.arange(nk, dtype=jnp.int32))
    dk = jnp.moveaxis(dk, 0, 1).reshape(k.shape)
    dv = jnp.moveaxis(dv, 0, 1).reshape(v.shape)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_flash.defvjp(_flash_fwd, _flash_bwd)
