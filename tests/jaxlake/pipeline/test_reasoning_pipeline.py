"""``python -m jaxlake.run prompt=reasoning engineer=policy`` end to end (slow) on a random
Qwen3-architecture model with the official Qwen3 tokenizer and chat template: the warm start
in reasoning form, GRPO with the thinking budget, the suite evaluation and the reasoning
engineer. (The same command on the embedded tiny default is in the README; it takes minutes.)"""

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support import run_cli, tiny_run_overrides

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow

REASONING = ["prompt=reasoning", "engineer=policy", "prompt.reasoning.thinking_tokens=8",
             "engineer.reasoning.thinking_tokens=8", "engineer.retries=0"]


def _spy(monkeypatch):
    """Record, in order, every reasoning sample and every mask the GRPO trainer hands to
    ``grpo.token_weights`` (it is called right after the step's sample)."""
    from llm.rl import grpo
    from llm.generation import reasoning

    events = []
    real_weights, real_sample = grpo.token_weights, reasoning.generate_with_thinking

    def weights(mask, *args, **kwargs):
        events.append(("weights", np.asarray(mask)))
        return real_weights(mask, *args, **kwargs)

    def sample(*args, **kwargs):
        s = real_sample(*args, **kwargs)
        events.append(("sample", s))
        return s

    monkeypatch.setattr(grpo, "token_weights", weights)
    monkeypatch.setattr(reasoning, "generate_with_thinking", sample)
    return events


def _check_run(run: Path, stages: int, events: list, budget: int, forced_len: int) -> None:
    for k in range(1, stages + 1):
        d = run / f"stage_{k}"
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
        grpo_rows = [r for r in rows if r.get("phase") == "grpo"]
        assert grpo_rows
        for r in grpo_rows:
            assert 0.0 <= r["thinking_budget_hit"] <= 1.0 and 0.0 < r["thinking_len"] <= budget
            assert "answer_len" in r and "term/think_unclosed" in r and "term/answer_empty" in r
        eng = json.loads((d / "engineer.json").read_text())
        assert eng["reasoning"] is True and eng["decision"] in ("proposed", "fallback")
        assert isinstance(eng["analysis"], str) and eng["analyses"][0]["tokens"] <= budget
        assert eng["raw_output"].startswith("<think>\n") and "</think>" in eng["raw_output"]
        if eng["decision"] == "proposed":  # constrained decoding after the analysis: a valid config
            assert eng["parsed"] and not eng["validation_errors"]
    # the forced close never reaches the policy-gradient weights: each GRPO step weighs its
    # sample's loss mask (the mask without the forced span); a random policy rambles, so the
    # budget is hit and forced tokens are there to be left out
    pairs = [(events[i - 1][1], events[i][1]) for i in range(1, len(events))
             if events[i][0] == "weights" and events[i - 1][0] == "sample"]
    assert pairs and len(pairs) == sum(e[0] == "weights" for e in events)
    forced_rows = 0
    for sample, mask in pairs:
        np.testing.assert_array_equal(mask, sample.loss_mask)
        np.testing.assert_array_equal(sample.mask.sum(1) - mask.sum(1), sample.forced_lengths)
        assert set(sample.forced_lengths.tolist()) <= {0, forced_len}
        forced_rows += int(sample.hit_budget.sum())
    assert forced_rows > 0


def test_reasoning_run_on_a_random_qwen3_with_the_official_tokenizer(monkeypatch, tmp_path, qwen_shaped_model):
    events = _spy(monkeypatch)
    from llm.training import warmstart

    targets = []
    real_targets = warmstart.plan_targets

    def plan_targets(*args, **kwargs):
        out = real_targets(*args, **kwargs)
        targets.extend(out[3])
        return out

    monkeypatch.setattr(warmstart, "plan_targets", plan_targets)
    # fewer compilations than the shared tiny overrides: one GRPO step, greedy suite only
    lighter = {"train.grpo.steps": "1", "eval.sampled.num_samples": "0"}
    base = [o for o in tiny_run_overrides(qwen_shaped_model) if o.split("=", 1)[0] not in (*lighter, "prompt")]
    args = [f"runs_dir={tmp_path}", "experiment=qwen", "stages=1", *base, *(f"{k}={v}" for k, v in lighter.items()),
            *REASONING, "prompt.reasoning.warmstart=true",
            "engineer.reasoning.enabled=true",  # auto leaves it off after a templated warm start
            # guidance (on by default where the warm start templates the trace) would put the planner's
            # completions in place of samples; this test follows the sampled rows' masks
            "train.grpo.guidance.enabled=false"]
    assert run_cli(monkeypatch, args) is None
    # Qwen3's close text "\n</think>\n\n" is 3 tokens
    _check_run(tmp_path / "qwen", 1, events, budget=8, forced_len=3)
    d = tmp_path / "qwen" / "stage_1"
    eng = json.loads((d / "engineer.json").read_text())
    assert eng["prompt"] and "<think>" not in eng["analysis"] and "Before the JSON object, think" in eng["system"]
    # the warm start wrote reasoning-form targets: its target length counts the thinking budget
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert any(r.get("phase") == "warmstart" and r.get("target_len", 0) > 0 for r in rows)
    train = json.loads((d / "train.json").read_text())
    assert train["warmstart_steps"] == 1
    solved = [t for t in targets if t]
    assert solved and all(t.startswith("<think>\n") and "\n</think>\n\n" in t for t in solved)
