"""Pretraining teaches the engineer's role: ``pretrain.engineer.rows > 0``.

Beside each step's plans, the warm start trains on ``rows`` engineer examples
(:class:`llm.training.warmstart.SideRows`): the prompt the ``policy`` engineer reads after a
stage and the teacher's answer (:mod:`jaxlake.engineers.teacher`), in the JSON constrained
decoding writes (:mod:`llm.engineer.examples`). The contexts are summaries of scripted
policies of many skill levels on many mixtures, played in the simulator on the run's held-out
suite (``eval``, the suite a run's summaries read) and rendered as a run renders them
(:mod:`jaxlake.engineers.contexts`).

The examples are made once, before training, and kept in ``engineer_examples.jsonl`` beside
the run (a resumed run re-reads them); step ``t`` trains on examples
``(t * rows + i) mod contexts``, so every context is seen about ``steps * rows / contexts``
times. The prompt length is the longest example's, rounded up to 64 tokens.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Optional

from jaxlake.config import reject_unknown, to_plain
from jaxlake.io import write_text
from jaxlake.pipeline.folder import log
from jaxlake.pipeline.settings import PipelineError, RunSettings


@dataclasses.dataclass(frozen=True)
class EngineerRole:
    """``pretrain.engineer``: the engineer examples in pretraining.

    Attributes:
      rows: examples a warm-start step trains beside its plans (0: none, plans only).
      contexts: distinct examples (contexts) made before training.
      mixtures: training mixtures the contexts are drawn on: ``reachable`` of them a curriculum
        from the ``starts`` visits (the teacher's edits,
        :class:`jaxlake.engineers.contexts.ContextPool`), the rest random.
      starts: the environments those curricula start from (``conf/env`` names; the run's
        ``env`` is added when it is not among them).
      reachable: that share (also the share of the contexts on them, the starts' excluded).
      start_share: the share of the contexts on the starts themselves.
      weight: the examples' loss weight beside the plans'.
      eval: the held-out suite the contexts' summaries read (the runs' default, ``large``).
      analysis: the engineer reasons first: each answer starts with the teacher's analysis in a
        ``<think>`` block (:func:`jaxlake.engineers.teacher.teacher_analysis`), and the shipped
        record says so, so that ``engineer.reasoning.enabled: auto`` turns the think block on
        for runs from this policy (:func:`llm.engineer.local.taught_analysis`).
      answer_tokens: room for an answer (with its analysis) and its end-of-turn token.
      seed: the contexts' seed.
    """

    rows: int = 0
    contexts: int = 1024
    mixtures: int = 48
    starts: tuple = ("broad", "tiny")
    reachable: float = 0.5
    start_share: float = 0.2
    weight: float = 1.0
    eval: str = "large"
    analysis: bool = True
    answer_tokens: int = 160
    seed: int = 0

    @classmethod
    def from_node(cls, node: Optional[Mapping[str, Any]]) -> "EngineerRole":
        node = dict(to_plain(node) or {})
        reject_unknown("pretrain.engineer", node, [f.name for f in dataclasses.fields(cls)], PipelineError)
        if "starts" in node:
            starts = node["starts"]
            if isinstance(starts, str) or not isinstance(starts, (list, tuple)) or not all(
                    isinstance(x, str) for x in starts):
                raise PipelineError(f"pretrain.engineer.starts={starts!r} must be a list of conf/env names")
            node["starts"] = tuple(starts)
        out = cls(**node)
        for name, low in (("rows", 0), ("contexts", 1), ("mixtures", 1), ("answer_tokens", 16), ("seed", 0)):
            v = getattr(out, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise PipelineError(f"pretrain.engineer.{name}={v!r} must be an integer in [{low}, inf)")
        for name in ("reachable", "start_share"):
            v = getattr(out, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise PipelineError(f"pretrain.engineer.{name}={v!r} not in [0, 1]")
        if out.reachable + out.start_share > 1:
            raise PipelineError(f"pretrain.engineer.reachable + start_share = {out.reachable + out.start_share} "
                                "must be at most 1")
        if not isinstance(out.analysis, bool):
            raise PipelineError(f"pretrain.engineer.analysis={out.analysis!r} must be true or false")
        if isinstance(out.weight, bool) or not isinstance(out.weight, (int, float)) or not out.weight > 0:
            raise PipelineError(f"pretrain.engineer.weight={out.weight!r} must be a number in (0, inf)")
        return out


def _engineer(s: RunSettings, role: EngineerRole) -> Any:
    from jaxlake.engineers import build_engineer

    node = s.engineer
    target = str((node or {}).get("_target_", ""))
    if not target.endswith(("PolicyEngineer", "BaseEngineer")):
        raise PipelineError(f"pretrain.engineer.rows > 0 teaches the policy engineer's role: engineer=policy "
                            f"(the run's engineer is {target or 'none'})")
    engineer = build_engineer(node)
    if role.analysis:
        engineer.reasoning = {**engineer.reasoning, "enabled": True}
    return engineer


def start_mixtures(s: RunSettings, role: EngineerRole) -> list:
    """The mixtures of ``role.starts`` (``conf/env/<name>.yaml``), then the run's ``env`` if it
    is not one of them."""
    from jaxlake.conf import CONF_DIR
    from jaxlake.mixture import load_mixture

    out = []
    for name in role.starts:
        path = CONF_DIR / "env" / f"{name}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in (CONF_DIR / "env").glob("*.yaml"))
            raise PipelineError(f"pretrain.engineer.starts: {name!r} is not an environment of conf/env ({known})")
        out.append(load_mixture(path))
    if s.env is not None and all(s.env != m for m in out):
        out.append(s.env)
    return out


def make_examples_file(s: RunSettings, role: EngineerRole, path: Path) -> list[dict]:
    """The role's examples, made (or re-read from ``path``)."""
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if len(rows) == role.contexts:
            return rows
    import time

    from flax import nnx

    from jaxlake.engineers.contexts import ContextPool
    from jaxlake.engineers.space import space_from_conf
    from jaxlake.suite import build_suite, load_eval_conf
    from llm.engineer.examples import make_examples
    from llm.training.phase import progress_bar
    from llm.training.policy import load_policy

    if s.env is None:
        raise PipelineError("pretrain.engineer needs an environment (env=...): the space is built around it")
    t0 = time.perf_counter()
    engineer = _engineer(s, role)
    eval_node = to_plain(load_eval_conf(role.eval))
    summary = dict(eval_node.get("summary") or {})
    space = space_from_conf(s.env.main, engineer.space_node)
    log(f"pretrain: engineer contexts: {role.mixtures} mixtures, scripted policies on the {role.eval} suite")
    pool = ContextPool(build_suite(eval_node, solve=True), space, mixtures=role.mixtures,
                       current_env_lakes=int(eval_node.get("current_env_lakes", 32) or 32),
                       env_stats_lakes=int(summary.get("env_stats_lakes", 64)),
                       k_failures=int(summary.get("k_failures", 6)), seed=role.seed, start=start_mixtures(s, role),
                       reachable=role.reachable, start_share=role.start_share)
    policy = load_policy(s.model, seed=s.seed)
    model = nnx.merge(policy.graphdef, policy.state)
    bar = progress_bar(role.contexts, 0, "engineer examples", s.train.train.progress)
    rows = make_examples(pool, engineer, model, policy.tokenizer, range(role.contexts), bar)
    bar.close()
    write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    share = shown_share(rows)
    cut = "" if share == 1.0 else " (the rest were cut to fit the context: they teach a prior, not a reading)"
    levels = {lv: sum(r["read"].get("level") == lv for r in rows) / max(len(rows), 1) for lv in (-1, 0, 1)}
    log(f"pretrain: {len(rows)} engineer examples in {time.perf_counter() - t0:.0f} s -> {path.name}; "
        f"{share:.0%} of them show the line the teacher reads{cut}; the teacher asks for easier / the same / harder "
        f"in {levels[-1]:.0%} / {levels[0]:.0%} / {levels[1]:.0%}")
    return rows


def shown_share(rows: list) -> float:
    """The share of examples whose prompt holds the line the teacher read (``shows``)."""
    return sum(bool(r.get("shows")) for r in rows) / max(len(rows), 1)


def side_rows(s: RunSettings, role: EngineerRole, run_dir: Path) -> Any:
    """The warm start's :class:`llm.training.warmstart.SideRows` for the role (None when
    ``rows`` is 0)."""
    if role.rows == 0:
        return None
    from llm.engineer.examples import example_rows
    from llm.training.policy import model_tokenizer
    from llm.training.warmstart import SideRows

    examples = make_examples_file(s, role, run_dir / "engineer_examples.jsonl")
    tokenizer = model_tokenizer(s.model)
    longest = max(len(tokenizer.encode(e["prompt"], add_special_tokens=False)) for e in examples)
    prompt_len = -(-longest // 64) * 64
    n = len(examples)

    def rows(step: int):
        pick = [examples[(step * role.rows + i) % n] for i in range(role.rows)]
        return example_rows(pick, tokenizer, prompt_len, role.answer_tokens)

    return SideRows(rows=rows, weight=float(role.weight), name="engineer")
