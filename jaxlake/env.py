"""The MAPF-FrozenLake dynamics: ``reset``, ``step`` and ``rollout`` (docs/rules.md#one-step).

All functions are pure, work on one unbatched lake (shapes ``[A]``, ``[A, 2]``, ``[H, W]``
with ``A = max_agents``) and are meant to be ``jax.jit``-ed and ``jax.vmap``-ed over lakes.

One :func:`step` applies, in this order (docs/rules.md#one-step, rules 1-6):

1. **Slip** - each ACTIVE agent with a move action slips with probability ``slip_prob`` to
   one of the two perpendicular directions (1/2 each). STAY never slips.
2. **Walls** - a move that would leave the region keeps the agent in place (``info.wall``;
   not a conflict).
3. **Conflicts** among *present* agents (ACTIVE, plus ARRIVED under ``on_goal="stay"``).
   A *mover* is an ACTIVE agent whose move changes its cell; its *target* is the new cell.
   (a) On the intended targets, at once: movers sharing a target (``vertex_conflict``) and
   movers exchanging cells (``swap_conflict``) are cancelled. (b) Then, until nothing
   changes, a remaining mover whose target is the cell of a present agent that does not move
   is cancelled (``blocked``). Following into a vacated cell and rotations are allowed.
4. **Holes** - an agent that moves onto a hole becomes FELL and leaves the board.
5. **Goals** - an ACTIVE agent on its own goal becomes ARRIVED (it leaves the board under
   ``"vanish"``, keeps occupying its goal under ``"stay"``).
6. **Time** - ``t`` increases by one; at ``max_steps`` ACTIVE agents become TIMED_OUT.

Conventions (docs/rules.md#conventions; all tested):

* Actions of agents that are not ACTIVE are ignored; action integers outside ``0..4`` are
  treated as STAY.
* Stepping an episode that is already done (no ACTIVE agent) returns the state unchanged -
  ``t`` does not advance either - with zero rewards and all event flags False.
* Agents off the board (FELL, vanished ARRIVED, TIMED_OUT, ABSENT) keep their last ``pos``;
  a FELL agent's last ``pos`` is the hole it fell into.
* Randomness: one uniform number per agent slot, ``jax.random.uniform(key, [A])``; agent
  ``i`` slips iff ``u[i] < slip_prob`` and then takes the first perpendicular direction
  (LEFT for vertical moves, UP for horizontal ones) iff ``u[i] < slip_prob / 2``, else the
  second (RIGHT / DOWN). :func:`step_from_uniforms` takes ``u`` directly, so per-agent
  randomness can be controlled (e.g. permuted together with the agents).

Implementation notes (speed under ``vmap`` on CPU): cells are flat indices
``row * max_width + col``; three ``[A, A]`` comparisons (same target, my target is your
cell, your target is my cell) are folded into per-agent int32 bitmasks (bit ``j`` = agent
``j``; ``A <= 26``), after which every rule is a few ``[A]`` bit operations. The fixed point
of rule (b) is a fixed ``A - 1`` rounds of an unrolled ``lax.fori_loop`` (a blocking chain
holds at most ``A`` distinct agents, so ``A - 1`` rounds always reach it and extra rounds
change nothing); no data-dependent loop, so ``vmap`` adds no masking. The lake's cells are
read with one flat gather of ``A`` entries per step. Folding the pairwise tables into
bitmasks instead of reducing ``[A, A]`` boolean tables in every round made the vmapped step
about 4x faster on CPU.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct

from jaxlake.types import (
    ABSENT,
    ACTIVE,
    ARRIVED,
    DOWN,
    FELL,
    LEFT,
    MAX_AGENTS_LIMIT,
    NUM_ACTIONS,
    ON_GOAL_STAY,
    RIGHT,
    STAY,
    TIMED_OUT,
    UP,
    Lake,
    State,
    StepInfo,
)

__all__ = [
    "Outcome",
    "Rollout",
    "Trajectory",
    "cell_codes",
    "pad_plan",
    "reset",
    "rollout",
    "step",
    "step_from_uniforms",
]

#: Cell codes of :func:`cell_codes`.
CELL_WALL, CELL_FROZEN, CELL_HOLE = 0, 1, 2


def _check_lake(lake: Lake) -> None:
    """Trace-time shape checks of an unbatched lake."""
    A = lake.max_agents
    H, W = lake.canvas_shape
    chex.assert_shape(lake.holes, (H, W))
    chex.assert_shape(lake.region, (H, W))
    chex.assert_shape([lake.starts, lake.goals], (A, 2))
    chex.assert_rank([lake.num_agents, lake.slip_prob, lake.max_steps, lake.on_goal], 0)


def _check_state(lake: Lake, state: State) -> None:
    A = lake.max_agents
    chex.assert_shape(state.pos, (A, 2))
    chex.assert_shape(state.status, (A,))
    chex.assert_rank(state.t, 0)


def _set_bits(mask: jax.Array, agent_bit: jax.Array) -> jax.Array:
    """``[A]`` bool -> ``[]`` int32 bitmask of the set agents."""
    return jnp.sum(jnp.where(mask, agent_bit, 0))


def _row_bits(pairs: jax.Array, agent_bit: jax.Array) -> jax.Array:
    """``[A, A]`` bool -> ``[A]`` int32: bit ``j`` of entry ``i`` is ``pairs[i, j]``."""
    return jnp.sum(jnp.where(pairs, agent_bit[None, :], 0), axis=1)


def reset(lake: Lake) -> State:
    """The initial state: agents on their starts, ACTIVE in slots ``< num_agents``, else ABSENT.

    Works on a single lake and, as it is purely elementwise, on a batch of lakes as well.
    ``t`` is 0. Starts and goals are distinct by contract, so nobody begins on its goal.
    """
    status = jnp.where(lake.agent_mask, ACTIVE, ABSENT).astype(jnp.int32)
    t = jnp.zeros_like(jnp.asarray(lake.num_agents), dtype=jnp.int32)
    return State(pos=jnp.asarray(lake.starts, jnp.int32), status=status, t=t)


def cell_codes(lake: Lake) -> jax.Array:
    """``[H * W]`` int8 flat cell map: ``0`` wall (outside the region), ``1`` frozen, ``2`` hole.

    Flat index of ``(row, col)`` is ``row * max_width + col``.
    """
    codes = jnp.where(lake.region, jnp.where(lake.holes, CELL_HOLE, CELL_FROZEN), CELL_WALL)
    return codes.astype(jnp.int8).reshape(-1)


def step(
    key: jax.Array,
    lake: Lake,
    state: State,
    actions: jax.Array,
    *,
    arrive_reward: float = 1.0,
    fall_reward: float = -1.0,
) -> tuple[State, StepInfo]:
    """Advance one lake by one joint step (docs/rules.md#one-step; see the module docstring).

    The PRNG key comes first, as in ``jax.random.*(key, ...)`` (and gymnasium-style JAX
    environments' ``step(key, state, action, params)``).

    Args:
      key: a PRNG key for the slips (one uniform draw per agent slot).
      lake: an unbatched :class:`Lake` (``vmap`` for batches).
      state: the current :class:`State`.
      actions: ``[A]`` integer actions (``STAY UP DOWN LEFT RIGHT`` = ``0..4``); entries of
        non-ACTIVE agents are ignored, out-of-range entries mean STAY.
      arrive_reward: reward of an agent on the step it arrives.
      fall_reward: reward of an agent on the step it falls.

    Returns:
      ``(next_state, info)`` with per-agent :class:`StepInfo` flags and rewards.
    """
    return step_from_uniforms(
        lake, state, actions, slip_uniforms(key, lake.max_agents), arrive_reward=arrive_reward,
        fall_reward=fall_reward,
    )


def slip_uniforms(key: jax.Array, num_slots: int) -> jax.Array:
    """The slip noise :func:`step` draws from its key: ``[num_slots]`` float32 uniforms."""
    return jax.random.uniform(key, (num_slots,), dtype=jnp.float32)


def step_from_uniforms(
    lake: Lake,
    state: State,
    actions: jax.Array,
    u: jax.Array,
    *,
    arrive_reward: float = 1.0,
    fall_reward: float = -1.0,
) -> tuple[State, StepInfo]:
    """:func:`step` with the per-agent slip noise ``u`` (``[A]`` float in ``[0, 1)``) given.

    ``step(key, lake, state, actions)`` equals
    ``step_from_uniforms(lake, state, actions, jax.random.uniform(key, [A]))``.
    """
    _check_lake(lake)
    _check_state(lake, state)
    A = lake.max_agents
    if A > MAX_AGENTS_LIMIT:
        raise ValueError(f"max_agents={A} exceeds {MAX_AGENTS_LIMIT} (agent sets are int32 bitmasks)")
    H, W = lake.canvas_shape
    actions = jnp.asarray(actions)
    chex.assert_shape(actions, (A,))
    chex.assert_shape(u, (A,))
    if not jnp.issubdtype(actions.dtype, jnp.integer):
        raise TypeError(f"actions must be integers in 0..{NUM_ACTIONS - 1}, got dtype {actions.dtype}")
    actions = actions.astype(jnp.int32)

    status = state.status
    active = status == ACTIVE
    act = jnp.where(active & (actions >= 0) & (actions < NUM_ACTIONS), actions, STAY)
    is_move = act != STAY

    # 1. Slip: u < p slips; u < p/2 takes the first perpendicular direction.
    slip_prob = jnp.asarray(lake.slip_prob, jnp.float32)
    slipped = is_move & (u < slip_prob)
    first = u < 0.5 * slip_prob
    vertical = (act == UP) | (act == DOWN)
    perp = jnp.where(first, jnp.where(vertical, LEFT, UP), jnp.where(vertical, RIGHT, DOWN))
    act = jnp.where(slipped, perp, act)

    # 2. Walls, via one flat gather of the cell codes at the (clipped) intended cell.
    row, col = state.pos[:, 0], state.pos[:, 1]
    d_row = (act == DOWN).astype(jnp.int32) - (act == UP).astype(jnp.int32)
    d_col = (act == RIGHT).astype(jnp.int32) - (act == LEFT).astype(jnp.int32)
    new_row, new_col = row + d_row, col + d_col
    in_canvas = (new_row >= 0) & (new_row < H) & (new_col >= 0) & (new_col < W)
    cur = row * W + col
    tgt_raw = jnp.clip(new_row, 0, H - 1) * W + jnp.clip(new_col, 0, W - 1)
    code = jnp.take(cell_codes(lake), tgt_raw, mode="clip")
    wall = is_move & ~(in_canvas & (code != CELL_WALL))
    mover = is_move & ~wall
    tgt = jnp.where(mover, tgt_raw, cur)

    # 3. Conflicts among present agents. Sets of agents are int32 bitmasks (bit j = agent
    # j; A <= 26), so every rule is a few [A] bit operations after three [A, A] comparisons.
    present = active | ((status == ARRIVED) & (lake.on_goal == ON_GOAL_STAY))
    agent_bit = jnp.left_shift(jnp.int32(1), jnp.arange(A, dtype=jnp.int32))
    mover_bits = _set_bits(mover, agent_bit)
    present_bits = _set_bits(present, agent_bit)
    same_bits = _row_bits(tgt[:, None] == tgt[None, :], agent_bit) & ~agent_bit  # others aiming at my target
    into_bits = _row_bits(tgt[:, None] == cur[None, :], agent_bit)  # agents standing on my target
    from_bits = _row_bits(cur[:, None] == tgt[None, :], agent_bit)  # agents aiming at my cell
    # (a) vertex: two movers share a target; swap: two movers exchange cells.
    vertex = mover & ((same_bits & mover_bits) != 0)
    swap = mover & ((into_bits & from_bits & mover_bits) != 0)
    survivors = mover & ~vertex & ~swap
    # (b) blocked: a mover's target holds a present agent that does not move (fixed point).
    # A mover's target differs from its own cell, so an agent never blocks itself.
    occupant_bits = into_bits & present_bits

    def block_round(_, moving):
        return moving & ((occupant_bits & ~_set_bits(moving, agent_bit)) == 0)

    moving = jax.lax.fori_loop(0, max(A - 1, 0), block_round, survivors, unroll=True)
    blocked = survivors & ~moving

    # 4. Holes (only a move can put an agent on a hole: starts are frozen).
    fell = moving & (code == CELL_HOLE)
    new_cell = jnp.where(moving, tgt, cur)
    new_pos = jnp.where(moving[:, None], jnp.stack([tgt // W, tgt % W], axis=-1), state.pos)

    # 5. Goals.
    goal_cell = lake.goals[:, 0] * W + lake.goals[:, 1]
    arrived = active & ~fell & (new_cell == goal_cell)

    # 6. Time (a done episode does not advance).
    t = state.t + jnp.any(active).astype(jnp.int32)
    timed_out = active & ~fell & ~arrived & (t >= lake.max_steps)

    new_status = jnp.where(
        fell, FELL, jnp.where(arrived, ARRIVED, jnp.where(timed_out, TIMED_OUT, status))
    ).astype(jnp.int32)
    zero = jnp.zeros((), jnp.float32)
    reward = jnp.where(arrived, jnp.asarray(arrive_reward, jnp.float32), zero) + jnp.where(
        fell, jnp.asarray(fall_reward, jnp.float32), zero
    )
    next_state = State(pos=new_pos.astype(jnp.int32), status=new_status, t=t)
    info = StepInfo(
        reward=reward,
        arrived=arrived,
        fell=fell,
        timed_out=timed_out,
        slipped=slipped,
        wall=wall,
        vertex_conflict=vertex,
        swap_conflict=swap,
        blocked=blocked,
        moved=moving,
        done=~jnp.any(new_status == ACTIVE),
    )
    return next_state, info


# ---------------------------------------------------------------------------------- rollout
@struct.dataclass
class Trajectory:
    """Per-step record of a rollout (leading axis ``T``: entry ``k`` is after step ``k + 1``).

    Attributes:
      pos: ``[T, A, 2]`` int32 positions after each step.
      status: ``[T, A]`` int32 statuses after each step.
      t: ``[T]`` int32 the state's ``t`` after each step (it stops once the episode is done).
      info: :class:`StepInfo` with every field stacked ``[T, ...]``.
    """

    pos: jax.Array
    status: jax.Array
    t: jax.Array
    info: StepInfo


@struct.dataclass
class Outcome:
    """Summary of one rollout, per agent ``[A]`` unless noted.

    Attributes:
      arrived / fell / timed_out: bool, the agent's final status.
      still_active: bool, ACTIVE after the plan ran out (only when the plan is shorter than
        the episode; none of arrived / fell / timed_out then).
      steps: int32, the ``t`` at which the agent's episode ended (it left ACTIVE); the final
        ``t`` (= ``T`` from a reset) for agents still ACTIVE; 0 for slots that were not
        ACTIVE at the start (ABSENT).
      returns: float32, sum of the agent's step rewards.
      vertex_conflicts / swap_conflicts / blocks: int32, moves of the agent cancelled by each
        rule. wall_bumps / slips: int32 counts of those events.
      num_arrived: ``[]`` int32.
      success: ``[]`` bool, every agent in play arrived.
      all_done: ``[]`` bool, no agent is ACTIVE at the end.
      makespan: ``[]`` int32, the final ``t`` (steps until the episode ended, or run).
    """

    arrived: jax.Array
    fell: jax.Array
    timed_out: jax.Array
    still_active: jax.Array
    steps: jax.Array
    returns: jax.Array
    vertex_conflicts: jax.Array
    swap_conflicts: jax.Array
    blocks: jax.Array
    wall_bumps: jax.Array
    slips: jax.Array
    num_arrived: jax.Array
    success: jax.Array
    all_done: jax.Array
    makespan: jax.Array


@struct.dataclass
class Rollout:
    """Result of :func:`rollout`: ``final_state``, ``trajectory`` and ``outcome``."""

    final_state: State
    trajectory: Trajectory
    outcome: Outcome


def pad_plan(plan: jax.Array, horizon: int) -> jax.Array:
    """Pad a ``[..., A, T]`` plan with STAY (or cut it) to ``[..., A, horizon]``.

    With ``horizon >= max_steps`` every episode ends within the rollout (the last step
    times out whoever is still ACTIVE), so an :class:`Outcome` has no ``still_active`` agent.
    """
    horizon = int(horizon)
    if horizon < 1:
        raise ValueError(f"horizon={horizon} must be >= 1")
    plan = jnp.asarray(plan)
    T = plan.shape[-1]
    if T >= horizon:
        return plan[..., :horizon]
    pad = [(0, 0)] * (plan.ndim - 1) + [(0, horizon - T)]
    return jnp.pad(plan, pad, constant_values=STAY)


def rollout(
    key: jax.Array,
    lake: Lake,
    plan: jax.Array,
    *,
    arrive_reward: float = 1.0,
    fall_reward: float = -1.0,
    horizon: Optional[int] = None,
    init_state: Optional[State] = None,
) -> Rollout:
    """Run a joint plan ``[A, T]`` with ``lax.scan`` from ``reset(lake)`` (or ``init_state``).

    Step ``k`` uses ``jax.random.split(key, T)[k]`` as its key, so the result equals calling
    :func:`step` by hand with those keys. Steps after the episode is done change nothing.

    Args:
      key: PRNG key for the slips (first, as in :func:`step`).
      lake: an unbatched lake (``jax.vmap`` over keys, lakes and plans for batches).
      plan: ``[A, T]`` integer actions; row ``i`` is agent ``i``'s plan.
      arrive_reward: as in :func:`step`.
      fall_reward: as in :func:`step`.
      horizon: static; if given, the plan is padded with STAY or cut to ``horizon`` steps
        (:func:`pad_plan`). Choose ``horizon >= max_steps`` to make every episode end: a plan
        shorter than the episode otherwise leaves agents ``still_active`` (counted as neither
        arrived, fell nor timed out).
      init_state: start from this state instead of ``reset(lake)``.

    Returns:
      :class:`Rollout` with the final state, the ``[T, ...]`` trajectory and the outcome.
    """
    _check_lake(lake)
    if horizon is not None:
        plan = pad_plan(plan, horizon)
    plan = jnp.asarray(plan)
    A = lake.max_agents
    chex.assert_rank(plan, 2)
    chex.assert_axis_dimension(plan, 0, A)
    T = plan.shape[1]
    if T < 1:
        raise ValueError(f"plan has T={T} steps; rollout needs at least one (shape [A, T])")
    state0 = reset(lake) if init_state is None else init_state
    keys = jax.random.split(key, T)

    def body(state, xs):
        actions, k = xs
        nxt, info = step(
            k, lake, state, actions, arrive_reward=arrive_reward, fall_reward=fall_reward
        )
        return nxt, (nxt.pos, nxt.status, nxt.t, info)

    final, (pos, status, t, info) = jax.lax.scan(body, state0, (plan.T, keys))
    trajectory = Trajectory(pos=pos, status=status, t=t, info=info)

    final_status = final.status
    # Step at which each agent left ACTIVE (t after that step); 0 if it never was ACTIVE.
    was_active = jnp.concatenate([(state0.status == ACTIVE)[None], status[:-1] == ACTIVE], axis=0)
    ended_now = was_active & (status != ACTIVE)  # [T, A]
    end_t = jnp.max(jnp.where(ended_now, t[:, None], 0), axis=0)
    still_active = final_status == ACTIVE
    steps = jnp.where(still_active, final.t, end_t)
    in_play = state0.status != ABSENT

    def count(x):
        return jnp.sum(x.astype(jnp.int32), axis=0)

    arrived = final_status == ARRIVED
    num_agents_in_play = jnp.sum(in_play.astype(jnp.int32))
    num_arrived = jnp.sum(arrived.astype(jnp.int32))
    outcome = Outcome(
        arrived=arrived,
        fell=final_status == FELL,
        timed_out=final_status == TIMED_OUT,
        still_active=still_active,
        steps=steps.astype(jnp.int32),
        returns=jnp.sum(info.reward, axis=0),
        vertex_conflicts=count(info.vertex_conflict),
        swap_conflicts=count(info.swap_conflict),
        blocks=count(info.blocked),
        wall_bumps=count(info.wall),
        slips=count(info.slipped),
        num_arrived=num_arrived,
        success=(num_arrived == num_agents_in_play) & (num_agents_in_play > 0),
        all_done=~jnp.any(still_active),
        makespan=final.t,
    )
    return Rollout(final_state=final, trajectory=trajectory, outcome=outcome)

