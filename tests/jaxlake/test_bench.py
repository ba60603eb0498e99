"""``python -m jaxlake.bench``: end-to-end tiny run writes its documented JSON; report helpers;
peers are skipped with a note when missing; the package re-exports its modules' public names."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxlake import bench
from jaxlake.bench import report, throughput
from jaxlake.config import ConfigError
from jaxlake.peers import measure_peer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "jaxlake.bench", "bench=tiny", f"hydra.run.dir={out}",
           "bench.peers=[gymnasium,pogema]", "bench.peer.root=/nonexistent/peers"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc.stdout


@pytest.mark.slow
def test_tiny_run_writes_json_with_documented_fields(tiny_run):
    out, stdout = tiny_run
    result = json.loads((out / "bench.json").read_text())
    assert result["schema"] == bench.SCHEMA
    for name in bench.TOP_FIELDS:
        assert name in result, name
        assert f"``{name}``" in throughput.__doc__, f"{name} undocumented"
    for name in bench.META_FIELDS:
        assert name in result["meta"], name
    assert set(bench.VERSION_FIELDS) <= set(result["meta"]["versions"])
    assert result["meta"]["device_count"] >= 1 and result["meta"]["device_kind"]
    kinds = {(r["kind"], r["batch_size"]) for r in result["results"]}
    assert kinds == {(k, b) for k in ("generator", "rollout", "rollout_autoreset") for b in (1, 8)} | {("observe", 8)}
    observed = {r["observation_kind"]: r for r in result["results"] if r["kind"] == "observe"}
    assert set(observed) == {"packed"}  # bench.like_for_like.kinds of the tiny setting
    # one lake's observation: [A, H, W] packed bits, [A, 2] float32 scalars, [A, 5] masks
    assert observed["packed"]["obs_bytes_per_lake_step"] == 2 * 16 + 2 * 2 * 4 + 2 * 5
    assert result["like_for_like"] == []  # no Connector, no POGEMA in this run
    for row in result["results"]:
        assert row["status"] == "ok", row
        wanted = bench.ROW_FIELDS + bench.OK_ROW_FIELDS + {
            "generator": bench.GENERATOR_FIELDS, "rollout": bench.ROLLOUT_FIELDS,
            "rollout_autoreset": bench.AUTORESET_FIELDS, "observe": bench.OBSERVE_FIELDS}[row["kind"]]
        missing = [f for f in wanted if f not in row]
        assert not missing, (row["kind"], missing)
        assert len(row["times_s"]) == result["config"]["repeats"] or row["kind"] == "generator"
        assert row["compile_s"] > 0 and row["median_s"] > 0
        rate = row["lakes_per_s"] if row["kind"] == "generator" else row["env_steps_per_s"]
        assert rate == pytest.approx(row["batch_size"] * row.get("steps", 1) / row["median_s"])
        if row["kind"] != "generator":
            assert row["observations"] is (row["kind"] == "observe")  # bench.observations: off by default
            assert row["agent_steps_per_s"] == pytest.approx(rate * row["num_agents"])
            assert row["flops_per_instance_step"] > 0 and row["bytes_per_instance_step"] > 0
    gen = next(r for r in result["results"] if r["kind"] == "generator" and r["batch_size"] == 8)
    assert set(bench.GENERATOR_STATS_FIELDS) <= set(gen["stats"])
    assert gen["stats"]["dist_ok"] == 1.0
    assert {(o["env"], o["batch_size"]) for o in result["autoreset_overhead"]} == {("4x4_a2", 1), ("4x4_a2", 8)}
    # Peers: gymnasium measured, pogema missing -> skipped with a note, never an error.
    peers = {p["peer"]: p for p in result["peers"]}
    assert peers["gymnasium"]["status"] == "ok" and peers["gymnasium"]["agent_steps_per_s"] > 0
    assert peers["pogema"]["status"] == "skipped" and "jaxlake.peers.setup" in peers["pogema"]["note"]
    (ratio,) = result["ratios"]
    assert set(bench.RATIO_FIELDS) <= set(ratio) and ratio["peer"] == "gymnasium"
    assert ratio["ratio"] == pytest.approx(ratio["ours_agent_steps_per_s"] / ratio["peer_agent_steps_per_s"])
    assert "skipped" in stdout and "auto-reset overhead" in stdout


@pytest.mark.slow
def test_tiny_run_writes_csv_and_png(tiny_run):
    out, _ = tiny_run
    result = json.loads((out / "bench.json").read_text())
    assert result["files"] == ["bench.json", "bench.csv", "bench.png"]
    with open(out / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result["results"]) + len(result["peers"])
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temp files


def _row(kind, env, batch, rate, **extra):
    return {"kind": kind, "env": env, "batch_size": batch, "status": "ok", "agent_steps_per_s": rate, **extra}


def test_ratios_and_overheads_are_computed_from_matching_rows():
    from jaxlake.config import LakeConfig

    envs = {"8x8": LakeConfig(height=8, width=8, num_agents=4, max_height=8, max_width=8, max_agents=4),
            "10x10": LakeConfig(height=10, width=10, num_agents=10, hole_density=0.0, max_height=10,
                                max_width=10, max_agents=10)}
    results = [_row("rollout", "8x8", 16, 400.0), _row("rollout_autoreset", "8x8", 16, 380.0),
               _row("rollout", "8x8", 4, 100.0), _row("rollout_autoreset", "8x8", 4, 125.0),
               _row("rollout", "10x10", 16, 900.0)]
    peers = [{"peer": "pogema", "status": "ok", "env": "8x8", "system": "P", "height": 8, "width": 8,
              "num_agents": 4, "agent_steps_per_s": 4.0},
             {"peer": "jumanji_connector", "status": "ok", "env": "8x8", "system": "J", "height": 10,
              "width": 10, "num_agents": 10, "agent_steps_per_s": 300.0},
             {"peer": "gymnasium", "status": "skipped", "note": "missing", "env": "8x8"}]
    pog, jum = report.peer_ratios(results, peers, envs, batch=16)
    assert (pog["env"], pog["ratio"], pog["ratio_autoreset"]) == ("8x8", 100.0, 95.0)
    assert (jum["env"], jum["ratio"], jum["ratio_autoreset"]) == ("10x10", 3.0, None)  # matched by shape
    over = {o["batch_size"]: o["overhead_pct"] for o in report.autoreset_overheads(results)}
    assert over[16] == pytest.approx(100 * (400 / 380 - 1)) and over[4] == pytest.approx(-20.0)
    text = report.format_report({"meta": {"local_device_count": 1, "device_kind": "cpu", "platform": "cpu",
                                          "versions": {"jax": "x"}, "git_commit": None},
                                 "results": [], "peers": peers, "ratios": [pog, jum], "autoreset_overhead": []})
    assert "skipped: missing" in text and "| P " in text


def test_like_for_like_matches_each_kind_with_its_peer_mode():
    def ours(kind, rate, h=8, a=4):
        return _row("observe", f"{h}x{h}", 16, rate, height=h, width=h, num_agents=a, observation_kind=kind,
                    agent_steps_per_cpu_s=rate / 2, obs_bytes_per_lake_step=None if kind == "none" else 64.0)

    def connector(mode, rate, h=8, a=4):
        return {"peer": "jumanji_connector", "status": "ok", "height": h, "width": h, "num_agents": a,
                "obs_mode": mode, "agent_steps_per_s": rate, "agent_steps_per_cpu_s": rate, "num_envs": 16,
                "obs_bytes_per_lake_step": None if mode == "none" else 100.0}

    results = [ours("none", 300.0), ours("global", 200.0), ours("packed", 150.0), ours("grids", 90.0),
               ours("jaxmarl", 100.0), ours("global", 50.0, 10, 10), _row("rollout", "8x8", 16, 1.0)]
    peers = [connector(m, 100.0) for m in bench.PEER_MODES] + [connector("returned", 100.0, 10, 10)] + [
        {"peer": "pogema", "status": "ok", "height": 8, "width": 8, "num_agents": 4, "agent_steps_per_s": 1.0},
        {"peer": "jumanji_connector", "status": "skipped", "note": "missing"}]
    rows = {(q["kind"], q["peer"], q["env"]): q for q in bench.like_for_like(results, peers)}
    assert set(rows) == {("none", "jumanji_connector", "8x8"), ("none", "pogema", "8x8"),
                         ("global", "jumanji_connector", "8x8"), ("packed", "jumanji_connector", "8x8"),
                         ("grids", "jumanji_connector", "8x8"), ("jaxmarl", "jumanji_connector", "8x8"),
                         ("global", "jumanji_connector", "10x10")}
    assert [rows[("packed", "jumanji_connector", "8x8")][f] for f in ("peer_mode", "ratio", "target", "met")] == \
        ["relabel", 1.5, 1.5, True]
    assert rows[("jaxmarl", "jumanji_connector", "8x8")]["peer_mode"] == "relabel_autoreset"
    assert rows[("global", "jumanji_connector", "10x10")]["met"] is False  # 0.5 < 1
    assert rows[("none", "pogema", "8x8")]["ratio"] == 300.0 and rows[("grids", "jumanji_connector", "8x8")]["met"] is None
    assert all(set(bench.LIKE_FOR_LIKE_FIELDS) == set(q) for q in rows.values())
    text = report.format_report({"meta": {"local_device_count": 1, "device_kind": "cpu", "platform": "cpu",
                                          "versions": {"jax": "x"}, "git_commit": None},
                                 "results": [], "peers": [], "ratios": [], "autoreset_overhead": [],
                                 "like_for_like": list(rows.values())})
    assert "like for like" in text and "relabel_autoreset" in text and "NO" in text
    with pytest.raises(ValueError, match=r"bench.like_for_like.kinds=\['local'\] not in"):
        bench.run_bench({"envs": [], "like_for_like": {"enabled": True, "kinds": ["local"]}})


def test_connector_relabel_is_process_grids_arithmetic():
    """The peer's inline relabel on a hand-made Connector grid: agent i's path / position / target
    are 1 + 3i / 2 + 3i / 3 + 3i; its own channel reads 1 / 2 / 3, the other channel every other
    agent's, collapsed to 1 / 2 / 3."""
    import jax.numpy as jnp

    from jaxlake.peers.jumanji_connector import relabel

    grid = jnp.asarray([[1, 2, 0], [4, 5, 6], [0, 3, 0]], jnp.int32)  # agent 0: path, head, target; agent 1: all
    out = np.asarray(relabel(grid, 2))
    assert out.shape == (2, 3, 3, 2) and out.dtype == np.float32
    np.testing.assert_array_equal(out[0, ..., 0], [[1, 2, 0], [0, 0, 0], [0, 3, 0]])
    np.testing.assert_array_equal(out[0, ..., 1], [[0, 0, 0], [1, 2, 3], [0, 0, 0]])
    np.testing.assert_array_equal(out[1, ..., 0], [[0, 0, 0], [1, 2, 3], [0, 0, 0]])
    np.testing.assert_array_equal(out[1, ..., 1], [[1, 2, 0], [0, 0, 0], [0, 3, 0]])


def test_memory_cap_skips_batches_that_do_not_fit():
    cap = throughput._Cap(limit=2000, fraction=0.5, max_batch=1000)  # budget 1000 bytes per device
    assert cap.reason("rollout", 2000, 1).startswith("batch 2000 > bench.max_batch")
    assert cap.reason("rollout", 500, 1) is None  # nothing known yet
    assert cap.check_compiled("rollout", 1, 1, mem=300) is None  # a fixed 300 bytes (e.g. the pool)...
    assert cap.reason("rollout", 500, 1) is None  # one point: no extrapolation
    assert cap.check_compiled("rollout", 11, 1, mem=320) is None  # ... + 2 bytes per instance
    assert cap.estimate("rollout", 101) == pytest.approx(500.0)
    assert cap.reason("rollout", 300, 1) is None  # 898 <= 1000
    assert "device memory" in cap.reason("rollout", 400, 1)  # 1098 > 1000
    assert cap.reason("rollout", 400, 2) is None  # 200 per device: 698
    assert "device memory" in cap.check_compiled("rollout", 60, 1, mem=1001)


def test_both_rng_modes_compile_and_step():
    import jax

    from jaxlake import LakeConfig, autoreset
    from jaxlake.env import reset
    from jaxlake.generator import generate_batch

    lakes = generate_batch(jax.random.key(0), LakeConfig(height=4, width=4, num_agents=2, max_height=4,
                                                         max_width=4, max_agents=2, max_steps=8), 2)
    state = jax.vmap(reset)(lakes)
    ar = autoreset.init(lakes, 2)
    for rng in bench.RNG_MODES:  # both modes trace, compile and step (the CI run uses only "bits")
        final, total = bench.make_rollout(4, rng=rng)(lakes, state, jax.random.key(1))
        assert total.shape == (2,) and int(final.t.min()) == 4, rng
        ar4, total = bench.make_autoreset_rollout(4, rng=rng)(lakes, ar, jax.random.key(1))
        assert total.shape == (2,) and int(ar4.state.t.max()) >= 1, rng
    with pytest.raises(ValueError, match="bench.rng='dice' not in"):
        bench.make_rollout(4, rng="dice")


def test_observations_option_builds_them_without_changing_the_rollout():
    """``bench.observations=true``: the timed programs also build the observations every step
    (they are in the compiled program) and the rollout is otherwise the same."""
    import jax

    from jaxlake import LakeConfig, autoreset
    from jaxlake.env import reset
    from jaxlake.generator import generate_batch

    lakes = generate_batch(jax.random.key(0), LakeConfig(height=4, width=4, num_agents=2, max_height=4,
                                                         max_width=4, max_agents=2, max_steps=8), 2)
    state = jax.vmap(reset)(lakes)
    ar = autoreset.init(lakes, 2)
    key = jax.random.key(1)
    for rng in bench.RNG_MODES:
        plain = bench.make_rollout(4, rng=rng)
        for observe in (True, "float32", "bool"):  # True: uint8 grids (bench.observation_dtype)
            with_obs = bench.make_rollout(4, rng=rng, observe=observe)
            for x, y in zip(jax.tree_util.tree_leaves(plain(lakes, state, key)),
                            jax.tree_util.tree_leaves(with_obs(lakes, state, key))):
                np.testing.assert_array_equal(x, y)
        plain = bench.make_autoreset_rollout(4, rng=rng)
        with_obs = bench.make_autoreset_rollout(4, rng=rng, observe=True)
        for x, y in zip(jax.tree_util.tree_leaves(plain(lakes, ar, key)),
                        jax.tree_util.tree_leaves(with_obs(lakes, ar, key))):
            np.testing.assert_array_equal(x, y)
    # the observation work is really compiled in: more flops per call than the plain rollout
    flops = [bench.cost_of(bench.make_rollout(4, observe=o).lower(lakes, state, key).compile())["flops"]
             for o in (False, True)]
    if None not in flops:
        assert flops[1] > flops[0]
    with pytest.raises(ValueError, match="bench.observations"):
        bench.run_bench({"envs": [], "observations": "yes"})
    with pytest.raises(ValueError, match="bench.observation_dtype"):
        bench.run_bench({"envs": [], "observations": True, "observation_dtype": "int3"})


def test_parse_envs_validates_names_and_fields():
    envs = bench.parse_envs([{"name": "a", "height": 4, "width": 4, "num_agents": 2, "max_height": 4,
                              "max_width": 4, "max_agents": 2, "batch_sizes": [8, 2]}])
    assert envs["a"][1] == [8, 2] and envs["a"][0].height == 4
    with pytest.raises(ValueError, match="repeated"):
        bench.parse_envs([{"name": "a"}, {"name": "a"}])
    with pytest.raises(ConfigError, match="num_agents"):
        bench.parse_envs([{"name": "b", "num_agents": 9}])


def test_unknown_or_missing_peer_is_a_skipped_row():
    (row,) = measure_peer("nope", {})
    assert row["status"] == "skipped" and "unknown peer" in row["note"]
    (row,) = measure_peer("jumanji_connector", {"height": 4, "width": 4, "num_agents": 2}, root="/nonexistent")
    assert row["status"] == "skipped" and "setup jumanji_connector" in row["note"]


def test_the_package_reexports_its_modules_public_names():
    """``jaxlake.bench.<name>`` is the object its module defines, for every name of ``__all__``;
    the modules' own ``__all__`` are all in it."""
    from jaxlake.bench import kinds, peers, rollouts

    modules = (throughput, rollouts, peers, report, kinds)
    for name in bench.__all__:
        obj = getattr(bench, name)
        if name != "main":
            assert any(getattr(m, name, None) is obj for m in modules), name
    for module in (rollouts, peers, kinds):
        assert set(module.__all__) <= set(bench.__all__), module.__name__
