"""LLM environment engineers: ``policy``, ``base`` and ``external``.

The system turn (:func:`default_system`) names only the summary parts the prompt shows. The
user turn (:func:`build_user_prompt`) is the stage summary rendered by
:func:`jaxlake.summaries.render_summary` with each context part switchable in
``conf/engineer/<name>.yaml`` (``context: {behaviour, failures, env_stats, history}``, for
ablations), the current environment as JSON and the schema of what may be proposed: the
editable fields with their allowed values (a :class:`jaxlake.engineers.ConfigSpace`).

**Constrained decoding** (``decoding: constrained``, the default of the local backends)
writes the JSON object itself and lets the model choose only the values: for each editable
field in :data:`jaxlake.engineers.FIELD_ORDER`, the allowed values that still admit a valid
config given the earlier choices (:meth:`ConfigSpace.choices`) are scored
(:func:`choice_logprobs`) and the best is taken (``temperature: 0``) or one is sampled from
``softmax(score / temperature)``. With ``max_components > 1`` the model also chooses each
component's weight and whether another component follows, giving a weighted mixture. The
result is valid by construction, so even a random model yields a valid config.
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

The model runs once per choice (teacher-forced, all candidates in one batch,
:class:`ChoiceScorer`): every allowed token at a branch point is some candidate's next token,
so its probability is read from that candidate's row.

Every backend runs :func:`jaxlake.engineers.propose_with_retries`: parse, validate
(``LakeConfig`` and :func:`jaxlake.engineers.check_in_space`: allowed values, fixed fields,
at most ``max_components`` components), retry with the error shown in the prompt, keep the
current environment as the last resort (a ``fallback``); the record keeps the prompt, the raw outputs, the parsed object, the
validation errors and, for constrained decoding, the top-scored values at every choice.
Malformed output never raises.

**Reasoning** (``reasoning: {enabled: auto | true | false, thinking_tokens, temperature}``;
``auto`` follows the run's ``prompt.reasoning.enabled``): the model first writes a free
analysis in a ``<think>`` block (sampled or greedy, at most ``thinking_tokens`` tokens; then
``</think>`` is forced, :func:`llm.reasoning.think_phase`), and the configuration is decoded
after it (constrained or free) conditioned on that analysis. The analysis is saved in the
record (``engineer.json`` key ``analysis``) and shown in the next summaries' stage history.
``conf/engineer/policy_answer_only.yaml`` is the ablation without it. Replies of free and
external engineers are read after any think block (the last complete JSON object,
:func:`jaxlake.engineers.extract_json`).

The ``external`` backend talks to any OpenAI-compatible chat endpoint with the standard
library (``POST <url>/chat/completions``); the API key is read from the environment
variable NAMED in the config (``api_key_env``), never stored in it.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import threading
import time
import urllib.parse
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from jaxlake.config import ConfigError
from jaxlake.engineers import (
    ConfigSpace,
    Engineer,
    EngineerContext,
    FatalEngineerError,
    Proposal,
    format_value,
    mixture_to_obj,
    propose_with_retries,
    space_from_conf,
)
from jaxlake.summaries import PARTS, render_summary

#: How the system turn names each summary part (only the parts the prompt shows are named).
_PART_NAMES = {"behaviour": "the policy's behaviour", "failures": "its failure cases",
               "env_stats": "the environment statistics", "history": "the stage history"}


def default_system(parts: Sequence[str] = PARTS) -> str:
    """The system turn for an engineer whose prompt shows ``parts`` of the summary (an
    ablation without a part must not be told it has it)."""
    names = [_PART_NAMES[p] for p in PARTS if p in parts]
    if not names:
        reads = "you read the current configuration"
    elif len(names) == 1:
        reads = f"you read a summary of {names[0]}"
    else:
        reads = f"you read a summary of {', '.join(names[:-1])} and {names[-1]}"
    aim = "and target the failures you see. " if "failures" in parts else ""
    return (
        "You are the environment engineer of a training curriculum for a policy that plans paths for "
        f"several agents on a frozen lake grid. After each stage {reads}, and you "
        "propose the configuration of the next stage as a JSON object. Use only the allowed values and "
        "follow the rules the prompt states. Make the environment harder when the success rate is high "
        f"and easier when it is low{', ' + aim if aim else '. '}Reply with a single JSON object and nothing else."
    )


DEFAULT_SYSTEM = default_system(PARTS)
#: Added to the system turn when the engineer reasons first.
REASONING_SYSTEM = (
    " Before the JSON object, think in a <think> block: what does the policy fail at, why, and "
    "which change of the environment would teach it most? Then close the block and answer."
)
#: Default mixture weights the constrained decoder chooses from (normalised afterwards).
DEFAULT_WEIGHTS = (0.25, 0.5, 0.75, 1.0)


# ============================================================================ prompt
def _context_flags(context: Optional[Mapping[str, Any]]) -> dict[str, bool]:
    flags = {p: True for p in PARTS}
    for k, v in dict(context or {}).items():
        if k not in flags:
            raise ConfigError(f"engineer.context.{k}: unknown part; choose from {list(PARTS)}")
        flags[k] = bool(v)
    return flags


def describe_space(space: ConfigSpace) -> str:
    """One line per editable field with its allowed values."""
    lines = []
    for name in space.editable:
        vals = space.values[name]
        shown = ", ".join(format_value(v) for v in vals)
        if len(vals) > 12 and all(isinstance(v, int) for v in vals):
            shown = f"an integer from {vals[0]} to {vals[-1]}"
        elif len(vals) > 12:
            shown = f"one of {', '.join(format_value(v) for v in vals[:4])}, ..., {format_value(vals[-1])}"
        else:
            shown = f"one of {shown}"
        lines.append(f"- {name}: {shown}")
    return "\n".join(lines)


def space_rules(space: ConfigSpace, max_components: int = 1) -> str:
    """The cross-field rules a proposal must meet (what :class:`LakeConfig` and
    :func:`jaxlake.engineers.check_in_space` check; the rules are in docs/rules.md), so that a
    free-text engineer does not have to learn them from rejections."""
    lines = ["- each agent needs its own frozen start and goal cell: "
             "2 * num_agents <= height * width - round(hole_density * height * width)"]
    if "min_dist" in space.editable or "max_dist" in space.editable:
        lines.append("- 1 <= min_dist <= height * width - 1, min_dist <= max_dist (null: no bound)")
    n = int(max_components)
    lines.append(f"- at most {n} component{'s' if n != 1 else ''}" + (", weights > 0" if n > 1 else ""))
    return "Rules:\n" + "\n".join(lines)


def build_user_prompt(
    ctx: EngineerContext,
    parts: Sequence[str],
    space: ConfigSpace,
    max_components: int = 1,
    max_failures: Optional[int] = None,
    max_history: Optional[int] = None,
    max_summary_chars: Optional[int] = None,
) -> str:
    """The user turn: summary parts, the current environment and the answer schema."""
    summary = dict(ctx.summary or {})
    if max_failures is not None and summary.get("failures"):
        f = dict(summary["failures"])
        f["cases"] = list(f.get("cases", []))[:max_failures]
        summary["failures"] = f
    if max_history is not None:
        summary["history"] = list(summary.get("history") or [])[-max_history:] if max_history > 0 else []
    text = render_summary(summary, parts) if summary and parts else ""
    if max_summary_chars is not None and len(text) > max_summary_chars:
        text = text[: max(max_summary_chars, 0)] + "\n(summary cut)"
    current = json.dumps({"mixture": mixture_to_obj(ctx.current)})
    fixed = {k: v for k, v in ctx.base.to_dict().items() if k not in space.editable}
    if max_components > 1:
        fmt = (
            '{"mixture": [{"weight": w, "config": {<fields>}}, ...]} with up to '
            f"{max_components} components (weights are normalised)"
        )
    else:
        fmt = '{"height": ..., "width": ..., ...} with the fields below'
    chunks = [
        f"Stage {ctx.stage} of training has finished. Propose the environment of stage {ctx.stage + 1}.",
        text,
        f"## Current environment\n{current}",
        f"## Answer\nOne JSON object {fmt}. Fields you may set, with their allowed values:\n{describe_space(space)}\n"
        f"Fixed fields (keep them): {json.dumps(fixed)}\n{space_rules(space, max_components)}",
    ]
    return "\n\n".join(c for c in chunks if c)


def chat_text(tokenizer: Any, system: str, user: str, thinking: bool = False) -> str:
    """The chat-formatted prompt ending with the assistant turn's opening (Qwen3: with an
    empty think block unless ``thinking``)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=bool(thinking))
    except (ValueError, AttributeError, TypeError):
        # no chat template: a plain transcript
        head = f"{system}\n\n" if system else ""
        return f"{head}{user}\n\nAnswer:\n"


def fit_user_prompt(
    build: Callable[..., str], count: Callable[[str], int], budget: int, num_failures: int, num_history: int
) -> str:
    """The richest prompt within ``budget`` tokens: fewer failure cases first, then a
    shorter history, then a cut summary."""
    for k in range(num_failures, -1, -1):
        text = build(max_failures=k)
        if count(text) <= budget:
            return text
    for h in (3, 1, 0):
        if h >= num_history:
            continue
        text = build(max_failures=0, max_history=h)
        if count(text) <= budget:
            return text
    chars = 4000
    while chars > 0:
        text = build(max_failures=0, max_history=0, max_summary_chars=chars)
        if count(text) <= budget:
            return text
        chars //= 2
    return build(max_failures=0, max_history=0, max_summary_chars=0)


# ============================================================================ scoring
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

    from llm.generate import left_pad_positions

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


_JITTED: dict = {}


def _jitted():
    if not _JITTED:
        import jax

        _JITTED["prefix"] = jax.jit(_score_prefix, static_argnames=("graphdef", "capacity"))
        _JITTED["suffix"] = jax.jit(_score_suffixes, static_argnames=("graphdef",))
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
    """

    def __init__(self, model: Any, tokenizer: Any, length_bucket: int = 256, suffix_bucket: int = 16, rows: int = 64):
        from llm.generate import split_model

        self.tokenizer = tokenizer
        self.graphdef, self.state = split_model(model)
        self.length_bucket, self.suffix_bucket, self.rows = int(length_bucket), int(suffix_bucket), int(rows)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad if pad is not None else 0)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (one batched tokenizer call)."""
        return [list(x) for x in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def split(self, prefix: str, candidates: Sequence[str]) -> tuple[list[int], list[list[int]]]:
        """``(context, suffixes)``: the token ids every ``prefix + candidate`` shares with the
        tokenized prefix, and each candidate's own tokens after them (at least one each; with
        nothing shared the context is one pad token and the suffixes are the whole texts)."""
        base, *full = self.encode_many([prefix] + [prefix + c for c in candidates])
        shared = min(_lcp(base, f) for f in full)
        # every candidate must keep at least one token of its own to be scored
        shared = min(shared, min(len(f) for f in full) - 1)
        if shared <= 0:  # nothing shared: condition on a pad token
            return [self.pad_id], full
        return base[:shared], [f[shared:] for f in full]

    def token_logprobs(self, context: Sequence[int], suffixes: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """The model's log-prob of each suffix token given ``context`` and the suffix's earlier
        tokens: one array per suffix."""
        prefix_fn, suffix_fn = _jitted()
        n = len(suffixes)
        rows = max(self.rows, _pow2(n))
        plen = _bucket(len(context), self.length_bucket)
        slen = _bucket(max(len(x) for x in suffixes), self.suffix_bucket)
        p_ids = np.full((1, plen), self.pad_id, np.int32)
        p_mask = np.zeros((1, plen), bool)
        p_ids[0, plen - len(context):] = context
        p_mask[0, plen - len(context):] = True
        c_ids = np.full((rows, slen), self.pad_id, np.int32)
        c_mask = np.zeros((rows, slen), bool)
        for i, x in enumerate(suffixes):
            c_ids[i, : len(x)] = x
            c_mask[i, : len(x)] = True
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


def _choose(scores: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(scores))
    z = (scores - scores.max()) / temperature
    p = np.exp(z)
    p /= p.sum()
    return int(rng.choice(len(scores), p=p))


def constrained_json(
    score: Callable[[str, Sequence[str]], np.ndarray],
    prefix: str,
    space: ConfigSpace,
    rng: np.random.Generator,
    temperature: float = 0.0,
    max_components: int = 1,
    weights: Sequence[float] = DEFAULT_WEIGHTS,
) -> tuple[str, list[dict]]:
    """Write a proposal JSON after ``prefix`` choosing only values (see the module doc).

    Args:
      score: ``score(text, candidates) -> [n]`` choice log-probs (e.g. :meth:`ChoiceScorer.scores`,
        length-unbiased; ``temperature: 1`` then samples exactly that distribution).
      prefix: the chat prompt up to the assistant's answer.
      space: the allowed values and constraints.
      rng: numpy generator for sampling (unused when ``temperature == 0``).
      temperature: 0 picks the best-scored value.
      max_components: > 1 writes ``{"mixture": [...]}`` with model-chosen weights and size.
      weights: the weight values offered per component.

    Returns:
      ``(json_text, choices)`` where ``choices`` logs every choice point with the top values.
    """
    if not space.editable:
        return "{}", []
    fields = list(space.editable)
    choices: list[dict] = []
    mixture = max_components > 1
    text = '{"mixture": [{"weight": ' if mixture else "{" + json.dumps(fields[0]) + ": "

    def pick(label: str, options: Sequence[Any], shown: Sequence[str], after: Sequence[str]) -> int:
        nonlocal text
        cands = [s + a for s, a in zip(shown, after)]
        sc = np.asarray(score(prefix + text, cands), dtype=np.float64) if len(cands) > 1 else np.zeros(1)
        i = _choose(sc, temperature, rng) if len(cands) > 1 else 0
        order = np.argsort(-sc)[:5]
        choices.append(
            {"choice": label, "chosen": options[i], "top": [[options[j], round(float(sc[j]), 3)] for j in order]}
        )
        text += cands[i]
        return i

    components = 0
    while True:
        components += 1
        if mixture:
            shown_w = [format_value(float(w)) for w in weights]
            pick(f"weight[{components - 1}]", list(weights), shown_w, [', "config": {' + json.dumps(fields[0]) + ": "] * len(weights))
        partial: dict[str, Any] = {}
        for j, name in enumerate(fields):
            options = space.choices(name, partial)
            if not options:  # cannot happen for a valid base; keep the base value
                raise ConfigError(f"no allowed value for {name} after {partial}")
            if j + 1 < len(fields):
                after = ", " + json.dumps(fields[j + 1]) + ": "
            else:
                after = "}}" if mixture else "}"
            i = pick(name if not mixture else f"{name}[{components - 1}]", options,
                     [format_value(v) for v in options], [after] * len(options))
            partial[name] = options[i]
        if not mixture:
            return text, choices
        if components >= max_components:
            text += "]}"
            return text, choices
        more = pick(f"more_after[{components - 1}]", [False, True], ["]}", ', {"weight": '], ["", ""])
        if not more:
            return text, choices


# ============================================================================ reasoning
_REASONING_KEYS = ("enabled", "thinking_tokens", "temperature", "close_text")


def reasoning_settings(node: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """Validated ``engineer.reasoning``: ``enabled`` (``auto`` | true | false), ``thinking_tokens``
    (>= 1), ``temperature`` (>= 0; 0 greedy) and ``close_text`` (forced at the budget)."""
    out: dict[str, Any] = {"enabled": "auto", "thinking_tokens": 256, "temperature": 0.0, "close_text": "\n</think>\n\n"}
    node = dict(node or {})
    unknown = sorted(set(node) - set(_REASONING_KEYS))
    if unknown:
        raise ConfigError(f"engineer.reasoning: unknown key(s) {unknown}; known: {list(_REASONING_KEYS)}")
    out.update(node)
    if out["enabled"] not in ("auto", True, False):
        raise ConfigError(f"engineer.reasoning.enabled={out['enabled']!r} not in ['auto', true, false]")
    t = out["thinking_tokens"]
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise ConfigError(f"engineer.reasoning.thinking_tokens={t!r} not an integer in [1, inf)")
    if not isinstance(out["temperature"], (int, float)) or not out["temperature"] >= 0:
        raise ConfigError(f"engineer.reasoning.temperature={out['temperature']!r} not in [0, inf)")
    c = out["close_text"]
    if not isinstance(c, str) or c.count("</think>") != 1 or "<think>" in c:
        raise ConfigError(f"engineer.reasoning.close_text={c!r} must contain '</think>' exactly once and no '<think>'")
    out["temperature"] = float(out["temperature"])
    return out


def run_reasons(ctx: EngineerContext) -> bool:
    """Whether the run's policy prompt has reasoning on (``prompt.reasoning.enabled``)."""
    cfg = ctx.run_cfg
    node = cfg.get("prompt") if isinstance(cfg, Mapping) else getattr(cfg, "prompt", None)
    if node is None:
        return False
    node = node.get("reasoning") if isinstance(node, Mapping) else getattr(node, "reasoning", None)
    if node is None:
        return False
    enabled = node.get("enabled", False) if isinstance(node, Mapping) else getattr(node, "enabled", False)
    return bool(enabled)


def write_analysis(model: Any, tokenizer: Any, text: str, thinking_tokens: int, temperature: float,
                   key: Any) -> tuple[str, int, bool]:
    """The engineer's free analysis after the chat prompt ``text`` (a ``<think>\n`` is appended).

    Samples (``temperature > 0``) or decodes greedily up to ``thinking_tokens`` tokens, stopping
    at ``</think>`` or the end of the turn (:func:`llm.reasoning.think_phase`). Returns
    ``(analysis, tokens, hit_budget)``: the analysis text without the tags, the number of
    tokens the model wrote, and whether the budget ran out before it closed the block.
    """
    from llm import reasoning
    from llm.generate import GenerationConfig, pad_prompts
    from llm.tokenizer import eos_and_pad

    eos, pad = eos_and_pad(tokenizer)
    close = reasoning.close_token_id(tokenizer)
    ids, mask = pad_prompts([tokenizer.encode(text + reasoning.THINK_OPEN + "\n", add_special_tokens=False)], pad, 64)
    cfg = GenerationConfig(max_new_tokens=int(thinking_tokens), temperature=float(temperature))
    out = reasoning.think_phase(model, ids, mask, None if temperature == 0 else key, cfg, thinking_tokens, close,
                                eos_token_ids=eos, pad_token_id=pad)
    n = int(out["lengths"][0])
    toks = out["tokens"][0, :n].tolist()
    if toks and (out["closed"][0] or out["ended"][0]):
        toks = toks[:-1]  # drop the </think> or end-of-turn token the model ended with
    # as written (special tokens shown, so an untrained model's output is visible), without
    # think tags, which would nest inside the block the answer is decoded after
    analysis = tokenizer.decode(toks, skip_special_tokens=False)
    analysis = analysis.replace(reasoning.THINK_OPEN, "").replace(reasoning.THINK_CLOSE, "").strip()
    return analysis, n, bool(out["hit_budget"][0])


# ============================================================================ local LLM backends
class LLMEngineer(Engineer):
    """An engineer that is a local Qwen3 checkpoint: ``source`` ``policy`` (this stage's
    trained checkpoint, the paper's method) or ``base`` (the stage-0 model).

    Args:
      context: which summary parts the prompt shows (``behaviour failures env_stats
        history``; all by default).
      decoding: ``constrained`` (valid by construction) or ``free`` (sampled text).
      temperature: 0 = best-scored value / greedy text.
      retries: attempts after the first one.
      max_components: > 1 lets the model propose a weighted mixture.
      weights: weights offered per mixture component.
      space: ``{editable, values}`` of the :class:`ConfigSpace`.
      max_new_tokens: text length for ``free`` decoding.
      max_prompt_tokens: prompt budget (default: the model's context minus the answer room).
      system: the system turn (default :data:`DEFAULT_SYSTEM`, plus :data:`REASONING_SYSTEM`
        when reasoning).
      reasoning: ``{enabled: auto | true | false, thinking_tokens, temperature, close_text}``
        (:func:`reasoning_settings`): write a free analysis first (see the module doc).
    """

    source = "policy"

    def __init__(
        self,
        name: Optional[str] = None,
        context: Optional[Mapping[str, Any]] = None,
        decoding: str = "constrained",
        temperature: float = 0.0,
        retries: int = 2,
        max_components: int = 1,
        weights: Sequence[float] = DEFAULT_WEIGHTS,
        space: Optional[Mapping[str, Any]] = None,
        max_new_tokens: int = 256,
        max_prompt_tokens: Optional[int] = None,
        system: Optional[str] = None,
        reasoning: Optional[Mapping[str, Any]] = None,
        **_: Any,
    ) -> None:
        self.reasoning = reasoning_settings(reasoning)
        self.custom_system = system is not None
        if decoding not in ("constrained", "free"):
            raise ConfigError(f"engineer.decoding={decoding!r} not in ['constrained', 'free']")
        if not temperature >= 0:
            raise ConfigError(f"engineer.temperature={temperature} not in [0, inf)")
        if int(retries) < 0:
            raise ConfigError(f"engineer.retries={retries} not in [0, inf)")
        if int(max_components) < 1:
            raise ConfigError(f"engineer.max_components={max_components} not in [1, inf)")
        weights = [float(w) for w in weights]
        if not weights or any(not (w > 0 and math.isfinite(w)) for w in weights):
            raise ConfigError(f"engineer.weights={weights} must be positive numbers")
        self.name = name or self.source
        self.flags = _context_flags(context)
        self.decoding, self.temperature, self.retries = decoding, float(temperature), int(retries)
        self.max_components, self.weights = int(max_components), weights
        self.space_node, self.max_new_tokens = space, int(max_new_tokens)
        self.max_prompt_tokens = max_prompt_tokens
        self.system = default_system(self.parts) if system is None else system

    @property
    def parts(self) -> list[str]:
        return [p for p in PARTS if self.flags[p]]

    def reasons(self, ctx: EngineerContext) -> bool:
        """Whether this proposal starts with an analysis (``auto``: the run's prompt decides)."""
        enabled = self.reasoning["enabled"]
        return run_reasons(ctx) if enabled == "auto" else bool(enabled)

    def _model(self, ctx: EngineerContext):
        if ctx.load_model is None:
            raise ConfigError(f"engineer={self.name} needs a model: the pipeline passes load_model in the context")
        return ctx.load_model(self.source)

    def prompt_turns(self, ctx: EngineerContext, model: Any, tokenizer: Any) -> tuple[str, str]:
        """The ``(system, user)`` turns this engineer sends for ``ctx``: the richest user prompt
        that fits the model's context beside the system turn and the answer room (see
        :func:`fit_user_prompt`). :meth:`propose` and notebook 03 both build it here."""
        space = space_from_conf(ctx.base, self.space_node)
        count = ChoiceScorer(model, tokenizer).count
        thinking = self.reasons(ctx)
        system = self.system + (REASONING_SYSTEM if thinking and not self.custom_system else "")
        answer_room = 64 + 24 * len(space.editable) * self.max_components
        if self.decoding == "free":
            answer_room = max(answer_room, self.max_new_tokens)
        if thinking:
            answer_room += self.reasoning["thinking_tokens"] + count(self.reasoning["close_text"]) + 8
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", 4096)
        budget = int(self.max_prompt_tokens) if self.max_prompt_tokens else int(limit) - answer_room
        system_tokens = count(chat_text(tokenizer, system, "", thinking))

        def build(**kw):
            return build_user_prompt(ctx, self.parts, space, self.max_components, **kw)

        failures = len(((ctx.summary or {}).get("failures") or {}).get("cases", []))
        history = len((ctx.summary or {}).get("history") or [])
        return system, fit_user_prompt(build, count, budget - system_tokens, failures, history)

    def propose(self, ctx: EngineerContext) -> Proposal:
        model, tokenizer = self._model(ctx)
        space = space_from_conf(ctx.base, self.space_node)
        scorer = ChoiceScorer(model, tokenizer)
        thinking = self.reasons(ctx)
        system, user = self.prompt_turns(ctx, model, tokenizer)
        rng = ctx.rng(7)
        traces: list = []
        analyses: list = []

        def ask(prompt: str, attempt: int) -> str:
            text = chat_text(tokenizer, system, prompt, thinking)
            head = ""
            if thinking:
                import jax

                from llm.reasoning import THINK_OPEN

                key = jax.random.PRNGKey(int(ctx.seed) * 1000 + int(ctx.stage) * 10 + attempt + 5)
                analysis, n_tok, hit = write_analysis(model, tokenizer, text, self.reasoning["thinking_tokens"],
                                                      self.reasoning["temperature"], key)
                analyses.append({"attempt": attempt, "analysis": analysis, "tokens": n_tok, "hit_budget": hit})
                head = f"{THINK_OPEN}\n{analysis}{self.reasoning['close_text']}"
                text += head
            if self.decoding == "constrained":
                out, choices = constrained_json(
                    scorer.scores, text, space, rng, self.temperature, self.max_components, self.weights
                )
                traces.append(choices)
                return head + out
            return head + self._free(model, tokenizer, text, ctx, attempt)

        proposal = propose_with_retries(ask, user, ctx, self.retries, space=space, max_components=self.max_components)
        proposal.record.update(
            {"system": system, "decoding": self.decoding, "context_parts": self.parts, "source": self.source,
             "reasoning": thinking}
        )
        if traces:
            proposal.record["choices"] = traces[-1]
        if analyses:
            proposal.record["analysis"] = analyses[-1]["analysis"]
            proposal.record["analyses"] = analyses
            proposal.record["thinking_budget"] = self.reasoning["thinking_tokens"]
        return proposal

    def _free(self, model, tokenizer, text: str, ctx: EngineerContext, attempt: int) -> str:
        import jax

        from llm.generate import GenerationConfig, generate

        cfg = GenerationConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature)
        key = jax.random.PRNGKey(int(ctx.seed) * 1000 + int(ctx.stage) * 10 + attempt)
        return generate(model, tokenizer, [text], cfg, key=key).texts[0]


class PolicyEngineer(LLMEngineer):
    """The current (just trained) policy checkpoint designs its next environment."""

    source = "policy"


class BaseEngineer(LLMEngineer):
    """The stage-0 (untrained) model as the engineer: isolates the effect of training."""

    source = "base"


# ============================================================================ external
class ExternalEngineer(Engineer):
    """Any OpenAI-compatible chat endpoint as the engineer (stdlib ``http.client``).

    Safe to point at a server on the internet:

    * **one deadline per request**: ``timeout_s`` bounds the whole HTTP exchange (connect,
      send, status, headers and the complete body); a server that drips bytes is cut off at
      the deadline (a watchdog closes the socket), not after every slow read;
    * **no redirects**: a 3xx answer is refused with an error naming its ``Location`` (a
      followed redirect would carry the ``Authorization`` header to another address); set
      ``url`` to the final address instead;
    * **bounded backoff**: HTTP 429 and 5xx are retried up to ``http_retries`` times within the
      attempt, waiting the server's ``Retry-After`` (seconds or an HTTP date) or else
      ``backoff_s * 2**k``; a wait longer than ``max_backoff_s`` is not made (the attempt
      fails with the server's request named);
    * **a prompt budget**: with ``context_tokens`` (the endpoint's context window) the user
      prompt is fitted to ``context_tokens - max_tokens - system - retry room`` (token counts
      estimated as ``chars / chars_per_token``) by dropping failure cases, then old history,
      then cutting the summary (:func:`fit_user_prompt`); if even the shortest prompt does
      not fit, the proposal fails once with that error. Errors that another attempt cannot
      fix (a refused redirect, HTTP 400/401/403/404/413/422) also end the attempts at once
      (:class:`jaxlake.engineers.FatalEngineerError`).

    Args:
      url: base URL (``http://host:port/v1``) or the full ``.../chat/completions`` URL.
      model: the endpoint's model name.
      api_key_env: NAME of the environment variable holding the API key (None: no auth).
      temperature, max_tokens: sampling settings sent with the request.
      timeout_s: the deadline of one HTTP request, seconds.
      retries: attempts after the first (each failed parse, validation or request counts).
      http_retries, backoff_s, max_backoff_s: retries of 429/5xx inside one attempt and their waits.
      context_tokens, chars_per_token: the prompt budget (None: no budget).
      json_mode: send ``response_format: {"type": "json_object"}``.
      context, max_components, space, system: as for :class:`LLMEngineer`.
      extra_body: more request fields (e.g. ``top_p``).
    """

    def __init__(
        self,
        url: str,
        model: str,
        api_key_env: Optional[str] = None,
        name: str = "external",
        context: Optional[Mapping[str, Any]] = None,
        temperature: float = 0.7,
        max_tokens: int = 512,
        timeout_s: float = 60.0,
        retries: int = 2,
        json_mode: bool = False,
        max_components: int = 1,
        space: Optional[Mapping[str, Any]] = None,
        system: Optional[str] = None,
        extra_body: Optional[Mapping[str, Any]] = None,
        http_retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        context_tokens: Optional[int] = None,
        chars_per_token: float = 3.0,
        **_: Any,
    ) -> None:
        if not url or not isinstance(url, str):
            raise ConfigError("engineer.url: give the endpoint's URL, e.g. http://127.0.0.1:8000/v1")
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ConfigError(f"engineer.url={url!r}: the scheme must be http or https")
        if not model:
            raise ConfigError("engineer.model: give the endpoint's model name")
        if api_key_env and api_key_env not in os.environ:
            raise ConfigError(
                f"engineer.api_key_env={api_key_env!r}: the environment variable {api_key_env} is not set"
            )
        if not float(timeout_s) > 0:
            raise ConfigError(f"engineer.timeout_s={timeout_s} not in (0, inf)")
        if int(http_retries) < 0:
            raise ConfigError(f"engineer.http_retries={http_retries} not in [0, inf)")
        if not float(backoff_s) >= 0:
            raise ConfigError(f"engineer.backoff_s={backoff_s} not in [0, inf)")
        if not float(max_backoff_s) >= 0:
            raise ConfigError(f"engineer.max_backoff_s={max_backoff_s} not in [0, inf)")
        if context_tokens is not None and int(context_tokens) <= int(max_tokens):
            raise ConfigError(f"engineer.context_tokens={context_tokens} must exceed max_tokens={max_tokens}")
        if not float(chars_per_token) > 0:
            raise ConfigError(f"engineer.chars_per_token={chars_per_token} not in (0, inf)")
        self.url = url.rstrip("/")
        if not self.url.endswith("/chat/completions"):
            self.url += "/chat/completions"
        self.model, self.api_key_env, self.name = model, api_key_env, name
        self.flags = _context_flags(context)
        self.temperature, self.max_tokens, self.timeout_s = float(temperature), int(max_tokens), float(timeout_s)
        self.retries, self.json_mode = int(retries), bool(json_mode)
        self.http_retries, self.backoff_s, self.max_backoff_s = int(http_retries), float(backoff_s), float(max_backoff_s)
        self.context_tokens = None if context_tokens is None else int(context_tokens)
        self.chars_per_token = float(chars_per_token)
        self.max_components, self.space_node = int(max_components), space
        self.system = default_system(self.parts) if system is None else system
        self.extra_body = dict(extra_body or {})

    @property
    def parts(self) -> list[str]:
        return [p for p in PARTS if self.flags[p]]

    # ------------------------------------------------------------------ HTTP
    def _exchange(self, data: bytes, headers: Mapping[str, str]) -> tuple[int, Any, bytes]:
        """One POST with a hard deadline of ``timeout_s``: ``(status, headers, body)``."""
        parts = urllib.parse.urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn = cls(parts.hostname, parts.port, timeout=self.timeout_s)
        expired = threading.Event()
        held: list = []  # the socket (http.client drops conn.sock once the answer will close)

        def cut() -> None:  # the deadline: unblock whatever read or write is waiting
            expired.set()
            for sock in held or ([conn.sock] if conn.sock is not None else []):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        watchdog = threading.Timer(self.timeout_s, cut)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.connect()
            held.append(conn.sock)
            if expired.is_set():
                cut()
            conn.request("POST", path, body=data, headers=dict(headers))
            resp = conn.getresponse()
            body = resp.read()
            if expired.is_set():
                raise OSError("cut at the deadline")
            return resp.status, resp.headers, body
        except (OSError, http.client.HTTPException) as err:
            if expired.is_set():
                raise TimeoutError(f"no complete answer from {self.url} within timeout_s={self.timeout_s:g}") from None
            raise err
        finally:
            watchdog.cancel()
            conn.close()

    def _wait(self, status: int, headers: Any, k: int) -> float:
        """Seconds to wait before retrying a 429/5xx (``Retry-After`` first)."""
        given = retry_after_seconds(headers.get("Retry-After") if headers is not None else None)
        if given is not None:
            if given > self.max_backoff_s:
                raise RuntimeError(f"HTTP {status} from {self.url} with Retry-After={given:g} s, more than "
                                   f"max_backoff_s={self.max_backoff_s:g}: not waiting")
            return given
        return min(self.backoff_s * 2.0 ** k, self.max_backoff_s)

    def chat(self, user: str) -> str:
        """One chat completion; raises on HTTP, network or response-format errors."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "system", "content": self.system}, {"role": "user", "content": user}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            **self.extra_body,
        }
        if self.json_mode:
            body["response_format"] = {"type": "json_object"}
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            headers["Authorization"] = f"Bearer {os.environ[self.api_key_env]}"
        data = json.dumps(body).encode()
        for k in range(self.http_retries + 1):
            status, resp_headers, raw = self._exchange(data, headers)
            if status == 200:
                break
            detail = raw.decode("utf-8", errors="replace")[:300]
            if 300 <= status < 400:
                where = resp_headers.get("Location") if resp_headers is not None else None
                raise FatalEngineerError(
                    f"HTTP {status} from {self.url}: redirect to {where!r} refused (a followed redirect would carry "
                    "the Authorization header to another address); set engineer.url to the final address"
                )
            if status == 429 or status >= 500:
                if k == self.http_retries:
                    raise RuntimeError(f"HTTP {status} from {self.url} after {k + 1} request(s): {detail}")
                time.sleep(self._wait(status, resp_headers, k))
                continue
            if status in (400, 401, 403, 404, 405, 413, 422):
                raise FatalEngineerError(f"HTTP {status} from {self.url}: {detail}")
            raise RuntimeError(f"HTTP {status} from {self.url}: {detail}")
        try:
            payload = json.loads(raw.decode("utf-8", errors="replace"))
            message = payload["choices"][0]["message"]
            content = message["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise RuntimeError(f"unexpected response from {self.url}: {raw[:300]!r}") from None
        if not isinstance(content, str):
            raise RuntimeError(f"response content is {type(content).__name__}, not text")
        thought = message.get("reasoning_content") if isinstance(message, Mapping) else None
        if isinstance(thought, str) and thought.strip() and "</think>" not in content:
            # servers that split Qwen3's thinking out (reasoning parsers): keep it in the record
            content = f"<think>\n{thought.strip()}\n</think>\n\n{content}"
        return content

    # ------------------------------------------------------------------ prompt budget
    def count(self, text: str) -> int:
        """Estimated tokens of ``text`` (no tokenizer for a remote model: ``chars / chars_per_token``)."""
        return int(math.ceil(len(text) / self.chars_per_token))

    def user_prompt(self, ctx: EngineerContext, space: ConfigSpace) -> tuple[str, Optional[str]]:
        """``(prompt, error)``: the richest user prompt within the budget, or the shortest one
        and why it does not fit."""

        def build(**kw):
            return build_user_prompt(ctx, self.parts, space, self.max_components, **kw)

        if self.context_tokens is None:
            return build(), None
        # room for the reply, the system turn, chat-format overhead and a retry's quoted answer
        retry_room = self.count(" " * 2300) if self.retries > 0 else 0
        budget = self.context_tokens - self.max_tokens - self.count(self.system) - 16 - retry_room
        failures = len(((ctx.summary or {}).get("failures") or {}).get("cases", []))
        history = len((ctx.summary or {}).get("history") or [])
        user = fit_user_prompt(build, self.count, budget, failures, history)
        if self.count(user) > budget:
            return user, (
                f"the shortest prompt (~{self.count(user)} tokens) does not fit engineer.context_tokens="
                f"{self.context_tokens} after max_tokens={self.max_tokens}, the system turn and the retry room "
                f"(budget {budget} tokens): raise context_tokens or lower max_tokens"
            )
        return user, None

    def propose(self, ctx: EngineerContext) -> Proposal:
        space = space_from_conf(ctx.base, self.space_node)
        user, too_long = self.user_prompt(ctx, space)

        def ask(prompt: str, attempt: int) -> str:
            if too_long:
                raise FatalEngineerError(too_long)
            return self.chat(prompt)

        proposal = propose_with_retries(ask, user, ctx, self.retries, space=space,
                                        max_components=self.max_components)
        proposal.record.update(
            {"system": self.system, "endpoint": self.url, "model": self.model, "context_parts": self.parts}
        )
        analysis = analysis_of(proposal.record.get("raw_output"))
        if analysis:
            proposal.record["analysis"] = analysis
        return proposal


def retry_after_seconds(value: Any) -> Optional[float]:
    """Seconds a ``Retry-After`` header asks for (delta seconds or an HTTP date; None when
    absent or unreadable; never negative)."""
    if value is None:
        return None
    value = str(value).strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        from email.utils import parsedate_to_datetime

        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    import datetime as _dt

    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return max(0.0, (when - _dt.datetime.now(_dt.timezone.utc)).total_seconds())


def analysis_of(raw: Any) -> Optional[str]:
    """The think-block text of a reply (``None`` without one)."""
    if not isinstance(raw, str) or "</think>" not in raw:
        return None
    from llm.reasoning import split_completion

    thinking = split_completion(raw).thinking
    return thinking.strip() if thinking and thinking.strip() else None
