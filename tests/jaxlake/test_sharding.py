"""Batch sharding helpers (jaxlake.sharding); a rollout sharded over 4 forced host devices ends
in the same states as the unsharded one (run in a subprocess: XLA_FLAGS must be set before
JAX initialises)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.support import xla_flags
from jaxlake.sharding import (
    batch_size_of,
    constrain_batch,
    devices_for_batch,
    local_mesh,
    mesh_for_batch,
    round_up,
    shard_batch,
)


@pytest.mark.parametrize("batch, devices, expect", [(8, 4, 4), (6, 4, 3), (7, 4, 1), (1, 8, 1), (12, 8, 6), (5, 1, 1)])
def test_devices_for_batch_is_the_largest_divisor(batch, devices, expect):
    assert devices_for_batch(batch, devices) == expect


def test_round_up_and_errors():
    assert [round_up(n, 4) for n in (1, 4, 5, 8)] == [4, 4, 8, 8]
    with pytest.raises(ValueError, match="batch_size"):
        devices_for_batch(0, 4)
    with pytest.raises(ValueError, match="num_devices"):
        local_mesh(len(jax.local_devices()) + 1)


def test_batch_size_of_names_the_disagreeing_leaves():
    assert batch_size_of({"a": jnp.zeros((3, 2)), "s": jnp.float32(1.0)}) == 3
    with pytest.raises(ValueError, match=r"\['a'\]: 3.*\['b'\]\['c'\]: 4"):
        batch_size_of({"a": jnp.zeros(3), "b": {"c": jnp.zeros(4)}})
    with pytest.raises(ValueError, match="no leaf"):
        batch_size_of({"s": jnp.float32(1.0)})


def test_shard_batch_on_one_device_keeps_values():
    tree = {"x": jnp.arange(6), "k": jax.random.split(jax.random.key(0), 6), "s": jnp.int32(3)}
    out = shard_batch(tree, local_mesh(1))
    np.testing.assert_array_equal(out["x"], tree["x"])
    assert out["x"].sharding.spec == jax.sharding.PartitionSpec("batch")
    assert out["s"].sharding.spec == jax.sharding.PartitionSpec()
    assert mesh_for_batch(6).size == devices_for_batch(6)
    assert constrain_batch(tree, None) is tree


SCRIPT = textwrap.dedent(
    r"""
    import json, os
    import jax, jax.numpy as jnp, numpy as np
    assert jax.local_device_count() == 4, jax.local_devices()
    from jaxlake import autoreset, bench, env
    from jaxlake.sharding import local_mesh, mesh_for_batch, replicated, shard_batch
    from jaxlake.types import Lake, LakeStats

    H = W = 5; A = 3
    def pool_of(n, seed):
        rng = np.random.default_rng(seed)
        holes = rng.random((n, H, W)) < 0.2
        region = np.ones((n, H, W), bool)
        starts = np.zeros((n, A, 2), np.int32); goals = np.zeros((n, A, 2), np.int32)
        k = rng.integers(1, A + 1, size=n)
        for i in range(n):
            cells = rng.choice(np.flatnonzero(~holes[i]), size=2 * A, replace=False)
            starts[i] = np.stack([cells[:A] // W, cells[:A] % W], -1)
            goals[i] = np.stack([cells[A:] // W, cells[A:] % W], -1)
        z = jnp.zeros(n)
        return Lake(holes=jnp.asarray(holes), region=jnp.asarray(region), starts=jnp.asarray(starts),
                    goals=jnp.asarray(goals), num_agents=jnp.asarray(k, jnp.int32),
                    slip_prob=jnp.full(n, 0.25, jnp.float32), max_steps=jnp.full(n, 6, jnp.int32),
                    on_goal=jnp.asarray(np.arange(n) % 2, jnp.int32),
                    stats=LakeStats(z, z, jnp.zeros((n, A), jnp.int32), jnp.ones(n, bool), jnp.ones(n, jnp.int32)))

    def same(a, b):
        return all(bool(np.array_equal(np.asarray(x), np.asarray(y)))
                   for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))

    out = {}
    key = jax.random.key(7)
    for B in (8, 6):
        lakes = pool_of(B, B)
        state = env.reset(lakes)
        ref = bench.make_rollout(20)(lakes, state, key)
        mesh = mesh_for_batch(B)
        got = bench.make_rollout(20, mesh)(shard_batch(lakes, mesh), shard_batch(state, mesh), key)
        out[f"plain_{B}"] = {"same": same(ref, got), "devices": len(got[0].pos.sharding.device_set),
                             "moved": bool(np.any(np.asarray(ref[0].pos) != np.asarray(state.pos)))}
        if B == 8:  # the keyed env.step path (one split key per instance) too
            ref = bench.make_rollout(20, rng="keys")(lakes, state, key)
            got = bench.make_rollout(20, mesh, rng="keys")(shard_batch(lakes, mesh), shard_batch(state, mesh), key)
            out["keys_8"] = {"same": same(ref, got), "devices": len(got[0].pos.sharding.device_set)}
        pool = pool_of(5, 100 + B)
        ar = autoreset.init(pool, B)
        ref = bench.make_autoreset_rollout(20)(pool, ar, key)
        got = bench.make_autoreset_rollout(20, mesh)(jax.device_put(pool, replicated(mesh)), shard_batch(ar, mesh), key)
        out[f"autoreset_{B}"] = {"same": same(ref, got), "devices": len(got[0].pool_idx.sharding.device_set),
                                 "episodes": int(jnp.sum(ref[0].episodes))}
    print(json.dumps(out))
    """
)


def test_rollout_sharded_over_4_host_devices_matches_unsharded(tmp_path):
    env_vars = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=4"), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env_vars,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, expect_devices in (("plain_8", 4), ("keys_8", 4), ("autoreset_8", 4), ("plain_6", 3), ("autoreset_6", 3)):
        assert out[name]["same"], (name, out)
        assert out[name]["devices"] == expect_devices, (name, out)
    assert out["plain_8"]["moved"] and out["autoreset_8"]["episodes"] > 0  # the rollouts did something
