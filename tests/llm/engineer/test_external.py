"""The external engineer against a local OpenAI-compatible stub server on 127.0.0.1."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from omegaconf import OmegaConf

from jaxlake.config import ConfigError, LakeConfig
from jaxlake.engineers import EngineerContext, build_engineer
from llm.engineer.external import ExternalEngineer
from jaxlake.conf import CONF_DIR

CONF = CONF_DIR / "engineer" / "external.yaml"
BASE = LakeConfig(height=5, width=5, num_agents=2, hole_density=0.1, conflict_density=0.5)
SUMMARY = {
    "behaviour": {"mode": "greedy", "n": 4, "overall": {k: 0.5 for k in (
        "score", "arrived_share", "fall_rate", "timeout_rate", "conflict_rate", "malformed_rate", "agents_fell",
        "agents_timed_out", "conflicts_per_episode", "plan_len", "soc_ratio", "solvable")}, "by_dim": {},
        "scores": {"greedy": 0.5}},
    "failures": {"types_present": [], "types_covered": [], "cases": []},
    "env_stats": None,
    "history": [],
}


class Stub:
    """Scripted chat-completions server: each request pops the next reply."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                status, content = stub.replies.pop(0) if stub.replies else (500, "no more replies")
                if status == 200:
                    payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})
                else:
                    payload = json.dumps({"error": content})
                data = payload.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        # polls its shutdown flag every 0.05 s: the test ends 0.5 s sooner than with the default
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def ctx():
    return EngineerContext(stage=2, current=[(1.0, BASE)], initial=[(1.0, BASE)], eval_result={}, summary=SUMMARY,
                           history=[], state={}, seed=0)


def test_good_output_is_proposed(monkeypatch):
    monkeypatch.setenv("JAXLAKE_TEST_KEY", "sekrit")
    reply = 'Here you go:\n```json\n{"height": 6, "width": 6, "num_agents": 3}\n```'
    with Stub([(200, reply)]) as stub:
        eng = ExternalEngineer(url=stub.url, model="stub-model", api_key_env="JAXLAKE_TEST_KEY", temperature=0.2)
        p = eng.propose(ctx())
    assert p.decision == "proposed"
    (w, cfg), = p.mixture
    assert (cfg.height, cfg.width, cfg.num_agents, cfg.hole_density) == (6, 6, 3, 0.1)
    (req,) = stub.requests
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sekrit"
    body = req["body"]
    assert body["model"] == "stub-model" and body["temperature"] == 0.2
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "Propose the environment of stage 3" in body["messages"][1]["content"]
    assert "## Policy behaviour" in body["messages"][1]["content"]
    assert p.record["raw_output"] == reply and p.record["parsed"] == {"height": 6, "width": 6, "num_agents": 3}
    assert p.record["validation_errors"] == [] and "sekrit" not in json.dumps(p.to_json("external", 2))


def test_malformed_then_invalid_then_error_falls_back_without_crash():
    replies = [(200, "I would make it harder."), (200, '{"height": 99}'), (500, "overloaded")]
    with Stub(replies) as stub:
        p = ExternalEngineer(url=stub.url + "/chat/completions", model="m", retries=2, http_retries=0).propose(ctx())
    assert p.decision == "fallback" and p.mixture == [(1.0, BASE)]
    assert len(stub.requests) == 3
    second = stub.requests[1]["body"]["messages"][1]["content"]
    assert "I would make it harder." in second and "It was rejected: no JSON object" in second
    third = stub.requests[2]["body"]["messages"][1]["content"]
    assert "height=99 exceeds max_height=8" in third
    errors = p.record["validation_errors"]
    assert errors[0] == "no JSON object in the output"
    assert errors[1] == "config: height=99 exceeds max_height=8"
    assert errors[2].startswith("RuntimeError: HTTP 500")
    assert [a["raw_output"] for a in p.record["attempts"]] == ["I would make it harder.", '{"height": 99}', None]


def test_retry_recovers_with_mixture():
    good = json.dumps({"mixture": [{"weight": 2, "config": {"num_agents": 1}}, {"weight": 1, "config": {"num_agents": 3}}]})
    with Stub([(200, "{not json"), (200, good)]) as stub:
        p = ExternalEngineer(url=stub.url, model="m", json_mode=True).propose(ctx())
    assert p.decision == "proposed" and len(stub.requests) == 2
    assert stub.requests[0]["body"]["response_format"] == {"type": "json_object"}
    assert [round(w, 4) for w, _ in p.mixture] == [0.6667, 0.3333]


def test_unreachable_endpoint_falls_back():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = ExternalEngineer(url=f"http://127.0.0.1:{port}/v1", model="m", retries=1, timeout_s=2).propose(ctx())
    assert p.decision == "fallback" and len(p.record["attempts"]) == 2
    assert all(e.startswith("ConnectionRefusedError") for e in p.record["validation_errors"])


def test_config_errors_and_conf_file(monkeypatch):
    monkeypatch.delenv("JAXLAKE_MISSING_KEY", raising=False)
    with pytest.raises(ConfigError, match="environment variable JAXLAKE_MISSING_KEY is not set"):
        ExternalEngineer(url="http://127.0.0.1:1/v1", model="m", api_key_env="JAXLAKE_MISSING_KEY")
    with pytest.raises(ConfigError, match=r"unknown engineer.context field\(s\) \[.gossip.\]"):
        ExternalEngineer(url="http://127.0.0.1:1/v1", model="m", context={"gossip": True})
    node = OmegaConf.load(CONF)
    node.url = "http://127.0.0.1:9/v1"
    eng = build_engineer(node)
    assert isinstance(eng, ExternalEngineer) and eng.url == "http://127.0.0.1:9/v1/chat/completions"
    assert eng.parts == ["behaviour", "failures", "env_stats", "history"]


# ----------------------------------------------------------------------------- hardening (issue 13 item 7)
class Scripted:
    """A stub endpoint on 127.0.0.1 that plays one scripted action per request and stops by itself.

    Actions: ``("ok", content)``, ``("status", code, body, headers)``, ``("drip", n_bytes, interval_s)``
    (a 200 whose body arrives one byte at a time, at most ``n_bytes``), ``("redirect", code, location)``,
    ``("body", code, data)`` (these bytes as the body), ``("stream", code, chunk, n, declared)`` (``n``
    copies of the bytes ``chunk``, written one by one, with their total as ``Content-Length`` or, with
    ``declared=False``, none: the body ends when the connection closes) and ``("fn", f)``
    (``f(authorization_header) -> (code, data)``: a server that echoes what it was sent).
    Past the script every request gets HTTP 500. Requests are recorded with their time and headers.
    """

    def __init__(self, actions):
        self.actions = list(actions)
        self.requests = []
        self.stop = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self):
                import time

                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                stub.requests.append({"t": time.monotonic(), "method": self.command, "path": self.path,
                                      "body": body, "auth": self.headers.get("Authorization")})
                action = stub.actions.pop(0) if stub.actions else ("status", 500, "script over", {})
                try:
                    if action[0] == "ok":
                        self._send(200, json.dumps({"choices": [{"message": {"content": action[1]}}]}).encode())
                    elif action[0] == "status":
                        self._send(action[1], json.dumps({"error": action[2]}).encode(), action[3])
                    elif action[0] == "redirect":
                        self._send(action[1], b"", {"Location": action[2]})
                    elif action[0] == "body":
                        self._send(action[1], action[2])
                    elif action[0] == "fn":
                        self._send(*action[1](self.headers.get("Authorization")))
                    elif action[0] == "stream":
                        _, code, chunk, n, declared = action
                        self.send_response(code)
                        if declared:
                            self.send_header("Content-Length", str(len(chunk) * n))
                        self.end_headers()
                        for _ in range(n):
                            if stub.stop.is_set():
                                break
                            self.wfile.write(chunk)
                    elif action[0] == "drip":
                        self.send_response(200)
                        self.send_header("Content-Length", str(action[1] + 100))
                        self.end_headers()
                        for _ in range(action[1]):
                            if stub.stop.wait(action[2]):
                                break
                            self.wfile.write(b" ")
                            self.wfile.flush()
                except OSError:
                    pass  # the client hung up: that is what a deadline does

            def _send(self, code, data, headers=None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_GET = _handle  # noqa: N815 - http.server API

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


GOOD = '{"height": 6, "width": 6}'
SPACE = {"editable": ["height", "width", "num_agents", "hole_density", "conflict_density"],
         "values": {"hole_density": [0.0, 0.1, 0.2, 0.3], "conflict_density": [0.0, 0.25, 0.5, 0.75, 1.0]}}


def test_slow_server_hits_one_overall_deadline():
    import time

    # 40 bytes, one every 0.05 s: every socket read is fast, the whole answer takes 2 s
    with Scripted([("drip", 40, 0.05)]) as stub:
        eng = ExternalEngineer(url=stub.url, model="m", timeout_s=0.5, retries=0)
        t0 = time.monotonic()
        p = eng.propose(ctx())
        took = time.monotonic() - t0
    assert p.decision == "fallback" and len(stub.requests) == 1
    assert took < 1.2, f"the request ran {took:.2f} s past a 0.5 s deadline"
    assert "TimeoutError" in p.record["validation_errors"][0] and "timeout_s=0.5" in p.record["validation_errors"][0]


def test_redirect_to_another_address_never_carries_the_key(monkeypatch):
    monkeypatch.setenv("JAXLAKE_TEST_KEY", "sekrit")
    with Scripted([("ok", GOOD)] * 3) as other:
        with Scripted([("redirect", code, other.url + "/chat/completions") for code in (302, 307, 308)]) as stub:
            for _ in range(3):
                p = ExternalEngineer(url=stub.url, model="m", api_key_env="JAXLAKE_TEST_KEY", retries=2,
                                     timeout_s=2).propose(ctx())
                assert p.decision == "fallback" and len(p.record["attempts"]) == 1  # refused once, not retried
                assert "redirect" in p.record["validation_errors"][0] and other.url in p.record["validation_errors"][0]
    assert other.requests == [] and len(stub.requests) == 3


def test_rate_limit_honours_retry_after_and_5xx_back_off():
    with Scripted([("status", 429, "slow down", {"Retry-After": "0.3"}), ("status", 503, "busy", {}),
                   ("status", 502, "busy", {}), ("ok", GOOD)]) as stub:
        eng = ExternalEngineer(url=stub.url, model="m", timeout_s=2, backoff_s=0.05, max_backoff_s=1.0, http_retries=3)
        p = eng.propose(ctx())
    assert p.decision == "proposed" and len(p.record["attempts"]) == 1
    t = [r["t"] for r in stub.requests]
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert len(gaps) == 3
    assert gaps[0] >= 0.3                      # Retry-After: 0.3
    assert 0.05 <= gaps[1] < 0.3               # backoff 0.05 * 2**1 = 0.1
    assert gaps[2] >= 0.2 and gaps[2] < 0.6    # backoff 0.05 * 2**2 = 0.2


def test_backoff_is_bounded():
    # a Retry-After beyond max_backoff_s is not waited for; the attempt fails at once
    import time

    with Scripted([("status", 429, "later", {"Retry-After": "3600"})]) as stub:
        eng = ExternalEngineer(url=stub.url, model="m", timeout_s=1, retries=0, max_backoff_s=0.5)
        t0 = time.monotonic()
        p = eng.propose(ctx())
        assert time.monotonic() - t0 < 1.0
    assert p.decision == "fallback" and len(stub.requests) == 1
    assert "Retry-After" in p.record["validation_errors"][0] and "max_backoff_s=0.5" in p.record["validation_errors"][0]
    # 5xx every time: http_retries + 1 requests per attempt, then the attempt fails
    with Scripted([]) as stub:
        p = ExternalEngineer(url=stub.url, model="m", timeout_s=1, retries=0, backoff_s=0.01,
                             http_retries=2).propose(ctx())
    assert p.decision == "fallback" and len(stub.requests) == 3 and "HTTP 500" in p.record["validation_errors"][0]


LONG_HISTORY = [{"stage": s, "env": [{"weight": 1.0, "config": BASE.to_dict()}], "scores": {"greedy": 0.5}}
                for s in range(1, 40)]


def test_prompt_budget_drops_context_or_fails_once():
    summary = dict(SUMMARY, history=LONG_HISTORY)
    c = EngineerContext(stage=40, current=[(1.0, BASE)], initial=[(1.0, BASE)], eval_result={}, summary=summary,
                        history=[], state={}, seed=0)
    with Scripted([("ok", GOOD)]) as stub:
        full = ExternalEngineer(url=stub.url, model="m", timeout_s=2).propose(c)
    full_len = len(full.record["prompt"])
    # a context that cannot hold the full history: the oldest stages go, the answer schema stays
    with Scripted([("ok", GOOD)]) as stub:
        p = ExternalEngineer(url=stub.url, model="m", timeout_s=2, context_tokens=2000, max_tokens=256,
                             retries=0).propose(c)
    assert p.decision == "proposed"
    sent = stub.requests[0]["body"]["messages"][1]["content"]
    assert len(sent) < full_len and "Fields you may set" in sent and "stage 39:" in sent and "stage 2:" not in sent
    # a context too small for even the shortest prompt: one clear error, no request, no retries
    with Scripted([("ok", GOOD)]) as stub:
        p = ExternalEngineer(url=stub.url, model="m", timeout_s=2, context_tokens=300, max_tokens=256,
                             retries=2).propose(c)
    assert p.decision == "fallback" and stub.requests == [] and len(p.record["attempts"]) == 1
    assert "context_tokens=300" in p.record["validation_errors"][0]
    # the server says the prompt is too long (HTTP 400): failed once, not on every attempt
    with Scripted([("status", 400, "This model's maximum context length is 4096 tokens", {})]) as stub:
        p = ExternalEngineer(url=stub.url, model="m", timeout_s=2, retries=2).propose(c)
    assert p.decision == "fallback" and len(stub.requests) == 1
    assert "HTTP 400" in p.record["validation_errors"][0] and "maximum context length" in p.record["validation_errors"][0]


def test_off_grid_and_fixed_fields_are_rejected_for_the_endpoint():
    with Scripted([("ok", '{"hole_density": 0.37}'), ("ok", '{"slip_prob": 0.5}'), ("ok", GOOD)]) as stub:
        p = ExternalEngineer(url=stub.url, model="m", timeout_s=2, retries=2, space=SPACE).propose(ctx())
    assert p.decision == "proposed" and len(stub.requests) == 3
    second = stub.requests[1]["body"]["messages"][1]["content"]
    assert "hole_density=0.37 is not an allowed value; allowed: [0.0, 0.1, 0.2, 0.3]" in second
    third = stub.requests[2]["body"]["messages"][1]["content"]
    assert "slip_prob=0.5 is fixed at 0.0" in third


# ----------------------------------------------------------------------------- the prompt says what is there (item 8)
def test_system_prompt_names_only_the_parts_shown_and_the_rules_are_stated():
    from llm.engineer.local import LLMEngineer

    with Scripted([("ok", GOOD)]) as stub:
        ExternalEngineer(url=stub.url, model="m", timeout_s=2, space=SPACE,
                         context={"failures": False, "env_stats": False}).propose(ctx())
    system, user = (m["content"] for m in stub.requests[0]["body"]["messages"])
    assert "behaviour" in system and "stage history" in system
    assert "failure" not in system and "environment statistics" not in system
    # the cross-field rules, so a free-text engineer need not learn them from rejections
    assert "2 * num_agents <= height * width - round(hole_density * height * width)" in user
    assert "Fixed fields (keep them)" in user and "adds at most 2 component(s)" in user
    assert '{"edit": "add", "add": [{"weight": ' in user and '{"edit": "keep"}' in user  # what an edit is, an example
    none = LLMEngineer(context={p: False for p in ("behaviour", "failures", "env_stats", "history")})
    assert "summary" not in none.system and "current configuration" in none.system
    full = LLMEngineer()
    for part in ("behaviour", "failure cases", "environment statistics", "stage history"):
        assert part in full.system


# ----------------------------------------------------------------------------- bounded in every dimension (issue 23 item 3)
def envelope(content, **message):
    return json.dumps({"choices": [{"message": {"content": content, **message}}]}).encode()


def measured_propose(eng):
    """``(proposal, seconds, peak traced bytes)`` of one ``eng.propose`` call."""
    import time
    import tracemalloc

    tracemalloc.start()
    try:
        t0 = time.monotonic()
        p = eng.propose(ctx())
        return p, time.monotonic() - t0, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_huge_brace_reply_ends_within_the_deadline_in_bounded_memory():
    """2 MB of ``{`` (the old parser was quadratic: 80 k characters took 4 s, this would take
    an hour): a failed attempt well within the deadline, memory a small multiple of the body."""

    body = envelope("{" * 2_000_000)
    with Scripted([("body", 200, body)]) as stub:
        eng = ExternalEngineer(url=stub.url, model="m", timeout_s=5, retries=0, max_body_bytes=4 << 20)
        p, took, peak = measured_propose(eng)
    assert p.decision == "fallback" and took < 5
    assert p.record["validation_errors"] == ["no parseable JSON object in the output (nested deeper than 32 levels)"]
    assert peak < 12 * len(body), f"peak {peak / 1e6:.1f} MB for a {len(body) / 1e6:.1f} MB body"
    raw = p.record["raw_output"]  # the stored raw output is cut to max_raw_chars (head and tail)
    assert len(raw) < 65_536 + 100 and "characters cut" in raw


def test_deep_nesting_huge_integers_and_bad_envelopes_are_failed_attempts():
    """What used to escape the engineer (RecursionError, the int digit limit's ValueError) is
    an ordinary failed attempt, in the reply's content and in the response envelope itself."""
    replies = [("ok", "[" * 100_000), ("ok", '{"a":' * 5000), ("ok", '{"height": ' + "7" * 5000 + "}"),
               ("body", 200, b"[" * 100_000), ("body", 200, b'{"choices": ' + b"1" * 5000 + b"}"), ("ok", GOOD)]
    with Scripted(replies) as stub:
        p = ExternalEngineer(url=stub.url, model="m", timeout_s=5, retries=5).propose(ctx())
    assert p.decision == "proposed" and len(stub.requests) == 6
    errors = p.record["validation_errors"]
    assert errors[0] == errors[1] == "no parseable JSON object in the output (nested deeper than 32 levels)"
    assert errors[2].startswith("no parseable JSON object in the output (ValueError at char 0: Exceeds the limit")
    assert errors[3].startswith("RuntimeError: unexpected response from") and errors[4].startswith("RuntimeError: unexp")
    assert all(len(e) < 600 for e in errors)


def test_bytes_that_are_not_utf8_never_raise():
    """Stray bytes in the prose are read as U+FFFD and the answer still counts; a body that is
    all garbage, or content with a lone surrogate escape, is a failed attempt at worst, and the
    record can be written as UTF-8."""
    stray = b'{"choices": [{"message": {"content": "caf\xe9 \xff\xfe ' + GOOD.replace('"', '\\"').encode() + b'"}}]}'
    with Scripted([("body", 200, bytes(range(128, 256)) * 8), ("ok", "\ud800 no answer \udfff"),
                   ("body", 200, stray)]) as stub:
        p = ExternalEngineer(url=stub.url, model="m", timeout_s=5, retries=2).propose(ctx())
    assert p.decision == "proposed" and len(stub.requests) == 3
    assert p.record["validation_errors"][0].startswith("RuntimeError: unexpected response")
    assert p.record["validation_errors"][1] == "no JSON object in the output"
    assert "\ufffd" in p.record["raw_output"] and p.record["parsed"] == {"height": 6, "width": 6}
    json.dumps(p.to_json("external", 2), ensure_ascii=False).encode("utf-8")  # no lone surrogate left


def test_a_body_over_the_cap_is_refused_without_reading_it_whole():
    """8 MB against a 64 KB cap: refused at once when Content-Length says so, else after the cap
    (a body that ends when the connection closes); memory stays near the cap."""

    chunk = b"x" * 65_536
    for declared in (True, False):
        with Scripted([("stream", 200, chunk, 128, declared)]) as stub:
            eng = ExternalEngineer(url=stub.url, model="m", timeout_s=5, retries=0, max_body_bytes=65_536)
            p, took, peak = measured_propose(eng)
        assert p.decision == "fallback" and took < 3, declared
        assert "over engineer.max_body_bytes=65536" in p.record["validation_errors"][0]
        assert peak < 2_000_000, f"peak {peak / 1e6:.1f} MB (declared={declared})"
    with pytest.raises(ConfigError, match=r"engineer.max_body_bytes=100 not an integer in \[4096, inf\)"):
        ExternalEngineer(url="http://127.0.0.1:1/v1", model="m", max_body_bytes=100)


def test_the_deadline_covers_the_parse_and_the_waits():
    import time

    from jaxlake.engineers import ProposalError, extract_json

    with pytest.raises(ProposalError, match="past the deadline"):
        extract_json('{"a":' * 5000, deadline=time.monotonic() - 1)
    # a reply that takes longer to read than the attempt has left
    with Scripted([("ok", '{"a":' * 400_000)]) as stub:
        eng = ExternalEngineer(url=stub.url, model="m", timeout_s=0.2, retries=0, max_body_bytes=4 << 20)
        t0 = time.monotonic()
        p = eng.propose(ctx())
        took = time.monotonic() - t0
    assert p.decision == "fallback" and "ran past the deadline" in p.record["validation_errors"][0]
    assert took < 1.5, f"{took:.2f} s for a 0.2 s deadline"
    # a Retry-After within max_backoff_s but past the attempt's deadline is not waited for
    with Scripted([("status", 429, "later", {"Retry-After": "3"})]) as stub:
        t0 = time.monotonic()
        p = ExternalEngineer(url=stub.url, model="m", timeout_s=0.5, retries=0, max_backoff_s=10).propose(ctx())
        assert time.monotonic() - t0 < 0.5
    assert "would pass the deadline (timeout_s=0.5)" in p.record["validation_errors"][0]


KEY = "sk-test/Zq9+w4/KEYVALUE-" + "k" * 24  # a "/" so that JSON's "\/" escape is covered


def echo_body(auth):
    return 401, json.dumps({"error": {"message": f"invalid credentials: {auth}"}}).encode()


def test_a_server_that_echoes_the_key_puts_it_nowhere(monkeypatch, tmp_path, caplog, capsys):
    """The key's value is in nothing written, raised or logged: echoed in a 401 body, in 500
    bodies (escaped as some servers write it), in a 200 reply and in its reasoning."""
    import logging

    from jaxlake.io import write_json
    from llm.engineer.external import KEY_MARK, KeyScrubber

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("JAXLAKE_TEST_KEY", KEY)
    escaped = KEY.replace("/", "\\/")
    cases = {
        "401": [("fn", echo_body)],
        "500": [("fn", lambda auth: (500, ('{"error": "' + auth.replace("/", "\\/") + '"}').encode()))] * 2,
        "reply": [("fn", lambda auth: (200, envelope(f"You sent {auth}. {GOOD}")))],
        "thinking": [("fn", lambda auth: (200, envelope(GOOD, reasoning_content=f"the header was {auth}")))],
        "retry": [("fn", lambda auth: (200, envelope(f"{auth} is not JSON"))), ("ok", GOOD)],
    }
    written = []
    for name, script in cases.items():
        with Scripted(script) as stub:
            eng = ExternalEngineer(url=stub.url, model="m", api_key_env="JAXLAKE_TEST_KEY", timeout_s=5, retries=1,
                                   http_retries=1, backoff_s=0.01)
            p = eng.propose(ctx())
        assert all(r["auth"] == f"Bearer {KEY}" for r in stub.requests)  # the key was sent ...
        out = write_json(tmp_path / f"{name}.json", p.to_json("external", 2)).read_text()
        assert KEY_MARK in out, name  # ... echoed, and removed
        written.append(out + p.reason)
        assert p.decision == ("proposed" if name in ("reply", "thinking", "retry") else "fallback"), name
    seen = "".join(written) + caplog.text + "".join(capsys.readouterr())
    for form in (KEY, escaped, KEY[:-1], KEY[1:]):
        assert form not in seen
    # the key split by a cut at the body cap: its leading part goes too
    assert KeyScrubber(KEY)("... invalid credentials: Bearer " + KEY[:12], cut=True).endswith("Bearer " + KEY_MARK)
    assert KeyScrubber(KEY)(KEY.replace("/", "\\u002F")) == KEY_MARK


@pytest.mark.parametrize("value, kind", [(KEY + "\r\n", r"a control character '\\r' at position 49 of 50 \(a line end"),
                                         (KEY + " ", "a space at position 49"), ("sk-\u00e9" + KEY, "a non-ASCII character"),
                                         ("", "is empty")])
def test_a_key_that_cannot_be_sent_is_refused_when_built_without_quoting_it(monkeypatch, value, kind):
    monkeypatch.setenv("JAXLAKE_TEST_KEY", value)
    with pytest.raises(ConfigError, match=kind) as err:
        ExternalEngineer(url="http://127.0.0.1:1/v1", model="m", api_key_env="JAXLAKE_TEST_KEY")
    message = str(err.value)
    assert message.startswith("engineer.api_key_env='JAXLAKE_TEST_KEY': ") and "\n" not in message
    assert KEY not in message and KEY[:12] not in message
    node = OmegaConf.load(CONF)  # built from the config as the pipeline does: the same one line
    node.api_key_env = "JAXLAKE_TEST_KEY"
    with pytest.raises(ConfigError) as built:
        build_engineer(node)
    assert str(built.value) == message


def test_a_key_changed_after_build_ends_the_attempts_without_a_request(monkeypatch):
    monkeypatch.setenv("JAXLAKE_TEST_KEY", KEY)
    with Scripted([("ok", GOOD)]) as stub:
        eng = ExternalEngineer(url=stub.url, model="m", api_key_env="JAXLAKE_TEST_KEY", timeout_s=2, retries=2)
        monkeypatch.setenv("JAXLAKE_TEST_KEY", KEY + "\r\n")
        p = eng.propose(ctx())
    assert p.decision == "fallback" and stub.requests == [] and len(p.record["attempts"]) == 1
    assert "control character" in p.record["validation_errors"][0]
    assert KEY not in json.dumps(p.to_json("external", 2))
