"""Reasoning mode: a ``<think> ... </think>`` block before the answer, with a thinking budget.

Qwen3 chat models think before they answer: the assistant turn is ``<think>`` free text
``</think>`` then the answer. This module gives the policy and the engineer that mode with a
bounded cost, on top of the public API of :func:`llm.generation.decode.generate_ids` (it does not touch
the decoder internals).

**Two-phase sampling** (:func:`generate_with_thinking`), all shapes static:

1. *think*: sample up to ``thinking_tokens`` tokens from the prompt, stopping at the
   ``</think>`` token or an end-of-turn token (``generate_ids`` with ``</think>`` added to the
   end ids);
2. *close*: rows that used the whole budget without closing get the **forced close**
   ``close_text`` (default ``"\\n</think>\\n\\n"``; Qwen3's guidance for budgets is to inject
   ``</think>``, optionally after a short sentence, and let the model continue) appended;
   rows that ended their turn inside phase 1 stop there;
3. *answer*: the other rows are left-packed again as ``prompt + thinking (+ close)`` (width
   ``P + thinking_tokens + F``, fixed) and sampled for up to ``max_new_tokens`` more tokens
   (the answer budget).

The completion handed to GRPO is ``thinking + close + answer`` right-padded to
``thinking_tokens + F + max_new_tokens`` tokens. **Forced tokens were not sampled by the
policy**: they are in ``mask`` (the model attends to them, the forward pass needs them) but
not in ``loss_mask`` and their log-probs are 0, so the policy-gradient loss and its
aggregation (``grpo.token_weights`` on ``loss_mask``) never push the policy towards or away
from text it did not choose. Their effect on the reward (the block was not closed in time)
is the ``think_unclosed`` reward term instead.

**Reading a completion** (:func:`split_completion`): the answer is the text after the last
``</think>`` (Qwen3's own template does the same); the format flags say whether the block was
missing, nested or repeated, never closed, whether nothing follows it and whether text
follows the plan. :mod:`llm.game.rewards` turns them into weighted terms.

Public API: :class:`ReasoningConfig`, :class:`ThinkParse`, :func:`split_completion`,
:func:`strip_thinking`, :class:`ThinkingSample`, :func:`think_phase`,
:func:`continuation_prompts`, :func:`generate_with_thinking`, :func:`thinking_metrics`,
:func:`close_token_id`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Optional, Sequence

import chex
import jax
import numpy as np

from llm.model import sharding
from llm.model.errors import reject_unknown

from llm.generation.decode import GenerationConfig, generate_ids

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

__all__ = [
    "THINK_OPEN",
    "THINK_CLOSE",
    "ReasoningConfig",
    "ThinkParse",
    "split_completion",
    "strip_thinking",
    "ThinkingSample",
    "think_phase",
    "continuation_prompts",
    "generate_with_thinking",
    "thinking_metrics",
    "close_token_id",
]


#: What the warm start's templated think block may say (:attr:`ReasoningConfig.warmstart_style`).
WARMSTART_STYLES = ("summary", "paths", "checks", "crowd")


class ReasoningError(ValueError):
    """A reasoning setting is invalid; the message names the field and its allowed range."""


@dataclasses.dataclass(frozen=True)
class ReasoningConfig:
    """Reasoning settings of the policy prompt (``prompt.reasoning`` in ``conf/prompt/*.yaml``).

    Attributes:
      enabled: the policy thinks before it answers (two-phase sampling, the answer is read
        after ``</think>``); off: answer-only, the completion is the plan.
      thinking_tokens: the thinking budget, sampled tokens before the close is forced (>= 1).
        The answer budget is the trainer's ``max_new_tokens`` (``grpo.max_new_tokens``,
        ``eval.max_new_tokens``), so a completion has at most ``thinking_tokens +
        len(close_text tokens) + max_new_tokens`` tokens.
      close_text: injected when the budget is used up; must contain ``</think>`` once (a
        short sentence before it, e.g. ``"\\nTime is up, I answer now.\\n</think>\\n\\n"``, is
        what Qwen3's guidance suggests for pretrained models).
      warmstart: the supervised warm start writes planner plans behind a short templated,
        truthful reasoning (:func:`llm.training.warmstart.reasoning_text`) so a model trained from
        scratch learns the format; keep it off for pretrained models, which think in their
        own words.
      warmstart_style: what the warm start's think block says. ``summary``: each agent's
        start, goal, move count, waits and arrival, then the first cell each pair of paths
        shares. ``paths``: each agent's path, one cell per time step (``A 42 32 33 34``, cells
        written by ``prompt.cell``), so the plan after the block is the path's differences and
        each written cell is one step from the last. ``checks``: the same paths, with the
        cells toward the goal that are holes written and marked before each step
        (``A 23 13~ 22``: the step up is a hole, so A goes left). ``crowd``: ``checks`` with
        the tried cells that an earlier agent takes over the same step marked too (``B 20
        21! 20 21``: the step right meets A, so B waits).
    """

    enabled: bool = False
    thinking_tokens: int = 128
    close_text: str = "\n</think>\n\n"
    warmstart: bool = False
    warmstart_style: str = "summary"

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ReasoningError(f"prompt.reasoning.enabled={self.enabled!r} must be true or false")
        if not isinstance(self.warmstart, bool):
            raise ReasoningError(f"prompt.reasoning.warmstart={self.warmstart!r} must be true or false")
        if self.warmstart_style not in WARMSTART_STYLES:
            raise ReasoningError(f"prompt.reasoning.warmstart_style={self.warmstart_style!r} not one of {list(WARMSTART_STYLES)}")
        if isinstance(self.thinking_tokens, bool) or not isinstance(self.thinking_tokens, int) \
                or self.thinking_tokens < 1:
            raise ReasoningError(f"prompt.reasoning.thinking_tokens={self.thinking_tokens!r} not an integer in [1, inf)")
        if not isinstance(self.close_text, str) or self.close_text.count(THINK_CLOSE) != 1 \
                or THINK_OPEN in self.close_text:
            raise ReasoningError(
                f"prompt.reasoning.close_text={self.close_text!r} must contain {THINK_CLOSE!r} exactly once "
                f"and no {THINK_OPEN!r}")

    @classmethod
    def from_value(cls, value: Any) -> "ReasoningConfig":
        """From ``None`` (off), a mapping (Hydra node / YAML) or a config; unknown keys are an error."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ReasoningError(f"prompt.reasoning must be a mapping, got {type(value).__name__}")
        reject_unknown("prompt.reasoning", value, (f.name for f in dataclasses.fields(cls)), ReasoningError)
        return cls(**dict(value))


# ============================================================================ reading
_AGENT_LINE = re.compile(r"^\s*[A-Za-z]\s*:")


@dataclasses.dataclass(frozen=True)
class ThinkParse:
    """A completion split into its thinking and its answer (:func:`split_completion`).

    Attributes:
      answer: the text after the last ``</think>`` (leading blank lines dropped); the whole
        text when there is no ``</think>`` and no ``<think>``; empty when a block was opened
        and never closed.
      thinking: the text inside the block (``None`` without one).
      closed: a ``</think>`` was written.
      think_format: the block is missing, nested, repeated, misordered or preceded by text.
      answer_empty: nothing but whitespace after the block (or the block never closed).
      trailing_text: non-blank lines follow the last agent line of the plan.
      problems: one line per flag that is set.
    """

    answer: str
    thinking: Optional[str]
    closed: bool
    think_format: bool
    answer_empty: bool
    trailing_text: bool
    problems: tuple[str, ...]


def _trailing_text(answer: str) -> bool:
    lines = answer.splitlines()
    last = max((i for i, line in enumerate(lines) if _AGENT_LINE.match(line)), default=-1)
    return last >= 0 and any(line.strip() for line in lines[last + 1:])


def _answer_problems(answer: str, empty_problem: str, problems: list) -> tuple[bool, bool]:
    """``(empty, trailing)`` of an answer, appending their problem texts to ``problems``."""
    empty = not answer.strip()
    if empty:
        problems.append(empty_problem)
    trailing = _trailing_text(answer)
    if trailing:
        problems.append("text after the plan")
    return empty, trailing


def split_completion(text: Any) -> ThinkParse:
    """Split a reasoning-mode completion into thinking and answer. Never raises.

    Cases (each tested in ``tests/llm/generation/test_reasoning.py``):

    * ``<think> t </think> plan``: thinking ``t``, answer ``plan``, no flag;
    * ``<think> t`` (never closed): answer empty, ``answer_empty``, not ``closed``;
    * ``<think> t </think>`` and nothing: ``answer_empty``;
    * ``plan`` without a block while thinking is on: the plan is read, ``think_format``;
    * nested / repeated / misordered tags or text before ``<think>``: ``think_format``, the
      answer is still the text after the last ``</think>``;
    * ``... </think> plan`` then chatter: ``trailing_text``.
    """
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    opens, closes = text.count(THINK_OPEN), text.count(THINK_CLOSE)
    problems: list[str] = []
    if closes == 0:
        if opens == 0:
            answer = text.lstrip("\n")
            problems.append("no think block")
            empty, trailing = _answer_problems(answer, "empty answer", problems)
            return ThinkParse(answer, None, False, True, empty, trailing, tuple(problems))
        thinking = text.split(THINK_OPEN, 1)[1]
        problems.append("think block not closed")
        fmt = opens != 1 or bool(text.split(THINK_OPEN, 1)[0].strip())
        if fmt:
            problems.append("nested, repeated or misplaced <think>")
        return ThinkParse("", thinking, False, fmt, True, False, tuple(problems))
    head, answer = text.rsplit(THINK_CLOSE, 1)
    if opens == 0:
        fmt = True
    else:
        first_open = text.index(THINK_OPEN)
        fmt = (opens != 1 or closes != 1 or first_open > text.index(THINK_CLOSE)
               or bool(text[:first_open].strip()))
    thinking = head.split(THINK_OPEN, 1)[1] if THINK_OPEN in head else head
    if fmt:
        problems.append("missing, nested, repeated or misplaced think tags")
    answer = answer.lstrip("\n")
    empty, trailing = _answer_problems(answer, "nothing after </think>", problems)
    return ThinkParse(answer, thinking.strip("\n"), True, fmt, empty, trailing, tuple(problems))


def strip_thinking(text: str) -> str:
    """The text after the last ``</think>`` (the whole text when there is none)."""
    return text.rsplit(THINK_CLOSE, 1)[1].lstrip("\n") if THINK_CLOSE in text else text


# ============================================================================ sampling
def close_token_id(tokenizer: Any) -> int:
    """The id of ``</think>``; raises when the tokenizer does not keep it as one token."""
    ids = tokenizer.encode(THINK_CLOSE, add_special_tokens=False)
    if len(ids) != 1:
        raise ReasoningError(f"the tokenizer splits {THINK_CLOSE!r} into {len(ids)} tokens; reasoning mode "
                             "needs it as one token (Qwen3 and the game tokenizer have it)")
    return int(ids[0])


@dataclasses.dataclass
class ThinkingSample:
    """Completions sampled in reasoning mode (host numpy arrays, ``T = thinking_tokens + F + N``).

    Attributes:
      tokens: ``[B, T]`` int32 completion ids (pad after each row's end).
      mask: ``[B, T]`` bool, every completion token, forced close included (attention).
      loss_mask: ``[B, T]`` bool, ``mask`` without the forced tokens (policy-gradient loss).
      logprobs: ``[B, T]`` float32 raw-model log-probs of the sampled tokens; 0 on forced
        tokens and padding.
      lengths: ``[B]`` int32 ``mask.sum(-1)``.
      hit_eos: ``[B]`` bool, the completion ended with an end-of-turn token.
      thinking_lengths: ``[B]`` int32 tokens the policy sampled in phase 1 (``</think>`` included).
      hit_budget: ``[B]`` bool, the budget ran out before ``</think>``: the close was forced.
      answer_lengths: ``[B]`` int32 tokens sampled in phase 3 (0 when the turn ended in phase 1).
      forced_lengths: ``[B]`` int32 forced tokens (``F`` or 0).
    """

    tokens: np.ndarray
    mask: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    hit_eos: np.ndarray
    thinking_lengths: np.ndarray
    hit_budget: np.ndarray
    answer_lengths: np.ndarray
    forced_lengths: np.ndarray


def think_phase(model: Any, input_ids, prompt_mask, key: Optional[jax.Array], config: GenerationConfig,
                thinking_tokens: int, close_id: int, *, eos_token_ids: Sequence[int], pad_token_id: int,
                to_host: Callable[[Any], np.ndarray] = sharding.to_host) -> dict[str, np.ndarray]:
    """Phase 1: sample up to ``thinking_tokens`` tokens, stopping at ``</think>`` or an end id.

    Returns host arrays ``tokens [B, thinking_tokens]``, ``lengths``, ``logprobs``, ``closed``
    (ended on ``</think>``), ``ended`` (ended the turn on an end id) and ``hit_budget``.
    """
    eos = tuple(int(i) for i in (config.eos_token_ids if config.eos_token_ids is not None else eos_token_ids))
    if int(close_id) in eos:
        raise ReasoningError(f"</think> id {close_id} is also an end-of-turn id")
    cfg = dataclasses.replace(config, max_new_tokens=int(thinking_tokens), eos_token_ids=eos + (int(close_id),),
                              stop_strings=())
    tokens, _, lengths, logp, hit = generate_ids(model, input_ids, prompt_mask, key, cfg, pad_token_id=pad_token_id)
    tokens, lengths, logp, hit = to_host(tokens), to_host(lengths), to_host(logp), to_host(hit).astype(bool)
    last = np.take_along_axis(tokens, np.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]
    closed = hit & (last == int(close_id))
    return {"tokens": tokens, "lengths": lengths.astype(np.int32), "logprobs": logp.astype(np.float32),
            "closed": closed, "ended": hit & ~closed, "hit_budget": ~hit}


def continuation_prompts(input_ids: np.ndarray, prompt_mask: np.ndarray, thought: np.ndarray,
                         thought_lengths: np.ndarray, forced: Sequence[int], add_forced: np.ndarray,
                         pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-packed ``prompt + thought[:len] (+ forced)`` rows, ``[B, P + T1 + F]`` (fixed width).

    Args:
      input_ids, prompt_mask: ``[B, P]`` left-padded prompts.
      thought: ``[B, T1]`` phase-1 tokens, ``thought_lengths [B]`` of them real.
      forced: the ``F`` forced-close ids; ``add_forced [B]`` bool says which rows get them.
    """
    input_ids, prompt_mask = np.asarray(input_ids), np.asarray(prompt_mask).astype(bool)
    chex.assert_rank([input_ids, thought], 2)
    b, p = input_ids.shape
    t1, f = thought.shape[1], len(forced)
    width = p + t1 + f
    ids = np.full((b, width), int(pad_token_id), np.int32)
    mask = np.zeros((b, width), bool)
    forced = np.asarray(list(forced), np.int32)
    for r in range(b):
        seq = np.concatenate([input_ids[r][prompt_mask[r]], thought[r, : int(thought_lengths[r])],
                              forced if add_forced[r] else forced[:0]])
        ids[r, width - len(seq):] = seq
        mask[r, width - len(seq):] = True
    return ids, mask


def generate_with_thinking(model: Any, input_ids, prompt_mask, key: Optional[jax.Array], config: GenerationConfig,
                           reasoning: ReasoningConfig, *, close_id: int, forced_ids: Sequence[int],
                           eos_token_ids: Sequence[int], pad_token_id: int,
                           place: Callable[[Any], Any] = lambda x: x,
                           to_host: Callable[[Any], np.ndarray] = sharding.to_host) -> ThinkingSample:
    """Sample ``thinking + (forced close) + answer`` for every prompt row (see the module doc).

    Args:
      model: ``nnx.Module`` or ``(graphdef, state)``.
      input_ids, prompt_mask: ``[B, P]`` left-padded prompts (may be sharded).
      key: PRNG key (``None`` only when greedy); phases use ``fold_in(key, 1)`` and ``2``.
      config: sampling settings; ``max_new_tokens`` is the **answer** budget.
      reasoning: ``thinking_tokens`` is the thinking budget.
      close_id: the ``</think>`` id (:func:`close_token_id`).
      forced_ids: ids of ``reasoning.close_text`` (must contain ``close_id``).
      eos_token_ids, pad_token_id: end-of-turn ids and pad id.
      place: puts the phase-3 prompt arrays where the model runs (e.g. shards them).
      to_host: gathers a device array to host numpy.
    """

    forced_ids = [int(i) for i in forced_ids]
    if int(close_id) not in forced_ids:
        raise ReasoningError(f"close_text ids {forced_ids} do not contain the </think> id {close_id}")
    eos = tuple(int(i) for i in (config.eos_token_ids if config.eos_token_ids is not None else eos_token_ids))
    k1 = k2 = None
    if key is not None:
        k1, k2 = jax.random.fold_in(key, 1), jax.random.fold_in(key, 2)
    one = think_phase(model, input_ids, prompt_mask, k1, config, reasoning.thinking_tokens, close_id,
                      eos_token_ids=eos, pad_token_id=pad_token_id, to_host=to_host)
    go_on = ~one["ended"]
    add = one["hit_budget"]
    ids2, mask2 = continuation_prompts(to_host(input_ids), to_host(prompt_mask), one["tokens"], one["lengths"],
                                       forced_ids, add, pad_token_id)
    cfg2 = dataclasses.replace(config, eos_token_ids=eos, stop_strings=())
    tok2, _, len2, lp2, hit2 = generate_ids(model, place(ids2), place(mask2), k2, cfg2, pad_token_id=pad_token_id)
    tok2, len2, lp2, hit2 = to_host(tok2), to_host(len2), to_host(lp2), to_host(hit2).astype(bool)

    b, t1 = one["tokens"].shape
    f, n = len(forced_ids), config.max_new_tokens
    width = t1 + f + n
    tokens = np.full((b, width), int(pad_token_id), np.int32)
    logp = np.zeros((b, width), np.float32)
    mask = np.zeros((b, width), bool)
    loss_mask = np.zeros((b, width), bool)
    ans_len = np.where(go_on, len2, 0).astype(np.int32)
    forced_len = np.where(add, f, 0).astype(np.int32)
    for r in range(b):
        l1, lf, l2 = int(one["lengths"][r]), int(forced_len[r]), int(ans_len[r])
        tokens[r, :l1] = one["tokens"][r, :l1]
        logp[r, :l1] = one["logprobs"][r, :l1]
        tokens[r, l1: l1 + lf] = forced_ids[:lf]
        tokens[r, l1 + lf: l1 + lf + l2] = tok2[r, :l2]
        logp[r, l1 + lf: l1 + lf + l2] = lp2[r, :l2]
        mask[r, : l1 + lf + l2] = True
        loss_mask[r, : l1 + lf + l2] = True
        loss_mask[r, l1: l1 + lf] = False
    hit_eos = one["ended"] | (go_on & hit2)
    return ThinkingSample(tokens=tokens, mask=mask, loss_mask=loss_mask, logprobs=logp,
                          lengths=mask.sum(-1).astype(np.int32), hit_eos=hit_eos,
                          thinking_lengths=one["lengths"], hit_budget=add, answer_lengths=ans_len,
                          forced_lengths=forced_len)


def thinking_metrics(sample: ThinkingSample) -> dict[str, float]:
    """Batch means for the metrics file: ``thinking_len`` (policy-sampled thinking tokens),
    ``thinking_budget_hit`` (share of completions whose close was forced), ``answer_len``
    (answer tokens, rows that reached the answer phase) and ``thinking_ended_turn`` (share
    that ended the turn inside the block)."""
    reached = sample.answer_lengths > 0
    return {
        "thinking_len": float(np.mean(sample.thinking_lengths)),
        "thinking_budget_hit": float(np.mean(sample.hit_budget)),
        "answer_len": float(np.mean(sample.answer_lengths[reached])) if reached.any() else 0.0,
        "thinking_ended_turn": float(np.mean(sample.hit_eos & (sample.answer_lengths == 0))),
    }
