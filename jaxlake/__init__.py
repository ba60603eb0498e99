"""jaxlake: MAPF-FrozenLake, a multi-agent path-finding game on FrozenLake grids in pure JAX.

The public API in one place::

    from jaxlake import LakeConfig, generate, generate_batch, generate_mixture
    from jaxlake import reset, step, rollout, render_text, parse_lake, parse_plan, solve
"""

from jaxlake.config import ConfigError, LakeConfig, repeat_config, stack_configs
from jaxlake.env import Outcome, Rollout, Trajectory, reset, rollout, step, step_from_uniforms
from jaxlake.generator import generate, generate_batch, generate_mixture, mixture_components
from jaxlake.planner import Solution, solve, solve_batch, solvable_share
from jaxlake.text import format_plan, parse_lake, parse_plan, render_text
from jaxlake.types import (
    ABSENT,
    ACTIVE,
    ARRIVED,
    DOWN,
    FELL,
    LEFT,
    ON_GOAL_STAY,
    ON_GOAL_VANISH,
    RIGHT,
    STAY,
    TIMED_OUT,
    UP,
    Lake,
    LakeStats,
    State,
    StepInfo,
)

__version__ = "0.1.0"
