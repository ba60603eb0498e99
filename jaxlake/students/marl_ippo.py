"""IPPO written the way JaxMARL's baselines write it (``baselines/IPPO/ippo_ff_mpe.py``), for the
throughput benchmark (:mod:`jaxlake.students.bench`): the peer's own training loop.

JaxMARL's pip package does not ship its baselines, so this module writes that loop again over
any JaxMARL ``MultiAgentEnv``: observations and actions as dicts per agent, ``batchify`` (the
agents' arrays stacked into one ``[num_agents * num_envs, ...]`` batch of actors) and
``unbatchify`` (back to dicts), ``jax.vmap(env.reset)`` / ``jax.vmap(env.step)`` (JaxMARL's
auto-resetting step), the feed-forward actor-critic (separate actor and critic torsos, tanh,
orthogonal initialisation, no action masks), GAE, and PPO epochs over shuffled minibatches with
Adam and a linearly annealed learning rate. The settings are an
:class:`~jaxlake.students.config.IPPOConfig`'s (``num_envs``, ``num_steps``, ``num_updates``,
``update_epochs``, ``num_minibatches``, ``hidden``, ``lr``, ``gamma``, ``gae_lambda``,
``clip_eps``, ``vf_coef``, ``ent_coef``, ``max_grad_norm``), so it trains at the student's
settings on the lakes through :mod:`jaxlake.adapters.jaxmarl` and on MPE alike.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlake.students.config import IPPOConfig

__all__ = ["FFActorCritic", "batchify", "make_train", "unbatchify"]


class FFActorCritic(nn.Module):
    """JaxMARL's feed-forward actor-critic: ``obs [..., F] -> (logits, value)``."""

    action_dim: int
    hidden: Sequence[int] = (64, 64)

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        def dense(width: int, scale: float) -> nn.Dense:
            return nn.Dense(width, kernel_init=nn.initializers.orthogonal(scale), bias_init=nn.initializers.zeros)

        actor = x
        for width in self.hidden:
            actor = nn.tanh(dense(width, np.sqrt(2))(actor))
        logits = dense(self.action_dim, 0.01)(actor)
        critic = x
        for width in self.hidden:
            critic = nn.tanh(dense(width, np.sqrt(2))(critic))
        return logits, dense(1, 1.0)(critic)[..., 0]


def batchify(x: dict, agents: Sequence[str], num_actors: int) -> jax.Array:
    """The agents' arrays stacked, ``[num_actors, -1]`` (agent-major, as JaxMARL's)."""
    return jnp.stack([x[a] for a in agents]).reshape((num_actors, -1))


def unbatchify(x: jax.Array, agents: Sequence[str], num_envs: int, num_agents: int) -> dict:
    """:func:`batchify`'s inverse: ``{agent: [num_envs, -1]}``."""
    x = x.reshape((num_agents, num_envs, -1))
    return {a: x[i] for i, a in enumerate(agents)}


class Transition(NamedTuple):
    done: jax.Array
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array


def make_train(config: IPPOConfig, env: Any) -> Callable[[jax.Array], Any]:
    """``train(key) -> (params, mean loss [num_updates])`` of JaxMARL's IPPO on ``env`` (a JaxMARL
    ``MultiAgentEnv``) at ``config``'s settings (jit it)."""
    agents = list(env.agents)
    num_agents, num_envs = len(agents), config.num_envs
    num_actors = num_agents * num_envs
    batch_size = num_actors * config.num_steps
    if batch_size % config.num_minibatches:
        raise ValueError(f"num_minibatches={config.num_minibatches} must divide num_envs * num_steps * agents "
                         f"= {batch_size}")
    minibatch = batch_size // config.num_minibatches
    network = FFActorCritic(int(env.action_space(agents[0]).n), tuple(config.hidden))
    steps = config.num_updates * config.update_epochs * config.num_minibatches
    lr = optax.linear_schedule(config.lr, 0.0, steps) if config.anneal_lr else config.lr
    tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(lr, eps=1e-5))

    def train(rng: jax.Array):
        rng, k_net, k_reset = jax.random.split(rng, 3)
        params = network.init(k_net, jnp.zeros(env.observation_space(agents[0]).shape, jnp.float32))
        opt_state = tx.init(params)
        obsv, env_state = jax.vmap(env.reset)(jax.random.split(k_reset, num_envs))

        def update_step(runner, _):
            def env_step(runner, _):
                params, opt_state, env_state, last_obs, rng = runner
                rng, k_act, k_step = jax.random.split(rng, 3)
                obs_batch = batchify(last_obs, agents, num_actors).astype(jnp.float32)
                logits, value = network.apply(params, obs_batch)
                action = jax.random.categorical(k_act, logits)
                log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
                env_act = {k: v.squeeze(-1) for k, v in unbatchify(action, agents, num_envs, num_agents).items()}
                obsv, env_state, reward, done, _ = jax.vmap(env.step)(jax.random.split(k_step, num_envs),
                                                                       env_state, env_act)
                tr = Transition(batchify(done, agents, num_actors).squeeze(-1), action, value,
                                batchify(reward, agents, num_actors).squeeze(-1).astype(jnp.float32), log_prob,
                                obs_batch)
                return (params, opt_state, env_state, obsv, rng), tr

            runner, traj = jax.lax.scan(env_step, runner, None, config.num_steps)
            params, opt_state, env_state, last_obs, rng = runner
            _, last_val = network.apply(params, batchify(last_obs, agents, num_actors).astype(jnp.float32))

            def gae_step(carry, tr):
                gae, next_value = carry
                delta = tr.reward + config.gamma * next_value * (1 - tr.done) - tr.value
                gae = delta + config.gamma * config.gae_lambda * (1 - tr.done) * gae
                return (gae, tr.value), gae

            _, adv = jax.lax.scan(gae_step, (jnp.zeros_like(last_val), last_val), traj, reverse=True, unroll=16)
            targets = adv + traj.value

            def loss_fn(params, tr, gae, target):
                logits, value = network.apply(params, tr.obs)
                logp = jnp.take_along_axis(jax.nn.log_softmax(logits), tr.action[:, None], axis=-1)[:, 0]
                v_clip = tr.value + jnp.clip(value - tr.value, -config.clip_eps, config.clip_eps)
                v_loss = 0.5 * jnp.maximum((value - target) ** 2, (v_clip - target) ** 2).mean()
                ratio = jnp.exp(logp - tr.log_prob)
                gae = (gae - gae.mean()) / (gae.std() + 1e-8)
                actor = -jnp.minimum(ratio * gae, jnp.clip(ratio, 1 - config.clip_eps, 1 + config.clip_eps) * gae)
                p = jax.nn.softmax(logits)
                ent = -jnp.sum(p * jax.nn.log_softmax(logits), axis=-1).mean()
                return actor.mean() + config.vf_coef * v_loss - config.ent_coef * ent

            grad_fn = jax.value_and_grad(loss_fn)

            def update_minibatch(state, mb):
                params, opt_state = state
                tr, gae, target = mb
                loss, grads = grad_fn(params, tr, gae, target)
                updates, opt_state = tx.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), loss

            def update_epoch(carry, _):
                params, opt_state, rng = carry
                rng, k_perm = jax.random.split(rng)
                batch = jax.tree_util.tree_map(lambda x: x.reshape((batch_size,) + x.shape[2:]), (traj, adv, targets))
                perm = jax.random.permutation(k_perm, batch_size)
                shuffled = jax.tree_util.tree_map(lambda x: jnp.take(x, perm, axis=0), batch)
                mbs = jax.tree_util.tree_map(lambda x: x.reshape((config.num_minibatches, minibatch) + x.shape[1:]),
                                             shuffled)
                (params, opt_state), losses = jax.lax.scan(update_minibatch, (params, opt_state), mbs)
                return (params, opt_state, rng), losses

            (params, opt_state, rng), losses = jax.lax.scan(update_epoch, (params, opt_state, rng), None,
                                                            config.update_epochs)
            return (params, opt_state, env_state, last_obs, rng), jnp.mean(losses)

        runner = (params, opt_state, env_state, obsv, rng)
        runner, losses = jax.lax.scan(update_step, runner, None, config.num_updates)
        return runner[0], losses

    return train
