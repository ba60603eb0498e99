"""The external engineer against a local OpenAI-compatible stub server on 127.0.0.1."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from jaxlake.config import ConfigError, LakeConfig
from jaxlake.engineers import EngineerContext, build_engineer
from llm.engineer import ExternalEngineer
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
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

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
        p = ExternalEngineer(url=stub.url + "/chat/completions", model="m", retries=2).propose(ctx())
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
    assert all(e.startswith("URLError") for e in p.record["validation_errors"])


def test_config_errors_and_conf_file(monkeypatch):
    monkeypatch.delenv("JAXLAKE_MISSING_KEY", raising=False)
    with pytest.raises(ConfigError, match="environment variable JAXLAKE_MISSING_KEY is not set"):
        ExternalEngineer(url="http://127.0.0.1:1/v1", model="m", api_key_env="JAXLAKE_MISSING_KEY")
    with pytest.raises(ConfigError, match="engineer.context.gossip"):
        ExternalEngineer(url="http://127.0.0.1:1/v1", model="m", context={"gossip": True})
    node = OmegaConf.load(CONF)
    node.url = "http://127.0.0.1:9/v1"
    eng = build_engineer(node)
    assert isinstance(eng, ExternalEngineer) and eng.url == "http://127.0.0.1:9/v1/chat/completions"
    assert eng.parts == ["behaviour", "failures", "env_stats", "history"]
