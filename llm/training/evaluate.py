"""Evaluate any policy checkpoint on the fixed held-out suite, greedy and sampled.

``python -m llm.evaluate <checkpoint> [--eval default] [--out eval.json] [--against other.json]``
or, from the pipeline, :func:`evaluate_policy`. A checkpoint is a Hugging Face folder (``config.json`` +
safetensors + tokenizer), a stage's orbax ``checkpoint/`` directory (the tokenizer then comes
from the run's model settings), or ``default`` (the embedded untrained model).

For each decoding mode of the eval config (``greedy``; ``sampled`` with ``num_samples``
completions per lake at ``temperature``/``top_k``/``top_p``) every suite lake's prompt
(:mod:`llm.game.prompts`, the same wording as training) is completed in fixed-shape batches
(:func:`llm.training.completions.sample_completions`: one compilation per mode), the plans are run in the
simulator and scored per episode (:func:`jaxlake.suite.score_texts`). The **aggregate score**
of a mode is its mean success over the suite; ``by_dim`` / ``by_cell`` break every metric
down by the suite's dimensions. Optionally the policy is also evaluated on fresh lakes of the
stage's own training environment (``current_env``), the success signal of the heuristic and
PLR engineers.

``eval.json`` layout::

    format        "jaxlake.eval/1"
    checkpoint    what was evaluated
    score         the greedy aggregate score (sampled when greedy is off)
    suite         name, seed, dims, cells (values + config), skipped cells, planner share
    grids         rendered grid per suite lake (index = episode "lake")
    modes         {mode: {n, score, <metrics>, by_dim: {dim: {value: metrics}}, by_cell: [...]}}
    episodes      one record per completion (jaxlake.suite.score_texts)
    current_env   {env, grids, modes, episodes} on the training environment (optional);
                  modes[m].by_component: each mixture component's metrics on its own lakes
    settings      decoding settings, max_new_tokens, prompt length, the prompt config
    against       with --against: the paired difference to that eval.json (:func:`paired_against`)

``--against other.json`` pairs this policy's episodes with those of another evaluation of the
same suite, lake by lake (:func:`jaxlake.stats.paired_difference`): the difference of the two
scores with its 95 % interval, the lakes won and lost, and the exact sign test on them. Two
policies trained from one start disagree on few lakes, so the paired interval is several
times narrower than either score's own (README, "How precisely a stage is measured").

A line counts the failed lakes by kind (:func:`jaxlake.suite.failed_by_kind`: collided,
fell, malformed, timed out, each lake once), with ``--against`` as ``before -> after``: what a
change moved, not only how much. With ``--against`` the last line names the suite cells whose
solved lakes changed, largest change first (:func:`jaxlake.suite.moved_cells`): where a change
won its lakes, and where it lost others for them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import numpy as np

from jaxlake.suite import (FAILURE_KINDS, Suite, aggregate, build_suite, cell_label, current_env_eval, decoding_modes,
                           failed_by_kind,
                           lake_outcomes, load_eval_conf, moved_cells, reference_soc, render_grids, score_texts, take_lakes)
from jaxlake.text import format_plan
from jaxlake.conf import CONF_DIR
from jaxlake.config import to_plain
from jaxlake.io import write_json
from jaxlake.mixture import Mixture
from jaxlake.stats import PairedDifference, paired_difference

EVAL_FORMAT = "jaxlake.eval/1"


# ============================================================================ loading
def plan_token_budget(tokenizer: Any, num_agents: int, max_steps: int) -> int:
    """Tokens for the longest plan of a lake (every agent moving every step) plus end of turn."""
    actions = np.full((max(int(num_agents), 1), max(int(max_steps), 1)), 4, np.int32)  # RIGHT
    text = format_plan(actions)
    return len(tokenizer.encode(text, add_special_tokens=False)) + 2


# ============================================================================ generation
def complete(policy, prompter, lakes, *, temperature: float, top_k: int, top_p: float, max_new_tokens: int,
             batch_size: int, key: jax.Array, mesh=None) -> list[str]:
    """Completions for every lake of a batched ``lakes`` in fixed ``[batch_size, P]`` batches
    (the last batch padded by repeating its first row)."""
    from llm.generation.decode import GenerationConfig
    from llm.training.completions import sample_completions

    ids, mask = prompter.encode(lakes)
    n = ids.shape[0]
    gen = GenerationConfig(max_new_tokens=int(max_new_tokens), temperature=float(temperature), top_k=int(top_k),
                           top_p=float(top_p))
    texts: list[str] = []
    for start in range(0, n, batch_size):
        rows = np.arange(start, min(start + batch_size, n))
        pad = np.full(batch_size - len(rows), rows[0], dtype=rows.dtype)
        idx = np.concatenate([rows, pad])
        out = sample_completions(policy, ids[idx], mask[idx], jax.random.fold_in(key, start), gen, mesh,
                                 reasoning=prompter.config.reasoning)
        texts.extend(out.plans[: len(rows)])  # reasoning mode: the plan after </think>
    return texts


def _modes(eval_cfg: Mapping[str, Any]) -> list[tuple[str, dict]]:
    """The decoding settings of each mode :func:`jaxlake.suite.decoding_modes` says the group scores."""
    sampled = eval_cfg.get("sampled") or {}
    modes = [(mode, {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "num_samples": 1}) if mode == "greedy" else
             (mode, {"temperature": float(sampled.get("temperature", 1.0)), "top_k": int(sampled.get("top_k", 0)),
                     "top_p": float(sampled.get("top_p", 1.0)), "num_samples": n})
             for mode, n in decoding_modes(eval_cfg)]
    if not modes:
        raise ValueError("eval: enable greedy or give sampled.num_samples > 0")
    return modes


def run_modes(policy, prompter, lakes, *, modes, cells_of: np.ndarray, opt_soc: Optional[np.ndarray],
              max_new_tokens: int, batch_size: int, horizon: int, seed: int, mesh=None) -> list[dict]:
    """Episode records of every mode on ``lakes`` (lake ``i`` of cell ``cells_of[i]``)."""
    n = int(np.asarray(lakes.num_agents).shape[0])
    episodes: list[dict] = []
    for m, (mode, s) in enumerate(modes):
        k = s["num_samples"]
        index = np.repeat(np.arange(n), k)
        rep = lakes if k == 1 else take_lakes(lakes, index)
        key = jax.random.fold_in(jax.random.PRNGKey(seed), m)
        texts = complete(policy, prompter, rep, temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"],
                         max_new_tokens=max_new_tokens, batch_size=batch_size, key=jax.random.fold_in(key, 1),
                         mesh=mesh)
        episodes += score_texts(
            rep, texts, jax.random.fold_in(key, 2), lake_ids=index, cell_ids=cells_of[index],
            opt_soc=None if opt_soc is None else opt_soc[index], mode=mode, samples=np.tile(np.arange(k), n),
            horizon=horizon,
        )
    return episodes


# ============================================================================ evaluation
def evaluate_policy(
    policy,
    eval_cfg: Mapping[str, Any],
    prompt_cfg: Any = None,
    *,
    current: Optional[Sequence[tuple[float, Any]]] = None,
    stage: int = 0,
    checkpoint: str = "",
    mesh=None,
    suite: Optional[Suite] = None,
) -> dict:
    """The ``eval.json`` dict of ``policy`` on the suite of ``eval_cfg`` (and on ``current``,
    the training mixture, when given and ``current_env_lakes > 0``)."""
    from llm.game.prompts import PromptConfig
    from llm.game.lakes import env_horizon, sample_lakes
    from llm.game.prompter import Prompter

    t0 = time.perf_counter()
    eval_cfg = to_plain(eval_cfg)
    if prompt_cfg is None or isinstance(prompt_cfg, PromptConfig):
        pcfg = prompt_cfg or PromptConfig()
    else:
        pcfg = PromptConfig.from_dict(to_plain(prompt_cfg))
    solve = bool(eval_cfg.get("planner", True))
    suite = suite or build_suite(eval_cfg, solve=solve)
    modes = _modes(eval_cfg)
    batch_size = int(eval_cfg.get("batch_size", 64))
    seed = int(eval_cfg.get("rollout_seed", 7))
    tok = policy.tokenizer

    lakes = suite.lakes
    horizon = int(np.max(np.asarray(lakes.max_steps)))
    current_lakes = None
    n_current = int(eval_cfg.get("current_env_lakes", 0) or 0)
    sizes = [(int(np.max(np.asarray(lakes.num_agents))), horizon)]
    if current and n_current > 0:
        current_lakes = sample_lakes(jax.random.PRNGKey(int(suite.spec.seed) + 7919 * (stage + 1)), list(current),
                                     n_current)
        sizes.append((int(np.max(np.asarray(current_lakes.num_agents))), env_horizon(list(current))))
        horizon = max(horizon, env_horizon(list(current)))  # one rollout horizon: fewer compiles
    max_new = eval_cfg.get("max_new_tokens")
    if max_new is None:
        max_new = max(plan_token_budget(tok, a, t) for a, t in sizes)
    probe = lakes
    prompter = Prompter.fit(tok, pcfg, probe, None, 16)

    episodes = run_modes(policy, prompter, lakes, modes=modes, cells_of=np.asarray([c["id"] for c in suite.cells])[suite.cell_of],
                         opt_soc=suite.opt_soc, max_new_tokens=int(max_new), batch_size=batch_size, horizon=horizon,
                         seed=seed, mesh=mesh)
    cells = suite.cells
    result: dict[str, Any] = {
        "format": EVAL_FORMAT,
        "checkpoint": str(checkpoint),
        "stage": stage,
        "suite": suite.describe(),
        "grids": suite.grids,
        "modes": {mode: aggregate([e for e in episodes if e["mode"] == mode], cells, suite.dims) for mode, _ in modes},
        "episodes": episodes,
    }
    result["score"] = result["modes"][modes[0][0]]["score"]

    if current_lakes is not None:
        result["current_env"] = current_env_eval(
            Mixture.of(list(current)), current_lakes, n_current, modes, solve,
            lambda lakes, cells_of, opt_soc: run_modes(
                policy, prompter, lakes, modes=modes, cells_of=cells_of, opt_soc=opt_soc, max_new_tokens=int(max_new),
                batch_size=batch_size, horizon=horizon, seed=seed + 1, mesh=mesh))
    result["settings"] = {
        "modes": {m: s for m, s in modes},
        "max_new_tokens": int(max_new),
        "prompt_tokens": int(prompter.length),
        "batch_size": batch_size,
        "rollout_seed": seed,
        "prompt": dataclasses.asdict(pcfg),
    }
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    return result


def write_eval(path: str | os.PathLike, result: Mapping[str, Any]) -> Path:
    """Write ``eval.json`` atomically (a temporary file renamed into place)."""
    return write_json(path, result, indent=None)


def is_suite_eval(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a complete ``eval.json`` written by this module."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8")).get("format") == EVAL_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


#: The ``eval.json["suite"]`` keys that fix its lakes (the name and the planner share do not).
SUITE_IDENTITY = ("seed", "lakes_per_cell", "cells")


def check_same_suite(mine: Mapping[str, Any], theirs: Mapping[str, Any], where: str) -> None:
    """Raise ``ValueError`` (naming ``where``) unless two ``eval.json["suite"]`` descriptions
    hold the same lakes (:data:`SUITE_IDENTITY`)."""
    for key in SUITE_IDENTITY:
        if mine.get(key) != theirs.get(key):
            raise ValueError(f"{where}: another suite ({key} {theirs.get(key)!r} there, {mine.get(key)!r} here); "
                             "pair evaluations of the same --eval")


def _first_samples(result: Mapping[str, Any], mode: str, where: str) -> dict:
    episodes = result.get("episodes")
    if not isinstance(episodes, list):
        raise ValueError(f"{where}: no episode list (an archived eval.json keeps its episodes as columns; "
                         "compare the run folder's file)")
    return lake_outcomes(episodes, mode)


def paired_against(result: Mapping[str, Any], other: Mapping[str, Any], mode: Optional[str] = None,
                   where: str = "--against") -> tuple[str, PairedDifference]:
    """``(mode, difference)`` of ``result`` against ``other``, two ``eval.json`` dicts of the
    same suite, paired lake by lake on each lake's first completion in ``mode`` (default: the
    first mode both have, greedy when on). Raises ``ValueError`` (naming ``where``) when the
    suites' lakes differ or the mode is missing."""
    check_same_suite(result.get("suite") or {}, other.get("suite") or {}, where)
    modes = [m for m in result.get("modes", {}) if m in other.get("modes", {})]
    mode = mode or (modes[0] if modes else None)
    if mode not in modes:
        raise ValueError(f"{where}: mode {mode!r} not in both evaluations (both have {modes})")
    a, b = _first_samples(other, mode, where), _first_samples(result, mode, "this evaluation")
    if set(a) != set(b):
        raise ValueError(f"{where}: the two evaluations hold different lakes ({len(a)} there, {len(b)} here)")
    keys = sorted(a)
    return mode, paired_difference([a[k] for k in keys], [b[k] for k in keys])


def checkpoint_prompt(checkpoint: str, prompt: Optional[str] = None) -> Any:
    """The prompt a policy is evaluated with: ``prompt`` (a ``conf/prompt`` name or a YAML path)
    when given; else the one a pretrained folder's ``pretrain.json`` records (a shipped policy:
    ``llm/game/novice`` reads the compact prompt, ``llm/game/planner`` its traced one); else the
    run config's (:func:`llm.game.prompts.default_prompt_name`)."""
    from llm.game.prompts import PromptConfig, default_prompt_name, load_prompt_config

    if prompt:
        return load_prompt_config(prompt)
    record = Path(checkpoint) / "pretrain.json"
    if checkpoint != "default" and record.is_file():
        trained = (json.loads(record.read_text()).get("settings") or {}).get("prompt")
        if trained:
            return PromptConfig.from_dict(trained)
    return load_prompt_config(default_prompt_name())


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="HF folder, orbax checkpoint dir, or 'default' (embedded model)")
    parser.add_argument("--eval", default="default", help="conf/eval/<name>.yaml or a YAML path (default: default)")
    parser.add_argument("--prompt", default=None,
                        help="conf/prompt/<name>.yaml or a YAML path (default: the one the checkpoint's pretrain.json "
                             "records, else the run config's, conf/config.yaml)")
    parser.add_argument("--model", default=None, help="conf/model/<name>.yaml for an orbax checkpoint's tokenizer")
    parser.add_argument("--out", type=Path, default=Path("eval.json"))
    parser.add_argument("--against", type=Path, default=None,
                        help="an eval.json of the same suite (e.g. the starting policy's): print and record the "
                             "paired difference to it")
    args = parser.parse_args(argv)
    other = None
    if args.against is not None:  # read before the evaluation: a bad file fails in a second
        try:
            other = json.loads(args.against.read_text())
        except (OSError, ValueError) as err:
            print(f"error: --against {args.against}: {err}", file=sys.stderr)
            return 2
    from omegaconf import OmegaConf

    from llm.training.policy import load_policy
    from llm.training.config import ModelConfig

    model = None
    if args.model:
        model = ModelConfig.from_dict(to_plain(OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml")))
    eval_cfg = to_plain(load_eval_conf(args.eval))
    if other is not None:  # the suite is built (and cached for the evaluation) before the policy runs
        suite = build_suite(eval_cfg, solve=bool(eval_cfg.get("planner", True)))
        try:
            check_same_suite(suite.describe(), other.get("suite") or {}, f"--against {args.against}")
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    policy = load_policy(model, None if args.checkpoint == "default" else args.checkpoint)
    result = evaluate_policy(policy, eval_cfg, checkpoint_prompt(args.checkpoint, args.prompt),
                             checkpoint=args.checkpoint)
    paired = None
    if other is not None:
        try:
            paired = paired_against(result, other, where=f"--against {args.against}")
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        result["against"] = {"path": str(args.against), "checkpoint": other.get("checkpoint"), "mode": paired[0],
                             **dataclasses.asdict(paired[1])}
    write_eval(args.out, result)
    scores = ", ".join(f"{m} {r['score']:.3f}" for m, r in result["modes"].items())
    print(f"{args.checkpoint}: {scores} over {result['suite']['num_lakes']} lakes -> {args.out}")
    if paired is not None:
        print(f"against {other.get('checkpoint') or args.against} ({paired[0]}): {paired[1].line()}")
    mode = paired[0] if paired is not None else next(iter(result["modes"]), None)
    if mode is not None:
        mine = failed_by_kind(result["episodes"], mode)
        theirs = failed_by_kind(other["episodes"], mode) if paired is not None else None
        print(f"failed lakes ({mode}): " + ", ".join(
            f"{k} {theirs[k]} -> {mine[k]}" if theirs is not None else f"{k} {mine[k]}" for k in FAILURE_KINDS))
    if paired is not None:
        moved = moved_cells(other["episodes"], result["episodes"], result["suite"]["cells"], mode)
        print(f"cells that moved ({mode}, lakes solved): " + ("; ".join(
            f"{cell_label(c['values'])}: {x} -> {y} of {n}" for c, x, y, n in moved) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
