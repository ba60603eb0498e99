"""What the adapters share about their inputs and outputs (no client import).

* :func:`agent_action` and :func:`joint_actions`: the actions as the ecosystems send them. JaxMARL's
  IPPO baselines turn their action batch back into a dict with ``x.reshape((num_actors,
  num_envs, -1))``, so under ``jax.vmap(env.step)`` each agent's action arrives with shape
  ``(1,)``; other loops send scalars. Any shape holding one integer per agent is taken (a scalar,
  ``(1,)``, ``(1, 1)``, ...; a joint action of ``A`` integers in any shape of ``A`` elements),
  anything else is one clear error.
* :func:`observation_dtype`: the dtype of an adapter's grid observations, a compact one (uint8 or
  bool) by default, float32 on request.
* :func:`quantize_scalars`: the per-agent scalars in a uint8 vector (``round(255 * x)``).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DTYPES", "agent_action", "joint_actions", "observation_dtype", "quantize_scalars"]

#: Grid dtypes an adapter may be asked for, by name.
DTYPES = {"bool": jnp.bool_, "uint8": jnp.uint8, "float32": jnp.float32}


def _integers(x: jax.Array, field: str) -> jax.Array:
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{field} must hold integers in 0..4 (STAY UP DOWN LEFT RIGHT), got dtype {x.dtype}")
    return x.astype(jnp.int32)


def agent_action(action: Any, field: str = "action") -> jax.Array:
    """One agent's action as a ``[]`` int32: any shape of one element (``()``, ``(1,)``, ...)."""
    x = jnp.asarray(action)
    if x.size != 1:
        raise ValueError(f"{field} has shape {tuple(x.shape)}; one integer per agent: shape (), (1,) "
                         f"or any shape of one element")
    return _integers(x.reshape(()), field)


def joint_actions(action: Any, num_agents: int, field: str = "action") -> jax.Array:
    """A joint action as ``[A]`` int32: any shape of ``A`` elements (``(A,)``, ``(A, 1)``, ...)."""
    x = jnp.asarray(action)
    if x.size != num_agents:
        raise ValueError(f"{field} has shape {tuple(x.shape)}; one integer per agent, {num_agents} in all: "
                         f"shape ({num_agents},), ({num_agents}, 1) or any shape of {num_agents} elements")
    return _integers(x.reshape(num_agents), field)


def observation_dtype(dtype: Any, allowed: Sequence[str] = tuple(DTYPES), field: str = "dtype") -> Any:
    """The jnp dtype of ``dtype`` (a name, a numpy or jnp dtype) if its name is ``allowed``."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in allowed:
        raise ValueError(f"{field}={dtype!r} not in {tuple(allowed)}")
    return DTYPES[name]


def quantize_scalars(scalars: jax.Array) -> jax.Array:
    """``[..., S]`` scalars in ``[0, 1]`` -> uint8 ``round(255 * x)``."""
    return jnp.round(jnp.clip(scalars, 0.0, 1.0) * 255.0).astype(jnp.uint8)
