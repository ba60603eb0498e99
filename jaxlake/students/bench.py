"""Training throughput of the IPPO student on the lakes against the same IPPO on a JaxMARL
environment: ``python -m jaxlake.students.bench``.

Both run the *same algorithm code*: :func:`jaxlake.students.ippo.build` (PureJaxRL's loop:
rollout, GAE, PPO epochs) with the same :class:`~jaxlake.students.config.IPPOConfig` and the
same :class:`~jaxlake.students.network.ActorCritic` widths, once over :func:`jaxlake.students.envs.lake_env`
(``env=tiny`` by default: observations, masks and sampler-driven auto-reset onto fresh lakes
included) and once over a JaxMARL environment through :func:`jaxmarl_env` (JaxMARL's own
``reset`` / ``step``, whose step auto-resets and returns observations; MPE simple spread by
default). JaxMARL's baselines are not in its wheel, so the peer's IPPO is this loop over its
environment API. Only the network's input width differs (the lake's crop against MPE's
vector); the parameter counts are reported.

The two are timed in one process, on the same device, alternating (``--repeats`` rounds of
one ``train`` each, compile excluded, medians kept), so a machine shared with other work
slows both alike. A rate is *environment steps a second*: lake (instance) steps,
``num_envs * num_steps * updates`` per ``train``, every agent's observation built in each;
agent steps (times the actors per instance) are reported too. The JSON (``--out``) holds both
rates, the ratio, the settings and the machine. The held-out evaluation is off (it is not
training throughput). Beside the training rates, the environments alone are timed the same
way (:func:`env_only`: random available actions, observations built, no network), which
separates the simulator's share from the network's. Needs ``pip install jaxmarl``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp

from jaxlake.config import LakeConfig
from jaxlake.io import write_json
from jaxlake.students.config import IPPOConfig
from jaxlake.students.envs import Obs, Outcome, StudentEnv, lake_env
from jaxlake.students.ippo import build

__all__ = ["jaxmarl_env", "main", "measure"]


def jaxmarl_env(name: str = "MPE_simple_spread_v3", **kwargs: Any) -> StudentEnv:
    """A JaxMARL environment (``jaxmarl.make(name, **kwargs)``) as a :class:`StudentEnv`:
    its agents' observation vectors are the actors' ``grid``, its available actions (all,
    where it has no ``get_avail_actions``) the masks; every agent acts in every step."""
    import jaxmarl

    env = jaxmarl.make(name, **kwargs)
    agents = list(env.agents)
    k = len(agents)
    n_actions = int(env.action_space(agents[0]).n)

    def stack(d: dict) -> jax.Array:
        return jnp.stack([d[a] for a in agents], axis=1)

    def obs_of(obs: dict, state: Any) -> Obs:
        x = stack(obs).astype(jnp.float32)
        e = x.shape[0]
        avail = jnp.ones((e, k, n_actions), bool)
        return Obs(grid=x, scalars=jnp.zeros((e, k, 0), jnp.float32), avail=avail, valid=jnp.ones((e, k), bool))

    def init(key: jax.Array, num_envs: int):
        obs, state = jax.vmap(env.reset)(jax.random.split(key, num_envs))
        return state, obs_of(obs, state)

    def step(key: jax.Array, state: Any, actions: jax.Array):
        e = actions.shape[0]
        acts = {a: actions[:, i] for i, a in enumerate(agents)}
        obs, state, reward, dones, _ = jax.vmap(env.step)(jax.random.split(key, e), state, acts)
        ended = dones["__all__"]
        out = Outcome(reward=stack(reward).astype(jnp.float32), done=stack(dones), ended=ended,
                      success=jnp.zeros_like(ended, jnp.float32))
        return state, obs_of(obs, state), out

    return StudentEnv(actors=k, num_actions=n_actions, init=init, refresh=lambda key, s: s, step=step)


def _params(tree: Any) -> int:
    return int(sum(x.size for x in jax.tree_util.tree_leaves(tree)))


def measure(config: IPPOConfig, envs: dict[str, StudentEnv], repeats: int, seed: int = 0) -> dict:
    """``{name: record}``: each environment's compiled ``train`` timed ``repeats`` times,
    alternating between the environments."""
    trains, records = {}, {}
    for name, env in envs.items():
        student = build(config, env)
        train = jax.jit(student.train)
        t0 = time.perf_counter()
        state, _ = train(jax.random.PRNGKey(seed))
        jax.block_until_ready(state.params)
        trains[name] = train
        records[name] = {"actors": env.actors, "params": _params(state.params),
                         "obs_features": int(state.obs.grid[0, 0].size + state.obs.scalars[0, 0].size),
                         "compile_and_first_s": round(time.perf_counter() - t0, 3), "seconds": []}
    for r in range(repeats):
        for name, train in trains.items():
            t0 = time.perf_counter()
            state, _ = train(jax.random.PRNGKey(seed + 1 + r))
            jax.block_until_ready(state.params)
            records[name]["seconds"].append(time.perf_counter() - t0)
    steps = config.num_envs * config.num_steps * config.num_updates
    for rec in records.values():
        med = statistics.median(rec["seconds"])
        rec["seconds"] = [round(s, 4) for s in rec["seconds"]]
        rec["median_s"] = round(med, 4)
        rec["env_steps"] = steps
        rec["env_steps_per_s"] = round(steps / med, 1)
        rec["best_env_steps_per_s"] = round(steps / min(rec["seconds"]), 1)
        rec["agent_steps_per_s"] = round(steps * rec["actors"] / med, 1)
    return records


def env_only(envs: dict[str, StudentEnv], num_envs: int, steps: int, repeats: int, seed: int = 0) -> dict:
    """``{name: {"with_refresh": rate, "step_only": rate}}`` in env steps/s of the environments
    alone: ``steps`` auto-resetting steps of ``num_envs`` instances with uniformly random
    available actions, observations built, no network; ``with_refresh`` runs one ``refresh``
    first (the lakes' fresh pool, as every update does), ``step_only`` not. Alternating,
    median of ``repeats``."""
    runs = {(name, mode): _timed_steps(env, num_envs, steps, mode == "with_refresh", seed)
            for name, env in envs.items() for mode in ("with_refresh", "step_only")}
    out: dict = {k: [] for k in runs}
    for r in range(repeats):
        for k, (fn, state, obs) in runs.items():
            t0 = time.perf_counter()
            fn(jax.random.PRNGKey(seed + 1 + r), state, obs).block_until_ready()
            out[k].append(time.perf_counter() - t0)
    result: dict = {}
    for (name, mode), ts in out.items():
        result.setdefault(name, {})[mode] = round(num_envs * steps / statistics.median(ts), 1)
    return result


def _timed_steps(env: StudentEnv, num_envs: int, steps: int, refresh: bool, seed: int):
    """A jitted ``(key, state, obs) -> sum of rewards`` of ``steps`` steps from a made state
    (``refresh`` first when asked), and that state; compiled here."""
    state, obs = jax.jit(lambda k: env.init(k, num_envs))(jax.random.PRNGKey(seed))

    def run(key, state, obs):
        if refresh:
            state = env.refresh(key, state)

        def body(carry, k):
            state, obs = carry
            a = jax.random.categorical(k, jnp.where(obs.avail, 0.0, -1e9)).astype(jnp.int32)
            state, obs, o = env.step(k, state, a)
            return (state, obs), jnp.sum(o.reward)

        return jnp.sum(jax.lax.scan(body, (state, obs), jax.random.split(key, steps))[1])

    fn = jax.jit(run)
    fn(jax.random.PRNGKey(seed), state, obs).block_until_ready()
    return fn, state, obs


def main(argv: Optional[Sequence[str]] = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m jaxlake.students.bench",
                                description="IPPO training throughput: the lakes against a JaxMARL environment, "
                                            "same algorithm code, same network widths, same process.")
    p.add_argument("--peer", default="MPE_simple_spread_v3", help="JaxMARL environment (jaxmarl.make name)")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--num-steps", type=int, default=32)
    p.add_argument("--updates", type=int, default=20, help="PPO updates per timed train call")
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--repeats", type=int, default=7, help="timed train calls per environment (median kept)")
    p.add_argument("--out", default="outputs/bench/ippo_throughput.json", help="the JSON written")
    args = p.parse_args(argv)
    config = IPPOConfig(num_envs=args.num_envs, num_steps=args.num_steps, num_updates=args.updates,
                        eval_every=args.updates, hidden=tuple(args.hidden), pool_lakes=args.num_envs * 8)
    lakes = LakeConfig()  # env=tiny's values (conf/env/tiny.yaml)
    envs = {"jaxlake_tiny": lake_env(lakes, radius=config.radius, pool_lakes=config.pool_lakes),
            f"jaxmarl_{args.peer}": jaxmarl_env(args.peer)}
    records = measure(config, envs, args.repeats)
    alone = env_only(envs, config.num_envs, config.num_steps, args.repeats * 4)
    for name, rates in alone.items():
        records[name]["env_only_steps_per_s"] = rates
    ours, peer = records["jaxlake_tiny"], records[f"jaxmarl_{args.peer}"]
    result = {
        "what": "IPPO training throughput (environment steps per second, observations included), same algorithm "
                "code and network widths; compile excluded, median of the repeats",
        "ratio_env_steps": round(ours["env_steps_per_s"] / peer["env_steps_per_s"], 3),
        "ratio_agent_steps": round(ours["agent_steps_per_s"] / peer["agent_steps_per_s"], 3),
        "ratio_best_env_steps": round(ours["best_env_steps_per_s"] / peer["best_env_steps_per_s"], 3),
        "ratio_env_only": {mode: round(ours["env_only_steps_per_s"][mode] / peer["env_only_steps_per_s"][mode], 3)
                           for mode in ("with_refresh", "step_only")},
        "runs": records,
        "settings": {**config.to_dict(), "lakes": lakes.to_dict(), "peer": args.peer, "repeats": args.repeats},
        "machine": {"backend": jax.default_backend(), "device": str(jax.devices()[0]), "cpu_count": os.cpu_count(),
                    "platform": platform.platform(), "jax": jax.__version__,
                    "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    for name, rec in records.items():
        print(f"{name:32s} {rec['env_steps_per_s']:>12,.0f} env steps/s  {rec['agent_steps_per_s']:>12,.0f} agent "
              f"steps/s  ({rec['actors']} actors, {rec['params']:,} params, {rec['obs_features']} obs features)")
    eo = result["ratio_env_only"]
    print(f"ratio (lakes / {args.peer}): training {result['ratio_env_steps']:.2f}x env steps/s (best runs "
          f"{result['ratio_best_env_steps']:.2f}x; {result['ratio_agent_steps']:.2f}x agent steps/s); environments "
          f"alone, random available actions, no network: {eo['with_refresh']:.2f}x with a fresh pool per "
          f"{config.num_steps} steps, {eo['step_only']:.2f}x stepping only -> {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
