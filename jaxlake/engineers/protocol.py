"""Reading an engineer's answer and the retry protocol of the model-backed engineers.

A reply is text; its answer is the **last** complete JSON object or array after any think
block (:func:`extract_json`), read as an edit of the current mixture
(:func:`~jaxlake.engineers.edits.edit_from_obj`) and checked against the engineer's space and
edit rules (:func:`~jaxlake.engineers.edits.check_edit`). :func:`propose_with_retries` asks, validates,
shows a rejected answer with its error in the next prompt (:func:`retry_prompt`) and, when
every attempt fails, falls back to the current environment; it never raises on bad output.

Any reply is safe to read: :func:`extract_json` is one linear pass that hands ``json.loads``
only balanced spans of bounded length and depth (:data:`MAX_JSON_CHARS`, :data:`MAX_JSON_DEPTH`)
and stops at the attempt's deadline; whatever a span raises is a failed candidate. The record
keeps each raw output cut to :data:`MAX_RAW_CHARS` (:func:`clip_text`: head and tail).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Callable, Optional

from jaxlake.engineers.base import EngineerContext, Proposal, ProposalError
from jaxlake.engineers.edits import ANY_EDIT, apply_edit, check_edit, edit_from_obj
from jaxlake.engineers.space import ConfigSpace
from jaxlake.mixture import MixtureError


def answer_text(text: str) -> str:
    """The answer part of a reply: the text after the last ``</think>`` (a reasoning model
    thinks first, and may quote configurations while it does). Raises :class:`ProposalError`
    when a ``<think>`` block is opened and never closed (the reply has no answer)."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        raise ProposalError("the think block was never closed (no </think>): there is no answer after it")
    return text


#: Limits of :func:`extract_json`: a candidate value nested deeper than this many brackets,
#: or longer than this many characters, is never parsed (an environment config is a few
#: levels deep and well under a kilobyte); the values inside it still are.
MAX_JSON_DEPTH = 32
MAX_JSON_CHARS = 65_536
#: The longest raw output :func:`propose_with_retries` keeps per attempt (the rest is cut,
#: with a note of how much).
MAX_RAW_CHARS = 65_536
MAX_ERROR_CHARS = 2000  # the longest error message kept or shown to the model

_NONE = object()
_OPENERS = re.compile(r"[{\[]+")
# inside a value, from the current position: everything up to the next bracket (scalars,
# punctuation and complete strings, which end at their first unescaped quote), then a run of
# opening brackets (group 1), a closing bracket (group 2), or a broken string (group 3: a
# control character, e.g. a line break, or the end of the text before its closing quote),
# consumed to where it breaks; no group: the end of the text
_STRING = r'"[^"\\\x00-\x1f]*(?:\\[^\x00-\x1f][^"\\\x00-\x1f]*)*'
_TOKEN = re.compile(rf'[^"{{}}\[\]]*(?:{_STRING}"[^"{{}}\[\]]*)*(?:([{{\[]+)|([}}\]])|({_STRING}))?')
_CLOCK_EVERY = 1024  # tokens between two looks at the deadline


def _loads(text: str, start: int, end: int) -> tuple[Any, Optional[str]]:
    """``(value, None)`` or ``(_NONE, why)`` for ``text[start:end]``: nothing escapes (a bad
    value, an integer over Python's digit limit, a nesting too deep for the decoder)."""
    try:
        return json.loads(text[start:end]), None
    except json.JSONDecodeError as err:
        return _NONE, f"{err.msg} at char {start + err.pos}"
    except (ValueError, RecursionError, MemoryError) as err:  # e.g. the int digit limit
        return _NONE, f"{type(err).__name__} at char {start}: {str(err)[:120]}"


def extract_json(text: str, deadline: Optional[float] = None, max_depth: int = MAX_JSON_DEPTH,
                 max_chars: int = MAX_JSON_CHARS) -> Any:
    """The **last** complete JSON object or array in the answer part of ``text``.

    The answer part is the text after any think block (:func:`answer_text`); in it, every
    top-level JSON value is read left to right (code fences and chatter around them allowed;
    a value nested in an earlier one is part of that one) and the last object or array wins,
    so a reply that quotes the current configuration and then gives its proposal is read as
    the proposal. A candidate that does not parse gives way to the last value inside it that
    does (``{"note": 1, {"height": 4}}`` reads as ``{"height": 4}``).

    One pass, linear in the text: brackets and strings are tracked by a scanner, and
    ``json.loads`` sees only balanced spans of at most ``max_chars`` characters and
    ``max_depth`` levels (each character is parsed at most ``max_depth`` times). A string that
    meets a line break or a control character before its closing quote is broken: the values
    around it end there. With ``deadline`` (a :func:`time.monotonic` value) the scan stops
    with a :class:`ProposalError` once it is passed. Never raises anything else: deep
    nesting, an integer over Python's digit limit and other undecodable spans are failed
    candidates. Raises :class:`ProposalError` when no object or array parses.
    """
    if not isinstance(text, str):
        raise ProposalError(f"output must be text, got {type(text).__name__}")
    chunk = answer_text(text)
    found: Any = _NONE
    why: Any = None  # why the last failed candidate failed: a message, or (message format, args)
    # the open values, outermost first: their start, their closing bracket and the last
    # parseable value inside them so far (three parallel lists)
    starts: list[int] = []
    closers: list[str] = []
    inner: list[Any] = []
    search_open, next_token = _OPENERS.search, _TOKEN.match
    pos, steps = 0, 0
    while True:
        steps += 1
        if not steps & (_CLOCK_EVERY - 1) and deadline is not None and time.monotonic() > deadline:
            raise ProposalError(f"reading the reply ran past the deadline (stopped at char {pos} of {len(chunk)})")
        if starts:
            m = next_token(chunk, pos)
            kind = m.lastindex
            if kind is None:
                break  # the end of the text
            begin = m.start(kind)
        else:
            m = search_open(chunk, pos)
            if m is None:
                break
            kind, begin = 1, m.start()
        pos = m.end()
        c = chunk[pos - 1]
        if kind == 1:
            n = pos - begin
            if len(starts) + n > max_depth:
                # values nested deeper than max_depth are not answers: drop the outermost ones
                why = ("nested deeper than {} levels", (max_depth,))
                excess = len(starts) + n - max_depth
                for v in inner[:excess]:
                    if v is not _NONE:
                        found = v
                del starts[:excess], closers[:excess], inner[:excess]
            if n == 1:
                starts.append(pos - 1)
                closers.append("}" if c == "{" else "]")
                inner.append(_NONE)
            else:
                for i in range(max(begin, pos - max_depth), pos):
                    starts.append(i)
                    closers.append("}" if chunk[i] == "{" else "]")
                    inner.append(_NONE)
            continue
        if kind == 3:
            why = ("a string not closed on its line (char {})", (pos,))
        elif closers[-1] != c:
            why = ("{!r} where {!r} was expected (char {})", (c, closers[-1], pos - 1))
        else:
            start, best = starts.pop(), inner.pop()
            closers.pop()
            if pos - start > max_chars:
                why = ("a value of {} characters, more than {}", (pos - start, max_chars))
            else:
                value, err = _loads(chunk, start, pos)
                if err is None:
                    best = value
                else:
                    why = err
            if best is not _NONE:
                if inner:
                    inner[-1] = best
                else:
                    found = best
            continue
        # a broken string or a wrong closing bracket: none of the open values can parse; the
        # innermost one that holds a parseable value gives it
        for v in inner:
            if v is not _NONE:
                found = v
        starts.clear(), closers.clear(), inner.clear()
    if starts:
        why = why or "a value never closed"
        for v in inner:
            if v is not _NONE:
                found = v
    if found is not _NONE:
        return found
    if why is not None:
        if isinstance(why, tuple):
            why = why[0].format(*why[1])
        raise ProposalError(f"no parseable JSON object in the output ({why})")
    raise ProposalError("no JSON object in the output")


def clip_text(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and its tail (half the
    limit each) around a note of how many characters were cut: a reply's answer comes last,
    so the tail is kept."""
    if len(text) <= limit:
        return text
    head, tail = limit // 2, limit - limit // 2
    return f"{text[:head]} ... [{len(text) - head - tail} characters cut] ... {text[len(text) - tail:]}"


def retry_prompt(prompt: str, raw: str, error: str) -> str:
    """The prompt of the next attempt: the original plus the rejected answer and why (its
    think block left out, as Qwen3's chat template drops earlier thinking)."""
    if "</think>" in raw:
        raw = raw.rsplit("</think>", 1)[1].lstrip("\n")
    shown = raw if len(raw) <= 2000 else raw[:2000] + " ..."
    return (
        f"{prompt}\n\nYour previous answer was:\n{shown}\n\nIt was rejected: {clip_text(error, MAX_ERROR_CHARS)}\n"
        "Answer again with exactly one JSON object that fixes this."
    )


class FatalEngineerError(RuntimeError):
    """A failure that another attempt cannot fix (a prompt over the endpoint's context, a
    refused redirect, HTTP 400/401/403/404): :func:`propose_with_retries` stops at once."""


def _same(text: str) -> str:
    return text


def propose_with_retries(
    ask: Callable[..., str],
    prompt: str,
    ctx: EngineerContext,
    retries: int = 2,
    space: Optional[ConfigSpace] = None,
    timeout_s: Optional[float] = None,
    max_raw_chars: int = MAX_RAW_CHARS,
    scrub: Optional[Callable[[str], str]] = None,
) -> Proposal:
    """Ask, validate, retry with the error shown, fall back to the current environment.

    ``ask(prompt, attempt) -> raw text`` may raise (network errors, ...): that counts as a
    failed attempt (a :class:`FatalEngineerError` ends the attempts at once). Each answer is
    parsed (:func:`extract_json`), read as an edit of the current mixture
    (:func:`~jaxlake.engineers.edits.edit_from_obj`: an edit object, or a whole environment
    read as the edit that makes it) and validated (:class:`LakeConfig`; with ``space``,
    :func:`~jaxlake.engineers.edits.check_edit` under ``space.edits``) and a rejected answer is shown to the
    model with the error in the next prompt (:func:`retry_prompt`). Never raises on bad
    output: whatever the parse or the validation raises is a failed attempt. The record holds
    every attempt's prompt, raw output (cut to ``max_raw_chars`` by :func:`clip_text`), parsed
    object and errors.

    Args:
      timeout_s: one deadline per attempt for the answer and its parse: ``ask`` is then called
        as ``ask(prompt, attempt, deadline)`` (a :func:`time.monotonic` value it must answer
        by) and :func:`extract_json` stops at the same deadline.
      scrub: applied to every string the record keeps (raw outputs, errors) and to the raw
        output before it is parsed or shown again (the external engineer removes its API key).
    """
    clean = scrub or _same
    attempts = []
    current_prompt = prompt
    for attempt in range(int(retries) + 1):
        entry: dict[str, Any] = {"attempt": attempt, "prompt": current_prompt}
        deadline = None if timeout_s is None else time.monotonic() + float(timeout_s)
        try:
            raw = ask(current_prompt, attempt) if deadline is None else ask(current_prompt, attempt, deadline)
            if not isinstance(raw, str):
                raise ProposalError(f"output must be text, got {type(raw).__name__}")
        except Exception as err:  # noqa: BLE001 - a backend failure must not crash the run
            error = clip_text(clean(f"{type(err).__name__}: {err}"), MAX_ERROR_CHARS)
            entry.update(raw_output=None, parsed=None, errors=[error])
            attempts.append(entry)
            if isinstance(err, FatalEngineerError):
                break  # the same request would fail the same way
            current_prompt = prompt  # nothing to show; ask again
            continue
        raw = clean(raw)
        entry["raw_output"] = clip_text(raw, max_raw_chars)
        try:
            parsed = extract_json(raw, deadline=deadline)
            entry["parsed"] = parsed
            edit = edit_from_obj(parsed, ctx.current, ctx.base)
            mixture = (check_edit(edit, ctx.current, space, space.edits) if space is not None
                       else apply_edit(ctx.current, edit, ANY_EDIT))
        except Exception as err:  # noqa: BLE001 - ProposalError, MixtureError, or anything odd in a value
            message = str(err) if isinstance(err, MixtureError) else f"{type(err).__name__}: {err}"
            message = clip_text(clean(message), MAX_ERROR_CHARS)
            entry.setdefault("parsed", None)
            entry["errors"] = [message]
            attempts.append(entry)
            current_prompt = retry_prompt(prompt, raw, message)
            continue
        entry["errors"] = []
        attempts.append(entry)
        return Proposal(
            mixture,
            "proposed",
            f"valid proposal on attempt {attempt + 1}: {edit.describe()}",
            record=_attempt_record(attempts),
            edit=edit,
        )
    return Proposal(
        ctx.current,
        "fallback",
        f"no valid proposal in {len(attempts)} attempt(s); keeping the current environment",
        record=_attempt_record(attempts),
    )


def _attempt_record(attempts: list[dict]) -> dict:
    last = attempts[-1] if attempts else {}
    return {
        "prompt": attempts[0]["prompt"] if attempts else None,
        "raw_output": last.get("raw_output"),
        "parsed": last.get("parsed"),
        "validation_errors": [e for a in attempts for e in a.get("errors", [])],
        "attempts": attempts,
    }
