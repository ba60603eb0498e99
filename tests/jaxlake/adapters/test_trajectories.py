"""Every adapter plays exactly the core's game: on the same lakes, keys and actions its
trajectories (rewards, dones, positions and statuses) equal ``jaxlake.env.rollout``'s.

Keys, client by client (each adapter's module docstring states its discipline):

* JaxUED: ``step(rng, ...)`` passes ``rng`` to the core unchanged: stepped with
  ``split(k, T)[t]`` it equals ``rollout(k, lake, plan)``, slips included.
* JaxMARL: ``step_env(key, ...)`` likewise equals ``rollout(k, ...)``. The public ``step(key, ...)``
  (JaxMARL's code) splits ``key`` and plays ``split(key)[0]``; ``rollout(key, lake, plan[:, t:t+1])``
  plays ``split(key, 1)[0]``, the same key under JAX's partitionable threefry (the default since
  JAX 0.5, checked below), so the reference is the chain of one-step rollouts with the keys the
  client was handed, up to the step that ends the episode; there the client's auto-reset takes
  over with ``split(key)[1]``, checked too.
* Jumanji: a step plays ``split(state.key)[0]`` and keeps ``split(state.key)[1]``: the reference
  is the chain of one-step rollouts with each state's key.

On lakes without slips the keys do not matter: there every adapter's trajectory also equals one
whole ``rollout``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxlake import env as core
from jaxlake.adapters import jaxmarl as marl
from jaxlake.adapters import jaxued as ued
from jaxlake.adapters import jumanji as jum
from jaxlake.types import ACTIVE, TIMED_OUT

from .support import POOL_SIZE, pool, take

T = 10  # steps per trajectory: longer than every horizon of the pool (6 and 8)
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
cases = st.tuples(st.integers(0, POOL_SIZE - 1), st.integers(0, 2**31 - 1),
                  st.lists(st.integers(0, 4), min_size=3 * T, max_size=3 * T))


@pytest.fixture(scope="module")
def envs():
    lakes = pool()
    return lakes, {"jaxmarl": marl.MAPFFrozenLake(lakes), "jumanji": jum.MAPFFrozenLake(lakes),
                   "jaxued": ued.MAPFFrozenLake()}


def _case(envs, case, client):
    """``(env, i, key, plan, lake)`` of a drawn ``case``: ``client``'s environment, the pool's lake
    ``i``, the key and the ``[3, T]`` plan."""
    lakes, clients = envs
    i, seed, flat = case
    return clients[client], i, jax.random.PRNGKey(seed), jnp.asarray(flat, jnp.int32).reshape(3, T), take(lakes, i)


def _client_scan(env, name, start, body):
    """``run(lake, level, key, xs)``: the outputs of ``lax.scan(body, start(lake, level, key), xs)``,
    the client's trajectory, jitted once per client (kept on ``env`` as ``name``)."""
    if not hasattr(env, name):
        setattr(env, name, jax.jit(lambda lake, level, key, xs: jax.lax.scan(body, start(lake, level, key), xs)[1]))
    return getattr(env, name)


@jax.jit
def _rollout(key, lake, plan):
    traj = core.rollout(key, lake, plan).trajectory
    return traj.info.reward, traj.status, traj.pos, traj.info.done


@jax.jit
def _one_step_chain(keys, lake, plan):
    """The reference of the key-splitting clients: ``rollout(keys[t], lake, plan[:, t:t+1])`` from
    the state the previous one left."""

    def body(state, xs):
        key, actions = xs
        r = core.rollout(key, lake, actions[:, None], init_state=state)
        s = r.final_state
        return s, (r.trajectory.info.reward[0], s.status, s.pos, s.done)

    _, out = jax.lax.scan(body, core.reset(lake), (keys, plan.T))
    return out


def _assert_equal(got, want, upto=None):
    for name, g, w in zip(("reward", "status", "pos", "done"), got, want):
        g, w = np.asarray(g), np.asarray(w)
        if upto is not None:
            g, w = g[:upto], w[:upto]
        np.testing.assert_array_equal(g, w, err_msg=name)


def test_one_step_rollout_key_is_the_first_split():
    """The identity the key-splitting clients' references rest on (threefry partitionable)."""
    for seed in range(5):
        k = jax.random.PRNGKey(seed)
        np.testing.assert_array_equal(jax.random.split(k, 1)[0], jax.random.split(k)[0])


@SETTINGS
@given(case=cases)
def test_jaxued_step_equals_rollout(envs, case):
    env, i, key, plan, lake = _case(envs, case, "jaxued")
    got = _ued_run(env, lake, jax.random.split(key, T), plan)
    _assert_equal(got, _rollout(key, lake, plan))


def _ued_run(env, lake, keys, plan):
    def body(state, xs):
        k, a = xs
        _, state, reward, done, _ = env.step(k, state, a, env.default_params)
        return state, (reward, state.state.status, state.state.pos, done)

    run = _client_scan(env, "_test_run", lambda lake, level, key: env.reset_to_level(key, lake, env.default_params)[1],
                       body)
    return run(lake, 0, keys[0], (keys, plan.T))


@SETTINGS
@given(case=cases)
def test_jaxmarl_step_env_equals_rollout(envs, case):
    env, i, key, plan, lake = _case(envs, case, "jaxmarl")
    got = _marl_run(env, lake, i, jax.random.split(key, T), plan, public=False)
    _assert_equal(got[:4], _rollout(key, lake, plan))


@SETTINGS
@given(case=cases)
def test_jaxmarl_step_with_auto_reset_equals_rollout(envs, case):
    env, i, key, plan, lake = _case(envs, case, "jaxmarl")
    keys = jax.random.split(key, T)
    reward, status, pos, done, all_done = (np.asarray(x) for x in _marl_run(env, lake, i, keys, plan, public=True))
    ref = [np.asarray(x) for x in _one_step_chain(keys, lake, plan)]
    end = int(np.argmax(ref[3]))  # the step that ends the episode (every episode ends within T)
    assert ref[3][end] and not ref[3][:end].any()
    np.testing.assert_array_equal(all_done[: end + 1], ref[3][: end + 1])
    np.testing.assert_array_equal(reward[: end + 1], ref[0][: end + 1])
    np.testing.assert_array_equal(done[: end + 1], ref[1][: end + 1] != ACTIVE)  # per-agent dones
    _assert_equal((status, pos), ref[1:3], upto=end)  # the state before the reset
    # at the end JaxMARL returns the reset of a fresh pool lake drawn with split(key)[1]
    _, fresh = env.reset(jax.random.split(keys[end])[1])
    np.testing.assert_array_equal(status[end], fresh.state.status)
    np.testing.assert_array_equal(pos[end], fresh.state.pos)
    if float(lake.slip_prob) == 0.0:
        _assert_equal((reward, status, pos), _rollout(jax.random.PRNGKey(0), lake, plan)[:3], upto=end)


def _marl_run(env, lake, level, keys, plan, public):
    step = env.step if public else env.step_env

    def body(state, xs):
        k, a = xs
        actions = {agent: a[j] for j, agent in enumerate(env.agents)}
        _, state, rewards, dones, _ = step(k, state, actions)
        return state, (jnp.stack([rewards[x] for x in env.agents]), state.state.status, state.state.pos,
                       jnp.stack([dones[x] for x in env.agents]), dones["__all__"])

    def start(lake, level, key):
        return marl.LakeEnvState(lake=lake, state=core.reset(lake), level=jnp.int32(level))

    out = _client_scan(env, f"_test_run_{public}", start, body)(lake, level, keys[0], (keys, plan.T))
    if public:
        return out
    reward, status, pos, done, all_done = out
    np.testing.assert_array_equal(done, np.asarray(status) != ACTIVE)
    return reward, status, pos, all_done


@SETTINGS
@given(case=cases)
def test_jumanji_step_equals_rollout(envs, case):
    env, i, key, plan, lake = _case(envs, case, "jumanji")

    def body(state, a):
        before = state.key
        state, ts = env.step(state, a)
        return state, (before, ts.reward, state.state.status, state.state.pos, ts.last(), ts.discount)

    def start(lake, level, key):
        return jum.JumanjiState(lake=lake, state=core.reset(lake), level=jnp.int32(level), key=key)

    keys, reward, status, pos, last, discount = _client_scan(env, "_test_run", start, body)(lake, i, key, plan.T)
    _assert_equal((reward, status, pos, last), _one_step_chain(keys, lake, plan))
    status = np.asarray(status)
    np.testing.assert_array_equal(np.asarray(discount), ((status == ACTIVE) | (status == TIMED_OUT)).astype(np.float32))
    if float(lake.slip_prob) == 0.0:
        _assert_equal((reward, status, pos, last), _rollout(jax.random.PRNGKey(0), lake, plan))
