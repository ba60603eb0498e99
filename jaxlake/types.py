"""Pytree types shared by the generator, the step function and the text interface.

Shapes use the static capacity of the config that made the lake:
``H = max_height``, ``W = max_width``, ``A = max_agents``. A batch of lakes simply has a
leading batch axis on every leaf (``jax.vmap`` adds it).

Coordinates are ``(row, col)`` with row 0 at the top (docs/rules.md#lakes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

# ----------------------------------------------------------------------------- actions
STAY, UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3, 4
NUM_ACTIONS = 5
ACTION_LETTERS = "SUDLR"
#: ``(d_row, d_col)`` for each action index.
ACTION_DELTAS = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))

# ----------------------------------------------------------------------------- agent status
ACTIVE, ARRIVED, FELL, TIMED_OUT, ABSENT = 0, 1, 2, 3, 4
STATUS_NAMES = ("ACTIVE", "ARRIVED", "FELL", "TIMED_OUT", "ABSENT")

# ----------------------------------------------------------------------------- goal rule
ON_GOAL_VANISH, ON_GOAL_STAY = 0, 1
ON_GOAL_CODES = {"vanish": ON_GOAL_VANISH, "stay": ON_GOAL_STAY}

#: One letter per agent: at most 26 agents.
MAX_AGENTS_LIMIT = 26


def action_deltas() -> jax.Array:
    """``[5, 2]`` int32 table of moves, indexed by action."""
    return jnp.asarray(ACTION_DELTAS, dtype=jnp.int32)


@struct.dataclass
class LakeStats:
    """What the generator achieved for one lake (reported, never assumed).

    Attributes:
      hole_density: ``[]`` float32, share of region cells that are holes.
      conflict_density: ``[]`` float32, share of agent pairs whose shortest-path cell sets
        intersect (docs/rules.md#densities); 0 for a single agent.
      path_len: ``[A]`` int32, BFS distance start -> goal through frozen cells; -1 for
        absent agent slots.
      dist_ok: ``[]`` bool, every agent's distance lies in ``[min_dist, max_dist]``.
      attempts: ``[]`` int32, generation attempts used (1 = first try succeeded).
    """

    hole_density: jax.Array
    conflict_density: jax.Array
    path_len: jax.Array
    dist_ok: jax.Array
    attempts: jax.Array


@struct.dataclass
class Lake:
    """One lake instance: everything ``step`` needs, plus the generator's report.

    Attributes:
      holes: ``[H, W]`` bool, True on hole cells (always False outside the region).
      region: ``[H, W]`` bool, True on the ``height x width`` cells in play (top-left).
      starts: ``[A, 2]`` int32 start cells; unused slots hold ``(0, 0)``.
      goals: ``[A, 2]`` int32 goal cells; unused slots hold ``(0, 0)``.
      num_agents: ``[]`` int32, agents in play (slots ``0..num_agents-1``).
      slip_prob: ``[]`` float32, probability that a move slips perpendicular.
      max_steps: ``[]`` int32, episode horizon.
      on_goal: ``[]`` int32, ``ON_GOAL_VANISH`` or ``ON_GOAL_STAY``.
      stats: :class:`LakeStats`.
    """

    holes: jax.Array
    region: jax.Array
    starts: jax.Array
    goals: jax.Array
    num_agents: jax.Array
    slip_prob: jax.Array
    max_steps: jax.Array
    on_goal: jax.Array
    stats: LakeStats

    @property
    def max_agents(self) -> int:
        return self.starts.shape[-2]

    @property
    def canvas_shape(self) -> tuple[int, int]:
        return tuple(self.holes.shape[-2:])

    @property
    def height(self) -> jax.Array:
        """Region height, derived from the region mask."""
        return jnp.sum(jnp.any(self.region, axis=-1), axis=-1).astype(jnp.int32)

    @property
    def width(self) -> jax.Array:
        """Region width, derived from the region mask."""
        return jnp.sum(jnp.any(self.region, axis=-2), axis=-1).astype(jnp.int32)

    @property
    def agent_mask(self) -> jax.Array:
        """``[A]`` bool, True for slots in play."""
        return jnp.arange(self.max_agents) < self.num_agents[..., None]


@struct.dataclass
class State:
    """Dynamic episode state.

    Attributes:
      pos: ``[A, 2]`` int32 current cells (agents off the board keep their last cell).
      status: ``[A]`` int32 status codes (``ACTIVE`` ... ``ABSENT``).
      t: ``[]`` int32 steps taken so far.
    """

    pos: jax.Array
    status: jax.Array
    t: jax.Array

    @property
    def done(self) -> jax.Array:
        """``[]`` bool: no agent is ACTIVE."""
        return ~jnp.any(self.status == ACTIVE, axis=-1)


@struct.dataclass
class StepInfo:
    """Per-step events, all ``[A]`` unless noted.

    Attributes:
      reward: float32 per-agent reward of this step.
      arrived / fell / timed_out: bool, the agent entered that status this step.
      slipped: bool, the agent's move direction was replaced by a perpendicular one.
      wall: bool, the (post-slip) move would have left the region.
      vertex_conflict / swap_conflict / blocked: bool, the agent's move was cancelled by
        that rule (docs/rules.md#conflicts, phase a / a / b).
      moved: bool, the agent changed cell this step.
      done: ``[]`` bool, no agent ACTIVE after the step.
    """

    reward: jax.Array
    arrived: jax.Array
    fell: jax.Array
    timed_out: jax.Array
    slipped: jax.Array
    wall: jax.Array
    vertex_conflict: jax.Array
    swap_conflict: jax.Array
    blocked: jax.Array
    moved: jax.Array
    done: jax.Array
