"""``python -m llm.benchmark pack``: the warm start's update, padded against packed, in one run.

The batches are pretraining's (``python -m jaxlake.pretrain``): ``--batch`` lakes drawn from
every config of the engineer's space around ``env=tiny`` (3750 configs: sizes 2-8, 1-4 agents,
holes 0-0.3, conflicts 0-1), the planner prompt (``conf/prompt/planner.yaml``) at pretraining's
112 prompt tokens, and the reference planner's traced plans as targets. The same ``--steps``
batches go through the padded update (:func:`llm.training.warmstart.make_sft_update`: a
lake a row) and through the packed one (the same update on a :class:`llm.training.packing.PackedBatch`)
for each ``--rows``; each update is compiled first, then timed (device work awaited) step by
step from the same starting weights. Reported per layout: the median seconds a step, the
speed-up against the padded update measured in this run, the share of positions that hold a
lake's tokens, and the lakes left out for lack of room. Host work (drawing lakes, the planner,
tokenizing, packing) is done before timing and not counted.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from jaxlake.io import write_json
from llm.benchmark.roofline import csv_ints, sync

#: pretraining's prompt budget (conf/pretrain.yaml: the largest lake of the space fits)
PROMPT_TOKENS = 112
#: pretraining's plan budget (conf/pretrain.yaml train.grpo.max_new_tokens)
PLAN_TOKENS = 48


def pretraining_space():
    """What ``python -m jaxlake.pretrain`` trains on: every config of the policy engineer's
    space around ``env=tiny``, equal weights (a :class:`jaxlake.mixture.Mixture`)."""
    from omegaconf import OmegaConf

    from jaxlake.config import LakeConfig
    from jaxlake.conf import CONF_DIR
    from jaxlake.engineers.space import space_from_conf

    env = LakeConfig(**OmegaConf.to_container(OmegaConf.load(CONF_DIR / "env" / "tiny.yaml")))
    node = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "engineer" / "policy.yaml")).get("space")
    return space_from_conf(env, node).mixture()


def _batches(tokenizer, batch: int, steps: int, seed: int):
    import jax

    from llm.game.lakes import sample_lakes
    from llm.game.prompter import Prompter
    from llm.game.prompts import load_prompt_config
    from llm.training.warmstart import plan_targets, token_weights

    space = pretraining_space()
    pcfg = load_prompt_config("planner")
    r = pcfg.reasoning
    probe = sample_lakes(jax.random.PRNGKey(seed), space, batch, split="random")
    prompter = Prompter.fit(tokenizer, pcfg, probe, PROMPT_TOKENS, 16)
    out = []
    for step in range(steps):
        lakes = sample_lakes(jax.random.fold_in(jax.random.PRNGKey(seed), step), space, batch, split="random")
        tokens, mask, _, _ = plan_targets(lakes, tokenizer, PLAN_TOKENS + r.thinking_tokens, r.thinking_tokens,
                                          style=r.warmstart_style, cell=pcfg.cell)
        ids, pmask = prompter.encode(lakes)
        out.append((ids, pmask, tokens, mask, token_weights(tokens, mask, tokenizer, 3.0)))
    return out, len(space)


def _time(update, state, opt_state, batches) -> list[float]:
    times = []
    for b in batches:
        t = time.perf_counter()
        state, opt_state, m = update(state, opt_state, b)
        sync(m)
        times.append(time.perf_counter() - t)
    return times


def pack_main(argv: list[str] | None = None) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from llm.game.default import load_default
    from llm.rl.batches import TokenBatch
    from llm.rl.optim import make_optimizer
    from llm.training.config import OptimConfig
    from llm.training.packing import pack_batch
    from llm.training.policy import Policy, copy_state
    from llm.training.warmstart import make_sft_update
    from llm.generation.stops import eos_and_pad

    p = argparse.ArgumentParser(prog="python -m llm.benchmark pack", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32, help="lakes a step (pretraining's 32)")
    p.add_argument("--rows", type=csv_ints, default=[16, 13], help="packed rows to compare, e.g. 16,13")
    p.add_argument("--steps", type=int, default=10, help="batches timed per layout (after one that compiles)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    a = p.parse_args(argv)
    if a.batch < 1 or a.steps < 1 or any(r < 1 or r > a.batch for r in a.rows):
        p.error(f"--batch={a.batch} and --steps={a.steps} must be >= 1, each --rows in [1, batch]")

    model, tokenizer = load_default()
    graphdef, state0 = nnx.split(model)
    policy = Policy(graphdef, state0, tokenizer)
    _, pad_id = eos_and_pad(tokenizer)
    raw, configs = _batches(tokenizer, a.batch, a.steps + 1, a.seed)
    opt = make_optimizer(OptimConfig(lr=1e-6, warmup_steps=0), 10 * (a.steps + 1))
    width = raw[0][0].shape[1] + raw[0][2].shape[1]
    real = float(np.mean([pm.sum() + m.sum() for _, pm, _, m, _ in raw]))

    def padded(ids, pmask, tokens, mask, scale):
        w = (scale / max(scale.sum(), 1e-9)).astype(np.float32)
        return jax.tree_util.tree_map(jnp.asarray, TokenBatch(prompt_ids=ids, prompt_mask=pmask, tokens=tokens,
                                                              mask=mask, weights=w))

    rows_out = []
    layouts = [("padded", 0)] + [(f"packed {r} rows", r) for r in a.rows]
    base = None
    for name, rows in layouts:
        if rows:
            packed = [pack_batch(*x, rows=rows, length=width, pad_id=pad_id) for x in raw]
            batches = [jax.tree_util.tree_map(jnp.asarray, b) for b, _ in packed]
            dropped = int(sum(d for _, d in packed[1:]))
            update = make_sft_update(graphdef, opt)
            positions = rows * width
        else:
            batches = [padded(*x) for x in raw]
            dropped = 0
            update = make_sft_update(graphdef, opt)
            positions = a.batch * width
        state = copy_state(policy.state)
        opt_state = opt.init(state)
        t0 = time.perf_counter()
        state, opt_state, m = update(state, opt_state, batches[0])
        sync(m)
        compile_s = time.perf_counter() - t0
        times = _time(update, state, opt_state, batches[1:])
        step_s = float(np.median(times))
        base = base or step_s
        rows_out.append({"layout": name, "rows": rows or a.batch, "width": width, "step_s": step_s,
                         "speedup": base / step_s, "fill": real / positions, "dropped": dropped,
                         "lakes": a.batch * a.steps, "compile_s": compile_s})
    result = {"batch": a.batch, "steps": a.steps, "space_configs": configs, "real_tokens_per_step": real,
              "device": str(jax.devices()[0].platform), "layouts": rows_out}
    print(f"warm-start update, {a.batch} pretraining lakes a step ({configs} configs), {a.steps} steps timed, "
          f"rows of {width} positions, {real:.0f} real tokens a step")
    print("| layout | rows | s / step | speed-up | positions filled | lakes left out | compile s |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for r in rows_out:
        print(f"| {r['layout']} | {r['rows']} | {r['step_s']:.3f} | {r['speedup']:.2f} | {r['fill']:.0%} | "
              f"{r['dropped']} of {r['lakes']} | {r['compile_s']:.1f} |")
    if a.out:
        write_json(a.out, result)
    return result
