"""Reading an engineer's answer and the retry protocol of the model-backed engineers.

A reply is text; its answer is the **last** complete JSON object or array after any think
block (:func:`extract_json`), read as a mixture against the run's current config
(:func:`~jaxlake.mixture.mixture_from_obj`) and checked against the engineer's space
(:func:`~jaxlake.engineers.space.check_in_space`). :func:`propose_with_retries` asks, validates,
shows a rejected answer with its error in the next prompt (:func:`retry_prompt`) and, when
every attempt fails, falls back to the current environment; it never raises on bad output.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from jaxlake.engineers.base import EngineerContext, Proposal, ProposalError
from jaxlake.engineers.space import ConfigSpace, check_in_space
from jaxlake.mixture import MixtureError, mixture_from_obj


def answer_text(text: str) -> str:
    """The answer part of a reply: the text after the last ``</think>`` (a reasoning model
    thinks first, and may quote configurations while it does). Raises :class:`ProposalError`
    when a ``<think>`` block is opened and never closed (the reply has no answer)."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        raise ProposalError("the think block was never closed (no </think>): there is no answer after it")
    return text


def extract_json(text: str) -> Any:
    """The **last** complete JSON object or array in the answer part of ``text``.

    The answer part is the text after any think block (:func:`answer_text`); in it, every
    top-level JSON value is read left to right (code fences and chatter around them allowed;
    a value nested in an earlier one is part of that one) and the last object or array wins,
    so a reply that quotes the current configuration and then gives its proposal is read as
    the proposal. Raises :class:`ProposalError` when there is none or it does not parse.
    """
    if not isinstance(text, str):
        raise ProposalError(f"output must be text, got {type(text).__name__}")
    chunk = answer_text(text)
    decoder = json.JSONDecoder()
    last_error = None
    found: Any = None
    i = 0
    while i < len(chunk):
        if chunk[i] in "{[":
            try:
                obj, end = decoder.raw_decode(chunk, i)
            except json.JSONDecodeError as err:
                last_error = err
                i += 1
                continue
            if isinstance(obj, (dict, list)):
                found = obj
                i = end
                continue
        i += 1
    if found is not None:
        return found
    if last_error is not None:
        raise ProposalError(f"no parseable JSON object in the output ({last_error.msg} at char {last_error.pos})")
    raise ProposalError("no JSON object in the output")


def retry_prompt(prompt: str, raw: str, error: str) -> str:
    """The prompt of the next attempt: the original plus the rejected answer and why (its
    think block left out, as Qwen3's chat template drops earlier thinking)."""
    if "</think>" in raw:
        raw = raw.rsplit("</think>", 1)[1].lstrip("\n")
    shown = raw if len(raw) <= 2000 else raw[:2000] + " ..."
    return (
        f"{prompt}\n\nYour previous answer was:\n{shown}\n\nIt was rejected: {error}\n"
        "Answer again with exactly one JSON object that fixes this."
    )


class FatalEngineerError(RuntimeError):
    """A failure that another attempt cannot fix (a prompt over the endpoint's context, a
    refused redirect, HTTP 400/401/403/404): :func:`propose_with_retries` stops at once."""


def propose_with_retries(
    ask: Callable[[str, int], str],
    prompt: str,
    ctx: EngineerContext,
    retries: int = 2,
    space: Optional[ConfigSpace] = None,
    max_components: int = 1,
) -> Proposal:
    """Ask, validate, retry with the error shown, fall back to the current environment.

    ``ask(prompt, attempt) -> raw text`` may raise (network errors, ...): that counts as a
    failed attempt (a :class:`FatalEngineerError` ends the attempts at once). Each answer is
    parsed and validated (:class:`LakeConfig`; with ``space``, :func:`check_in_space` with
    ``max_components``) and a rejected answer is shown to the model with the error in the
    next prompt (:func:`retry_prompt`). Never raises on bad output. The record holds every
    attempt's prompt, raw output, parsed object and errors.
    """
    attempts = []
    current_prompt = prompt
    for attempt in range(int(retries) + 1):
        entry: dict[str, Any] = {"attempt": attempt, "prompt": current_prompt}
        try:
            raw = ask(current_prompt, attempt)
        except Exception as err:  # noqa: BLE001 - a backend failure must not crash the run
            entry.update(raw_output=None, parsed=None, errors=[f"{type(err).__name__}: {err}"])
            attempts.append(entry)
            if isinstance(err, FatalEngineerError):
                break  # the same request would fail the same way
            current_prompt = prompt  # nothing to show; ask again
            continue
        entry["raw_output"] = raw
        try:
            parsed = extract_json(raw)
            entry["parsed"] = parsed
            mixture = mixture_from_obj(parsed, ctx.base)
            if space is not None:
                check_in_space(mixture, space, max_components)
        except MixtureError as err:  # ProposalError (the answer, the space) or the mixture itself
            entry.setdefault("parsed", None)
            entry["errors"] = [str(err)]
            attempts.append(entry)
            current_prompt = retry_prompt(prompt, raw, str(err))
            continue
        entry["errors"] = []
        attempts.append(entry)
        return Proposal(
            mixture,
            "proposed",
            f"valid proposal on attempt {attempt + 1}",
            record=_attempt_record(attempts),
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


