"""Array observations for neural agents: per-agent grids, an egocentric crop, a global state and
action masks, built from a :class:`~jaxlake.types.Lake` and a :class:`~jaxlake.types.State`.

Every function is pure, works on one unbatched lake and state (``jax.vmap`` makes batches) and
has static output shapes, so it can sit inside a jitted step or training loop. Shapes use the
static capacity of the lake, as :mod:`jaxlake.types` does: ``H = max_height``,
``W = max_width``, ``A = max_agents``; agent slot ``i`` gets row ``i`` of every per-agent
array, absent slots included (their rows are all zero except ``STAY`` in the mask).

Grid channels (:data:`CHANNELS`, last axis of :func:`agent_grids`, ``C = NUM_CHANNELS = 6``),
for agent ``i`` (docs/rules.md#lakes and docs/rules.md#agent-status for the terms):

====  ==============  =====================================================================
 ch   name            1.0 on
====  ==============  =====================================================================
 0    ``region``      the region's cells (0 on walls, i.e. the rest of the canvas)
 1    ``holes``       hole cells
 2    ``self``        agent ``i``'s cell while it is *present* (ACTIVE, or ARRIVED under
                      ``on_goal: stay``); all zero once it fell, timed out, vanished or if
                      the slot is absent
 3    ``goal``        agent ``i``'s goal while it is ACTIVE
 4    ``others``      the cells of the other present agents (the obstacles of the conflict
                      rules; docs/rules.md#conflicts)
 5    ``other_goals`` the goals of the other ACTIVE agents
====  ==============  =====================================================================

Goals are shown exactly while their agent is ACTIVE and agents exactly while they are
present, as ``jaxlake.text.render_text`` draws a state. Starts and goals are distinct and no
two present agents share a cell, so every channel is 0/1.

Per-agent scalars (:data:`SCALARS`, ``[A, S]``, ``S = NUM_SCALARS = 2``): ``time_left``
``= clip((max_steps - t) / max_steps, 0, 1)`` (1 at the reset, 0 when the horizon ran
out) and ``slip_prob``; the same for every slot.

Partial observability (:func:`egocentric`): a ``(2r + 1) x (2r + 1)`` window of the grid
channels centred on each agent's ``pos`` (agents off the board keep their last ``pos``, see
docs/rules.md#conventions). Cells beyond the canvas read as outside: every channel 0,
``region`` included, exactly as a wall cell of the canvas reads. It equals slicing the
full grid padded by ``r`` zero cells on every side (tested).

Global state for a centralised critic (:func:`global_state`, ``[H, W, 2 + 2A]``): ``region``,
``holes``, then one channel per agent slot with its cell while present, then one per slot
with its goal while ACTIVE (agent identities kept, unlike the per-agent ``others``), plus
:func:`agent_scalars`' two values (the same for every agent) from :func:`global_scalars`.

Action masks (:func:`avail_actions`, ``[A, 5]`` bool over ``STAY UP DOWN LEFT RIGHT``):
``STAY`` is always available; a move is available iff the agent is ACTIVE and the cell it
names is a region cell (docs/rules.md#walls: a move off the region is void). Holes are
legal moves (they kill, docs/rules.md#holes) and so are moves toward other agents (the
conflict rules cancel them); agents that are not ACTIVE may only ``STAY`` (their actions
are ignored anyway, docs/rules.md#conventions). With ``slip_prob > 0`` an available move
may still slip into a wall: the mask is about the intended move.

:func:`observe` bundles grids (full or cropped), scalars and masks in one
:class:`Observation`.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct

from jaxlake.types import ACTIVE, ARRIVED, NUM_ACTIONS, ON_GOAL_STAY, Lake, State, action_deltas

__all__ = [
    "CHANNELS",
    "NUM_CHANNELS",
    "NUM_SCALARS",
    "Observation",
    "SCALARS",
    "agent_grids",
    "agent_scalars",
    "avail_actions",
    "egocentric",
    "global_scalars",
    "global_state",
    "observe",
    "present_mask",
]

#: Names of the grid channels, in order (the last axis of :func:`agent_grids`).
CHANNELS = ("region", "holes", "self", "goal", "others", "other_goals")
NUM_CHANNELS = len(CHANNELS)
REGION, HOLES, SELF, GOAL, OTHERS, OTHER_GOALS = range(NUM_CHANNELS)
#: Names of the per-agent scalars, in order (the last axis of :func:`agent_scalars`).
SCALARS = ("time_left", "slip_prob")
NUM_SCALARS = len(SCALARS)


@struct.dataclass
class Observation:
    """What every agent sees at one state (add leading batch axes with ``vmap``).

    Attributes:
      grid: ``[A, G, G', C]`` float (``float32`` by default): :func:`agent_grids`
        (``G, G' = H, W``) or its :func:`egocentric` crop (``G = G' = 2 * radius + 1``).
      scalars: ``[A, S]`` float32, :func:`agent_scalars`.
      avail_actions: ``[A, 5]`` bool, :func:`avail_actions`.
    """

    grid: jax.Array
    scalars: jax.Array
    avail_actions: jax.Array


def _check(lake: Lake, state: State) -> None:
    """Trace-time shape checks of an unbatched lake and state."""
    A = lake.max_agents
    H, W = lake.canvas_shape
    chex.assert_shape([lake.holes, lake.region], (H, W))
    chex.assert_shape([lake.starts, lake.goals, state.pos], (A, 2))
    chex.assert_shape(state.status, (A,))
    chex.assert_rank([lake.num_agents, lake.slip_prob, lake.max_steps, lake.on_goal, state.t], 0)


def present_mask(lake: Lake, state: State) -> jax.Array:
    """``[A]`` bool: the agent occupies its cell (ACTIVE, or ARRIVED under ``on_goal: stay``)."""
    arrived_stays = (state.status == ARRIVED) & (lake.on_goal == ON_GOAL_STAY)
    return (state.status == ACTIVE) | arrived_stays


def _one_hot_cells(cells: jax.Array, on: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """``[A, 2]`` cells and ``[A]`` bool -> ``[A, H, W]`` bool, True at each kept cell."""
    rows = jnp.arange(shape[0])[None, :, None] == cells[:, 0, None, None]
    cols = jnp.arange(shape[1])[None, None, :] == cells[:, 1, None, None]
    return rows & cols & on[:, None, None]


def _id_maps(lake: Lake, state: State) -> tuple[jax.Array, jax.Array]:
    """``([H, W] agent standing there while present, [H, W] agent whose goal it is while
    ACTIVE)``, int32 slot ids, -1 for none (present agents hold distinct cells and goals are
    distinct, so one id per cell is all there is)."""
    shape = lake.canvas_shape
    ids = jnp.arange(lake.max_agents, dtype=jnp.int32)[:, None, None]

    def id_map(cells: jax.Array, on: jax.Array) -> jax.Array:
        return jnp.max(jnp.where(_one_hot_cells(cells, on, shape), ids, -1), axis=0)

    return id_map(state.pos, present_mask(lake, state)), id_map(lake.goals, state.status == ACTIVE)


def agent_grids(lake: Lake, state: State, dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """``[A, H, W, C]`` per-agent grids over the whole canvas (channels: module docstring).

    Args:
      lake: an unbatched :class:`Lake`.
      state: its :class:`State`.
      dtype: static output dtype (``float32`` by default; ``bool`` or ``int8`` save memory).
    """
    _check(lake, state)
    agent_at, goal_at = _id_maps(lake, state)
    # one elementwise select over [A, H, W, C] (a stack of channels was ~3x slower on CPU)
    me = jnp.arange(lake.max_agents, dtype=jnp.int32)[:, None, None, None]
    ch = jnp.arange(NUM_CHANNELS)
    agent, goal = agent_at[None, :, :, None], goal_at[None, :, :, None]
    value = jnp.where(ch == REGION, lake.region[None, :, :, None],
            jnp.where(ch == HOLES, (lake.holes & lake.region)[None, :, :, None],
            jnp.where(ch == SELF, agent == me,
            jnp.where(ch == GOAL, goal == me,
            jnp.where(ch == OTHERS, (agent >= 0) & (agent != me), (goal >= 0) & (goal != me))))))
    return value.astype(dtype)


def global_scalars(lake: Lake, state: State) -> jax.Array:
    """``[S]`` float32: ``time_left`` and ``slip_prob`` (:data:`SCALARS`)."""
    chex.assert_rank([lake.max_steps, state.t], 0)
    horizon = jnp.maximum(jnp.asarray(lake.max_steps, jnp.float32), 1.0)
    time_left = jnp.clip((horizon - state.t.astype(jnp.float32)) / horizon, 0.0, 1.0)
    return jnp.stack([time_left, jnp.asarray(lake.slip_prob, jnp.float32)])


def agent_scalars(lake: Lake, state: State) -> jax.Array:
    """``[A, S]`` float32 per-agent scalars (:data:`SCALARS`; the same for every slot)."""
    _check(lake, state)
    return jnp.broadcast_to(global_scalars(lake, state)[None], (lake.max_agents, NUM_SCALARS))


def egocentric(grids: jax.Array, pos: jax.Array, radius: int) -> jax.Array:
    """Crop ``[A, H, W, C]`` grids to ``[A, 2r + 1, 2r + 1, C]`` windows centred on ``pos``.

    Window cell ``(r + dr, r + dc)`` of agent ``i`` is canvas cell ``pos[i] + (dr, dc)``;
    cells beyond the canvas are 0 in every channel (they read as outside, like a wall).

    Args:
      grids: ``[A, H, W, C]`` (e.g. :func:`agent_grids`).
      pos: ``[A, 2]`` int32 centres (``State.pos``).
      radius: static, ``>= 0``.
    """
    radius = int(radius)
    if radius < 0:
        raise ValueError(f"radius={radius} must be >= 0")
    chex.assert_rank(grids, 4)
    A, _, _, C = grids.shape
    chex.assert_shape(pos, (A, 2))
    size = 2 * radius + 1
    padded = jnp.pad(grids, ((0, 0), (radius, radius), (radius, radius), (0, 0)))

    def crop(grid: jax.Array, p: jax.Array) -> jax.Array:
        # padded cell (p + r) - r = p is the window's top-left corner
        return jax.lax.dynamic_slice(grid, (p[0], p[1], 0), (size, size, C))

    return jax.vmap(crop)(padded, pos.astype(jnp.int32))


def avail_actions(lake: Lake, state: State) -> jax.Array:
    """``[A, 5]`` bool: which of ``STAY UP DOWN LEFT RIGHT`` each agent may take.

    ``STAY`` always; a move iff the agent is ACTIVE and the move's cell is in the region
    (holes included). Agents that are not ACTIVE (finished or absent) only ``STAY``.
    """
    _check(lake, state)
    H, W = lake.canvas_shape
    target = state.pos[:, None, :] + action_deltas()[None]  # [A, 5, 2]
    row, col = target[..., 0], target[..., 1]
    in_canvas = (row >= 0) & (row < H) & (col >= 0) & (col < W)
    in_region = in_canvas & lake.region[jnp.clip(row, 0, H - 1), jnp.clip(col, 0, W - 1)]
    active = (state.status == ACTIVE)[:, None]
    is_stay = jnp.arange(NUM_ACTIONS) == 0
    return is_stay[None] | (active & in_region)


def global_state(lake: Lake, state: State, dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """``[H, W, 2 + 2A]`` for a centralised critic: ``region``, ``holes``, agent ``j``'s cell
    while present (channel ``2 + j``), agent ``j``'s goal while ACTIVE (channel ``2 + A + j``).

    Pair it with :func:`global_scalars` (``[S]``) for the time left and the slip probability.
    """
    _check(lake, state)
    A = lake.max_agents
    agent_at, goal_at = _id_maps(lake, state)
    ch = jnp.arange(2 + 2 * A)
    value = jnp.where(ch == REGION, lake.region[..., None],
            jnp.where(ch == HOLES, (lake.holes & lake.region)[..., None],
            jnp.where(ch < 2 + A, agent_at[..., None] == ch - 2, goal_at[..., None] == ch - 2 - A)))
    return value.astype(dtype)


def observe(lake: Lake, state: State, *, radius: Optional[int] = None,
            dtype: jnp.dtype = jnp.float32) -> Observation:
    """Every agent's :class:`Observation`: grids (the full canvas, or the :func:`egocentric`
    crop of static ``radius``), scalars and action masks.

    Args:
      lake: an unbatched :class:`Lake` (``jax.vmap`` over lakes and states for batches).
      state: its :class:`State`.
      radius: static; ``None`` for the whole ``[H, W]`` canvas, else the crop radius.
      dtype: static dtype of the grid.
    """
    grids = agent_grids(lake, state, dtype)
    if radius is not None:
        grids = egocentric(grids, state.pos, radius)
    return Observation(grid=grids, scalars=agent_scalars(lake, state), avail_actions=avail_actions(lake, state))
