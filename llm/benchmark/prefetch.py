"""``python -m llm.benchmark prefetch``: the warm start's whole step, its batch prepared in line
against on a thread while the step before updates, in one run.

A warm-start step has host work before its update: drawing fresh lakes (from a pool several
times the batch when shares of blocked, crowded or detour lakes are asked for), solving them with
the reference planner, writing and tokenizing the traced plans, packing the rows. With one
process :func:`llm.training.warmstart.run_warmstart` prepares the next step's batch on a thread
while the current step updates (``prefetch``). This benchmark runs the same ``--steps`` warm-start
steps twice from the shipped planner, the same batches both ways (the data is keyed by step), on
pretraining's recipe: every config of the engineer's space around ``env=tiny``, 32 lakes a step
packed into 16 rows, the planner prompt with the ``--style`` trace, the ``--blocked-share`` /
``--crowded-share`` of ``python -m jaxlake.pretrain``'s fifth step. Reported per way: the median
seconds a step (the first step, which compiles, left out), the median seconds a step waited for
its batch, the whole loop's wall time (after an untimed two-step run that compiles the data
path for both), and the speed-up of the median step against in line, measured in this run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from jaxlake.io import write_json
from llm.benchmark.pack import PLAN_TOKENS, PROMPT_TOKENS, pretraining_space


def prefetch_main(argv: list[str] | None = None) -> dict[str, Any]:
    import jax
    from flax import nnx

    from jaxlake.metrics import JsonlWriter, read_rows
    from llm.game.default import load_default
    from llm.game.lakes import sample_lakes
    from llm.game.prompter import Prompter
    from llm.game.prompts import load_prompt_config
    from llm.generation.reasoning import WARMSTART_STYLES
    from llm.training.config import StageConfig
    from llm.training.policy import Policy, copy_state
    from llm.training.warmstart import run_warmstart

    p = argparse.ArgumentParser(prog="python -m llm.benchmark prefetch", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="warm-start steps a way (the first compiles, untimed)")
    p.add_argument("--batch", type=int, default=32, help="lakes a step (pretraining's 32)")
    p.add_argument("--pack-rows", type=int, default=16, help="packed rows (pretraining's 16; 0: a lake a row)")
    p.add_argument("--style", default="crowd", help=f"the trace, one of {list(WARMSTART_STYLES)}")
    p.add_argument("--blocked-share", type=float, default=0.5)
    p.add_argument("--crowded-share", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    a = p.parse_args(argv)
    if a.steps < 2 or a.batch < 1:
        p.error(f"--steps={a.steps} must be >= 2 and --batch={a.batch} >= 1")
    if a.style not in WARMSTART_STYLES:
        p.error(f"--style={a.style!r} not in {list(WARMSTART_STYLES)}")
    try:
        train = StageConfig.from_cfg({"train": {
            "seed": a.seed, "progress": False, "max_prompt_tokens": PROMPT_TOKENS,
            "warmstart": {"steps": a.steps, "batch_size": a.batch, "pack_rows": a.pack_rows,
                          "checkpoint_every": a.steps, "keep_checkpoints": 1, "blocked_share": a.blocked_share,
                          "crowded_share": a.crowded_share, "mark_weight": 3.0}}}).train
    except ValueError as err:
        p.error(str(err))

    space = pretraining_space()
    pcfg = load_prompt_config("planner")
    pcfg = dataclasses.replace(pcfg, reasoning=dataclasses.replace(pcfg.reasoning, warmstart_style=a.style))
    model, tokenizer = load_default()
    graphdef, state0 = nnx.split(model)
    probe = sample_lakes(jax.random.PRNGKey(a.seed), space, a.batch, split="random")
    prompter = Prompter.fit(tokenizer, pcfg, probe, PROMPT_TOKENS, 16)

    ways = []
    with tempfile.TemporaryDirectory(prefix="jaxlake-prefetch-") as tmp:
        # untimed: the data path's own compilations (lake draw, planner, packing) happen here,
        # so the way timed first does not pay them for the second
        warm = dataclasses.replace(train, warmstart=dataclasses.replace(train.warmstart, steps=2, checkpoint_every=2))
        with JsonlWriter(Path(tmp) / "warm.jsonl") as writer:
            run_warmstart(Policy(graphdef, copy_state(state0), tokenizer), warm, space, Path(tmp) / "warm", writer,
                          prompter, PLAN_TOKENS, prefetch=False)
        for name, prefetch in (("in line", False), ("prefetched", True)):
            folder = Path(tmp) / name.replace(" ", "_")
            writer = JsonlWriter(folder / "metrics.jsonl")
            t0 = time.perf_counter()
            run_warmstart(Policy(graphdef, copy_state(state0), tokenizer), train, space, folder / "checkpoint", writer,
                          prompter, PLAN_TOKENS, prefetch=prefetch)
            wall = time.perf_counter() - t0
            writer.close()
            rows = [r for r in read_rows(folder / "metrics.jsonl") if r.get("phase") == "warmstart"][1:]
            ways.append({"way": name, "prefetch": prefetch, "steps_timed": len(rows),
                         "step_s": statistics.median(r["time/step_s"] for r in rows),
                         "data_wait_s": statistics.median(r["time/data_wait_s"] for r in rows),
                         "update_s": statistics.median(r["time/update_s"] for r in rows), "wall_s": wall})
    base = ways[0]["step_s"]
    for w in ways:
        w["speedup"] = base / w["step_s"]
    result = {"batch": a.batch, "steps": a.steps, "pack_rows": a.pack_rows, "style": a.style,
              "blocked_share": a.blocked_share, "crowded_share": a.crowded_share, "space_configs": len(space),
              "device": str(jax.devices()[0].platform), "cpu_count": os.cpu_count(), "ways": ways}
    print(f"warm-start steps, {a.batch} lakes of {len(space)} configs a step ({a.style} trace, blocked "
          f"{a.blocked_share}, crowded {a.crowded_share}, {a.pack_rows or a.batch} rows), {a.steps - 1} steps timed, "
          f"{result['device']} ({result['cpu_count']} CPUs)")
    print("| batch prepared | s / step | s waiting for the batch | s updating | wall s | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for w in ways:
        print(f"| {w['way']} | {w['step_s']:.3f} | {w['data_wait_s']:.3f} | {w['update_s']:.3f} | {w['wall_s']:.1f} | "
              f"{w['speedup']:.2f} |")
    if a.out:
        write_json(a.out, result)
    return result
