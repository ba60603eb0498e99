"""Constrained JSON decoding: the model only chooses values, so its answer is valid by construction.

**Constrained decoding** (``decoding: constrained``, the default of the local backends)
writes the JSON of an edit of the current mixture (:mod:`jaxlake.engineers.edits`) itself and
lets the model choose only what it is free to: first the kind of edit (keep, re-weight, drop,
add, replace: those the space's edit rules allow), then its values: a weight per component, the
component to drop, and for each added config each editable field in
:data:`jaxlake.engineers.FIELD_ORDER` among the allowed values that still admit a valid config
given the earlier choices (:meth:`ConfigSpace.choices`), its share, and whether another follows
(:func:`constrained_edit`). Each choice's candidates are scored (:func:`choice_logprobs`) and
the best is taken (``temperature: 0``) or one is sampled from ``softmax(score / temperature)``.
The result is valid by construction, so even a random model yields a valid edit.
``decoding: free`` samples text instead and relies on validation and retries.

**A choice does not depend on how many tokens a value takes.** Each candidate is the value's
text and the delimiter that follows it (so ``1`` and ``12`` are told apart); the candidates'
token sequences form a trie. At every node where the candidates branch, the model's
probabilities of the allowed next tokens are compared with their mean, and a value's score
is the sum over the branch points on its path of ``log(p(token) / mean_allowed p)``; the
choice distribution is ``softmax`` of these scores. In other words, the model's distribution
restricted to the candidates (renormalised over the allowed tokens at each branch point,
``R(v)``) is divided by what a model with no preference would give under the same
restriction (``U(v)``, the product of ``1/branches``), then normalised over the candidates:
``Q(v) ∝ R(v) / U(v)``. Why this one:

* an **indifferent model** (every token equally likely) gets ``R = U``, so every score is 0
  and every allowed value is equally likely, by construction and whatever the tokenizer; this
  is the only fixed, model-independent reweighting of ``R`` with that property;
* tokens that do not branch (``5`` after ``0.2`` when ``0.25`` is the only value there, the
  delimiter after a value) add exactly 0: a value's length in tokens never matters. The sum
  of token log-probs (the former score) charged every such token about ``log V`` (V the
  vocabulary), so ``0.25``, ``0.75``, two-digit heights, fractional weights and a second
  mixture component were never chosen; plain per-token averaging or a ``+ log V`` per token
  would still reward or punish the length of a value whose tokens a real model predicts
  with confidence;
* a **real model** keeps its preferences: between values with the same branch structure
  (``0.25``, ``0.5``, ``0.75``) the odds are exactly the model's own, and elsewhere they are
  the model's odds times the fixed ratio of branch counts. The price of the correction: a
  model that spreads its mass evenly over the continuations of a prefix (``0.`` then any
  digit) is read as indifferent among them, not as disliking each.

The model runs once per choice (teacher-forced, all candidates at once): every allowed token
at a branch point is some candidate's next token, so its probability is read from that
candidate's tokens. :class:`ChoiceScorer` runs the prompt once into a key/value cache
(:meth:`ChoiceScorer.set_base`); a :class:`ChoiceSession` then holds each answer so far in a
cache row of its own and, at each choice, runs only the tokens the answer gained since the last
one and the candidates packed after them, each candidate attending to the prompt, the answer
and its own earlier tokens (``Qwen3.__call__(branches=...)``). :func:`constrained_edits`
writes several answers to one prompt side by side, one forward pass a round (engineer
self-play's proposals).
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from jaxlake.config import ConfigError
from jaxlake.engineers import ConfigSpace, format_value

def _bucket(n: int, step: int) -> int:
    return max(step, -(-n // step) * step)


def _pow2(n: int, low: int = 4) -> int:
    return max(low, 1 << (max(n, 1) - 1).bit_length())


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _score_prefix(graphdef, state, ctx_ids, ctx_mask, *, capacity):
    """Forward the shared context once: last-position logits ``[1, V]`` and the KV cache."""
    from flax import nnx

    from llm.generation.decode import left_pad_positions

    model = nnx.merge(graphdef, state)
    cache = model.init_cache(1, capacity)
    logits, cache = model(ctx_ids, positions=left_pad_positions(ctx_mask), attention_mask=ctx_mask, cache=cache)
    return logits[:, -1], cache


def _score_suffixes(graphdef, state, last, cache, n_ctx, suf_ids, suf_mask):
    """Per-token log-probs ``[R, S]`` (0 on padding) of right-padded suffixes ``[R, S]`` after
    the cached context."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    model = nnx.merge(graphdef, state)
    rows, length = suf_ids.shape
    cache = cache.replace(
        k=jnp.repeat(cache.k, rows, axis=1), v=jnp.repeat(cache.v, rows, axis=1), mask=jnp.repeat(cache.mask, rows, axis=0)
    )
    positions = n_ctx + jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (rows, length))
    logits, _ = model(suf_ids, positions=positions, attention_mask=suf_mask, cache=cache)
    first = jnp.broadcast_to(last[:, None, :], (rows, 1, last.shape[-1]))
    pred = jnp.concatenate([first, logits[:, :-1]], axis=1).astype(jnp.float32)
    logp = jnp.take_along_axis(jax.nn.log_softmax(pred, axis=-1), suf_ids[..., None], axis=-1)[..., 0]
    return jnp.where(suf_mask, logp, 0.0)


def _extend(graphdef, state, cache, n_base, tail_ids, tail_mask, n_tail):
    """Run right-padded tail tokens ``[1, T]`` after a cached base of ``n_base`` real tokens:
    the logits ``[1, V]`` at the last real tail token and the cache with the tail in it (the
    padded slots masked)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    model = nnx.merge(graphdef, state)
    positions = n_base + jnp.arange(tail_ids.shape[1], dtype=jnp.int32)[None]
    logits, cache = model(tail_ids, positions=positions, attention_mask=tail_mask, cache=cache)
    return jax.lax.dynamic_index_in_dim(logits, n_tail - 1, axis=1, keepdims=False), cache


_JITTED: dict = {}


def _jitted():
    if not _JITTED:
        import jax

        _JITTED["prefix"] = jax.jit(_score_prefix, static_argnames=("graphdef", "capacity"))
        _JITTED["suffix"] = jax.jit(_score_suffixes, static_argnames=("graphdef",))
        _JITTED["extend"] = jax.jit(_extend, static_argnames=("graphdef",))
        _JITTED["session"] = jax.jit(_score_session, static_argnames=("graphdef",), donate_argnums=(2,))
    return _JITTED["prefix"], _JITTED["suffix"]


def choice_logprobs(sequences: Sequence[Sequence[int]], token_logprobs: Sequence[Sequence[float]]) -> np.ndarray:
    """Log-probabilities ``[n]`` of choosing each of ``n`` candidates, independent of their
    lengths in tokens (the rule and why: the module doc).

    Args:
      sequences: each candidate's token ids after the context the candidates share; no
        sequence may equal or be a prefix of another (a delimiter after each value ensures it).
      token_logprobs: the model's log-prob of each of those tokens given the context and the
        candidate's earlier tokens (same lengths as ``sequences``).

    Returns:
      ``log Q`` with ``logsumexp == 0``, where ``Q(v) ∝ R(v) / U(v)``: ``R`` is the model's
      distribution renormalised over the allowed tokens at each branch point of the
      candidates' token trie and ``U`` the same for a model with no preference. Equivalently a
      value's unnormalised score is the sum over the branch points on its path of
      ``log p(token) - log mean(p(allowed tokens))``. Tokens where the candidates do not branch
      add 0, and a model that gives every token the same probability gets ``Q`` uniform.
    """
    seqs = [tuple(int(t) for t in s) for s in sequences]
    logps = [np.asarray(lp, dtype=np.float64).reshape(-1) for lp in token_logprobs]
    n = len(seqs)
    if n == 0:
        raise ValueError("choice_logprobs: no candidates")
    if len(logps) != n or any(len(lp) != len(s) for lp, s in zip(logps, seqs)):
        raise ValueError("choice_logprobs: token_logprobs must match sequences in number and lengths")
    score = np.zeros(n)
    stack = [(list(range(n)), 0)]  # (candidates sharing the first `depth` tokens, depth)
    while stack:
        group, depth = stack.pop()
        if len(group) == 1:
            continue
        ended = [i for i in group if len(seqs[i]) == depth]
        if ended:
            other = next(i for i in group if i != ended[0])
            raise ValueError(f"choice_logprobs: candidate {ended[0]}'s tokens {list(seqs[ended[0]])} are a prefix of "
                             f"candidate {other}'s {list(seqs[other])}; end each candidate with a delimiter")
        children: dict[int, list[int]] = {}
        for i in group:
            children.setdefault(seqs[i][depth], []).append(i)
        if len(children) > 1:
            branch = list(children.values())
            # the allowed next tokens' log-probs, each read from the first candidate that takes it
            lp = np.array([logps[b[0]][depth] for b in branch])
            mean = np.logaddexp.reduce(lp) - math.log(len(branch))
            for b, x in zip(branch, lp):
                score[b] += x - mean
        stack.extend((b, depth + 1) for b in children.values())
    return score - np.logaddexp.reduce(score)


class ChoiceScorer:
    """Length-unbiased choice among candidate continuations of a text under a causal LM.

    For a prefix ``P`` and candidates ``C_i`` every ``P + C_i`` is tokenized; the tokens
    after the longest token prefix that the tokenized ``P`` shares with all of them
    (:meth:`split`) are scored given that shared context (:meth:`token_logprobs`) and turned
    into the choice distribution by :func:`choice_logprobs` (:meth:`scores`). The context runs
    once (batch 1, left-padded to a multiple of ``length_bucket``) into a KV cache; all
    candidates' suffixes then run in one batch of ``max(rows, next power of two)`` rows on
    that cache. Jitted functions are shared by every scorer (the model's graph is a static
    argument), so a model architecture compiles once per context bucket.

    **A cached base** (:meth:`set_base`, the engineer's prompt): its KV cache is computed once
    and every later context that starts with it runs only its tail (the analysis and the
    answer so far, in blocks of ``tail_bucket`` tokens) on a copy of that cache: a proposal's
    choices, and the proposals of one model (self-play's), share one pass over the prompt.
    The log-probs are those of the full context (tested).
    """

    def __init__(self, model: Any, tokenizer: Any, length_bucket: int = 256, suffix_bucket: int = 16, rows: int = 8,
                 tail_bucket: int = 64):
        from llm.generation.decode import split_model

        self.tokenizer = tokenizer
        self.graphdef, self.state = split_model(model)
        self.length_bucket, self.suffix_bucket, self.rows = int(length_bucket), int(suffix_bucket), int(rows)
        self.tail_bucket = int(tail_bucket)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad if pad is not None else 0)
        self.base: Any = None  # (ids, last logits, cache, room) of set_base
        self.base_text: Any = None
        self.head: Any = None  # (text, ids) of the base up to its last special token (_set_head)
        self.calls = {"cached": 0, "full": 0}

    def set_base(self, text: str, room: int = 512) -> None:
        """Cache the KV of ``text`` (without its last token, which may merge with what follows
        it) with ``room`` slots (rounded up to ``tail_bucket``) for later tails and suffixes (see
        the class doc); a no-op when ``text`` is already the base."""
        room = _bucket(int(room), self.tail_bucket)
        if self.base is not None and self.base_text == (text, room):
            return
        self.base_text = (text, room)
        self.head = None
        prefix_fn, _ = _jitted()
        full = self.encode(text)
        ids = full[:-1]
        self._set_head(text, full)
        if not ids:
            self.base = None
            return
        plen = _bucket(len(ids), self.length_bucket)
        p_ids = np.full((1, plen), self.pad_id, np.int32)
        p_mask = np.zeros((1, plen), bool)
        p_ids[0, plen - len(ids):] = ids
        p_mask[0, plen - len(ids):] = True
        last, cache = prefix_fn(self.graphdef, self.state, p_ids, p_mask, capacity=plen + int(room))
        self.base = (ids, last, cache, int(room))

    def _on_base(self, context: Sequence[int], slen: int):
        """``(last, cache)`` of ``context`` from the cached base, or None when it does not
        start with the base or its tail does not fit the base's room."""
        if self.base is None:
            return None
        ids, last, cache, room = self.base
        n = len(ids)
        if len(context) < n or list(context[:n]) != ids:
            return None
        tail = list(context[n:])
        width = _bucket(len(tail), self.tail_bucket) if tail else 0
        if width + slen > room:
            return None
        if tail:
            t_ids = np.full((1, width), self.pad_id, np.int32)
            t_mask = np.zeros((1, width), bool)
            t_ids[0, : len(tail)] = tail
            t_mask[0, : len(tail)] = True
            last, cache = _JITTED["extend"](self.graphdef, self.state, cache, np.int32(n), t_ids, t_mask,
                                            np.int32(len(tail)))
        return last, cache

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _set_head(self, text: str, full: list[int]) -> None:
        """Keep the base's text up to its last special token and that text's ids (``head``):
        a tokenizer splits its input at special tokens before anything else, so a text that
        starts with the head is tokenized as the head's ids and then its rest's (checked on the
        base itself; no head when the check fails or the base has no special token)."""
        try:
            specials = [t for t in self.tokenizer.get_added_vocab() if t and t in text]
        except AttributeError:  # a tokenizer without added tokens
            return
        if not specials:
            return
        cut = max(text.rfind(t) + len(t) for t in specials)
        head_ids = self.encode(text[:cut])
        if head_ids + self.encode(text[cut:]) == full:
            self.head = (text[:cut], head_ids)

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (one batched tokenizer call; texts that start with the
        base's head, its text up to its last special token, tokenize only what follows it)."""
        head = getattr(self, "head", None)  # a subclass may build its scorer without __init__
        if head is not None and all(t.startswith(head[0]) for t in texts):
            n = len(head[0])
            rests = self.tokenizer([t[n:] for t in texts], add_special_tokens=False)["input_ids"]
            return [head[1] + list(x) for x in rests]
        return [list(x) for x in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def split(self, prefix: str, candidates: Sequence[str]) -> tuple[list[int], list[list[int]]]:
        """``(context, suffixes)``: the token ids every ``prefix + candidate`` shares with the
        tokenized prefix, and each candidate's own tokens after them (at least one each; with
        nothing shared the context is one pad token and the suffixes are the whole texts)."""
        base, *full = self.encode_many([prefix] + [prefix + c for c in candidates])
        return self._split_ids(base, full)

    def token_logprobs(self, context: Sequence[int], suffixes: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """The model's log-prob of each suffix token given ``context`` and the suffix's earlier
        tokens: one array per suffix."""
        prefix_fn, suffix_fn = _jitted()
        n = len(suffixes)
        rows = max(self.rows, _pow2(n))
        slen = _bucket(max(len(x) for x in suffixes), self.suffix_bucket)
        c_ids = np.full((rows, slen), self.pad_id, np.int32)
        c_mask = np.zeros((rows, slen), bool)
        for i, x in enumerate(suffixes):
            c_ids[i, : len(x)] = x
            c_mask[i, : len(x)] = True
        cached = self._on_base(context, slen)
        if cached is not None:
            self.calls["cached"] += 1
            last, cache = cached
            out = np.asarray(suffix_fn(self.graphdef, self.state, last, cache, np.int32(len(context)), c_ids, c_mask))
            return [out[i, : len(x)] for i, x in enumerate(suffixes)]
        self.calls["full"] += 1
        plen = _bucket(len(context), self.length_bucket)
        p_ids = np.full((1, plen), self.pad_id, np.int32)
        p_mask = np.zeros((1, plen), bool)
        p_ids[0, plen - len(context):] = context
        p_mask[0, plen - len(context):] = True
        last, cache = prefix_fn(self.graphdef, self.state, p_ids, p_mask, capacity=plen + slen)
        out = np.asarray(suffix_fn(self.graphdef, self.state, last, cache, np.int32(len(context)), c_ids, c_mask))
        return [out[i, : len(x)] for i, x in enumerate(suffixes)]

    def scores(self, prefix: str, candidates: Sequence[str]) -> np.ndarray:
        """``[len(candidates)]`` log-probabilities of choosing each candidate after ``prefix``
        (:func:`choice_logprobs`: length-unbiased, uniform for an indifferent model)."""
        if len(candidates) == 1:
            return np.zeros(1)
        context, suffixes = self.split(prefix, candidates)
        return choice_logprobs(suffixes, self.token_logprobs(context, suffixes))

    def _split_ids(self, base: list[int], full: list[list[int]]) -> tuple[list[int], list[list[int]]]:
        shared = min(_lcp(base, f) for f in full)
        shared = min(shared, min(len(f) for f in full) - 1)  # every candidate keeps a token of its own
        if shared <= 0:  # nothing shared: condition on a pad token
            return [self.pad_id], full
        return base[:shared], [f[shared:] for f in full]

    def session(self, rows: int) -> "ChoiceSession":
        """A :class:`ChoiceSession` of ``rows`` answers written side by side on the cached base
        (:meth:`set_base` first)."""
        return ChoiceSession(self, rows)


def _score_session(graphdef, state, cache, cut, ids, mask, positions, branches, pred, targets):
    """One round of a :class:`ChoiceSession`: mask each row's stale slots ``[cut, index)``,
    run ``ids [N, W]`` at ``index`` (each row: its context's new tokens, branch 0, then its
    candidates, one branch each) and return the targets' log-probs ``[N, K]`` (each predicted
    by the hidden state at ``pred``) and the cache."""
    import jax.numpy as jnp
    from flax import nnx

    from llm.model.logprobs import head_weight, token_logprobs

    model = nnx.merge(graphdef, state)
    slot = jnp.arange(cache.mask.shape[1], dtype=jnp.int32)[None]
    stale = (slot >= cut[:, None]) & (slot < cache.index)
    cache = cache.replace(mask=cache.mask & ~stale)
    hidden, cache = model(ids, positions=positions, attention_mask=mask, cache=cache, branches=branches,
                          hidden_only=True)
    h = jnp.take_along_axis(hidden, pred[..., None], axis=1)
    weight, tied = head_weight(model)
    logp, _, _ = token_logprobs(h, weight, targets, tied=tied, chunk=None, entropy=False)
    return logp, cache


class ChoiceSession:
    """Several constrained answers to one cached prompt written side by side, each row of a
    key/value cache holding one answer so far (:func:`constrained_edits`).

    A round scores every active row's choice in one forward pass. Row ``r`` runs only what
    its context adds to what its cache row already holds (the answer's new tokens; at least
    the context's last token, whose hidden state predicts the candidates), then all its
    candidates packed after it, each attending to the prompt, the answer so far and its own
    earlier tokens (``Qwen3.__call__(branches=...)``). The candidates' slots are overwritten
    by the next round. Where a context's tokens differ from what the row holds (a token that
    merged with the chosen text), the row's cache slots from the first difference on are
    masked out and the context's tokens from there run again at their positions. The
    log-probs are those of :meth:`ChoiceScorer.token_logprobs` (tested). A row whose context
    does not continue the base, or a round that would overflow the base's room, is scored one
    by one on the full path.
    """

    def __init__(self, scorer: ChoiceScorer, rows: int, new_bucket: int = 8, pack_bucket: int = 16):
        import jax.numpy as jnp

        if scorer.base is None:
            raise ValueError("ChoiceSession: set_base first")
        self.scorer, self.rows = scorer, int(rows)
        self.new_bucket, self.pack_bucket = int(new_bucket), int(pack_bucket)
        ids, _, cache, room = scorer.base
        self.n_base = len(ids)
        self.capacity = int(cache.mask.shape[1])
        self.cache = cache.replace(k=jnp.repeat(cache.k, self.rows, axis=1), v=jnp.repeat(cache.v, self.rows, axis=1),
                                   mask=jnp.repeat(cache.mask, self.rows, axis=0))
        self.index = int(self.capacity - room)  # the base fills the slots before it (left-padded)
        self.held: list[list[int]] = [[] for _ in range(self.rows)]  # tokens after the base, per row
        self.slots: list[list[int]] = [[] for _ in range(self.rows)]
        _jitted()  # every scorer's jitted functions, the session's round among them

    def scores_many(self, requests: Sequence[Optional[tuple[str, Sequence[str]]]]) -> list[Optional[np.ndarray]]:
        """Choice log-probs per row (``requests[r]``: row ``r``'s ``(prefix, candidates)``, or
        None for a row with nothing to choose this round)."""
        if len(requests) != self.rows:
            raise ValueError(f"ChoiceSession: {len(requests)} requests for {self.rows} rows")
        sc = self.scorer
        out: list[Optional[np.ndarray]] = [None] * self.rows
        live = [r for r, q in enumerate(requests) if q is not None]
        flat: list[str] = []
        for r in live:
            prefix, cands = requests[r]
            flat += [prefix] + [prefix + c for c in cands]
        enc = sc.encode_many(flat) if flat else []
        splits, k = {}, 0
        for r in live:
            n = len(requests[r][1])
            splits[r] = sc._split_ids(enc[k], enc[k + 1 : k + 1 + n])
            k += 1 + n
        base_ids = sc.base[0]
        ours = [r for r in live if len(splits[r][0]) > self.n_base and splits[r][0][: self.n_base] == base_ids]
        if ours:
            got = self._round({r: splits[r] for r in ours})
            if got is not None:
                for r, lp in got.items():
                    out[r] = choice_logprobs(splits[r][1], lp)
        for r in live:
            if out[r] is None:
                context, suffixes = splits[r]
                out[r] = choice_logprobs(suffixes, sc.token_logprobs(context, suffixes))
        return out

    def _round(self, work: dict) -> Optional[dict]:
        sc = self.scorer
        plan = {}
        for r, (context, _) in work.items():
            tail = list(context[self.n_base :])
            keep = min(_lcp(self.held[r], tail), len(tail) - 1)  # run at least the last token
            plan[r] = (tail, keep)
        n_new = _bucket(max(len(t) - k for t, k in plan.values()), self.new_bucket)
        n_pack = _pow2(max(sum(len(x) for x in work[r][1]) for r in work), low=self.pack_bucket)  # few shapes
        n_cand = max(len(work[r][1]) for r in work)
        width = n_new + n_pack
        if self.index + width > self.capacity:
            return None
        ids = np.full((self.rows, width), sc.pad_id, np.int32)
        mask = np.zeros((self.rows, width), bool)
        positions = np.zeros((self.rows, width), np.int32)
        branches = np.zeros((self.rows, width), np.int32)
        pred = np.zeros((self.rows, n_pack), np.int32)
        targets = np.zeros((self.rows, n_pack), np.int32)
        cut = np.full((self.rows,), self.index, np.int32)
        for r, (tail, keep) in plan.items():
            new = tail[keep:]
            if keep < len(self.slots[r]):
                cut[r] = self.slots[r][keep]
            ids[r, : len(new)] = new
            mask[r, : len(new)] = True
            positions[r, : len(new)] = self.n_base + keep + np.arange(len(new))
            at = n_new
            for j, x in enumerate(work[r][1]):
                m = len(x)
                ids[r, at : at + m] = x
                mask[r, at : at + m] = True
                positions[r, at : at + m] = self.n_base + len(tail) + np.arange(m)
                branches[r, at : at + m] = j + 1
                off = at - n_new
                targets[r, off : off + m] = x
                pred[r, off] = len(new) - 1  # the context's last token predicts the first
                pred[r, off + 1 : off + m] = at + np.arange(m - 1)
                at += m
            branches[r, at:] = n_cand + 1  # padding: a branch of its own, masked
        import jax.numpy as jnp

        cache = self.cache.replace(index=jnp.asarray(self.index, jnp.int32))
        logp, cache = _JITTED["session"](sc.graphdef, sc.state, cache, cut, ids, mask, positions, branches, pred,
                                         targets)
        logp = np.asarray(logp)
        self.cache = cache
        for r, (tail, keep) in plan.items():
            self.held[r] = tail
            self.slots[r] = self.slots[r][:keep] + [self.index + i for i in range(len(tail) - keep)]
        self.index += n_new  # the candidates' slots are the next round's
        sc.calls["session"] = sc.calls.get("session", 0) + 1
        result = {}
        for r in work:
            at, lps = 0, []
            for x in work[r][1]:
                lps.append(logp[r, at : at + len(x)])
                at += len(x)
            result[r] = lps
        return result


def _choose(scores: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(scores))
    z = (scores - scores.max()) / temperature
    p = np.exp(z)
    p /= p.sum()
    return int(rng.choice(len(scores), p=p))


def constrained_edit(
    score: Callable[[str, Sequence[str]], np.ndarray],
    prefix: str,
    space: ConfigSpace,
    components: int,
    rng: np.random.Generator,
    temperature: float = 0.0,
) -> tuple[str, list[dict]]:
    """Write an edit of a mixture of ``components`` components after ``prefix``, choosing only
    the kind of edit and then its values (see the module doc and :mod:`jaxlake.engineers.edits`).

    The JSON is written in this order, each choice among the values still allowed:

    1. ``{"edit": "<kind>"`` -- a kind of :meth:`EditRules.kinds` (``space.edits``);
    2. ``reweight``: ``"weights": [...]``, one of the rules' ``weights`` per component;
       ``drop`` / ``replace``: ``"drop": i``, a component index;
    3. ``add`` / ``replace``: ``"add": [{"weight": share, "config": {<field>: value, ...}}, ...]``:
       a share of the rules' ``shares``, each editable field in :data:`~jaxlake.engineers.FIELD_ORDER`
       among the values that still complete to a valid config (:meth:`ConfigSpace.choices`),
       and whether another component follows (up to the rules' ``max_add`` and ``max_components``).

    Args:
      score: ``score(text, candidates) -> [n]`` choice log-probs (e.g. :meth:`ChoiceScorer.scores`,
        length-unbiased; ``temperature: 1`` then samples exactly that distribution).
      prefix: the chat prompt up to the assistant's answer.
      space: the allowed values, constraints and edit rules.
      components: how many components the current mixture has.
      rng: numpy generator for sampling (unused when ``temperature == 0``).
      temperature: 0 picks the best-scored value.

    Returns:
      ``(json_text, choices)`` where ``choices`` logs every choice point with the top values.
      The text is a valid edit by construction (:func:`jaxlake.engineers.check_edit` passes).
    """
    writer = _edit_writer(prefix, space, components, rng, temperature)
    request = next(writer)
    while True:
        try:
            request = writer.send(np.asarray(score(*request), dtype=np.float64))
        except StopIteration as done:
            return done.value


def constrained_edits(
    score_many: Callable[[Sequence[Optional[tuple[str, Sequence[str]]]]], Sequence[Optional[np.ndarray]]],
    prefixes: Sequence[str],
    space: ConfigSpace,
    components: int,
    rngs: Sequence[np.random.Generator],
    temperature: float = 0.0,
) -> list[tuple[str, list[dict]]]:
    """:func:`constrained_edit` of several prompts side by side: at each round every answer
    not yet finished makes its next choice, all of them scored in one call
    (``score_many(requests) -> scores``, one entry per prompt, None for a finished one, e.g.
    :meth:`ChoiceSession.scores_many`). Each answer
    is the one :func:`constrained_edit` writes with the same ``rng`` and the same scores
    (self-play's proposals of one prompt: one forward pass a round instead of one a choice).
    """
    if len(rngs) != len(prefixes):
        raise ValueError(f"constrained_edits: {len(prefixes)} prefixes but {len(rngs)} rngs")
    writers = [_edit_writer(p, space, components, r, temperature) for p, r in zip(prefixes, rngs)]
    pending: dict[int, Any] = {}
    done: dict[int, tuple[str, list[dict]]] = {}
    for i, w in enumerate(writers):
        try:
            pending[i] = next(w)
        except StopIteration as stop:  # nothing to choose
            done[i] = stop.value
    while pending:
        scores = score_many([pending.get(i) for i in range(len(writers))])
        for i in sorted(pending):
            try:
                pending[i] = writers[i].send(np.asarray(scores[i], dtype=np.float64))
            except StopIteration as stop:
                done[i] = stop.value
                del pending[i]
    return [done[i] for i in range(len(writers))]


def _edit_writer(prefix: str, space: ConfigSpace, components: int, rng: np.random.Generator, temperature: float):
    """The generator behind :func:`constrained_edit`: yields ``(text, candidates)`` for every
    choice with more than one candidate, receives their scores, returns ``(json_text, choices)``."""
    rules = space.edits
    fields = list(space.editable)
    choices: list[dict] = []
    text = '{"edit": "'

    def pick(label: str, options: Sequence[Any], shown: Sequence[str], after: Sequence[str]):
        nonlocal text
        cands = [a + b for a, b in zip(shown, after)]
        sc = (yield (prefix + text, cands)) if len(cands) > 1 else np.zeros(1)
        i = _choose(sc, temperature, rng) if len(cands) > 1 else 0
        order = np.argsort(-sc)[:5]
        choices.append({"choice": label, "chosen": options[i],
                        "top": [[options[j], round(float(sc[j]), 3)] for j in order]})
        text += cands[i]
        return i

    kinds = [k for k in rules.kinds(components) if k not in ("add", "replace") or fields]
    openers = {"keep": '"}', "reweight": '", "weights": [', "drop": '", "drop": ', "add": '", "add": [{"weight": ',
               "replace": '", "drop": '}
    kind = kinds[(yield from pick("edit", kinds, kinds, [openers[k] for k in kinds]))]
    if kind == "keep":
        return text, choices
    if kind == "reweight":
        shown = [format_value(w) for w in rules.weights]
        for i in range(components):
            after = ", " if i + 1 < components else "]}"
            yield from pick(f"weights[{i}]", list(rules.weights), shown, [after] * len(shown))
        return text, choices
    if kind in ("drop", "replace"):
        idx = list(range(components))
        after = "}" if kind == "drop" else ', "add": [{"weight": '
        yield from pick("drop", idx, [str(i) for i in idx], [after] * components)
        if kind == "drop":
            return text, choices
    room = min(rules.max_add, rules.max_components - components + (1 if kind == "replace" else 0))
    added = 0
    shares = list(rules.shares)
    while True:
        yield from pick(f"add[{added}].weight", shares, [format_value(w) for w in shares],
                        [', "config": {' + json.dumps(fields[0]) + ": "] * len(shares))
        partial: dict[str, Any] = {}
        for j, name in enumerate(fields):
            options = space.choices(name, partial)
            if not options:  # cannot happen for a valid base
                raise ConfigError(f"no allowed value for {name} after {partial}")
            after = ", " + json.dumps(fields[j + 1]) + ": " if j + 1 < len(fields) else "}}"
            i = yield from pick(f"add[{added}].{name}", options, [format_value(v) for v in options],
                                [after] * len(options))
            partial[name] = options[i]
        added += 1
        if added >= room:
            text += "]}"
            return text, choices
        if not (yield from pick(f"more_after[{added - 1}]", [False, True], ["]}", ', {"weight": '], ["", ""])):
            return text, choices
