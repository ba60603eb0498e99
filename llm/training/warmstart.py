"""Supervised warm start: teach a from-scratch policy the reference planner's plans.

Each step draws ``batch_size`` lakes (deterministic in the step), solves them with
:func:`jaxlake.planner.solve`, writes the plans with :func:`jaxlake.text.format_plan`
followed by the end-of-turn token, and minimises the token-mean negative log-likelihood of
the *completion tokens only* (prompt tokens take no loss), in the same prompt/completion
layout the GRPO forward uses. Lakes the planner cannot solve take no loss.

Checkpoints use the same format as GRPO (:class:`llm.training.phase.Checkpoints`), so a warm-start
checkpoint is a policy checkpoint.

**Reasoning form** (``prompt.reasoning.warmstart: true``, for models trained from scratch in
reasoning mode): the target is ``<think>`` + :func:`reasoning_text` + ``</think>`` + the plan,
where the reasoning is templated from the planner's own solution and therefore true. Style
``checks``: each agent's path with the cells it tried toward its goal and found to be holes
(:func:`check_lines`); ``crowd``: the same with the cells an earlier agent takes. The styles
``summary`` and ``paths`` are experiments (:mod:`llm.training.experiments.traces`). It is cut,
whole lines at a time, to fit the thinking budget, so the model learns to close the block in
time. Off by default: a pretrained model thinks in its own words and templated text would
overwrite them.

The planner solves each step's lakes once (:class:`Drawn`): the selection of the batch, its
shares and its targets share one solve.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlake import planner
from jaxlake.types import ON_GOAL_STAY
from jaxlake.baselines import straight_blocked
from jaxlake.metrics import MetricsWriter
from jaxlake.mixture import Mixture
from jaxlake.text import format_plan
from llm.game import prompts
from llm.generation.reasoning import THINK_CLOSE, THINK_OPEN, WARMSTART_STYLES
from llm.model import distributed as dist
from llm.model import sharding as shd
from llm.game.lakes import sample_lakes
from llm.rl.optim import apply_gradients, make_optimizer, schedule_value
from llm.training.packing import PackedBatch, pack_batch, packed_forward
from llm.training.phase import Checkpoints, PhaseResult, progress_bar
from llm.training.policy import Policy
from llm.game.prompter import Prompter
from llm.generation.stops import eos_and_pad
from llm.training.config import TrainConfig
from llm.rl.batches import TokenBatch
from llm.rl.updates import accumulate_gradients, token_nll, weighted_nll
from llm.training.experiments.detour import detour_lakes
from llm.training.experiments.traces import path_lines, reasoning_lines
from llm.rl.reuse import reused



def _letter(i: int) -> str:
    return chr(ord("A") + int(i))


#: With ``warmstart.blocked_share > 0`` each step draws this many times its batch and keeps
#: the batch from it (:func:`select_blocked`).
BLOCKED_POOL = 4
#: With ``warmstart.crowded_share > 0`` the pool is this many times the batch instead: lakes
#: where one agent's way meets another's (:func:`crowded_lakes`) are about a sixth of the
#: engineer's space (the warm start's ``crowded_share`` metric) and a tenth of 5x5 two-agent
#: lakes at conflict density 1.
CROWDED_POOL = 8
#: What :func:`check_lines` writes after a cell it tried and found to be a hole.
HOLE_MARK = "~"
#: What :func:`check_lines` (``agents=True``, style ``crowd``) writes after a cell it tried
#: that an earlier agent takes at the next time step (or swaps through).
AGENT_MARK = "!"
#: The marks :func:`token_weights` weighs with ``mark_weight``.
MARKS = (HOLE_MARK, AGENT_MARK)


def toward_goal(here: tuple[int, int], goal: tuple[int, int]) -> list[tuple[int, int]]:
    """The cells one step from ``here`` toward ``goal``, in the straight walk's order: the
    row move first (if the rows differ), then the column move (if the columns differ)."""
    (r, c), (gr, gc) = here, goal
    out = []
    if gr != r:
        out.append((r + (1 if gr > r else -1), c))
    if gc != c:
        out.append((r, c + (1 if gc > c else -1)))
    return out


def check_lines(solution: planner.Solution, num_agents: int, holes: np.ndarray, cell: str = " {row}{col}",
                *, agents: bool = False, stays: bool = False) -> list[str]:
    """Each agent's path as :func:`path_lines` writes it, with the cells it checked on the way.

    Before each step, the cells toward the agent's goal (:func:`toward_goal`: the row move,
    then the column move) are tried in that order; each one that is a hole of ``holes``
    (``[H, W]`` bool) is written, followed by :data:`HOLE_MARK`, until one is not. Then the
    path's next cell follows. ``A 23 13~ 22 12 11 10``: from row 2 col 3, the step up
    toward the goal is a hole, so A goes left. The path is the reference planner's, so the
    cell after a mark may be any free neighbour (or a wait); every cell without a mark is
    the path, and the plan is the differences of those cells.

    With ``agents`` (style ``crowd``) a tried cell that an *earlier* agent (a line above, which
    the model has already written) takes over the same step is written too, followed by
    :data:`AGENT_MARK`: ``B 20 21! 20 21``: the step right meets A, so B waits. "Takes" is
    the reference planner's own test (:class:`jaxlake.planner.Reservations` of the earlier
    paths): the cell is occupied at the next step (``stays``: arrived agents stay on their
    goals for good), or an agent moves from it to this one (a swap).
    """
    if not solution.found:
        return []
    holes = np.asarray(holes, bool)
    width = holes.shape[1]
    flat = lambda rc: rc[0] * width + rc[1]  # noqa: E731 (the planner's cell index)
    lines, earlier = [], planner.Reservations()
    for i in range(int(num_agents)):
        path = [(int(r), int(c)) for r, c in np.asarray(solution.paths[i])]
        goal = path[-1]
        text = _letter(i) + cell.format(row=path[0][0], col=path[0][1])
        for t, (here, nxt) in enumerate(zip(path, path[1:])):
            for cand in toward_goal(here, goal):
                if holes[cand]:
                    text += cell.format(row=cand[0], col=cand[1]) + HOLE_MARK
                elif agents and not (earlier.cell_free(t + 1, flat(cand))
                                     and earlier.move_free(t, flat(here), flat(cand))):
                    text += cell.format(row=cand[0], col=cand[1]) + AGENT_MARK
                else:
                    break
            text += cell.format(row=nxt[0], col=nxt[1])
        lines.append(text)
        earlier.add([flat(rc) for rc in path], stays)
    return lines


def reasoning_text(solution: planner.Solution, num_agents: int, tokenizer: Any = None,
                   max_tokens: Optional[int] = None, style: str = "summary", cell: str = " {row}{col}",
                   holes: Optional[np.ndarray] = None, stays: bool = False) -> str:
    """The think block of a warm-start target: ``<think>\n`` lines ``\n</think>``.

    ``style`` picks the lines (``summary``: :func:`reasoning_lines`; ``paths``:
    :func:`path_lines`, cells written by ``cell``; ``checks``: :func:`check_lines`, which
    needs the lake's ``holes``; ``crowd``: the same with the earlier agents' cells checked too,
    ``stays`` saying whether arrived agents stay on their goals). With ``tokenizer`` and ``max_tokens``, whole lines are
    dropped from the end until the block (tags included) fits in ``max_tokens`` tokens (the
    thinking budget).
    """
    if style not in WARMSTART_STYLES:
        raise ValueError(f"style={style!r} not one of {list(WARMSTART_STYLES)}")
    if style == "summary":  # the experiments' traces (llm.training.experiments.traces)
        lines = reasoning_lines(solution, num_agents)
    elif style == "paths":
        lines = path_lines(solution, num_agents, cell)
    else:
        if holes is None:
            raise ValueError(f"style={style!r} needs the lake's holes")
        lines = check_lines(solution, num_agents, holes, cell, agents=style == "crowd", stays=stays)
    while True:
        block = f"{THINK_OPEN}\n" + "\n".join(lines) + f"\n{THINK_CLOSE}"
        if tokenizer is None or max_tokens is None or not lines:
            return block
        if len(tokenizer.encode(block, add_special_tokens=False)) <= max_tokens:
            return block
        lines = lines[:-1]


def plan_targets(lakes, tokenizer, length: int, thinking_tokens: Optional[int] = None, *,
                 style: str = "summary", cell: str = " {row}{col}", solutions: Optional[Sequence] = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Reference-planner completions of a batch of lakes as right-padded token ids.

    Returns ``(tokens [N, length] int32, mask [N, length] bool, solved [N] bool, texts)``;
    a completion is the plan text then the end-of-turn id; unsolved lakes get an empty mask.
    Plans longer than ``length`` tokens are cut (and counted as unsolved: the policy must
    learn whole plans). With ``thinking_tokens`` (reasoning form), the plan follows the
    templated think block of :func:`reasoning_text` (at most ``thinking_tokens`` tokens) and
    a blank line, and ``length`` must leave room for both; ``style`` and ``cell`` are
    :func:`reasoning_text`'s. ``solutions``: the planner's solutions of ``lakes`` when already
    solved (:meth:`Drawn.solve`), else the planner solves them here.
    """
    sols = planner.solve_batch(lakes).solutions if solutions is None else list(solutions)
    _, pad = eos_and_pad(tokenizer)
    n = len(sols)
    tokens = np.full((n, length), pad, np.int32)
    mask = np.zeros((n, length), bool)
    solved = np.zeros((n,), bool)
    texts = []
    num_agents = np.asarray(lakes.num_agents)
    holes = np.asarray(lakes.holes, bool)
    stays = np.asarray(lakes.on_goal) == ON_GOAL_STAY
    for i, sol in enumerate(sols):
        text = format_plan(sol.actions, int(num_agents[i])) if sol.found else ""
        if sol.found and thinking_tokens is not None:
            text = reasoning_text(sol, int(num_agents[i]), tokenizer, thinking_tokens, style, cell,
                                  holes=holes[i], stays=bool(stays[i])) + "\n\n" + text
        texts.append(text)
        if not sol.found:
            continue
        ids = prompts.completion_ids(text, tokenizer)
        if len(ids) > length:
            continue
        tokens[i, : len(ids)] = ids
        mask[i, : len(ids)] = True
        solved[i] = True
    return tokens, mask, solved, texts


def select_blocked(lakes, n: int, share: float):
    """``n`` of the batched ``lakes`` (a pool drawn larger than ``n``), at least ``ceil(share *
    n)`` of them :func:`straight_blocked` where the pool has that many: the first blocked
    lakes, then the first others, in pool order (so deterministic in the pool)."""
    return select_shares(lakes, n, [(straight_blocked(lakes), share)])



def crowded_lakes(lakes, solutions: Optional[list] = None) -> np.ndarray:
    """``[N]`` bool: the ``crowd`` trace of the lake's reference plan writes an agent mark
    (:data:`AGENT_MARK`): on the way, some agent tries a cell toward its goal that an earlier
    agent takes over the same step, so its plan must wait or go round (:func:`check_lines`
    with ``agents``): the lakes where checking the other agents changes the trace. A host
    loop (``solutions``: the batch's, when already solved)."""
    sols = planner.solve_batch(lakes).solutions if solutions is None else solutions
    counts, holes = np.asarray(lakes.num_agents), np.asarray(lakes.holes, bool)
    stays = np.asarray(lakes.on_goal) == ON_GOAL_STAY
    return np.array([sol.found and any(AGENT_MARK in line for line in check_lines(
        sol, int(counts[i]), holes[i], agents=True, stays=bool(stays[i]))) for i, sol in enumerate(sols)], bool)


def select_shares(lakes, n: int, wants: list) -> Any:
    """``n`` of the batched ``lakes`` (a pool): for each ``(flags [pool] bool, share)`` in order,
    up to ``ceil(share * n)`` flagged lakes not yet taken, then the first others, each in pool
    order; the batch keeps pool order (deterministic in the pool)."""
    index = share_index(int(np.asarray(lakes.num_agents).shape[0]), n, wants)
    return jax.tree_util.tree_map(lambda x: x[index], lakes)


def share_index(size: int, n: int, wants: list) -> np.ndarray:
    """``[n]`` rows of a pool of ``size`` that :func:`select_shares` keeps, in pool order."""
    taken = np.zeros((size,), bool)
    for flags, share in wants:
        want = int(np.ceil(share * n)) if share > 0 else 0
        room = n - int(taken.sum())
        taken[np.flatnonzero(np.asarray(flags, bool) & ~taken)[: min(want, room)]] = True
    taken[np.flatnonzero(~taken)[: n - int(taken.sum())]] = True
    return np.flatnonzero(taken)


def token_weights(tokens: np.ndarray, mask: np.ndarray, tokenizer: Any, mark_weight: float) -> np.ndarray:
    """``[N, T]`` float32 loss weights before normalisation: 1 on every target token, and
    ``mark_weight`` on the :data:`MARKS` tokens (styles ``checks`` and ``crowd``: the look-up
    of a tried cell in the hole line or in an earlier agent's path, the decision the plan
    turns on and a few per cent of the tokens)."""
    scale = mask.astype(np.float32)
    if mark_weight != 1.0:
        for symbol in MARKS:
            mark = tokenizer.encode(symbol, add_special_tokens=False)
            if len(mark) != 1:
                raise ValueError(f"train.warmstart.mark_weight={mark_weight} needs the mark {symbol!r} to be one "
                                 f"token of the tokenizer, it is {len(mark)}")
            scale = np.where(mask & (tokens == mark[0]), np.float32(mark_weight), scale)
    return scale


def reference_lakes(key: jax.Array, env: Mixture, n: int, wc: Any):
    """The ``n`` lakes of one supervised batch: fresh lakes of ``env`` (its components drawn at
    random, ``split="random"``), of which at least ``wc.detour_share`` are lakes whose
    reference path detours (:func:`detour_lakes`, taken first: the rarest), then at least
    ``wc.crowded_share`` lakes where one agent's way meets another's (:func:`crowded_lakes`)
    and at least ``wc.blocked_share`` lakes whose straight walk meets a hole, picked from a
    pool :data:`BLOCKED_POOL` times larger when any share is asked for (:data:`CROWDED_POOL`
    times with ``crowded_share``). ``wc``: a
    :class:`llm.training.config.WarmStartConfig`. Deterministic in ``key``."""
    return reference_draw(key, env, n, wc).lakes


def _horizon(lakes) -> int:
    """The horizon :func:`jaxlake.planner.solve_batch` plans a batch at: its largest ``max_steps``."""
    return int(np.max(np.asarray(lakes.max_steps)))


@dataclasses.dataclass(frozen=True)
class Drawn:
    """The lakes of a supervised batch and, when drawing them took the planner, its solutions
    of them (``solutions``, planned at ``horizon``: the pool's)."""

    lakes: Any
    solutions: Optional[tuple] = None
    horizon: Optional[int] = None

    def take(self, rows: slice) -> "Drawn":
        """Rows ``rows`` of the batch (host arrays: :func:`llm.model.distributed.take_rows`)."""
        sols = None if self.solutions is None else self.solutions[rows]
        return Drawn(dist.take_rows(self.lakes, rows), sols, self.horizon)

    def solve(self) -> list:
        """The planner's solutions of :attr:`lakes` as ``solve_batch(lakes)`` finds them: those
        of the draw when it planned at the batch's own horizon (the planner is deterministic
        per lake and horizon), else solved now."""
        if self.solutions is not None and self.horizon == _horizon(self.lakes):
            return list(self.solutions)
        return list(planner.solve_batch(self.lakes).solutions)


def reference_draw(key: jax.Array, env: Mixture, n: int, wc: Any) -> Drawn:
    """:func:`reference_lakes`, with the planner's solutions when the selection needed them
    (``detour_share`` or ``crowded_share``: the pool is solved to find those lakes)."""
    selecting = wc.blocked_share > 0 or wc.detour_share > 0 or wc.crowded_share > 0
    pool = CROWDED_POOL if wc.crowded_share > 0 else BLOCKED_POOL if selecting else 1
    lakes = sample_lakes(key, env, n * pool, split="random")
    if not selecting:
        return Drawn(lakes)
    sols = planner.solve_batch(lakes).solutions if wc.detour_share > 0 or wc.crowded_share > 0 else None
    wants = [(detour_lakes(lakes, sols), wc.detour_share)] if wc.detour_share > 0 else []
    wants += [(crowded_lakes(lakes, sols), wc.crowded_share)] if wc.crowded_share > 0 else []
    index = share_index(n * pool, n, wants + [(straight_blocked(lakes), wc.blocked_share)])
    chosen = jax.tree_util.tree_map(lambda x: x[index], lakes)
    if sols is None:
        return Drawn(chosen)
    return Drawn(chosen, tuple(sols[i] for i in index), _horizon(lakes))


def reference_rows(lakes, tokenizer: Any, prompter: Prompter, completion_len: int, thinking_tokens: Optional[int],
                   mark_weight: float, solutions: Optional[Sequence] = None) -> tuple[np.ndarray, ...]:
    """The supervised rows of ``lakes``: ``(prompt_ids [N, P], prompt_mask [N, P], tokens
    [N, T], mask [N, T], scale [N, T] float32, solved [N] bool)`` -- the prompts as
    ``prompter`` encodes them, the reference planner's completions (:func:`plan_targets`, in
    the prompter's trace style and cell spelling; ``T = completion_len``, which must hold the
    think block when ``thinking_tokens`` is given) and each token's loss weight before
    normalisation (:func:`token_weights`). ``solutions``: :func:`plan_targets`'s."""
    tokens, mask, solved, _ = plan_targets(lakes, tokenizer, completion_len, thinking_tokens,
                                           style=prompter.config.reasoning.warmstart_style, cell=prompter.config.cell,
                                           solutions=solutions)
    ids, pmask = prompter.encode(lakes)
    return ids, pmask, tokens, mask, token_weights(tokens, mask, tokenizer, mark_weight), solved


@dataclasses.dataclass(frozen=True)
class SideRows:
    """Supervised rows of another task trained beside the plans in every warm-start step.

    ``rows(step)`` gives step ``step``'s :class:`~llm.rl.batches.TokenBatch` (numpy, a fixed
    shape; weights summing to 1 over its rows), deterministic in the step; the step's loss is
    the plans' plus ``weight`` times these rows'. The engineer's role is taught this way
    (:mod:`llm.engineer.examples`, from :mod:`jaxlake.pipeline.pretrain`); ``name`` prefixes
    its metrics (``engineer_nll``, ``engineer_acc``).
    """

    rows: Callable[[int], TokenBatch]
    weight: float = 1.0
    name: str = "engineer"


@reused
def make_sft_update(graphdef: Any, optimizer: optax.GradientTransformation, *, micro_batches: int = 1,
                    mesh=None, side_weight: float = 0.0, side_name: str = "side") -> Callable:
    """Jitted ``(state, opt_state, batch) -> (state, opt_state, metrics)`` for the warm start.

    ``batch``: a :class:`llm.rl.batches.TokenBatch` (weights = :func:`token_weights` over their
    sum on the global batch: the token mean when ``mark_weight`` is 1), or a packed one; or
    ``(plans, side)`` with a :class:`SideRows` batch beside them (the loss adds ``side_weight``
    times the side rows' weighted nll). Metrics: ``nll`` (the plans' weighted mean),
    ``token_acc`` (arg-max == target), ``loss``, ``grad_norm``; with side rows
    ``<side_name>_nll`` and ``<side_name>_acc``.
    """

    def plan_loss(state, mb):
        if not isinstance(mb, PackedBatch):  # the pytree's type is static: one branch is traced
            return token_nll(graphdef, state, mb)
        return weighted_nll(*packed_forward(graphdef, state, mb), mb.weights)

    def loss_fn(state, mb):
        if not isinstance(mb, tuple):
            loss, m = plan_loss(state, mb)
            return loss, {**m, "nll": loss}
        plans, side = mb
        loss, m = plan_loss(state, plans)
        s_loss, s_m = token_nll(graphdef, state, side)
        return loss + side_weight * s_loss, {**m, "nll": loss, f"{side_name}_nll": s_loss,
                                             f"{side_name}_acc": s_m["token_acc"]}

    def update(state, opt_state, batch):
        first = batch[0] if isinstance(batch, tuple) else batch
        if not isinstance(first, (TokenBatch, PackedBatch)):
            raise TypeError(f"the warm-start update takes a llm.rl.batches.TokenBatch or a "
                            f"llm.training.packing.PackedBatch, got {type(first).__name__}")
        loss, msum, grads = accumulate_gradients(loss_fn, state, batch, micro_batches, mesh)
        state, opt_state, gnorm = apply_gradients(optimizer, state, opt_state, grads, mesh)
        return state, opt_state, {**msum, "loss": loss, "grad_norm": gnorm}

    return jax.jit(update, donate_argnums=(0, 1))


def run_warmstart(
    policy: Policy,
    config: TrainConfig,
    env: Mixture,
    checkpoint_dir: str | os.PathLike,
    metrics: MetricsWriter,
    prompter: Prompter,
    completion_len: int,
    mesh=None,
    max_steps: Optional[int] = None,
    prefetch: Optional[bool] = None,
    side: Optional[SideRows] = None,
) -> PhaseResult:
    """Run (or resume) the warm start; rows ``phase="warmstart"`` go to ``metrics``.

    ``prefetch``: prepare each step's batch (lakes drawn, planned, encoded, packed) on a
    thread while the step before it updates; ``None``: whenever the run has one process
    (several prepare in line: the row gather is a collective whose order they must keep). The
    data is keyed by step, so both ways train on the same batches. ``side``: rows of another
    task in every step (:class:`SideRows`; one process; split over the mesh's data axis)."""
    wc = config.warmstart
    optimizer = make_optimizer(wc.optim, wc.steps)
    if mesh is not None:
        shd.check_divisible(wc.batch_size // wc.micro_batches, mesh, "warmstart rows per micro-batch")
    ckpt = Checkpoints(checkpoint_dir, wc.keep_checkpoints, mesh)
    state, opt_state, start, rng, resumed = ckpt.start(policy, optimizer, config.seed)
    metrics.truncate("warmstart", start, drop_later=start < wc.steps)
    if mesh is not None:
        state, opt_state = shd.place_state(state, mesh), shd.place_opt_state(opt_state, state, mesh)
    if wc.pack_rows:
        if jax.process_count() > 1:
            raise ValueError("train.warmstart.pack_rows > 0 runs in one process (each process would pack its own "
                             "rows); set it to 0 for a multi-process warm start")
        if mesh is not None:
            shd.check_divisible(wc.pack_rows // wc.micro_batches, mesh, "warmstart packed rows per micro-batch")
    if side is not None and jax.process_count() > 1:
        raise ValueError("side rows in the warm start (pretraining the engineer's role) run in one process")
    update = make_sft_update(policy.graphdef, optimizer, micro_batches=wc.micro_batches, mesh=mesh,
                             side_weight=0.0 if side is None else float(side.weight),
                             side_name="side" if side is None else side.name)
    data_key = jax.random.fold_in(rng, 21)
    reasoning = prompter.config.reasoning
    thinking_tokens = None
    if reasoning.enabled and reasoning.warmstart:
        thinking_tokens = reasoning.thinking_tokens
        completion_len = completion_len + thinking_tokens
    end = wc.steps if max_steps is None else min(wc.steps, max_steps)
    bar = progress_bar(wc.steps, start, "warmstart", config.progress)
    rows_sharding = shd.batch_sharding(mesh) if mesh is not None else None
    _, pad_id = eos_and_pad(policy.tokenizer)

    def prepare(step: int) -> tuple:
        """Step ``step``'s batch, drawn, planned, encoded, packed and placed, and the batch's
        shares for its metrics row: a step's host work, which a one-process run does on a
        thread while the step before it updates."""
        drawn = reference_draw(jax.random.fold_in(data_key, step), env, wc.batch_size, wc)  # the same on every process
        shares = {"blocked_share": float(straight_blocked(drawn.lakes).mean())}
        drawn = drawn.take(dist.process_rows(wc.batch_size, rows_sharding))  # this process plans and encodes its rows
        lakes, sols = drawn.lakes, drawn.solve()  # one solve for the shares and the targets
        if wc.detour_share > 0:
            shares["detour_share"] = float(detour_lakes(lakes, sols).mean())
        if wc.crowded_share > 0 or reasoning.warmstart_style == "crowd":
            shares["crowded_share"] = float(crowded_lakes(lakes, sols).mean())
        ids, pmask, tokens, mask, scale, solved = reference_rows(lakes, policy.tokenizer, prompter, completion_len,
                                                                 thinking_tokens, wc.mark_weight, sols)
        solved_all, target_all, prompt_all, scale_all = dist.gather_rows((solved, mask.sum(1), pmask.sum(1),
                                                                          scale.sum(1)))
        dropped = 0
        if wc.pack_rows:  # one process: these are all the batch's rows
            batch, dropped = pack_batch(ids, pmask, tokens, mask, scale, rows=wc.pack_rows,
                                        length=ids.shape[1] + tokens.shape[1], pad_id=pad_id)
            batch = shd.shard_batch(batch, mesh) if mesh is not None else jax.tree_util.tree_map(jnp.asarray, batch)
        else:
            weights = scale / max(scale_all.sum(), 1e-9)
            batch = TokenBatch(prompt_ids=ids, prompt_mask=pmask, tokens=tokens, mask=mask,
                               weights=weights.astype(np.float32))
            batch = dist.global_batch(batch, rows_sharding, wc.batch_size) if mesh is not None else jax.tree_util.tree_map(jnp.asarray, batch)
        if side is not None:
            rows = side.rows(step)
            if mesh is not None:
                shd.check_divisible(rows.rows, mesh, "the warm start's side rows")
            rows = shd.shard_batch(rows, mesh) if mesh is not None else jax.tree_util.tree_map(jnp.asarray, rows)
            batch = (batch, rows)
        return batch, shares, dropped, solved_all, target_all, prompt_all

    if prefetch is None:
        prefetch = jax.process_count() == 1
    ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warmstart-data") if prefetch else None
    pending = ahead.submit(prepare, start) if ahead is not None and start < end else None
    try:
        for step in range(start, end):
            t0 = time.perf_counter()
            batch, shares, dropped, solved_all, target_all, prompt_all = (
                pending.result() if pending is not None else prepare(step))
            pending = ahead.submit(prepare, step + 1) if ahead is not None and step + 1 < end else None
            t_upd = time.perf_counter()
            state, opt_state, m = update(state, opt_state, batch)
            m = jax.device_get(m)
            t_end = time.perf_counter()
            processed = int(prompt_all.sum() + target_all.sum())
            row = {"phase": "warmstart", "step": step + 1, **{k: float(v) for k, v in m.items()},
                   "solved_share": float(solved_all.mean()), **shares,
                   "target_len": float(target_all[solved_all].mean()) if solved_all.any() else 0.0,
                   **({"packed_dropped": dropped} if wc.pack_rows else {}),
                   "lr": schedule_value(wc.optim, wc.steps, step),
                   "time/step_s": t_end - t0, "time/data_wait_s": t_upd - t0, "time/update_s": t_end - t_upd,
                   "train_tokens_per_s": processed / max(t_end - t_upd, 1e-9)}
            if (step + 1) % wc.log_every == 0 or step + 1 == end:
                metrics.append(row)
            else:
                metrics.append({"phase": "warmstart", "step": step + 1, "nll": row["nll"],
                                **({f"{side.name}_nll": row[f"{side.name}_nll"]} if side is not None else {}),
                                "time/step_s": row["time/step_s"]})
            bar.update(1)
            bar.set_postfix(nll=f"{row['nll']:.3f}", acc=f"{row['token_acc']:.3f}")
            if (step + 1) % wc.checkpoint_every == 0 or step + 1 == wc.steps:
                ckpt.save(Policy(policy.graphdef, state, policy.tokenizer), opt_state, step + 1, rng, step + 1)
    finally:
        if ahead is not None:  # an interrupted run drops the batch drawn ahead
            ahead.shutdown(wait=True, cancel_futures=True)
    bar.close()
    return PhaseResult(policy=Policy(policy.graphdef, state, policy.tokenizer), step=end, resumed_from=resumed)
