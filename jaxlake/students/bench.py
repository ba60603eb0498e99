"""Training throughput of the IPPO student on the lakes against IPPO written as JaxMARL's
baselines write it: ``python -m jaxlake.students.bench``.

Three trainings at the same :class:`~jaxlake.students.config.IPPOConfig` (64 environments x 32
steps, 4 epochs of 4 minibatches, 64-64 torsos), timed in one process:

* ``student``: the student (:func:`jaxlake.students.ippo.build`, PureJaxRL's loop) on
  :func:`jaxlake.students.envs.lake_env` (``env=tiny``'s lakes: packed crops, masks, a fresh
  pool of lakes every update);
* ``jaxmarl_ippo_lakes``: JaxMARL's IPPO (:mod:`jaxlake.students.marl_ippo`: ``batchify`` /
  ``unbatchify``, the feed-forward actor-critic) on the same lakes through the JaxMARL adapter
  (:class:`jaxlake.adapters.jaxmarl.MAPFFrozenLake`: a fixed pool, every agent slot an actor,
  float32 observation vectors of the same crop);
* ``jaxmarl_ippo_<peer>``: JaxMARL's IPPO on a JaxMARL environment (``MPE_simple_spread_v3``),
  the reference rate.

The calls alternate (``--repeats`` rounds of one ``train`` each, compile excluded, medians kept),
so a machine shared with other work slows all alike. A rate is *environment steps a second*:
``num_envs * num_steps * updates`` per ``train``; agent steps (times the actors per instance)
are reported too. The held-out evaluation is off (it is not training throughput). Beside the
training rates, the environments alone are timed (:func:`env_only`: random available actions,
no network; every observation summed into the loop's carry, so none is dead code), which
separates the simulator's share from the network's. :func:`jaxmarl_env` runs the student's own
loop on a JaxMARL environment. Needs ``pip install jaxmarl``.
"""

from __future__ import annotations

import argparse
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
from jaxlake.students import marl_ippo
from jaxlake.students.compiled import jit

__all__ = ["env_only", "jaxmarl_env", "main", "measure", "trainers"]


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


def trainers(config: IPPOConfig, peer: str, lakes: LakeConfig) -> dict[str, tuple[Any, int]]:
    """``{name: (train(key) -> params, actors per instance)}``: the student on the lakes, JaxMARL's
    IPPO on the lakes (the adapter) and on ``peer`` (module docstring)."""
    import jaxmarl

    from jaxlake.adapters.jaxmarl import MAPFFrozenLake

    student = build(config, lake_env(lakes, radius=config.radius, pool_lakes=config.pool_lakes))
    adapter = MAPFFrozenLake(env=lakes, pool_size=config.pool_lakes, radius=config.radius, dtype="float32")
    mpe = jaxmarl.make(peer)
    on_lakes, on_peer = marl_ippo.make_train(config, adapter), marl_ippo.make_train(config, mpe)
    return {"student": (lambda k: student.train(k)[0].params, student.env.actors),
            "jaxmarl_ippo_lakes": (lambda k: on_lakes(k)[0], adapter.num_agents),
            f"jaxmarl_ippo_{peer}": (lambda k: on_peer(k)[0], mpe.num_agents)}


def measure(config: IPPOConfig, runs: dict[str, tuple[Any, int]], repeats: int, seed: int = 0) -> dict:
    """``{name: record}``: each ``train(key) -> params`` of ``runs`` (:func:`trainers`) jitted
    and timed ``repeats`` times, alternating between them. Every program, the peers' too, is
    compiled with the room's XLA options (:mod:`jaxlake.students.compiled`), so they compare
    on the same footing."""
    trains, records = {}, {}
    for name, (fn, actors) in runs.items():
        train = jit(fn)
        t0 = time.perf_counter()
        params = jax.block_until_ready(train(jax.random.PRNGKey(seed)))
        trains[name] = train
        records[name] = {"actors": actors, "params": _params(params),
                         "compile_and_first_s": round(time.perf_counter() - t0, 3), "seconds": []}
    for r in range(repeats):
        for name, train in trains.items():
            t0 = time.perf_counter()
            jax.block_until_ready(train(jax.random.PRNGKey(seed + 1 + r)))
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
    """A jitted ``(key, state, obs) -> sum`` of ``steps`` steps from a made state (``refresh``
    first when asked), and that state; compiled here. The sum is of every step's rewards and
    observations (grids, scalars, masks), carried through the loop, so XLA cannot drop the
    observations as dead code."""
    state, obs = jax.jit(lambda k: env.init(k, num_envs))(jax.random.PRNGKey(seed))

    def run(key, state, obs):
        if refresh:
            state = env.refresh(key, state)

        def body(carry, k):
            state, obs, total = carry
            a = jax.random.categorical(k, jnp.where(obs.avail, 0.0, -1e9)).astype(jnp.int32)
            state, obs, o = env.step(k, state, a)
            seen = (jnp.sum(obs.grid, dtype=jnp.float32) + jnp.sum(obs.scalars) + jnp.sum(obs.avail)
                    + jnp.sum(obs.valid))
            return (state, obs, total + jnp.sum(o.reward) + seen), None

        zero = jnp.zeros((), jnp.float32)
        return jax.lax.scan(body, (state, obs, zero), jax.random.split(key, steps))[0][2]

    fn = jit(run)
    fn(jax.random.PRNGKey(seed), state, obs).block_until_ready()
    return fn, state, obs


def main(argv: Optional[Sequence[str]] = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m jaxlake.students.bench",
                                description="IPPO training throughput: the student on the lakes, JaxMARL's IPPO on "
                                            "the lakes (the adapter) and on a JaxMARL environment, same settings, "
                                            "same process.")
    p.add_argument("--peer", default="MPE_simple_spread_v3", help="JaxMARL environment (jaxmarl.make name)")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--num-steps", type=int, default=32)
    p.add_argument("--updates", type=int, default=20, help="PPO updates per timed train call")
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--repeats", type=int, default=7, help="timed train calls per training (median kept)")
    p.add_argument("--out", default="outputs/bench/ippo_throughput.json", help="the JSON written")
    args = p.parse_args(argv)
    config = IPPOConfig(num_envs=args.num_envs, num_steps=args.num_steps, num_updates=args.updates,
                        eval_every=args.updates, hidden=tuple(args.hidden), pool_lakes=args.num_envs * 8)
    lakes = LakeConfig()  # env=tiny's values (conf/env/tiny.yaml)
    peer_name = f"jaxmarl_ippo_{args.peer}"
    records = measure(config, trainers(config, args.peer, lakes), args.repeats)
    envs = {"student": lake_env(lakes, radius=config.radius, pool_lakes=config.pool_lakes),
            peer_name: jaxmarl_env(args.peer)}
    alone = env_only(envs, config.num_envs, config.num_steps, args.repeats * 4)
    for name, rates in alone.items():
        records[name]["env_only_steps_per_s"] = rates
    ours, peer = records["student"], records[peer_name]
    result = {
        "what": "IPPO training throughput (environment steps per second, observations included): the student on the "
                "lakes, JaxMARL's IPPO on the lakes (adapter) and on the peer, same settings; compile excluded, "
                "median of the repeats",
        "ratio_env_steps": round(ours["env_steps_per_s"] / peer["env_steps_per_s"], 3),
        "ratio_agent_steps": round(ours["agent_steps_per_s"] / peer["agent_steps_per_s"], 3),
        "ratio_best_env_steps": round(ours["best_env_steps_per_s"] / peer["best_env_steps_per_s"], 3),
        "ratio_student_to_jaxmarl_ippo_lakes": round(
            ours["env_steps_per_s"] / records["jaxmarl_ippo_lakes"]["env_steps_per_s"], 3),
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
        print(f"{name:36s} {rec['env_steps_per_s']:>10,.0f} env steps/s (best {rec['best_env_steps_per_s']:>9,.0f}) "
              f"{rec['agent_steps_per_s']:>10,.0f} agent steps/s  ({rec['actors']} actors, {rec['params']:,} params)")
    eo = result["ratio_env_only"]
    print(f"ratio (student / JaxMARL's IPPO on {args.peer}): training {result['ratio_env_steps']:.2f}x env steps/s "
          f"(best runs {result['ratio_best_env_steps']:.2f}x; {result['ratio_agent_steps']:.2f}x agent steps/s); "
          f"student / JaxMARL's IPPO on the lakes {result['ratio_student_to_jaxmarl_ippo_lakes']:.2f}x; environments "
          f"alone, random available actions, no network: {eo['with_refresh']:.2f}x with a fresh pool per "
          f"{config.num_steps} steps, {eo['step_only']:.2f}x stepping only -> {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
