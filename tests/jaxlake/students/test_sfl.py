"""SFL (sampling for learnability) inside the jit: under a fixed policy, the levels it keeps
have a higher learnability ``p (1 - p)`` than fresh random levels, measured again on rollouts
it never saw; an update's pool mixes them with fresh levels."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlake.config import LakeConfig
from jaxlake.students import ued
from jaxlake.students.config import UEDConfig
from jaxlake.students.envs import lake_env
from jaxlake.students.lakes import lake_hash
from jaxlake.students.network import ActorCritic

ENV = LakeConfig()  # env=tiny's values
P = 16


@pytest.fixture(scope="module")
def setting():
    env = lake_env(ENV, pool_lakes=P)
    network = ActorCritic(num_actions=env.num_actions, hidden=(16,))
    obs = jax.eval_shape(lambda k: env.init(k, 4)[1], jax.random.PRNGKey(0))  # shapes only, nothing compiled
    one = [jnp.zeros(x.shape[1:], x.dtype) for x in (obs.grid, obs.scalars, obs.avail)]
    params = network.init(jax.random.PRNGKey(1), *one)  # a fixed policy

    def success(params, lakes, key, repeats=4):
        return ued.success_rates(params, network.apply, lakes, actors=env.actors, radius=4, horizon=ENV.max_steps,
                                 key=key, repeats=repeats)

    return env, params, success


def test_sfl_keeps_levels_of_higher_learnability_than_random(setting):
    env, params, success = setting
    config = UEDConfig(method="sfl", sfl_levels=512, sfl_repeats=4, sfl_buffer=32, sfl_every=1, sfl_ratio=0.5)
    hook = ued.make_levels(config, env, P, success=success, scored_steps=512 * 4 * ENV.max_steps)
    assert hook.period == 1 and hook.refresh_steps == 512 * 4 * ENV.max_steps
    state = hook.init(jax.random.PRNGKey(2))
    state = jax.jit(hook.refresh)(jax.random.PRNGKey(3), state, params)
    kept = state.buffer.lakes
    assert bool(jnp.all(state.buffer.filled)) and float(jnp.min(state.buffer.scores)) > 0
    # measured again, on 64 fresh episodes a level: the kept levels against 32 random ones
    again = jax.jit(lambda p, lakes, k: ued.learnability(success(p, lakes, k, repeats=64)))
    chosen = np.asarray(again(params, kept, jax.random.PRNGKey(4)))
    random = np.asarray(again(params, env.draw(jax.random.PRNGKey(5), 32), jax.random.PRNGKey(4)))
    assert chosen.mean() > random.mean() + 0.05, (chosen.mean(), random.mean())
    # an update's pool: half the kept levels (drawn uniformly), half fresh, shuffled
    state, plan = jax.jit(hook.start)(jax.random.PRNGKey(6), state)
    assert not bool(jnp.any(plan.idx >= 0)) and bool(hook.learns(plan))
    in_buffer = np.isin(np.asarray(jax.vmap(lake_hash)(plan.pool)), np.asarray(state.buffer.hashes))
    assert in_buffer.sum() == P // 2
    assert not in_buffer[: P // 2].all()  # shuffled: instance e's first lakes are not all kept ones


def test_sfl_needs_the_policy_success_rates(setting):
    env, _, _ = setting
    with pytest.raises(ValueError, match="sfl needs"):
        ued.make_levels(UEDConfig(method="sfl"), env, P)
