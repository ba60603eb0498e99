"""What the simulator's property tests share: hypothesis strategies of valid lake configs."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hypothesis import strategies as st

from jaxlake.config import LakeConfig


@st.composite
def lake_configs(draw, canvas: Mapping[str, int], holes: Sequence[float], conflicts: Sequence[float], *,
                 dists: bool = False, **fields: Any) -> LakeConfig:
    """A valid :class:`LakeConfig` on ``canvas`` (``max_height``, ``max_width``, ``max_agents``).

    Any region of at least 2 x 2 that fits, 1 to ``min(max_agents, cells // 2)`` agents, a hole
    density of ``holes`` (0 where it would leave too few frozen cells for every agent's start
    and goal), a conflict density of ``conflicts`` and either goal rule; with ``dists`` any
    distance bounds the region allows (``min_dist`` 1 to 4, ``max_dist`` none or up to the
    longest path); ``fields``: the other fields, each a value or a strategy drawn in turn.
    """
    height, width = draw(st.integers(2, canvas["max_height"])), draw(st.integers(2, canvas["max_width"]))
    cells = height * width
    n = draw(st.integers(1, min(canvas["max_agents"], cells // 2)))
    hole_density = draw(st.sampled_from(list(holes)))
    if 2 * n > cells - round(hole_density * cells):
        hole_density = 0.0
    bounds = {}
    if dists:
        min_dist = draw(st.integers(1, min(4, cells - 1)))
        bounds = dict(min_dist=min_dist, max_dist=draw(st.one_of(st.none(), st.integers(min_dist, cells - 1))))
    conflict_density = draw(st.sampled_from(list(conflicts)))
    drawn = {k: draw(v) if isinstance(v, st.SearchStrategy) else v for k, v in fields.items()}
    return LakeConfig(height=height, width=width, num_agents=n, hole_density=hole_density,
                      conflict_density=conflict_density, **bounds, **drawn,
                      on_goal=draw(st.sampled_from(["vanish", "stay"])), **canvas)
