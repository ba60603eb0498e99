"""The ``external`` engineer (:class:`ExternalEngineer`).

The ``external`` backend talks to any OpenAI-compatible chat endpoint with the standard
library (``POST <url>/chat/completions``); the API key is read from the environment
variable NAMED in the config (``api_key_env``), never stored in it.

Its prompt is built like a local engineer's (:mod:`llm.engineer.prompt`) and its reply
goes through the same parse / validate / retry protocol
(:func:`jaxlake.engineers.propose_with_retries`). Every way a server can misbehave ends as a
failed attempt (then a fallback) within the deadline and the body cap, and the key's value
never reaches the record, an error or a log (:class:`ExternalEngineer`).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import socket
import threading
import time
import urllib.parse
from typing import Any, Mapping, Optional

from jaxlake.config import ConfigError
from jaxlake.engineers import (
    ConfigSpace,
    Engineer,
    EngineerContext,
    FatalEngineerError,
    Proposal,
    propose_with_retries,
    space_from_conf,
)
from jaxlake.engineers.protocol import MAX_RAW_CHARS
from jaxlake.summaries import PARTS
from llm.engineer.prompt import build_user_prompt, context_flags, default_system, fit_user_prompt

#: The default cap on a response body (1 MiB: a reply of tens of thousands of tokens, thinking
#: included, fits many times over) and the smallest one allowed.
MAX_BODY_BYTES = 1 << 20
MIN_BODY_BYTES = 4096
#: What stands in for the API key wherever a server echoed it.
KEY_MARK = "[API key removed]"
_DETAIL_CHARS = 300  # how much of an error body an error message quotes
_READ_CHUNK = 1 << 16


def check_api_key(name: str, value: Optional[str]) -> str:
    """``value`` if it can go into an ``Authorization`` header, else a :class:`ConfigError`
    that names the variable ``name`` and never quotes the value.

    The value is used exactly as set: surrounding whitespace is not stripped (a key read from
    a CRLF ``.env`` file that ends in ``\\r`` is refused, not silently changed). Allowed:
    printable ASCII without spaces (what API keys and bearer tokens are made of).
    """
    where = f"engineer.api_key_env={name!r}"
    if value is None:
        raise ConfigError(f"{where}: the environment variable {name} is not set")
    if not value:
        raise ConfigError(f"{where}: the environment variable {name} is empty "
                          "(an endpoint without auth: engineer.api_key_env=null)")
    for i, ch in enumerate(value):
        if not "!" <= ch <= "~":
            if ord(ch) < 32 or 127 <= ord(ch) < 160:  # which one is shown: it is no secret
                kind = f"a control character {ascii(ch)}"
            else:
                kind = "a space" if ch.isspace() else "a non-ASCII character"
            hint = " (a line end from a CRLF .env file?)" if ch in "\r\n" else ""
            raise ConfigError(
                f"{where}: the value of {name} has {kind} at position {i + 1} of {len(value)}{hint}; "
                "a key is printable ASCII without spaces: fix the variable (its value is not shown)"
            )
    return value


class KeyScrubber:
    """Removes an API key's value from text: as written, with any of its characters escaped
    the way JSON or Python write them (``\\/``, ``\\u002f``), and a leading part of it left at
    the end of a text that was cut (``cut=True``). ``KeyScrubber(None)`` changes nothing."""

    def __init__(self, key: Optional[str]):
        self.key = key or None
        self.pattern = None
        if self.key:
            self.pattern = re.compile("".join(
                f"(?:{re.escape(ch)}|\\\\{re.escape(ch)}|\\\\u(?i:{ord(ch):04x}))" for ch in self.key))

    def __call__(self, text: str, cut: bool = False) -> str:
        if self.pattern is None or not isinstance(text, str):
            return text
        text = self.pattern.sub(KEY_MARK, text)
        if cut:  # a cut may have split an echo of the key: drop a tail that starts it
            for n in range(min(len(self.key), len(text)), 0, -1):
                if text.endswith(self.key[:n]):
                    return text[: len(text) - n] + KEY_MARK
        return text

    def tree(self, value: Any) -> Any:
        """``value`` with every string in it (keys of mappings too) scrubbed."""
        if self.pattern is None:
            return value
        if isinstance(value, str):
            return self(value)
        if isinstance(value, Mapping):
            return {self.tree(k): self.tree(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.tree(v) for v in value]
        return value


class ExternalEngineer(Engineer):
    """Any OpenAI-compatible chat endpoint as the engineer (stdlib ``http.client``).

    Safe to point at a server on the internet:

    * **one deadline per attempt**: ``timeout_s`` bounds the whole attempt: connect, send,
      status, headers, the complete body, the backoff waits between its 429/5xx retries and the
      parse of the reply (:func:`jaxlake.engineers.extract_json` stops at the same deadline);
      a server that drips bytes is cut off at the deadline (a watchdog closes the socket), not
      after every slow read, and a wait that would pass the deadline is not made;
    * **a body cap**: a body over ``max_body_bytes`` is refused: at once when its
      ``Content-Length`` says so, else as soon as that many bytes have come (never read
      whole); each raw output kept in the record is cut to ``max_raw_chars`` (head and tail);
    * **any reply is a failed attempt at worst**: the parse is linear in the reply and nothing
      escapes it (deep nesting, integers over Python's digit limit); bytes that are not UTF-8
      are read as U+FFFD (a stray byte in the prose does not lose the answer);
    * **the key stays secret**: its value is removed (:data:`KEY_MARK`) from every reply,
      error body and error message before anything is kept or raised, so a server that echoes
      the ``Authorization`` header puts nothing secret in ``engineer.json``; a key with a
      control character, a space or a non-ASCII character (a CRLF ``.env`` file's ``\\r``) is
      refused when the engineer is built, naming the variable, not the value
      (:func:`check_api_key`; no whitespace is stripped);
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
      timeout_s: the deadline of one attempt (its requests, waits and parse), seconds.
      max_body_bytes: the largest response body read (>= 4096).
      max_raw_chars: the longest raw output kept per attempt in the record.
      retries: attempts after the first (each failed parse, validation or request counts).
      http_retries, backoff_s, max_backoff_s: retries of 429/5xx inside one attempt and their waits.
      context_tokens, chars_per_token: the prompt budget (None: no budget).
      json_mode: send ``response_format: {"type": "json_object"}``.
      context, space, system: as for :class:`llm.engineer.local.LLMEngineer`.
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
        space: Optional[Mapping[str, Any]] = None,
        system: Optional[str] = None,
        extra_body: Optional[Mapping[str, Any]] = None,
        http_retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        context_tokens: Optional[int] = None,
        chars_per_token: float = 3.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_raw_chars: int = MAX_RAW_CHARS,
        **_: Any,
    ) -> None:
        if not url or not isinstance(url, str):
            raise ConfigError("engineer.url: give the endpoint's URL, e.g. http://127.0.0.1:8000/v1")
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ConfigError(f"engineer.url={url!r}: the scheme must be http or https")
        if not model:
            raise ConfigError("engineer.model: give the endpoint's model name")
        if api_key_env:
            check_api_key(api_key_env, os.environ.get(api_key_env))
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
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < MIN_BODY_BYTES:
            raise ConfigError(f"engineer.max_body_bytes={max_body_bytes!r} not an integer in [{MIN_BODY_BYTES}, inf)")
        if isinstance(max_raw_chars, bool) or not isinstance(max_raw_chars, int) or max_raw_chars < 1:
            raise ConfigError(f"engineer.max_raw_chars={max_raw_chars!r} not an integer in [1, inf)")
        self.url = url.rstrip("/")
        if not self.url.endswith("/chat/completions"):
            self.url += "/chat/completions"
        self.model, self.api_key_env, self.name = model, api_key_env, name
        self.flags = context_flags(context)
        self.temperature, self.max_tokens, self.timeout_s = float(temperature), int(max_tokens), float(timeout_s)
        self.retries, self.json_mode = int(retries), bool(json_mode)
        self.http_retries, self.backoff_s, self.max_backoff_s = int(http_retries), float(backoff_s), float(max_backoff_s)
        self.context_tokens = None if context_tokens is None else int(context_tokens)
        self.chars_per_token = float(chars_per_token)
        self.max_body_bytes, self.max_raw_chars = int(max_body_bytes), int(max_raw_chars)
        self.space_node = space
        self.system = default_system(self.parts) if system is None else system
        self.extra_body = dict(extra_body or {})

    @property
    def parts(self) -> list[str]:
        return [p for p in PARTS if self.flags[p]]

    # ------------------------------------------------------------------ HTTP
    def _api_key(self) -> Optional[str]:
        """The key to send (checked: :func:`check_api_key`), or None without auth."""
        return check_api_key(self.api_key_env, os.environ.get(self.api_key_env)) if self.api_key_env else None

    def scrubber(self) -> KeyScrubber:
        """Removes the key's current value from text (whatever the variable holds, valid or not)."""
        return KeyScrubber(os.environ.get(self.api_key_env) if self.api_key_env else None)

    def _timeout(self) -> TimeoutError:
        return TimeoutError(f"no complete answer from {self.url} within timeout_s={self.timeout_s:g}")

    def _exchange(self, data: bytes, headers: Mapping[str, str], deadline: float) -> tuple[int, Any, bytes, bool]:
        """One POST that ends by ``deadline`` (a :func:`time.monotonic` value):
        ``(status, headers, body, cut)``. ``cut``: the body is over ``max_body_bytes`` and only
        its first bytes were read (none past the cap)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout()
        parts = urllib.parse.urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn = cls(parts.hostname, parts.port, timeout=remaining)
        expired = threading.Event()
        held: list = []  # the socket (http.client drops conn.sock once the answer will close)

        def cut() -> None:  # the deadline: unblock whatever read or write is waiting
            expired.set()
            for sock in held or ([conn.sock] if conn.sock is not None else []):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        watchdog = threading.Timer(remaining, cut)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.connect()
            held.append(conn.sock)
            if expired.is_set():
                cut()
            conn.request("POST", path, body=data, headers=dict(headers))
            resp = conn.getresponse()
            cap = self.max_body_bytes
            try:
                declared = int(resp.getheader("Content-Length") or -1)
            except ValueError:
                declared = -1
            if declared > cap:  # refused unread: only a head, for the error message
                body, over = resp.read(min(cap, 4 * _DETAIL_CHARS)), True
            else:
                chunks, size, over = [], 0, False
                while True:
                    piece = resp.read(min(_READ_CHUNK, cap + 1 - size))
                    if not piece:
                        break
                    chunks.append(piece)
                    size += len(piece)
                    if size > cap:
                        over = True
                        break
                body = b"".join(chunks)
            if expired.is_set():
                raise OSError("cut at the deadline")
            return resp.status, resp.headers, body, over
        except (OSError, http.client.HTTPException) as err:
            if expired.is_set():
                raise self._timeout() from None
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

    def chat(self, user: str, deadline: Optional[float] = None) -> str:
        """One chat completion by ``deadline`` (default: ``timeout_s`` from now); raises on
        HTTP, network or response-format errors, with the key's value removed from every
        message and from the reply."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        try:
            key = self._api_key()
        except ConfigError as err:  # the variable changed since the engineer was built
            raise FatalEngineerError(str(err)) from None
        scrub = KeyScrubber(key)
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
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode()
        for k in range(self.http_retries + 1):
            status, resp_headers, raw, over = self._exchange(data, headers, deadline)
            text = scrub(raw.decode("utf-8", errors="replace"), cut=over)
            if status == 200:
                break
            detail = text[:_DETAIL_CHARS]
            if 300 <= status < 400:
                where = resp_headers.get("Location") if resp_headers is not None else None
                where = None if where is None else scrub(str(where))
                raise FatalEngineerError(
                    f"HTTP {status} from {self.url}: redirect to {where!r} refused (a followed redirect "
                    "would carry the Authorization header to another address); set engineer.url to the final address"
                )
            if status == 429 or status >= 500:
                if k == self.http_retries:
                    raise RuntimeError(f"HTTP {status} from {self.url} after {k + 1} request(s): {detail}")
                wait = self._wait(status, resp_headers, k)
                if time.monotonic() + wait > deadline:
                    raise RuntimeError(f"HTTP {status} from {self.url}: waiting {wait:g} s to retry would pass the "
                                       f"deadline (timeout_s={self.timeout_s:g}): {detail}")
                time.sleep(wait)
                continue
            if status in (400, 401, 403, 404, 405, 413, 422):
                raise FatalEngineerError(f"HTTP {status} from {self.url}: {detail}")
            raise RuntimeError(f"HTTP {status} from {self.url}: {detail}")
        if over:
            raise RuntimeError(f"the response from {self.url} is over engineer.max_body_bytes={self.max_body_bytes}: "
                               "refused (raise max_body_bytes if the endpoint's replies are this long)")
        if time.monotonic() > deadline:
            raise self._timeout()
        try:
            payload = json.loads(text)
            message = payload["choices"][0]["message"]
            content = message["content"]
        except Exception:  # noqa: BLE001 - bad JSON, deep nesting, a huge integer, another shape
            raise RuntimeError(f"unexpected response from {self.url}: {text[:_DETAIL_CHARS]!r}") from None
        if not isinstance(content, str):
            raise RuntimeError(f"response content is {type(content).__name__}, not text")
        thought = message.get("reasoning_content") if isinstance(message, Mapping) else None
        if isinstance(thought, str) and thought.strip() and "</think>" not in content:
            # servers that split Qwen3's thinking out (reasoning parsers): keep it in the record
            content = f"<think>\n{thought.strip()}\n</think>\n\n{content}"
        # the key as the server decoded it (a JSON escape in the body), and no lone surrogates
        # (a \ud800 escape): the text can be written as UTF-8 anywhere
        return scrub(content.encode("utf-8", errors="replace").decode("utf-8"))

    # ------------------------------------------------------------------ prompt budget
    def count(self, text: str) -> int:
        """Estimated tokens of ``text`` (no tokenizer for a remote model: ``chars / chars_per_token``)."""
        return int(math.ceil(len(text) / self.chars_per_token))

    def user_prompt(self, ctx: EngineerContext, space: ConfigSpace) -> tuple[str, Optional[str]]:
        """``(prompt, error)``: the richest user prompt within the budget, or the shortest one
        and why it does not fit."""

        def build(**kw):
            return build_user_prompt(ctx, self.parts, space, **kw)

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

        def ask(prompt: str, attempt: int, deadline: float) -> str:
            if too_long:
                raise FatalEngineerError(too_long)
            return self.chat(prompt, deadline)

        scrub = self.scrubber()
        proposal = propose_with_retries(ask, user, ctx, self.retries, space=space,
                                        timeout_s=self.timeout_s,
                                        max_raw_chars=self.max_raw_chars, scrub=scrub)
        proposal.record.update(
            {"system": self.system, "endpoint": self.url, "model": self.model, "context_parts": self.parts}
        )
        analysis = analysis_of(proposal.record.get("raw_output"))
        if analysis:
            proposal.record["analysis"] = analysis
        # every string already went through the scrubber; once more over the whole record
        proposal.record, proposal.reason = scrub.tree(proposal.record), scrub(proposal.reason)
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
    from llm.generation.reasoning import split_completion

    thinking = split_completion(raw).thinking
    return thinking.strip() if thinking and thinking.strip() else None
