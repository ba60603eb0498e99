"""The Jumanji adapter, checked with Jumanji's own tooling: its registry (``jumanji.make``), its
environment checks (``jumanji.testing.env_not_smoke``), its spec validation and its
``VmapAutoResetWrapper``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jumanji
import numpy as np
import pytest
from jumanji import specs
from jumanji.testing.env_not_smoke import check_env_does_not_smoke, check_env_specs_does_not_smoke
from jumanji.wrappers import VmapAutoResetWrapper

from jaxlake import observations
from jaxlake.adapters import jumanji as jum
from jaxlake.types import ACTIVE

from .support import pool

BATCH, STEPS = 4, 12


@pytest.fixture(scope="module")
def env():
    return jumanji.make(jum.ENV_ID, pool=pool())


def test_registered_and_made(env):
    assert jum.ENV_ID == "MAPFFrozenLake-v0" and jum.ENV_ID in jumanji.registered_environments()
    assert isinstance(env, jum.MAPFFrozenLake) and env.num_agents == 3
    assert isinstance(env.action_spec, specs.MultiDiscreteArray)
    np.testing.assert_array_equal(env.action_spec.num_values, [5, 5, 5])
    assert env.reward_spec.shape == (3,) and env.discount_spec.shape == (3,)
    assert env.observation_spec.action_mask.shape == (3, 5)
    assert env.observation_spec.grid.shape == (3, 4, 4, observations.NUM_CHANNELS)
    jum.register()  # registering again is skipped, not an error


def test_jumanji_environment_checks(env):
    check_env_specs_does_not_smoke(env)
    check_env_does_not_smoke(env)  # random actions of the action spec until the episode's last step
    crop = jum.MAPFFrozenLake(pool(), radius=1)
    check_env_does_not_smoke(crop)
    assert crop.observation_spec.grid.shape == (3, 3, 3, observations.NUM_CHANNELS)


def test_timesteps_conform_to_the_specs(env):
    state, ts = env.reset(jax.random.PRNGKey(0))
    env.observation_spec.validate(ts.observation)
    env.reward_spec.validate(ts.reward)
    env.discount_spec.validate(ts.discount)
    assert bool(ts.first()) and set(ts.extras) == {"terminated", "truncated", "level"}
    mask = ts.observation.action_mask
    np.testing.assert_array_equal(mask, observations.avail_actions(state.lake, state.state))
    state, ts = jax.jit(env.step)(state, env.action_spec.generate_value())
    env.observation_spec.validate(ts.observation)
    env.reward_spec.validate(ts.reward)
    assert "MAPFFrozenLake" in repr(env) and isinstance(env.render(state), str)


def test_vmap_auto_reset_wrapper(env):
    """Jumanji's VmapAutoResetWrapper: every episode ends within the horizon and restarts with
    all in-play agents ACTIVE; the terminal step keeps its reward and discount."""
    wrapped = VmapAutoResetWrapper(env)

    @jax.jit
    def run(key):
        state, ts = wrapped.reset(jax.random.split(key, BATCH))

        def body(state, k):
            action = jax.random.randint(k, (BATCH, 3), 0, 5, jnp.int32)
            state, ts = wrapped.step(state, action)
            return state, (ts.last(), ts.discount, state.state.status, state.state.t, state.lake.num_agents)

        return jax.lax.scan(body, state, jax.random.split(key, STEPS))[1]

    last, discount, status, t, num = (np.asarray(x) for x in run(jax.random.PRNGKey(1)))
    assert last.shape == (STEPS, BATCH) and last.sum(axis=0).min() >= 1
    assert (t[last] == 0).all()  # the state after a last step is a fresh reset
    for s, b in zip(*np.nonzero(last)):
        assert (status[s, b, : num[s, b]] == ACTIVE).all()
    assert np.isin(discount, [0.0, 1.0]).all()
