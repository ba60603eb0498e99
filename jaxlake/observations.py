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

Kinds of observation (:data:`KINDS`; :func:`observe`'s ``kind``), each built alone, so a step
pays only for the one it returns:

==========  ================================================================================
 kind       what
==========  ================================================================================
``global``  :class:`GlobalObservation`: one shared ``[H, W]`` uint16 map for the whole lake
            (:func:`shared_map`, Jumanji Connector's kind of observation), the ``[S]``
            scalars and the ``[A, 5]`` masks
``packed``  :class:`Observation` whose ``grid`` is ``[A, H, W]`` uint8: agent ``i``'s channel
            ``c`` is bit ``c`` (:func:`packed_grids`; :func:`unpack` gives the grids back)
``grids``   :class:`Observation` with the ``[A, H, W, C]`` grids (:func:`agent_grids`)
``crop``    :class:`Observation` with the ``[A, 2r + 1, 2r + 1, C]`` egocentric crops, each
            agent's window of the padded shared map, relabelled (:func:`crop_grids`)
==========  ================================================================================

The shared map packs a cell in 12 bits: bit 0 ``region``, bit 1 ``holes``, bits 2-6 the slot
plus one of the agent present there (0: none), bits 7-11 the slot plus one of the ACTIVE agent
whose goal it is (0: none); present agents hold distinct cells and goals are distinct, so one of
each per cell is all there is (:func:`decode_shared_map`). Every agent's channels follow from it
by a relabel: ``self`` is "the agent there is me", ``others`` "an agent is there and it is not
me", and so on.

The per-lake cache (:class:`ObsCache`, :func:`make_cache`): what never changes during an
episode, computed once per lake (at generation or reset) and passed as ``cache=`` to every
function that takes it: the two static bits of every cell and, per cell, which of the four
moves stays on the region (the action mask's lookups, one gather per agent instead of four).
Without a cache the functions compute it on the fly (the same values).

:func:`observe` bundles grids (full, packed or cropped) or the shared map, scalars and masks.
"""

from __future__ import annotations

from typing import Optional, Union

import chex
import jax
import jax.numpy as jnp
from flax import struct

from jaxlake.types import ACTIVE, ARRIVED, NUM_ACTIONS, ON_GOAL_STAY, Lake, State

__all__ = [
    "CHANNELS",
    "KINDS",
    "NUM_CHANNELS",
    "NUM_SCALARS",
    "GlobalObservation",
    "ObsCache",
    "Observation",
    "SCALARS",
    "agent_grids",
    "agent_scalars",
    "avail_actions",
    "crop_grids",
    "crop_packed",
    "decode_shared_map",
    "egocentric",
    "global_scalars",
    "global_state",
    "make_cache",
    "observe",
    "packed_grids",
    "planes",
    "present_mask",
    "shared_map",
    "unpack",
]

#: Names of the grid channels, in order (the last axis of :func:`agent_grids`).
CHANNELS = ("region", "holes", "self", "goal", "others", "other_goals")
NUM_CHANNELS = len(CHANNELS)
REGION, HOLES, SELF, GOAL, OTHERS, OTHER_GOALS = range(NUM_CHANNELS)
#: Names of the per-agent scalars, in order (the last axis of :func:`agent_scalars`).
SCALARS = ("time_left", "slip_prob")
NUM_SCALARS = len(SCALARS)
#: The kinds of :func:`observe` (module docstring).
KINDS = ("global", "packed", "grids", "crop")

#: Bit fields of :func:`shared_map`: two static bits, then 5 bits of agent and 5 of goal.
AGENT_SHIFT, GOAL_SHIFT, ID_BITS = 2, 7, 0x1F
# The relabel of a packed cell for agent i: "the agent there is me" moves bit OTHERS to SELF,
# "the goal there is mine" moves bit OTHER_GOALS to GOAL.
_SELF_FLIP = (1 << SELF) | (1 << OTHERS)
_GOAL_FLIP = (1 << GOAL) | (1 << OTHER_GOALS)


@struct.dataclass
class Observation:
    """What every agent sees at one state (add leading batch axes with ``vmap``).

    Attributes:
      grid: ``[A, G, G', C]`` (``float32`` by default): :func:`agent_grids`
        (``G, G' = H, W``) or its :func:`egocentric` crop (``G = G' = 2 * radius + 1``); for
        the ``packed`` kind ``[A, H, W]`` uint8, channel ``c`` as bit ``c``.
      scalars: ``[A, S]`` float32, :func:`agent_scalars`.
      avail_actions: ``[A, 5]`` bool, :func:`avail_actions`.
    """

    grid: jax.Array
    scalars: jax.Array
    avail_actions: jax.Array


@struct.dataclass
class GlobalObservation:
    """The ``global`` kind: one shared map for the whole lake.

    Attributes:
      grid: ``[H, W]`` uint16, :func:`shared_map`.
      scalars: ``[S]`` float32, :func:`global_scalars`.
      avail_actions: ``[A, 5]`` bool, :func:`avail_actions`.
    """

    grid: jax.Array
    scalars: jax.Array
    avail_actions: jax.Array


@struct.dataclass
class ObsCache:
    """What the observations need of a lake that never changes: build it once per lake with
    :func:`make_cache` (``vmap`` it for a batch) and keep it beside the lake.

    Attributes:
      cells: ``[H, W]`` uint8, bit 0 ``region``, bit 1 ``holes`` (hole cells of the region).
      moves: ``[H, W]`` uint8, bit ``a - 1`` set iff action ``a`` (``UP DOWN LEFT RIGHT``)
        from that cell names a region cell.
    """

    cells: jax.Array
    moves: jax.Array


def _check(lake: Lake, state: State) -> None:
    """Trace-time shape checks of an unbatched lake and state."""
    A = lake.max_agents
    H, W = lake.canvas_shape
    chex.assert_shape([lake.holes, lake.region], (H, W))
    chex.assert_shape([lake.starts, lake.goals, state.pos], (A, 2))
    chex.assert_shape(state.status, (A,))
    chex.assert_rank([lake.num_agents, lake.slip_prob, lake.max_steps, lake.on_goal, state.t], 0)


def make_cache(lake: Lake) -> ObsCache:
    """The :class:`ObsCache` of one unbatched lake (``jax.vmap`` for a batch)."""
    H, W = lake.canvas_shape
    chex.assert_shape([lake.holes, lake.region], (H, W))
    region = lake.region.astype(bool)
    cells = region.astype(jnp.uint8) | ((lake.holes & region).astype(jnp.uint8) << 1)
    padded = jnp.pad(region, 1)  # False beyond the canvas
    # the region cell each move names, for every cell: UP DOWN LEFT RIGHT
    targets = (padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:])
    moves = sum(t.astype(jnp.uint8) << k for k, t in enumerate(targets)).astype(jnp.uint8)
    return ObsCache(cells=cells, moves=moves)


def _cache(lake: Lake, cache: Optional[ObsCache]) -> ObsCache:
    if cache is None:
        return make_cache(lake)
    chex.assert_shape([cache.cells, cache.moves], lake.canvas_shape)
    return cache


def present_mask(lake: Lake, state: State) -> jax.Array:
    """``[A]`` bool: the agent occupies its cell (ACTIVE, or ARRIVED under ``on_goal: stay``)."""
    arrived_stays = (state.status == ARRIVED) & (lake.on_goal == ON_GOAL_STAY)
    return (state.status == ACTIVE) | arrived_stays


def _id_codes(lake: Lake, state: State) -> tuple[jax.Array, jax.Array]:
    """``([H, W] slot + 1 of the agent standing there while present, [H, W] slot + 1 of the agent
    whose goal it is while ACTIVE)``, uint8, 0 for none (one flat compare per agent and cell)."""
    H, W = lake.canvas_shape
    A = lake.max_agents
    code = jnp.arange(1, A + 1, dtype=jnp.uint8)
    flat = jnp.arange(H * W, dtype=jnp.int32)

    def id_map(cells: jax.Array, on: jax.Array) -> jax.Array:
        index = jnp.where(on, cells[:, 0] * W + cells[:, 1], -1)  # -1 matches no cell
        hits = flat[None, :] == index[:, None]  # [A, H * W]
        return jnp.sum(jnp.where(hits, code[:, None], jnp.uint8(0)), axis=0, dtype=jnp.uint8).reshape(H, W)

    return id_map(state.pos, present_mask(lake, state)), id_map(lake.goals, state.status == ACTIVE)


def _relabel(cells: jax.Array, agent: jax.Array, goal: jax.Array, me: jax.Array) -> jax.Array:
    """Packed channels (uint8, bit ``c`` = channel ``c``) of agents ``me`` (slot + 1, broadcast
    against the maps) from the static bits and the agent and goal codes of each cell."""
    base = cells | ((agent != 0).astype(jnp.uint8) << OTHERS) | ((goal != 0).astype(jnp.uint8) << OTHER_GOALS)
    return (base ^ jnp.where(agent == me, jnp.uint8(_SELF_FLIP), jnp.uint8(0))
            ^ jnp.where(goal == me, jnp.uint8(_GOAL_FLIP), jnp.uint8(0)))


def packed_grids(lake: Lake, state: State, cache: Optional[ObsCache] = None) -> jax.Array:
    """``[A, H, W]`` uint8: agent ``i``'s channel ``c`` of :func:`agent_grids` as bit ``c``.

    Args:
      lake: an unbatched :class:`Lake`.
      state: its :class:`State`.
      cache: the lake's :class:`ObsCache` (computed here when ``None``).
    """
    _check(lake, state)
    cache = _cache(lake, cache)
    agent, goal = _id_codes(lake, state)
    me = jnp.arange(1, lake.max_agents + 1, dtype=jnp.uint8)[:, None, None]
    return _relabel(cache.cells[None], agent[None], goal[None], me)


def unpack(packed: jax.Array, dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """Packed channels ``[..., G, G']`` uint8 -> ``[..., G, G', C]`` 0/1 in ``dtype``."""
    bits = jnp.arange(NUM_CHANNELS, dtype=jnp.uint8)
    return ((packed[..., None] >> bits) & jnp.uint8(1)).astype(dtype)


def agent_grids(lake: Lake, state: State, dtype: jnp.dtype = jnp.float32,
                cache: Optional[ObsCache] = None) -> jax.Array:
    """``[A, H, W, C]`` per-agent grids over the whole canvas (channels: module docstring).

    Args:
      lake: an unbatched :class:`Lake`.
      state: its :class:`State`.
      dtype: static output dtype (``float32`` by default; ``bool`` or ``uint8`` save memory).
      cache: the lake's :class:`ObsCache` (computed here when ``None``).
    """
    return unpack(packed_grids(lake, state, cache), dtype)


def shared_map(lake: Lake, state: State, cache: Optional[ObsCache] = None) -> jax.Array:
    """``[H, W]`` uint16: the whole lake in one map (bit fields: module docstring).

    Args:
      lake: an unbatched :class:`Lake`.
      state: its :class:`State`.
      cache: the lake's :class:`ObsCache` (computed here when ``None``).
    """
    _check(lake, state)
    cache = _cache(lake, cache)
    agent, goal = _id_codes(lake, state)
    u16 = jnp.uint16
    return cache.cells.astype(u16) | (agent.astype(u16) << AGENT_SHIFT) | (goal.astype(u16) << GOAL_SHIFT)


def decode_shared_map(grid: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """:func:`shared_map`'s fields: ``(region, holes, agent, goal)``; ``region`` and ``holes``
    bool, ``agent`` and ``goal`` int32 slots, ``-1`` for none (any leading axes)."""
    grid = grid.astype(jnp.int32)
    agent = ((grid >> AGENT_SHIFT) & ID_BITS) - 1
    goal = ((grid >> GOAL_SHIFT) & ID_BITS) - 1
    return (grid & 1).astype(bool), ((grid >> 1) & 1).astype(bool), agent, goal


def crop_packed(lake: Lake, state: State, radius: int, cache: Optional[ObsCache] = None) -> jax.Array:
    """``[A, 2r + 1, 2r + 1]`` uint8: the :func:`egocentric` crops of :func:`packed_grids`, without
    building them: each agent's window of the shared map (:func:`shared_map`) padded by ``r``
    empty cells (read as outside), relabelled for that agent.

    The window is selected by one-hot rows then columns (a cell beyond the canvas matches no
    row or column: 0, the padding), which XLA's CPU backend runs about twice as fast as a
    batched ``dynamic_slice`` of the padded map.

    Args:
      lake: an unbatched :class:`Lake`.
      state: its :class:`State`.
      radius: static, ``>= 0``.
      cache: the lake's :class:`ObsCache` (computed here when ``None``).
    """
    radius = _radius(radius)
    H, W = lake.canvas_shape
    grid = shared_map(lake, state, cache)
    offsets = jnp.arange(-radius, radius + 1, dtype=jnp.int32)
    pos = state.pos.astype(jnp.int32)
    zero = jnp.uint16(0)
    rows = jnp.arange(H)[None, None, :] == (pos[:, 0, None] + offsets[None, :])[..., None]  # [A, S, H]
    strips = jnp.sum(jnp.where(rows[..., None], grid[None, None], zero), axis=2, dtype=jnp.uint16)  # [A, S, W]
    cols = jnp.arange(W)[None, None, :] == (pos[:, 1, None] + offsets[None, :])[..., None]  # [A, S, W]
    win = jnp.sum(jnp.where(cols[:, None], strips[:, :, None], zero), axis=-1, dtype=jnp.uint16)  # [A, S, S]
    cells = (win & 3).astype(jnp.uint8)
    agent = ((win >> AGENT_SHIFT) & ID_BITS).astype(jnp.uint8)
    goal = ((win >> GOAL_SHIFT) & ID_BITS).astype(jnp.uint8)
    me = jnp.arange(1, lake.max_agents + 1, dtype=jnp.uint8)[:, None, None]
    return _relabel(cells, agent, goal, me)


def crop_grids(lake: Lake, state: State, radius: int, dtype: jnp.dtype = jnp.float32,
               cache: Optional[ObsCache] = None) -> jax.Array:
    """``[A, 2r + 1, 2r + 1, C]``: :func:`crop_packed` unpacked, the :func:`egocentric` crops of
    :func:`agent_grids` without building the grids (static ``radius >= 0``, ``dtype``)."""
    return unpack(crop_packed(lake, state, radius, cache), dtype)


def planes(packed: jax.Array, dtype: jnp.dtype = jnp.float32) -> list[jax.Array]:
    """Packed channels ``[..., G, G']`` -> the ``C`` planes ``[..., G * G']`` in ``dtype``, channel
    ``c`` first to last: the grid channels-first, flattened by concatenating them (XLA's CPU
    backend writes a channels-last flat vector of unpacked bits an order of magnitude slower)."""
    flat = packed.reshape(*packed.shape[:-2], -1)
    return [((flat >> c) & jnp.uint8(1)).astype(dtype) for c in range(NUM_CHANNELS)]


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


def _radius(radius: int) -> int:
    radius = int(radius)
    if radius < 0:
        raise ValueError(f"radius={radius} must be >= 0")
    return radius


def egocentric(grids: jax.Array, pos: jax.Array, radius: int) -> jax.Array:
    """Crop ``[A, H, W, C]`` grids to ``[A, 2r + 1, 2r + 1, C]`` windows centred on ``pos``.

    Window cell ``(r + dr, r + dc)`` of agent ``i`` is canvas cell ``pos[i] + (dr, dc)``;
    cells beyond the canvas are 0 in every channel (they read as outside, like a wall).
    (:func:`crop_grids` gives the same crops of :func:`agent_grids` without building them.)

    Args:
      grids: ``[A, H, W, C]`` (e.g. :func:`agent_grids`).
      pos: ``[A, 2]`` int32 centres (``State.pos``).
      radius: static, ``>= 0``.
    """
    radius = _radius(radius)
    chex.assert_rank(grids, 4)
    A, _, _, C = grids.shape
    chex.assert_shape(pos, (A, 2))
    size = 2 * radius + 1
    padded = jnp.pad(grids, ((0, 0), (radius, radius), (radius, radius), (0, 0)))

    def crop(grid: jax.Array, p: jax.Array) -> jax.Array:
        return jax.lax.dynamic_slice(grid, (p[0], p[1], 0), (size, size, C))

    return jax.vmap(crop)(padded, pos.astype(jnp.int32))


def avail_actions(lake: Lake, state: State, cache: Optional[ObsCache] = None) -> jax.Array:
    """``[A, 5]`` bool: which of ``STAY UP DOWN LEFT RIGHT`` each agent may take.

    ``STAY`` always; a move iff the agent is ACTIVE and the move's cell is in the region
    (holes included). Agents that are not ACTIVE (finished or absent) only ``STAY``. One
    lookup of the cache's move bits per agent.
    """
    _check(lake, state)
    cache = _cache(lake, cache)
    H, W = lake.canvas_shape
    row = jnp.clip(state.pos[:, 0], 0, H - 1)
    col = jnp.clip(state.pos[:, 1], 0, W - 1)
    bits = jnp.take(cache.moves.reshape(-1), row * W + col, mode="clip")  # [A]
    shifts = jnp.arange(NUM_ACTIONS - 1, dtype=jnp.uint8)
    moves = ((bits[:, None] >> shifts) & jnp.uint8(1)).astype(bool) & (state.status == ACTIVE)[:, None]
    return jnp.concatenate([jnp.ones((lake.max_agents, 1), bool), moves], axis=1)


def global_state(lake: Lake, state: State, dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """``[H, W, 2 + 2A]`` for a centralised critic: ``region``, ``holes``, agent ``j``'s cell
    while present (channel ``2 + j``), agent ``j``'s goal while ACTIVE (channel ``2 + A + j``).

    Pair it with :func:`global_scalars` (``[S]``) for the time left and the slip probability.
    (:func:`shared_map` holds the same in one ``[H, W]`` uint16 map.)
    """
    _check(lake, state)
    A = lake.max_agents
    agent, goal = _id_codes(lake, state)
    ch = jnp.arange(2 + 2 * A)
    value = jnp.where(ch == REGION, lake.region[..., None],
            jnp.where(ch == HOLES, (lake.holes & lake.region)[..., None],
            jnp.where(ch < 2 + A, agent[..., None] == ch - 1, goal[..., None] == ch - 1 - A)))
    return value.astype(dtype)


def observe(lake: Lake, state: State, *, radius: Optional[int] = None, dtype: jnp.dtype = jnp.float32,
            kind: Optional[str] = None, cache: Optional[ObsCache] = None
            ) -> Union[Observation, GlobalObservation]:
    """Every agent's observation of one kind (:data:`KINDS`, module docstring), built alone.

    Args:
      lake: an unbatched :class:`Lake` (``jax.vmap`` over lakes and states for batches).
      state: its :class:`State`.
      radius: static; the crop radius of the ``crop`` kind (``None`` for the whole canvas).
      dtype: static dtype of the ``grids`` and ``crop`` kinds' grid.
      kind: static, one of :data:`KINDS`; ``None``: ``"crop"`` when ``radius`` is given, else
        ``"grids"``.
      cache: the lake's :class:`ObsCache` (computed here when ``None``).

    Returns:
      a :class:`GlobalObservation` for ``global``, else an :class:`Observation`.
    """
    if kind is None:
        kind = "grids" if radius is None else "crop"
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} not in {KINDS}")
    if (kind == "crop") != (radius is not None):
        raise ValueError(f"radius={radius!r}: the crop kind needs a radius and the other kinds take none "
                         f"(kind={kind!r})")
    cache = _cache(lake, cache)
    mask = avail_actions(lake, state, cache)
    if kind == "global":
        return GlobalObservation(grid=shared_map(lake, state, cache), scalars=global_scalars(lake, state),
                                 avail_actions=mask)
    if kind == "packed":
        grid = packed_grids(lake, state, cache)
    elif kind == "grids":
        grid = agent_grids(lake, state, dtype, cache)
    else:
        grid = crop_grids(lake, state, radius, dtype, cache)
    return Observation(grid=grid, scalars=agent_scalars(lake, state), avail_actions=mask)
