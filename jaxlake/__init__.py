"""jaxlake: MAPF-FrozenLake, a multi-agent path-finding game on FrozenLake grids in pure JAX.

The public face of the package (``jaxlake.__all__``), all re-exported from their modules::

    LakeConfig, ConfigError, stack_configs, repeat_config        # validated configs (jaxlake.config)
    generate, generate_batch, generate_mixture, mixture_components
                                                                 # config -> lakes (jaxlake.generator)
    reset, step, step_from_uniforms, rollout                     # the game (jaxlake.env)
    Outcome, Rollout, Trajectory                                 # rollout results (jaxlake.env)
    solve, solve_batch, solvable_share, Solution                 # reference planner (jaxlake.planner)
    render_text, parse_lake, parse_plan, format_plan             # text formats (jaxlake.text)
    Lake, LakeStats, State, StepInfo                             # pytrees (jaxlake.types)
    STAY, UP, DOWN, LEFT, RIGHT                                  # actions (jaxlake.types)
    ACTIVE, ARRIVED, FELL, TIMED_OUT, ABSENT                     # agent statuses (jaxlake.types)
    ON_GOAL_VANISH, ON_GOAL_STAY                                 # on_goal codes (jaxlake.types)

Everything else is reached through its module (``jaxlake.autoreset``, ``jaxlake.suite``,
``jaxlake.viewer``, ``jaxlake.bench``, ...); no name here shadows a module of the package
(``tests/test_public_api.py`` checks it). The simulator never imports the language-model
package ``llm``; only the orchestration modules ``jaxlake.pipeline.stages``, ``jaxlake.run`` and
``jaxlake.pipeline.study`` wire the two together (``tests/test_layering.py``).
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


def _find_source_conf() -> None:
    """In a source checkout, ``jaxlake.conf`` is the checkout's own top-level ``conf/``.

    A wheel carries the configs inside the package (pyproject's ``package-dir`` maps ``conf/``
    to ``jaxlake.conf``), and an editable install maps them to the same folder. A checkout that
    is only on ``PYTHONPATH`` (or a second work tree beside an editable install) has no mapping
    of its own, so the ``conf/`` beside this package is registered under that name: the code and
    the configs always come from the same tree. Recognised by ``pyproject.toml`` and
    ``conf/config.yaml`` beside the package; an installed wheel never takes this path.
    """
    import importlib.machinery
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if "jaxlake.conf" in sys.modules or not ((root / "pyproject.toml").is_file() and (root / "conf" / "config.yaml").is_file()):
        return
    spec = importlib.machinery.PathFinder.find_spec("jaxlake.conf", [str(root)])
    if spec is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["jaxlake.conf"] = module
    spec.loader.exec_module(module)
    globals()["conf"] = module


_find_source_conf()

__all__ = [
    # jaxlake.config
    "ConfigError", "LakeConfig", "repeat_config", "stack_configs",
    # jaxlake.generator
    "generate", "generate_batch", "generate_mixture", "mixture_components",
    # jaxlake.env
    "Outcome", "Rollout", "Trajectory", "reset", "rollout", "step", "step_from_uniforms",
    # jaxlake.planner
    "Solution", "solvable_share", "solve", "solve_batch",
    # jaxlake.text
    "format_plan", "parse_lake", "parse_plan", "render_text",
    # jaxlake.types
    "ABSENT", "ACTIVE", "ARRIVED", "DOWN", "FELL", "LEFT", "ON_GOAL_STAY", "ON_GOAL_VANISH", "RIGHT",
    "STAY", "TIMED_OUT", "UP", "Lake", "LakeStats", "State", "StepInfo",
]
