"""Pools of lakes and level samplers shared by the adapters (no client import).

* :func:`make_pool`: the pre-generated pool an adapter's ``reset`` draws from: a batch of lakes
  given as it is, or ``size`` lakes generated from a :class:`~jaxlake.config.LakeConfig` or a
  mixture (:func:`jaxlake.generator.generate_mixture`, the ``"quota"`` split, shuffled).
* :func:`make_level_sampler`: a jittable ``key -> Lake`` drawing a fresh lake from a config or a
  mixture (a component by weight, then :func:`jaxlake.generator.generate` with its config):
  JaxUED's ``sample_random_level``, or a :data:`jaxlake.levels.Sampler`.
* :func:`make_pool_draw`: a jittable ``key -> index`` into a pool by weight, one random number a
  draw (the pool adapters' resets run on every step under ``vmap``, where a categorical over the
  pool, one Gumbel number a lake, cost as much as thousands of steps).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp

from jaxlake import autoreset
from jaxlake.config import ConfigError, LakeConfig, stack_configs
from jaxlake.generator import generate, generate_mixture, lift_configs
from jaxlake.mixture import Mixture
from jaxlake.types import Lake

__all__ = ["EnvSource", "make_level_sampler", "make_pool", "make_pool_draw"]

#: What an adapter's lakes come from: a config or a mixture (``[(weight, config), ...]``).
EnvSource = Union[LakeConfig, Mixture, Sequence[Any]]


def make_pool(pool: Optional[Lake] = None, *, env: Optional[EnvSource] = None, size: int = 256,
              seed: int = 0) -> Lake:
    """A pool of lakes with a leading ``[P]`` axis on every leaf.

    Args:
      pool: a batch of lakes (leading axis ``[P]``), returned as it is; an unbatched lake becomes
        a pool of one.
      env: else a :class:`LakeConfig` or a mixture to generate ``size`` lakes from (a
        ``LakeConfig()`` when both are ``None``).
      size: lakes to generate (``env`` only).
      seed: the generation key, ``jax.random.key(seed)`` (``env`` only).
    """
    if pool is not None:
        if env is not None:
            raise ConfigError("give either a pool of lakes or an env (config or mixture), not both")
        if not isinstance(pool, Lake):
            raise ConfigError(f"pool must be a Lake (batched on a leading axis), got {type(pool).__name__}")
        if jnp.ndim(pool.holes) == 2:
            pool = jax.tree_util.tree_map(lambda x: jnp.asarray(x)[None], pool)
        autoreset.pool_size(pool)  # checks the rank
        return pool
    if int(size) < 1:
        raise ConfigError(f"size={size} not in [1, inf)")
    mixture = Mixture.of(LakeConfig() if env is None else env)
    return generate_mixture(jax.random.key(int(seed)), mixture, int(size), shuffle=True)


def make_level_sampler(env: EnvSource) -> Callable[[jax.Array], Lake]:
    """A pure ``key -> Lake``: a component of ``env`` drawn by weight (``fold_in(key, 0)``), then
    ``generate(fold_in(key, 1), its config)``; configs of different capacities are lifted to a
    common one (:func:`jaxlake.generator.lift_configs`). Jittable and vmappable."""
    mixture = Mixture.of(env)
    configs = stack_configs(lift_configs(mixture.configs))
    log_w = jnp.log(jnp.asarray(mixture.weights, jnp.float32))

    def sample(key: jax.Array) -> Lake:
        idx = jax.random.categorical(jax.random.fold_in(key, 0), log_w)
        config = jax.tree_util.tree_map(lambda x: x[idx], configs)
        return generate(jax.random.fold_in(key, 1), config)

    return sample



def make_pool_draw(size: int, weights: Optional[Any] = None) -> Callable[[jax.Array], jax.Array]:
    """A pure ``key -> []`` int32 index into a pool of ``size`` lakes: uniform
    (``jax.random.randint``) when ``weights`` is ``None``, else by weight from one uniform number
    (the inverse of the cumulative weights; lakes of weight 0 are never drawn)."""
    size = int(size)
    if weights is None:
        return lambda key: jax.random.randint(key, (), 0, size, dtype=jnp.int32)
    w = jnp.asarray(weights, jnp.float32)
    if w.shape != (size,) or not bool(jnp.all(w >= 0)) or not float(jnp.sum(w)) > 0:
        raise ConfigError(f"weights must be {size} non-negative numbers with a positive sum (one per pool lake), "
                          f"got shape {tuple(w.shape)}")
    cdf = jnp.cumsum(w) / jnp.sum(w)
    last = int(jnp.max(jnp.nonzero(w > 0, size=size, fill_value=0)[0]))
    cdf = jnp.where(jnp.arange(size) >= last, 1.0, cdf)  # rounding never reaches a trailing weight-0 lake

    def draw(key: jax.Array) -> jax.Array:
        u = jax.random.uniform(key, (), jnp.float32)
        return jnp.clip(jnp.searchsorted(cdf, u, side="right"), 0, size - 1).astype(jnp.int32)

    return draw
