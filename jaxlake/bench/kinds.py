"""The like-for-like measurements of ``python -m jaxlake.bench`` (``bench.like_for_like``): our
step with each kind of observation built every step, against the Jumanji Connector peer building
the same information, in the same run, at the same batch.

Our side, one row (``kind == "observe"``) per env of ``bench.like_for_like.envs`` and kind of
:data:`OBSERVATION_KINDS`:

* ``none``: the step alone (``bench.rng=bits``), no observation;
* ``global``, ``packed``, ``grids``: :func:`jaxlake.observations.observe` of that kind (grids in
  ``bench.like_for_like.dtype``), with each lake's :class:`~jaxlake.observations.ObsCache` made
  once, outside the timed loop (as at generation), over a batch of lakes stepped without reset;
* ``jaxmarl``: the JaxMARL adapter (:class:`jaxlake.adapters.jaxmarl.MAPFFrozenLake`, its default
  observation) over the auto-reset pool, stepped as a JaxMARL user does: ``jax.vmap(env.step)``
  with one key per environment and each agent's action shaped ``(1,)`` as IPPO's ``unbatchify``
  sends it, JaxMARL's auto-reset on.

Every step's observation is kept in the scan's carry and a sum of it that is exactly 0 is added
to the returns, so XLA builds and writes it (as the peer keeps its own). ``obs_bytes_per_lake_step``
is the size of one lake's observation.

The peer (:mod:`jaxlake.peers.jumanji_connector`, spec ``modes``) measures the matching
:data:`PEER_MODE` of each kind: ``none`` (the step, its observation dropped by XLA),
``returned`` (Connector's returned observation: its ``[G, G]`` grid copied out of the state, the
masks, the step count), ``relabel`` (that plus the per-agent relabel Jumanji's network applies,
``process_grid``'s arithmetic) and ``relabel_autoreset`` (the same under Jumanji's
``AutoResetWrapper``). :func:`like_for_like` sets the two side by side, with
:data:`TARGETS`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp

from jaxlake import env, observations
from jaxlake.bench.rollouts import OBSERVATION_DTYPES, random_actions
from jaxlake.sharding import constrain_batch
from jaxlake.types import Lake

__all__ = ["OBSERVATION_KINDS", "PEER_MODE", "PEER_MODES", "TARGETS", "like_for_like", "make_kind_rollout",
           "make_jaxmarl_rollout", "observation_bytes"]

#: Our observation kinds measured by ``bench.like_for_like`` (module docstring).
OBSERVATION_KINDS = ("none", "global", "packed", "grids", "jaxmarl")
#: The peer's modes (:mod:`jaxlake.peers.jumanji_connector`).
PEER_MODES = ("none", "returned", "relabel", "relabel_autoreset")
#: The Connector mode each of our kinds is set against.
PEER_MODE = {"none": "none", "global": "returned", "packed": "relabel", "grids": "relabel",
             "jaxmarl": "relabel_autoreset"}
#: The project's targets, ours / theirs in agent-steps/s: ``(kind, peer, (height, width, agents))``
#: (the step alone keeps its headline targets, set at 8x8 with 4 agents).
TARGETS = {
    ("none", "jumanji_connector", (8, 8, 4)): 3.0, ("none", "pogema", (8, 8, 4)): 300.0,
    ("global", "jumanji_connector", (8, 8, 4)): 2.0, ("global", "jumanji_connector", (10, 10, 10)): 1.0,
    ("packed", "jumanji_connector", (8, 8, 4)): 1.5, ("packed", "jumanji_connector", (10, 10, 10)): 1.5,
    ("jaxmarl", "jumanji_connector", (8, 8, 4)): 1.5, ("jaxmarl", "jumanji_connector", (10, 10, 10)): 1.0,
}


def observation_bytes(fn: Callable, *args: Any, batch: int) -> float:
    """Bytes of the observation ``fn(*args)`` returns, per lake (from its abstract shapes)."""
    leaves = jax.tree_util.tree_leaves(jax.eval_shape(fn, *args))
    return sum(leaf.size * jnp.dtype(leaf.dtype).itemsize for leaf in leaves) / batch


def _kept(obs: Any, batch: int) -> jax.Array:
    """``[B]``: ``min(sum of every leaf of the observation, 0)``, exactly 0 (observations are
    >= 0) but not provably so, so XLA must build and keep them."""
    total = jnp.zeros((batch,), jnp.float32)
    for leaf in jax.tree_util.tree_leaves(obs):
        total = total + jnp.sum(leaf.reshape(batch, -1).astype(jnp.float32), axis=-1)
    return jnp.minimum(total, 0.0)


def _observe_fn(kind: str, dtype: str) -> Optional[Callable]:
    """``(lakes, caches, states) -> observation`` of ``kind`` over a batch (``None`` for none)."""
    if kind not in OBSERVATION_KINDS or kind == "jaxmarl":
        raise ValueError(f"bench.like_for_like.kinds: kind={kind!r} not in {OBSERVATION_KINDS}")
    if kind == "none":
        return None
    dt = OBSERVATION_DTYPES[dtype]
    return jax.vmap(lambda lake, cache, state: observations.observe(lake, state, kind=kind, dtype=dt, cache=cache))


def make_kind_rollout(kind: str, steps: int, mesh=None, dtype: str = "uint8") -> Callable:
    """``(lakes, caches, state, key) -> (state, reward_sum)``: ``steps`` random-action steps
    (``bench.rng=bits``) of a batch of lakes, building the ``kind`` observation of the state each
    step starts from and keeping it in the carry (``kind="none"``: no observation)."""
    observe = _observe_fn(kind, dtype)
    step = jax.vmap(env.step_from_uniforms)

    def rollout(lakes: Lake, caches, state, key):
        batch = state.t.shape[0]

        def body(carry, k):
            state, total, obs = carry
            if observe is not None:
                obs = constrain_batch(observe(lakes, caches, state), mesh)
            actions, u = random_actions(k, batch, lakes.max_agents, mesh)
            state, info = step(lakes, state, actions, u)
            return (constrain_batch(state, mesh), total + jnp.sum(info.reward, axis=-1), obs), None

        obs0 = None if observe is None else jax.tree_util.tree_map(
            lambda s: constrain_batch(jnp.zeros(s.shape, s.dtype), mesh), jax.eval_shape(observe, lakes, caches, state))
        init = (state, constrain_batch(jnp.zeros((batch,), jnp.float32), mesh), obs0)
        (state, total, obs), _ = jax.lax.scan(body, init, jax.random.split(key, steps))
        return state, total if obs is None else total + _kept(obs, batch)

    return jax.jit(rollout)


def make_jaxmarl_rollout(marl_env: Any, steps: int, mesh=None) -> Callable:
    """``(env_state, obs, key) -> (env_state, reward_sum)``: ``steps`` steps of
    ``jax.vmap(marl_env.step)`` (JaxMARL's auto-reset on), one key per environment, random
    actions (``bench.rng=bits``' draw) shaped ``(1,)`` per agent, every observation kept."""
    agents = list(marl_env.agents)
    step = jax.vmap(marl_env.step)

    def rollout(env_state, obs, key):
        batch = env_state.level.shape[0]

        def body(carry, k):
            state, total, obs = carry
            k_act, k_env = jax.random.split(k)
            actions, _ = random_actions(k_act, batch, len(agents), mesh)
            acts = {a: actions[:, i:i + 1] for i, a in enumerate(agents)}  # [B, 1]: IPPO's unbatchify
            obs, state, rewards, _, _ = step(constrain_batch(jax.random.split(k_env, batch), mesh), state, acts)
            reward = sum(rewards[a] for a in agents)
            return (constrain_batch(state, mesh), total + reward, constrain_batch(obs, mesh)), None

        init = (env_state, constrain_batch(jnp.zeros((batch,), jnp.float32), mesh), obs)
        (state, total, obs), _ = jax.lax.scan(body, init, jax.random.split(key, steps))
        return state, total + _kept(obs, batch)

    return jax.jit(rollout)


def like_for_like(results: Sequence[dict], peer_rows: Sequence[dict]) -> list[dict]:
    """Our ``observe`` rows against the peer rows of the matching mode and shape (height, width,
    agents): ratios of agent-steps/s (wall and per CPU-second), bytes per lake-step, targets."""
    out = []
    for ours in results:
        if ours.get("kind") != "observe" or ours.get("status") != "ok":
            continue
        shape = (ours["height"], ours["width"], ours["num_agents"])
        for peer in peer_rows:
            if peer.get("status") != "ok" or (peer.get("height"), peer.get("width"), peer.get("num_agents")) != shape:
                continue
            if peer["peer"] == "jumanji_connector":
                if peer.get("obs_mode", "none") != PEER_MODE[ours["observation_kind"]]:
                    continue
            elif not (peer["peer"] == "pogema" and ours["observation_kind"] == "none"):
                continue
            target = TARGETS.get((ours["observation_kind"], peer["peer"], shape))
            ratio = ours["agent_steps_per_s"] / float(peer["agent_steps_per_s"])
            theirs_cpu = peer.get("agent_steps_per_cpu_s")
            out.append({
                "env": ours["env"], "kind": ours["observation_kind"], "batch_size": ours["batch_size"],
                "peer": peer["peer"], "peer_mode": peer.get("obs_mode", "none"), "peer_num_envs": peer.get("num_envs"),
                "ours_agent_steps_per_s": ours["agent_steps_per_s"], "peer_agent_steps_per_s": peer["agent_steps_per_s"],
                "ours_obs_bytes_per_lake_step": ours.get("obs_bytes_per_lake_step"),
                "peer_obs_bytes_per_lake_step": peer.get("obs_bytes_per_lake_step"),
                "ratio": ratio,
                "ratio_cpu": None if not theirs_cpu else ours["agent_steps_per_cpu_s"] / float(theirs_cpu),
                "target": target, "met": None if target is None else bool(ratio >= target),
            })
    return out


def kinds_settings(settings: Mapping[str, Any]) -> dict:
    """``bench.like_for_like`` checked: ``enabled``, ``batch_size``, ``envs``, ``kinds``, ``dtype``."""
    s = dict(settings or {})
    kinds = list(s.get("kinds") or OBSERVATION_KINDS)
    bad = [k for k in kinds if k not in OBSERVATION_KINDS]
    if bad:
        raise ValueError(f"bench.like_for_like.kinds={bad} not in {OBSERVATION_KINDS}")
    dtype = str(s.get("dtype", "uint8"))
    if dtype not in OBSERVATION_DTYPES:
        raise ValueError(f"bench.like_for_like.dtype={dtype!r} not in {list(OBSERVATION_DTYPES)}")
    return {"enabled": bool(s.get("enabled", False)), "batch_size": int(s.get("batch_size", 16384)),
            "envs": list(s.get("envs") or []), "kinds": kinds, "dtype": dtype}
