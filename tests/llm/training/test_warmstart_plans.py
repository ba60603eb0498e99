"""The warm start solves each step's lakes with the planner once (llm/training/warmstart.py,
:class:`~llm.training.warmstart.Drawn`): the selection of the batch, its shares and its targets
share one solve. (That the batches and metrics are those of the code that solved up to three extra
times: tests/llm/training/test_loop_regression.py, case ``warmstart``.)"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxlake import planner
from jaxlake.config import LakeConfig
from jaxlake.mixture import Mixture
from llm.game.lakes import sample_lakes
from llm.game.prompter import Prompter
from llm.game.prompts import PromptConfig
from llm.training import warmstart as ws
from llm.training.config import OptimConfig, TrainConfig, WarmStartConfig
from llm.training.stage import MetricsLog
from tests.support import small_policy

CROWD = LakeConfig(height=5, width=5, num_agents=2, hole_density=0.2, conflict_density=1.0, max_steps=12,
                   max_height=6, max_width=6, max_agents=2)
LONG = LakeConfig(height=6, width=6, num_agents=2, hole_density=0.2, conflict_density=1.0, max_steps=20,
                  max_height=6, max_width=6, max_agents=2)


def _count_solves(monkeypatch) -> list[int]:
    """The number of lakes of every ``planner.solve_batch`` call from now on."""
    calls: list[int] = []
    real = planner.solve_batch

    def counted(lakes, **kwargs):
        calls.append(int(np.asarray(lakes.num_agents).shape[0]))
        return real(lakes, **kwargs)

    monkeypatch.setattr(planner, "solve_batch", counted)
    return calls


@pytest.mark.parametrize("shares", [True, False])
def test_a_warm_start_step_solves_its_lakes_once(shares, monkeypatch, tmp_path):
    policy, tokenizer = small_policy(num_layers=1)
    pcfg = PromptConfig(system="", user="{grid}\n{agents}", use_system=False,
                        reasoning={"enabled": True, "warmstart": True, "thinking_tokens": 48, "warmstart_style": "crowd"})
    # fitted on a batch's count of lakes: the draw without shares reuses that lake program
    prompter = Prompter.fit(tokenizer, pcfg, sample_lakes(jax.random.PRNGKey(0), CROWD, 4), None, 16)
    share = 0.25 if shares else 0.0
    wc = WarmStartConfig(steps=2, batch_size=4, blocked_share=share, detour_share=share, crowded_share=share,
                         optim=OptimConfig(lr=1e-3, warmup_steps=0))
    config = TrainConfig(seed=2, warmstart=wc, prompt=pcfg, progress=False)
    calls = _count_solves(monkeypatch)
    ws.run_warmstart(policy, config, Mixture.of(CROWD), tmp_path / "ws", MetricsLog(tmp_path / "m.jsonl"), prompter,
                     32, mesh=None, prefetch=False)
    # with shares the pool (8 times the batch) is solved to select the lakes, and that solve is
    # reused for the shares and the targets; without, the batch is solved once for both
    assert calls == ([4 * ws.CROWDED_POOL] if shares else [4]) * 2


def test_a_draw_reuses_its_solutions_only_at_the_batch_horizon(monkeypatch):
    """A mixture's pool plans at its longest ``max_steps``: rows of the shorter component alone
    are solved again at theirs, so the targets are what ``solve_batch(rows)`` gives; at the
    pool's horizon the reused solutions are the planner's own."""
    from jaxlake.text import format_plan

    wc = WarmStartConfig(detour_share=0.5)
    assert ws.reference_draw(jax.random.PRNGKey(1), Mixture.of(CROWD), 4, WarmStartConfig()).solutions is None
    mix = Mixture([(0.5, CROWD), (0.5, LONG)])
    for seed in range(40):  # a draw of both components whose first two rows are the short one's
        drawn = ws.reference_draw(jax.random.PRNGKey(seed), mix, 4, wc)
        steps = np.asarray(drawn.lakes.max_steps)
        if drawn.horizon == 20 and (steps[:2] == 12).all() and steps.max() == 20:
            break
    else:
        pytest.fail("no draw mixed both components")
    fresh = planner.solve_batch(drawn.lakes).solutions
    calls = _count_solves(monkeypatch)
    reused = drawn.solve()
    assert calls == []
    counts = np.asarray(drawn.lakes.num_agents)
    assert [format_plan(s.actions, int(c)) if s.found else None for s, c in zip(reused, counts)] == \
        [format_plan(s.actions, int(c)) if s.found else None for s, c in zip(fresh, counts)]
    got = drawn.take(slice(0, 2)).solve()
    assert calls == [2]  # planned at 20 in the pool; the short rows alone plan at 12: solved again
    assert all(s.actions.shape[-1] == 12 for s in got)


def test_side_rows_train_beside_the_plans_and_are_logged(tmp_path):
    """``SideRows`` (how pretraining teaches the engineer's role): every step adds the rows'
    weighted nll to the plans' loss; the rows' nll falls as they are learned, and a warm start
    without them logs none."""
    import json

    from llm.rl.batches import TokenBatch

    policy, tokenizer = small_policy(num_layers=1)
    pcfg = PromptConfig(system="", user="{grid}\n{agents}", use_system=False)
    prompter = Prompter.fit(tokenizer, pcfg, sample_lakes(jax.random.PRNGKey(0), CROWD, 4), None, 16)
    ids = np.asarray([tokenizer.encode("propose an edit", add_special_tokens=False)] * 2, np.int32)
    ans = np.asarray([tokenizer.encode('{"edit": "keep"}', add_special_tokens=False)] * 2, np.int32)
    mask = np.ones_like(ans, bool)
    side_batch = TokenBatch(prompt_ids=ids, prompt_mask=np.ones_like(ids, bool), tokens=ans, mask=mask,
                            weights=(mask / mask.sum()).astype(np.float32))
    seen = []

    def rows(step):
        seen.append(step)
        return side_batch

    wc = WarmStartConfig(steps=6, batch_size=4, log_every=1, checkpoint_every=6, optim=OptimConfig(lr=1e-2, warmup_steps=0))
    config = TrainConfig(seed=2, warmstart=wc, prompt=pcfg, progress=False)
    ws.run_warmstart(policy, config, Mixture.of(CROWD), tmp_path / "ws", MetricsLog(tmp_path / "m.jsonl"), prompter,
                     32, mesh=None, prefetch=False, side=ws.SideRows(rows=rows, weight=0.5))
    logged = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert seen == list(range(6)) and len(logged) == 6
    for r in logged:
        assert r["loss"] == pytest.approx(r["nll"] + 0.5 * r["engineer_nll"], rel=1e-5)
    assert logged[-1]["engineer_nll"] < 0.85 * logged[0]["engineer_nll"]  # the fixed rows are being learned
    policy, _ = small_policy(num_layers=1)
    ws.run_warmstart(policy, config, Mixture.of(CROWD), tmp_path / "plain", MetricsLog(tmp_path / "p.jsonl"),
                     prompter, 32, mesh=None, prefetch=False)
    plain = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert "engineer_nll" not in plain[0] and plain[0]["loss"] == pytest.approx(plain[0]["nll"])
