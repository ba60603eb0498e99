"""The GRPO loop and the warm start train exactly as they did before the loop was split into phases
with hooks (llm/training/grpo_loop.py, llm/training/hooks.py, llm/training/experiments/) and before
the warm start solved each lake once a step (llm/training/warmstart.py).

Each case runs a tiny model for two steps and compares its metrics rows (timings left out) and its
final parameters with values recorded from the code before those changes (``RECORDED``, in
loop_regression.json; ``python -m tests.llm.training.test_loop_regression > out.json`` records them):

* ``core``: what every default run does -- dynamic sampling over two rounds, two updates per batch,
  two micro-batches, no hook;
* ``experiments``: greedy screening, guidance and the supervised anchor (with its own screen) and a
  KL term, all at once: the hooks must reproduce the loop's old branches;
* ``warmstart``: two warm-start steps with every lake selection and the ``crowd`` trace on (the
  steps that used to solve the same lakes up to three extra times).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxlake.config import LakeConfig

#: Holed 4x4 lakes of one or two agents: a random model's groups differ now and then.
ENV = LakeConfig(height=4, width=4, num_agents=2, hole_density=0.2, max_steps=8, max_height=4, max_width=4,
                 max_agents=2)


def _policy():
    from flax import nnx

    from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer
    from llm.model.config import Qwen3Config
    from llm.model.qwen3 import Qwen3ForCausalLM
    from llm.training.policy import Policy

    tokenizer = to_hf_tokenizer(build_game_tokenizer())
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    return Policy.from_model(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), tokenizer)


def _digest(state) -> list[float]:
    """Per parameter leaf: the sum of its entries and of their squares (float64)."""
    out = []
    for x in jax.tree_util.tree_leaves(state):
        a = np.asarray(x, np.float64)
        out += [float(a.sum()), float((a * a).sum())]
    return out


def _rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not (k.startswith("time/") or k.endswith("tokens_per_s"))} for r in rows]


def _varied(real):
    """``compute_rewards`` with a term that depends on each completion's text (a random model's
    plans are all malformed, so its groups would all tie and no step would train)."""

    def compute_rewards(lakes, texts, *args, **kwargs):
        res = real(lakes, texts, *args, **kwargs)
        bonus = np.asarray([sum(map(ord, t)) % 29 == 0 for t in texts], np.float32) * 0.25
        return res.replace(reward=np.asarray(res.reward, np.float32) + bonus)

    return compute_rewards


def run_case(kind: str, folder: Path) -> dict:
    """Run one case in ``folder``; returns ``{"rows": [...], "params": [...]}``."""
    from llm.game import rewards

    real = rewards.compute_rewards
    if kind == "core":
        rewards.compute_rewards = _varied(real)
    try:
        return _run_case(kind, folder)
    finally:
        rewards.compute_rewards = real


def _run_case(kind: str, folder: Path) -> dict:
    from jaxlake.mixture import Mixture
    from llm.game.lakes import sample_lakes
    from llm.game.prompter import Prompter
    from llm.game.prompts import PromptConfig
    from llm.rl.dynamic import DynamicSamplingConfig
    from llm.rl.grpo import GRPOLossConfig
    from llm.training.config import (AnchorConfig, GRPOConfig, GuidanceConfig, OptimConfig, ScreenConfig,
                                     TrainConfig, WarmStartConfig)
    from llm.training.stage import MetricsLog

    policy = _policy()
    pcfg = PromptConfig(system="", user="{grid}\n{agents}", use_system=False)
    prompter = Prompter.fit(policy.tokenizer, pcfg, sample_lakes(jax.random.PRNGKey(0), ENV, 8), None, 16)
    metrics = MetricsLog(folder / "metrics.jsonl")
    if kind == "warmstart":
        from jaxlake.config import LakeConfig as LC
        from llm.training.warmstart import run_warmstart

        crowd = LC(height=5, width=5, num_agents=2, hole_density=0.2, conflict_density=1.0, max_steps=12,
                   max_height=5, max_width=5, max_agents=2)
        pcfg = PromptConfig(system="", user="{grid}\n{agents}", use_system=False,
                            reasoning={"enabled": True, "warmstart": True, "thinking_tokens": 48,
                                       "warmstart_style": "crowd"})
        prompter = Prompter.fit(policy.tokenizer, pcfg, sample_lakes(jax.random.PRNGKey(0), crowd, 8), None, 16)
        wc = WarmStartConfig(steps=2, batch_size=4, blocked_share=0.25, detour_share=0.25, crowded_share=0.25,
                             optim=OptimConfig(lr=1e-2, warmup_steps=0))
        config = TrainConfig(seed=2, warmstart=wc, prompt=pcfg, progress=False)
        res = run_warmstart(policy, config, Mixture.of(crowd), folder / "ws", metrics, prompter, 32, mesh=None,
                            prefetch=False)
        return {"rows": _rows(metrics.path), "params": _digest(res.policy.state)}
    optim = OptimConfig(lr=1e-2, warmup_steps=0)
    if kind == "core":
        gc = GRPOConfig(steps=3, lakes_per_step=4, group_size=4, mu=2, micro_batches=2, max_new_tokens=12,
                        optim=optim, dynamic_sampling=DynamicSamplingConfig(enabled=True, max_rounds=2))
    elif kind == "experiments":
        gc = GRPOConfig(steps=2, lakes_per_step=2, group_size=4, mu=2, micro_batches=2, max_new_tokens=12,
                        optim=optim, loss=GRPOLossConfig(beta=0.05),
                        dynamic_sampling=DynamicSamplingConfig(enabled=True, max_rounds=2),
                        guidance=GuidanceConfig(enabled=True, rows=1), screen=ScreenConfig(lakes=4),
                        anchor=AnchorConfig(weight=0.5, lakes=2, screen_lakes=4))
    else:
        raise ValueError(kind)
    config = TrainConfig(seed=1, grpo=gc, prompt=pcfg, progress=False,
                         warmstart=WarmStartConfig(blocked_share=0.5))
    from llm.training.grpo_loop import run_grpo

    res = run_grpo(policy, policy.state, config, ENV, folder / "ckpt", metrics, prompter, mesh=None)
    return {"rows": _rows(metrics.path), "params": _digest(res.policy.state)}


#: Recorded from the code before the split (commit 426f46c), on CPU: loop_regression.json.
_RECORDED = Path(__file__).with_name("loop_regression.json")
RECORDED: dict = json.loads(_RECORDED.read_text()) if _RECORDED.is_file() else {}


def _close(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        return a == b
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=2e-4, abs_tol=2e-5) or (math.isnan(a) and math.isnan(b))
    return a == b


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["core", "experiments", "warmstart"])
def test_two_steps_train_as_before(kind, tmp_path):
    got = run_case(kind, tmp_path)
    want = RECORDED[kind]
    assert len(got["rows"]) == len(want["rows"])
    for g, w in zip(got["rows"], want["rows"]):
        assert g.keys() == w.keys(), (sorted(set(g) ^ set(w)))
        bad = {k: (g[k], w[k]) for k in w if not _close(g[k], w[k])}
        assert not bad, bad
    assert _close(got["params"], want["params"])


def test_the_comparison_can_fail():
    """The tolerance separates a changed run from a recorded one."""
    assert _close({"a": [1.0, 2]}, {"a": [1.00001, 2]})
    assert not _close({"a": [1.0, 2]}, {"a": [1.001, 2]})
    assert not _close({"a": [1.0, 2]}, {"a": [1.0, 3]})
    assert not _close({"a": 1}, {"b": 1})


if __name__ == "__main__":  # record: python -m tests.llm.training.test_loop_regression [kind ...]
    out = {}
    for name in sys.argv[1:] or ["core", "experiments", "warmstart"]:
        with tempfile.TemporaryDirectory() as d:
            out[name] = run_case(name, Path(d))
    print(json.dumps(out))
