"""The JaxUED adapter, checked with JaxUED's own tooling: its ``LevelSampler`` (the PLR / ACCEL
level buffer) holding lakes, and its ``AutoReplayWrapper`` and ``AutoResetWrapper``. JaxUED
0.0.1 calls ``jax.tree_map`` (removed in JAX 0.6): those tests install the adapter's shim for
their duration only."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlake import levels
from jaxlake.adapters import jaxued as ued
from jaxlake.types import ACTIVE, Lake

from .support import BASE, MIXTURE, pool, take


@pytest.fixture
def tree_map_shim(monkeypatch):
    if not hasattr(jax, "tree_map"):
        monkeypatch.setattr(jax, "tree_map", jax.tree.map, raising=False)


def test_the_interface():
    from gymnax.environments import spaces
    from jaxued.environments import UnderspecifiedEnv

    env = ued.MAPFFrozenLake(MIXTURE, radius=1)
    assert isinstance(env, UnderspecifiedEnv)
    assert isinstance(env.action_space(env.default_params), spaces.Discrete) and env.action_space().n == 5
    assert (env.min_dist, env.max_dist) == (1, None)
    obs, state = env.reset_to_level(jax.random.PRNGKey(0), take(pool(), 1), env.default_params)
    assert obs.grid.shape == (3, 3, 3, 6) and obs.avail_actions.shape == (3, 5)
    _, _, reward, done, info = env.step(jax.random.PRNGKey(1), state, jnp.zeros(3, jnp.int32), env.default_params)
    assert reward.shape == (3,) and done.shape == () and set(info) == {"terminated", "truncated"}


def test_the_generator_samples_levels_and_mutate_edits_them():
    env = ued.MAPFFrozenLake(MIXTURE)
    lakes = jax.jit(jax.vmap(env.sample_random_level))(jax.random.split(jax.random.PRNGKey(0), 6))
    assert isinstance(lakes, Lake) and lakes.holes.shape == (6, 4, 4) and lakes.max_agents == 3
    assert np.asarray(lakes.stats.dist_ok).all()
    kinds = zip(*(np.asarray(x).round(2).tolist() for x in (lakes.num_agents, lakes.slip_prob, lakes.on_goal)))
    assert len(set(kinds)) > 1  # several components of the mixture
    mutate = jax.jit(jax.vmap(env.mutate_level, in_axes=(0, 0, None)))
    edited = mutate(jax.random.split(jax.random.PRNGKey(1), 6), lakes, 4)
    np.testing.assert_array_equal(edited.num_agents, lakes.num_agents)
    assert np.asarray(edited.stats.dist_ok).all()  # recomputed with the bounds, kept by every edit
    changed = np.asarray(jnp.any(edited.holes != lakes.holes, axis=(1, 2))
                         | jnp.any(edited.starts != lakes.starts, axis=(1, 2))
                         | jnp.any(edited.goals != lakes.goals, axis=(1, 2)))
    assert changed.any()


def test_the_mutator_is_the_cores_mutate_with_the_config_bounds(monkeypatch):
    calls = []
    monkeypatch.setattr(levels, "mutate", lambda *a, **k: calls.append((a, k)) or "edited")
    mutator = ued.MAPFFrozenLake([(1.0, BASE.replace(min_dist=2, max_dist=5)), (1.0, BASE)]).mutate_level
    assert mutator("rng", "lake", 3) == "edited"
    assert calls == [(("rng", "lake", 3), {"min_dist": 1, "max_dist": None})]
    ued.make_level_mutator(2, 5)("rng", "lake")
    assert calls[-1] == (("rng", "lake", 1), {"min_dist": 2, "max_dist": 5})


def test_level_sampler_buffer_of_lakes(tree_map_shim):
    """PLR's buffer: insert scored lakes, sample a replay level, play it."""
    from jaxued.level_sampler import LevelSampler

    lakes = pool()
    sampler = LevelSampler(capacity=8, replay_prob=0.5, staleness_coeff=0.3, minimum_fill_ratio=0.5)
    buffer = sampler.initialize(take(lakes, 0), {"max_return": -jnp.inf})
    buffer, idx = sampler.insert_batch(buffer, take(lakes, slice(0, 6)), jnp.arange(6, dtype=jnp.float32),
                                       {"max_return": jnp.zeros(6)})
    assert int(buffer["size"]) == 6
    buffer, (i, level) = sampler.sample_replay_level(buffer, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(level.holes, take(lakes, int(i)).holes)
    assert int(sampler.find(buffer, take(lakes, 3))) == 3
    env = ued.MAPFFrozenLake(BASE)
    _, state = env.reset_to_level(jax.random.PRNGKey(1), level, env.default_params)
    assert int(state.state.t) == 0


def test_auto_replay_and_auto_reset_wrappers(tree_map_shim):
    """AutoReplayWrapper replays the same lake after each episode; AutoResetWrapper draws a new
    one from the generator."""
    from jaxued.wrappers import AutoReplayWrapper, AutoResetWrapper

    env = ued.MAPFFrozenLake(BASE)
    lake = take(pool(), 0)
    for wrapped in (AutoReplayWrapper(env), AutoResetWrapper(env, env.sample_random_level)):
        params = wrapped.default_params

        @jax.jit
        def run(key):
            _, state = wrapped.reset_to_level(key, lake, params)

            def body(state, k):
                _, state, reward, done, _ = wrapped.step(k, state, jnp.zeros(3, jnp.int32), params)
                return state, (done, state.env_state.state.t, state.env_state.lake.holes, state.env_state.state.status)

            return jax.lax.scan(body, state, jax.random.split(key, 8))[1]

        done, t, holes, status = (np.asarray(x) for x in run(jax.random.PRNGKey(0)))
        end = int(np.argmax(done))
        assert done[end] and end == int(lake.max_steps) - 1  # STAY until the horizon
        assert t[end] == 0 and (status[end][: int(lake.num_agents)] == ACTIVE).all()
        if isinstance(wrapped, AutoReplayWrapper):
            assert (holes == np.asarray(lake.holes)).all()


def test_the_shim_sets_only_what_is_missing(monkeypatch):
    monkeypatch.setattr(jax, "tree_map", None, raising=False)  # undone last: JAX as it was
    monkeypatch.delattr(jax, "tree_map")
    assert ued.install_tree_map_shim() is True and jax.tree_map is jax.tree.map
    assert ued.install_tree_map_shim() is False
