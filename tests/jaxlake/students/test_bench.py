"""The benchmark's peer loop (JaxMARL's IPPO, :mod:`jaxlake.students.marl_ippo`) at the smallest
settings, on the lakes through the JaxMARL adapter."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("jaxmarl")

from jaxlake.config import LakeConfig  # noqa: E402
from jaxlake.students import marl_ippo  # noqa: E402
from jaxlake.students.config import IPPOConfig  # noqa: E402


def test_batchify_and_unbatchify_are_inverse():
    agents = ["agent_0", "agent_1", "agent_2"]
    x = {a: jnp.arange(8).reshape(4, 2) + 10 * i for i, a in enumerate(agents)}
    flat = marl_ippo.batchify(x, agents, 12)
    assert flat.shape == (12, 2) and int(flat[4, 0]) == 10  # agent-major: agent_1's first instance
    back = marl_ippo.unbatchify(flat, agents, 4, 3)
    assert all(np.array_equal(back[a], x[a]) for a in agents)


def test_jaxmarl_ippo_trains_on_the_lakes_adapter():
    from jaxlake.adapters.jaxmarl import MAPFFrozenLake

    config = IPPOConfig(num_envs=2, num_steps=4, num_updates=1, eval_every=1, update_epochs=1, num_minibatches=2,
                        hidden=(8,), pool_lakes=4)
    env = MAPFFrozenLake(env=LakeConfig(), pool_size=4, radius=config.radius, dtype="float32")
    params, losses = jax.jit(marl_ippo.make_train(config, env))(jax.random.PRNGKey(0))
    assert losses.shape == (1,) and bool(jnp.all(jnp.isfinite(losses)))
    assert params["params"]["Dense_0"]["kernel"].shape == (env.observation_space(env.agents[0]).shape[0], 8)
    with pytest.raises(ValueError, match="num_minibatches=3 must divide"):
        marl_ippo.make_train(dataclasses.replace(config, num_minibatches=3), env)
