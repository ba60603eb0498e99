"""The stage's environment as the trainer sees it: lakes drawn from a config or a mixture.

An environment (:data:`EnvSpec`) is a ``LakeConfig`` or a mixture ``[(weight, LakeConfig),
...]``; :func:`sample_lakes` draws a batch deterministically from a key.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

EnvSpec = Any  # a LakeConfig or a mixture [(weight, LakeConfig), ...]


@functools.lru_cache(maxsize=None)
def _vmapped_generate():
    from jaxlake.generator import generate

    return jax.jit(jax.vmap(generate))


def sample_lakes(key: jax.Array, env: EnvSpec, n: int):
    """``n`` lakes of ``env`` (a ``LakeConfig`` or a list of ``(weight, LakeConfig)``).

    Deterministic in ``key``. Uses ``jaxlake.generator.generate_batch`` /
    ``generate_mixture`` when present, else one jitted ``vmap(generate)`` over a stacked
    config (a mixture picks each lake's config by weight).
    """
    from jaxlake import generator
    from jaxlake.config import repeat_config, stack_configs

    if isinstance(env, (list, tuple)):
        if hasattr(generator, "generate_mixture"):
            return generator.generate_mixture(key, list(env), n)
        weights = np.asarray([float(w) for w, _ in env], np.float64)
        pick_key, key = jax.random.split(key)
        choice = np.asarray(jax.random.choice(pick_key, len(env), (n,), p=jnp.asarray(weights / weights.sum())))
        configs = stack_configs([env[int(i)][1] for i in choice])
    else:
        if hasattr(generator, "generate_batch"):
            return generator.generate_batch(key, env, n)
        configs = repeat_config(env, n)
    return _vmapped_generate()(jax.random.split(key, n), configs)


def env_horizon(env: EnvSpec) -> int:
    """Largest ``max_steps`` of the environment (the rollout horizon)."""
    if isinstance(env, (list, tuple)):
        return max(int(c.max_steps) for _, c in env)
    return int(env.max_steps)


def env_description(env: EnvSpec) -> Any:
    """The environment as JSON-ready data (a dict, or a list of weighted dicts for a mixture)."""
    if isinstance(env, (list, tuple)):
        return [{"weight": float(w), **c.to_dict()} for w, c in env]
    return env.to_dict()
