"""The stage's environment as the trainer sees it: lakes drawn from a :class:`~jaxlake.mixture.Mixture`.

An environment is a :class:`jaxlake.mixture.Mixture` (the one mixture type of the project; a
``LakeConfig`` or a list of ``(weight, LakeConfig)`` pairs is read as one with
``Mixture.of``); :func:`sample_lakes` draws a batch deterministically from a key.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxlake.config import LakeConfig
from jaxlake.generator import generate_batch, generate_mixture
from jaxlake.mixture import Mixture


def sample_lakes(key: jax.Array, env: Mixture | LakeConfig, n: int, split: str = "quota"):
    """``n`` lakes of ``env``, deterministic in ``key``.

    A one-component mixture draws exactly as its config does
    (:func:`jaxlake.generator.generate_batch`); a mixture of several draws its components in
    blocks (:func:`jaxlake.generator.generate_mixture`): ``split="quota"`` gives every key the
    same largest-remainder counts, component 0 first (the evaluations, whose cells are the
    components: :func:`jaxlake.generator.mixture_components` says which lake is whose);
    ``split="random"`` draws the counts and the order from ``key`` (the trainers: a mixture
    with more components than lakes per step still trains on every component).
    """
    mixture = Mixture.of(env)
    if len(mixture) == 1:
        return generate_batch(key, mixture.main, n)
    return generate_mixture(key, mixture, n, split=split)


def env_horizon(env: Mixture | LakeConfig) -> int:
    """Largest ``max_steps`` of the environment (the rollout horizon)."""
    return Mixture.of(env).horizon


def env_description(env: Mixture | LakeConfig) -> Any:
    """The environment as JSON-ready data: the config's fields for one component, else a list
    of ``{"weight": w, **fields}``."""
    mixture = Mixture.of(env)
    if len(mixture) == 1:
        return mixture.main.to_dict()
    return [{"weight": float(w), **c.to_dict()} for w, c in mixture]
