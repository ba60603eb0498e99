"""The benchmark's peer loop (JaxMARL's IPPO, :mod:`jaxlake.students.marl_ippo`) at the smallest
settings, on a two-agent toy with JaxMARL's interface (no JaxMARL import: CI time; the benchmark
runs it on the lakes' adapter and on MPE)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlake.students import marl_ippo
from jaxlake.students.config import IPPOConfig


class _Toy:
    """JaxMARL's interface: dicts per agent; each agent is rewarded for action 1; episodes of 3
    steps, auto-reset in ``step``."""

    agents = ["agent_0", "agent_1"]

    def action_space(self, agent):
        return SimpleNamespace(n=3)

    def observation_space(self, agent):
        return SimpleNamespace(shape=(4,))

    def _obs(self, t):
        return {a: jnp.full((4,), t, jnp.float32) + i for i, a in enumerate(self.agents)}

    def reset(self, key):
        return self._obs(0.0), jnp.zeros((), jnp.float32)

    def step(self, key, t, actions):
        t = t + 1
        done = t >= 3
        t = jnp.where(done, 0.0, t)
        reward = {a: (actions[a] == 1).astype(jnp.float32) for a in self.agents}
        dones = {**{a: done for a in self.agents}, "__all__": done}
        return self._obs(t), t, reward, dones, {}


def test_batchify_and_unbatchify_are_inverse():
    agents = ["agent_0", "agent_1", "agent_2"]
    x = {a: jnp.arange(8).reshape(4, 2) + 10 * i for i, a in enumerate(agents)}
    flat = marl_ippo.batchify(x, agents, 12)
    assert flat.shape == (12, 2) and int(flat[4, 0]) == 10  # agent-major: agent_1's first instance
    back = marl_ippo.unbatchify(flat, agents, 4, 3)
    assert all(np.array_equal(back[a], x[a]) for a in agents)


def test_jaxmarl_ippo_trains_on_a_multi_agent_env():
    config = IPPOConfig(num_envs=2, num_steps=4, num_updates=2, eval_every=1, update_epochs=1, num_minibatches=2,
                        hidden=(8,), pool_lakes=4)
    env = _Toy()
    params, losses = jax.jit(marl_ippo.make_train(config, env))(jax.random.PRNGKey(0))
    assert losses.shape == (2,) and bool(jnp.all(jnp.isfinite(losses)))
    assert params["params"]["Dense_0"]["kernel"].shape == (4, 8)
    with pytest.raises(ValueError, match="num_minibatches=3 must divide"):
        marl_ippo.make_train(dataclasses.replace(config, num_minibatches=3), env)


def test_every_timed_program_compiles_with_the_rooms_options(monkeypatch):
    """The student and its peers are timed on the same footing: ``measure`` compiles each of
    them with the room's XLA options (jaxlake.students.compiled, the CPU runtime's wedge), and
    reports each one's rate from its own medians."""
    from jaxlake.students import bench, compiled

    seen, real = [], jax.jit

    def spy(fn, **kwargs):
        seen.append(kwargs.get("compiler_options"))
        return real(fn, **kwargs)

    monkeypatch.setattr(compiled.jax, "jit", spy)
    config = IPPOConfig(num_envs=2, num_steps=3, num_updates=20)
    runs = {"ours": (lambda k: jnp.zeros(3) + jax.random.uniform(k), 2),
            "peer": (lambda k: jnp.ones((2, 2)) * jax.random.uniform(k), 3)}
    out = bench.measure(config, runs, repeats=2)
    assert seen == [compiled.COMPILER_OPTIONS] * 2
    assert out["ours"]["params"] == 3 and out["peer"]["params"] == 4 and len(out["peer"]["seconds"]) == 2
    assert out["peer"]["agent_steps_per_s"] == pytest.approx(out["peer"]["env_steps_per_s"] * 3, rel=1e-3)
