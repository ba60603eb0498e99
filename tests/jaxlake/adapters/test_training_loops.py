"""Every adapter inside a training-style loop written the way its ecosystem's baselines write
theirs, with the action shapes those loops send.

PureJaxRL's and JaxMARL's IPPO scripts flatten the per-agent dicts into one batch of actors and
back with two helpers (written here as they write them): ``batchify`` stacks the agents and
reshapes to ``[num_actors, -1]``; ``unbatchify`` reshapes the policy's ``[num_actors]`` actions to
``[num_agents, num_envs, -1]``, so under ``jax.vmap(env.step)`` each agent's action is ``(1,)``.
Each loop is checked against the same loop fed plain scalar actions (the same trajectory), and a
shape that does not hold one integer per agent is one clear error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlake.adapters import jaxmarl as marl
from jaxlake.adapters import jaxued as ued
from jaxlake.adapters import jumanji as jum
from jaxlake.adapters.common import agent_action, joint_actions

from .support import BASE, pool, take

NUM_ENVS, STEPS, A = 4, 9, 3
NUM_ACTORS = A * NUM_ENVS


def batchify(x: dict, agent_list, num_actors):
    x = jnp.stack([x[a] for a in agent_list])
    return x.reshape((num_actors, -1))


def unbatchify(x: jax.Array, agent_list, num_envs, num_actors):
    x = x.reshape((num_actors, num_envs, -1))
    return {a: x[i] for i, a in enumerate(agent_list)}


def masked_sample(key, logits_shape, avail):
    """A random policy over the available actions: ``[num_actors]`` int32."""
    logits = jax.random.normal(key, logits_shape)
    return jax.random.categorical(key, jnp.where(avail, logits, -1e9)).astype(jnp.int32)


def test_jaxmarl_ippo_loop_sends_shape_1_actions():
    """JaxMARL's IPPO loop (LogWrapper, vmapped reset and step, batchify / unbatchify): each agent's
    action arrives as ``(1,)`` and plays the same game as scalar actions."""
    from jaxmarl.wrappers.baselines import LogWrapper

    env = LogWrapper(marl.MAPFFrozenLake(pool()))
    agents = env._env.agents

    def run(key, squeeze):
        obsv, env_state = jax.vmap(env.reset)(jax.random.split(key, NUM_ENVS))

        def env_step(runner_state, k):
            env_state, last_obs = runner_state
            k_act, k_step = jax.random.split(k)
            obs_batch = batchify(last_obs, agents, NUM_ACTORS)
            avail = batchify(jax.vmap(env._env.get_avail_actions)(env_state.env_state), agents, NUM_ACTORS)
            action = masked_sample(k_act, (NUM_ACTORS, 5), avail)
            env_act = unbatchify(action, agents, NUM_ENVS, A)
            if squeeze:
                env_act = {a: x[:, 0] for a, x in env_act.items()}
            else:
                assert env_act["agent_0"].shape == (NUM_ENVS, 1)
            obsv, env_state, reward, done, info = jax.vmap(env.step)(jax.random.split(k_step, NUM_ENVS),
                                                                     env_state, env_act)
            return (env_state, obsv), (obs_batch, batchify(reward, agents, NUM_ACTORS).squeeze(-1),
                                      batchify(done, agents, NUM_ACTORS).squeeze(-1), info["returned_episode"])

        return jax.lax.scan(env_step, (env_state, obsv), jax.random.split(key, STEPS))[1]

    shaped, scalar = jax.jit(lambda k: (run(k, False), run(k, True)))(jax.random.PRNGKey(0))
    for x, y in zip(shaped, scalar):
        np.testing.assert_array_equal(x, y)
    obs, reward, done, ended = (np.asarray(x) for x in shaped)
    assert obs.shape == (STEPS, NUM_ACTORS, 4 * 4 * 6 + 2) and obs.dtype == np.uint8
    assert reward.shape == (STEPS, NUM_ACTORS) and done.dtype == bool and ended.any()
    bad = {a: jnp.zeros((2,), jnp.int32) for a in agents}
    with pytest.raises(ValueError, match=r"actions\['agent_0'\] has shape \(2,\); one integer per agent"):
        env._env.step_env(jax.random.PRNGKey(0), env._env.reset(jax.random.PRNGKey(0))[1], bad)


def test_jumanji_loop_with_actor_batch_actions():
    """Jumanji's VmapAutoResetWrapper fed the actor batch reshaped as those scripts do: ``[E, A, 1]``
    actions play the same game as ``[E, A]``; the grids are uint8 unless asked otherwise."""
    from jumanji.wrappers import VmapAutoResetWrapper

    env = VmapAutoResetWrapper(jum.MAPFFrozenLake(pool()))
    agents = [f"agent_{i}" for i in range(A)]

    def run(key, squeeze):
        state, ts = env.reset(jax.random.split(key, NUM_ENVS))

        def body(state_ts, k):
            state, ts = state_ts
            avail = batchify({a: ts.observation.action_mask[:, i] for i, a in enumerate(agents)}, agents, NUM_ACTORS)
            action = unbatchify(masked_sample(k, (NUM_ACTORS, 5), avail), agents, NUM_ENVS, A)
            joint = jnp.stack([action[a] for a in agents], axis=1)  # [E, A, 1]
            state, ts = env.step(state, joint[..., 0] if squeeze else joint)
            return (state, ts), (ts.reward, ts.discount, ts.last(), ts.observation.grid)

        return jax.lax.scan(body, (state, ts), jax.random.split(key, STEPS))[1]

    shaped, scalar = jax.jit(lambda k: (run(k, False), run(k, True)))(jax.random.PRNGKey(1))
    for x, y in zip(shaped, scalar):
        np.testing.assert_array_equal(x, y)
    assert shaped[3].dtype == jnp.uint8 and bool(shaped[2].any())
    exact = jum.MAPFFrozenLake(pool(), dtype="float32")
    assert exact.observation_spec.grid.dtype == jnp.float32 and jum.MAPFFrozenLake(pool()).observation_spec.grid.dtype == jnp.uint8
    _, ts = exact.reset(jax.random.PRNGKey(0))
    exact.observation_spec.validate(ts.observation)
    with pytest.raises(ValueError, match=r"action has shape \(2, 3\); one integer per agent, 3 in all"):
        exact.step(exact.reset(jax.random.PRNGKey(0))[0], jnp.zeros((2, 3), jnp.int32))


def test_jaxued_loop_with_actor_batch_actions(monkeypatch):
    """JaxUED's AutoReplayWrapper, vmapped over environments as its baselines vmap it, fed the actor
    batch reshaped to ``[E, A, 1]``: the same game as ``[E, A]``."""
    from jaxued.wrappers import AutoReplayWrapper

    if not hasattr(jax, "tree_map"):
        monkeypatch.setattr(jax, "tree_map", jax.tree.map, raising=False)
    base = ued.MAPFFrozenLake(BASE)
    env = AutoReplayWrapper(base)
    params = env.default_params
    lakes = take(pool(), slice(0, NUM_ENVS))
    agents = [f"agent_{i}" for i in range(A)]

    def run(key, squeeze):
        obs, state = jax.vmap(env.reset_to_level, in_axes=(0, 0, None))(jax.random.split(key, NUM_ENVS), lakes, params)

        def body(carry, k):
            state, obs = carry
            k_act, k_step = jax.random.split(k)
            avail = batchify({a: obs.avail_actions[:, i] for i, a in enumerate(agents)}, agents, NUM_ACTORS)
            action = unbatchify(masked_sample(k_act, (NUM_ACTORS, 5), avail), agents, NUM_ENVS, A)
            joint = jnp.stack([action[a] for a in agents], axis=1)
            obs, state, reward, done, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k_step, NUM_ENVS), state, joint[..., 0] if squeeze else joint, params)
            return (state, obs), (reward, done, obs.grid)

        return jax.lax.scan(body, (state, obs), jax.random.split(key, STEPS))[1]

    shaped, scalar = jax.jit(lambda k: (run(k, False), run(k, True)))(jax.random.PRNGKey(2))
    for x, y in zip(shaped, scalar):
        np.testing.assert_array_equal(x, y)
    assert shaped[2].dtype == jnp.uint8 and bool(shaped[1].any())
    assert ued.MAPFFrozenLake(BASE, dtype=bool).reset_to_level(jax.random.PRNGKey(0), take(pool(), 0), params)[0].grid.dtype == bool


def test_action_shapes_and_dtypes():
    assert int(agent_action(jnp.array([[3]]))) == 3 and agent_action(np.int64(2)).dtype == jnp.int32
    np.testing.assert_array_equal(joint_actions(jnp.arange(3)[None], 3), [0, 1, 2])
    with pytest.raises(ValueError, match=r"action has shape \(\); one integer per agent, 3 in all"):
        joint_actions(1, 3)
    with pytest.raises(TypeError, match="must hold integers"):
        agent_action(jnp.float32(1.0))
    with pytest.raises(ValueError, match=r"dtype='int3' not in \('bool', 'uint8', 'float32'\)"):
        jum.MAPFFrozenLake(pool(), dtype="int3")


def test_pool_draws_one_number_each_by_weight():
    from jaxlake.adapters.pools import make_pool_draw
    from jaxlake.config import ConfigError

    draws = jax.vmap(make_pool_draw(4, [0.0, 1.0, 0.0, 3.0]))(jax.random.split(jax.random.PRNGKey(0), 4000))
    counts = np.bincount(np.asarray(draws), minlength=4)
    assert counts[0] == counts[2] == 0 and 0.2 < counts[1] / 4000 < 0.3
    uniform = np.asarray(jax.vmap(make_pool_draw(3))(jax.random.split(jax.random.PRNGKey(1), 300)))
    assert set(uniform.tolist()) == {0, 1, 2}
    with pytest.raises(ConfigError, match="weights must be 4 non-negative numbers"):
        make_pool_draw(4, [1.0, -1.0, 0.0, 0.0])


def test_the_benchmarks_jaxmarl_rollout():
    """``python -m jaxlake.bench``'s ``jaxmarl`` kind (``bench.like_for_like``): the adapter stepped
    with ``jax.vmap(env.step)`` and ``(1,)`` actions, its observations kept; its bytes per lake."""
    from jaxlake.bench import make_jaxmarl_rollout, observation_bytes

    env = marl.MAPFFrozenLake(pool())
    obs, state = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), NUM_ENVS))
    final, total = make_jaxmarl_rollout(env, STEPS)(state, obs, jax.random.PRNGKey(1))
    assert total.shape == (NUM_ENVS,) and (np.round(np.asarray(total)) == np.asarray(total)).all()  # +-1 a step
    assert final.state.t.shape == (NUM_ENVS,)
    assert observation_bytes(lambda o: o, obs, batch=NUM_ENVS) == A * (4 * 4 * 6 + 2)
