"""The JaxMARL adapter, checked with JaxMARL's own tooling: its spaces, the ``LogWrapper`` of its
IPPO baselines and the ``CTRolloutManager`` of its Q-learning baselines, run jitted and vmapped.
(JaxMARL's API-conformance tests are not in its wheel.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlake import observations
from jaxlake.adapters import jaxmarl as marl
from jaxlake.adapters.pools import make_pool
from jaxlake.config import ConfigError
from jaxlake.types import ACTIVE, STAY

from .support import POOL_SIZE, pool, take

BATCH, STEPS = 4, 12


@pytest.fixture(scope="module")
def env():
    return marl.MAPFFrozenLake(pool())


def test_agents_spaces_and_names(env):
    from jaxmarl.environments.spaces import Box, Discrete

    assert env.num_agents == 3 and env.agents == ["agent_0", "agent_1", "agent_2"]
    assert env.name == "MAPFFrozenLake" and env.agent_classes == {"agent": env.agents}
    size = 4 * 4 * observations.NUM_CHANNELS + observations.NUM_SCALARS
    for a in env.agents:
        assert isinstance(env.observation_space(a), Box) and env.observation_space(a).shape == (size,)
        assert isinstance(env.action_space(a), Discrete) and env.action_space(a).n == 5
    obs, state = env.reset(jax.random.PRNGKey(0))
    assert all(bool(env.observation_space(a).contains(obs[a])) for a in env.agents)
    assert env.world_state(state).shape == (4 * 4 * (2 + 2 * 3) + 2,)


def test_observations_and_avail_actions_are_the_cores(env):
    """Each agent's vector is its grid channels (channels first) then its scalars (uint8 by default: the scalars
    x 255, rounded; float32 on request: exact); the masks are the core's, and absent slots are
    done from the start with only STAY available."""
    step_env = jax.jit(env.step_env)
    exact = marl.MAPFFrozenLake(pool(), dtype="float32")
    assert exact.observation_space("agent_0").dtype == jnp.float32 and env.observation_space("agent_0").dtype == jnp.uint8
    for seed in range(2):
        obs, state = env.reset(jax.random.PRNGKey(seed))
        floats, _ = exact.reset(jax.random.PRNGKey(seed))
        core = observations.observe(state.lake, state.state)
        avail = env.get_avail_actions(state)
        for i, a in enumerate(env.agents):
            assert obs[a].dtype == jnp.uint8 and floats[a].dtype == jnp.float32
            channels_first = core.grid[i].transpose(2, 0, 1).reshape(-1)  # C planes of G x G'
            np.testing.assert_array_equal(floats[a], jnp.concatenate([channels_first, core.scalars[i]]))
            np.testing.assert_array_equal(obs[a][:-2], channels_first)
            np.testing.assert_array_equal(obs[a][-2:], np.round(np.asarray(core.scalars[i]) * 255))
            np.testing.assert_array_equal(avail[a], core.avail_actions[i])
            if i >= int(state.lake.num_agents):
                assert np.asarray(avail[a]).tolist() == [True, False, False, False, False]
        absent = int(state.lake.num_agents)
        _, _, _, dones, infos = step_env(jax.random.PRNGKey(9), state, {a: jnp.int32(STAY) for a in env.agents})
        assert [bool(dones[a]) for a in env.agents[absent:]] == [True] * (3 - absent)
        assert set(infos) == {"terminated", "truncated", "level"} and infos["level"].shape == (3,)


def test_grid_observations_and_crops():
    lakes = pool()
    grid = marl.MAPFFrozenLake(lakes, flatten=False)
    crop = marl.MAPFFrozenLake(lakes, radius=1, flatten=False)
    assert grid.observation_space("agent_0").shape == (4, 4, observations.NUM_CHANNELS + 2)
    assert crop.observation_space("agent_1").shape == (3, 3, observations.NUM_CHANNELS + 2)
    flat = marl.MAPFFrozenLake(lakes, radius=1)
    obs, state = flat.reset(jax.random.PRNGKey(1))
    core = observations.observe(state.lake, state.state, radius=1)
    np.testing.assert_array_equal(obs["agent_2"][:-2], core.grid[2].transpose(2, 0, 1).reshape(-1))
    crop = marl.MAPFFrozenLake(lakes, radius=1, flatten=False, dtype=jnp.float32)
    obs, state = crop.reset(jax.random.PRNGKey(1))
    core = observations.observe(state.lake, state.state, radius=1)
    np.testing.assert_array_equal(obs["agent_0"][..., :-2], core.grid[0])
    np.testing.assert_array_equal(obs["agent_0"][..., -2:], jnp.broadcast_to(core.scalars[0], (3, 3, 2)))
    with pytest.raises(ValueError, match=r"dtype='bool' not in \('uint8', 'float32'\)"):
        marl.MAPFFrozenLake(lakes, dtype="bool")


def test_reset_draws_from_the_pool_by_weight():
    lakes = pool()
    env = marl.MAPFFrozenLake(lakes, weights=np.eye(POOL_SIZE)[5])
    for seed in range(3):
        _, state = env.reset(jax.random.PRNGKey(seed))
        assert int(state.level) == 5
        np.testing.assert_array_equal(state.lake.holes, take(lakes, 5).holes)
    levels = {int(marl.MAPFFrozenLake(lakes).reset(jax.random.PRNGKey(s))[1].level) for s in range(12)}
    assert len(levels) > 3


def test_a_pool_xor_an_env():
    with pytest.raises(ConfigError, match="not both"):
        make_pool(pool(), env=[(1.0, object())])
    assert make_pool(take(pool(), 0)).holes.shape == (1, 4, 4)


def test_ippo_log_wrapper_vmapped(env):
    """JaxMARL's IPPO loop: LogWrapper over vmapped reset/step with sampled actions; every episode
    ends within the horizon, so episodes are logged, and observations stay in their space."""
    from jaxmarl.wrappers.baselines import LogWrapper

    wrapped = LogWrapper(env)

    @jax.jit
    def run(key):
        obs, state = jax.vmap(wrapped.reset)(jax.random.split(key, BATCH))

        def body(carry, k):
            obs, state = carry
            k_act, k_step = jax.random.split(k)
            acts = {a: jax.vmap(env.action_space(a).sample)(jax.random.split(jax.random.fold_in(k_act, i), BATCH))
                    for i, a in enumerate(env.agents)}
            obs, state, reward, done, info = jax.vmap(wrapped.step)(jax.random.split(k_step, BATCH), state, acts)
            inside = jnp.all(jnp.stack([jax.vmap(env.observation_space(a).contains)(obs[a]) for a in env.agents]))
            return (obs, state), (info["returned_episode"], info["returned_episode_returns"], inside)

        return jax.lax.scan(body, (obs, state), jax.random.split(key, STEPS))[1]

    ended, returns, inside = (np.asarray(x) for x in run(jax.random.PRNGKey(0)))
    assert ended.shape == (STEPS, BATCH, 3) and inside.all()
    assert ended[:, :, 0].sum(axis=0).min() >= 1  # horizons are 6 and 8 < STEPS
    assert np.isin(np.unique(returns), [-1.0, 0.0, 1.0]).all()


def test_q_learning_rollout_manager(env):
    """JaxMARL's CTRolloutManager (its Q-learning baselines): batched reset, sampled actions,
    batched steps, a global state and a global reward."""
    from jaxmarl.wrappers.baselines import CTRolloutManager

    manager = CTRolloutManager(env, batch_size=BATCH)
    key = jax.random.PRNGKey(2)
    obs, state = manager.batch_reset(key)
    assert obs["agent_0"].shape == (BATCH, manager.obs_size) and "__all__" in obs
    for t in range(3):
        k = jax.random.fold_in(key, t)
        acts = {a: manager.batch_sample(jax.random.fold_in(k, i), a) for i, a in enumerate(env.agents)}
        obs, state, reward, done, _ = manager.batch_step(k, state, acts)
    assert reward["__all__"].shape == (BATCH,) and done["__all__"].shape == (BATCH,)
    assert (np.asarray(state.state.status) <= 4).all()


def test_auto_reset_restarts_a_pool_lake(env):
    """When ``dones["__all__"]``, JaxMARL's step returns a fresh episode (all in-play agents ACTIVE)."""
    _, state = env.reset(jax.random.PRNGKey(4))
    stay = {a: jnp.int32(STAY) for a in env.agents}
    for t in range(8):
        _, state, _, dones, _ = env.step(jax.random.PRNGKey(t), state, stay)
        if bool(dones["__all__"]):
            break
    assert bool(dones["__all__"])  # STAY until the horizon: everyone timed out
    assert int(state.state.t) == 0
    assert (np.asarray(state.state.status)[: int(state.lake.num_agents)] == ACTIVE).all()
