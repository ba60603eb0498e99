"""What the adapter tests share: a small mixed pool of lakes (one compiled generation)."""

from __future__ import annotations

import functools

import jax

from jaxlake import LakeConfig
from jaxlake.adapters.pools import make_pool

#: Tiny settings with every feature that matters to an adapter: 1-3 agents of 3 slots (absent
#: slots), both goal rules, slips and none, holes, short horizons (time-outs).
BASE = LakeConfig(height=4, width=4, num_agents=3, hole_density=0.15, conflict_density=0.5, slip_prob=0.0,
                  max_steps=6, max_height=4, max_width=4, max_agents=3)
MIXTURE = [
    (1.0, BASE),
    (1.0, BASE.replace(num_agents=2, slip_prob=0.3, on_goal="stay", max_steps=8)),
    (1.0, BASE.replace(num_agents=1, slip_prob=0.5, height=3, width=3)),
    (1.0, BASE.replace(num_agents=3, hole_density=0.3, on_goal="stay")),
]
POOL_SIZE = 16


@functools.lru_cache(maxsize=None)
def pool():
    """The shared pool: ``POOL_SIZE`` lakes of :data:`MIXTURE`."""
    return make_pool(env=MIXTURE, size=POOL_SIZE, seed=3)


def take(lakes, i: int):
    """Lake ``i`` of a pool."""
    return jax.tree_util.tree_map(lambda x: x[i], lakes)
