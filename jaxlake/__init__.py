"""jaxlake: MAPF-FrozenLake, a multi-agent path-finding game on FrozenLake grids in pure JAX."""

from jaxlake.config import ConfigError, LakeConfig, stack_configs
from jaxlake.types import (
    ABSENT,
    ACTIVE,
    ARRIVED,
    DOWN,
    FELL,
    LEFT,
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
