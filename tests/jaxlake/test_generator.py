"""Generator guarantees (docs/rules.md#generator-guarantees), checked lake by lake with an independent plain-Python BFS.

Compile budget: one vmapped generator for the 8x8 / 4-agent canvas at batch 256 (chunked by
100, so the chunked path is what every batch test exercises), one single-lake generator, and
one mixture of all presets on their common canvas.
"""

from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from jaxlake.config import ConfigError, LakeConfig, stack_configs
from jaxlake.distances import lake_stats
from jaxlake.generator import (
    generate,
    generate_batch,
    generate_many,
    generate_mixture,
    mixture_components,
    mixture_counts,
)
from jaxlake.types import ON_GOAL_CODES
from jaxlake.conf import CONF_DIR

BATCH = 256
CANVAS = dict(max_height=8, max_width=8, max_agents=4)
OPTIONS = dict(chunk_size=100)  # 256 lakes -> 3 chunks, the last one padded
#: conf/env/'s one-config presets (every LakeConfig field listed); MIXTURE_PRESETS: its mixtures.
PRESETS = sorted(p for p in (CONF_DIR / "env").glob("*.yaml") if "mixture" not in OmegaConf.load(p))
MIXTURE_PRESETS = sorted(p for p in (CONF_DIR / "env").glob("*.yaml") if "mixture" in OmegaConf.load(p))
INF = 10**9


def many(keys, configs):
    return generate_many(keys, configs, **OPTIONS)


def cfg(**kw):
    return LakeConfig(**{**CANVAS, **kw})


def to_numpy(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


def lake_at(lakes, i):
    return jax.tree_util.tree_map(lambda x: x[i], lakes)


# ============================================================================ independent checker
def bfs(free: np.ndarray, src) -> np.ndarray:
    h, w = free.shape
    dist = np.full((h, w), INF, dtype=np.int64)
    dist[src] = 0
    queue = deque([tuple(src)])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            rr, cc = r + dr, c + dc
            if 0 <= rr < h and 0 <= cc < w and free[rr, cc] and dist[rr, cc] == INF:
                dist[rr, cc] = dist[r, c] + 1
                queue.append((rr, cc))
    return dist


def check_lake(lake, config: LakeConfig, max_attempts: int = 6) -> None:
    """Assert every docs/rules.md#generator-guarantees guarantee and that the reported stats are exact."""
    h, w = lake.holes.shape
    region = np.zeros((h, w), bool)
    region[: config.height, : config.width] = True
    np.testing.assert_array_equal(lake.region, region)
    assert not (lake.holes & ~region).any(), "hole outside the region"
    frozen = region & ~lake.holes
    n = config.num_agents
    assert int(lake.num_agents) == n
    assert float(lake.slip_prob) == pytest.approx(config.slip_prob)
    assert int(lake.max_steps) == config.max_steps
    assert int(lake.on_goal) == ON_GOAL_CODES[config.on_goal]
    cells = [tuple(x) for x in lake.starts[:n]] + [tuple(x) for x in lake.goals[:n]]
    assert len(set(cells)) == 2 * n, f"starts/goals not distinct: {cells}"
    for cell in cells:
        assert frozen[cell], f"start/goal {cell} not a frozen region cell"
    np.testing.assert_array_equal(lake.starts[n:], 0)
    np.testing.assert_array_equal(lake.goals[n:], 0)
    np.testing.assert_array_equal(lake.stats.path_len[n:], -1)
    sp_sets, lengths = [], []
    for i in range(n):
        ds = bfs(frozen, tuple(lake.starts[i]))
        dg = bfs(frozen, tuple(lake.goals[i]))
        length = ds[tuple(lake.goals[i])]
        assert length < INF, f"agent {i}: goal unreachable"
        lengths.append(length)
        sp_sets.append(set(zip(*np.nonzero((ds + dg == length) & frozen))))
    np.testing.assert_array_equal(lake.stats.path_len[:n], lengths)
    in_bounds = all(config.min_dist <= d <= config.effective_max_dist for d in lengths)
    assert bool(lake.stats.dist_ok) == in_bounds
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    conflicts = sum(bool(sp_sets[i] & sp_sets[j]) for i, j in pairs)
    density = conflicts / len(pairs) if pairs else 0.0
    assert float(lake.stats.conflict_density) == pytest.approx(density, abs=1e-6)
    holes = int(lake.holes.sum())
    assert float(lake.stats.hole_density) == pytest.approx(holes / (config.height * config.width), abs=1e-6)
    assert 1 <= int(lake.stats.attempts) <= max_attempts


def check_batch(lakes, configs) -> None:
    lakes = to_numpy(lakes)
    for i, config in enumerate(configs):
        check_lake(lake_at(lakes, i), config)


# ============================================================================ configs
GUARANTEE_CONFIGS = [
    cfg(height=5, width=5, num_agents=2, hole_density=0.1),
    cfg(height=8, width=8, num_agents=4, hole_density=0.2, conflict_density=0.5),
    cfg(height=8, width=8, num_agents=4, hole_density=0.5, conflict_density=0.9),
    cfg(height=8, width=8, num_agents=4, hole_density=0.6, conflict_density=0.1),
    cfg(height=6, width=7, num_agents=3, hole_density=0.3, min_dist=3, max_dist=4),
    cfg(height=8, width=8, num_agents=4, hole_density=0.2, min_dist=7, max_dist=7, on_goal="stay"),
    cfg(height=3, width=8, num_agents=4, hole_density=0.25, slip_prob=0.3, max_steps=40),
    cfg(height=2, width=2, num_agents=2, hole_density=0.0, min_dist=1, max_dist=2),
    cfg(height=8, width=2, num_agents=1, hole_density=0.4, conflict_density=1.0),
    cfg(height=4, width=4, num_agents=4, hole_density=0.5),  # all frozen cells needed
]


def test_guarantees_on_thousands_of_lakes():
    configs = [GUARANTEE_CONFIGS[i % len(GUARANTEE_CONFIGS)] for i in range(BATCH)]
    stacked = stack_configs(configs)
    for round_ in range(8):  # 8 x BATCH lakes
        keys = jax.random.split(jax.random.key(100 + round_), BATCH)
        check_batch(many(keys, stacked), configs)


def test_dense_holes_fall_back_without_breaking_guarantees():
    # 4x4 with 8 holes and 4 agents: only lakes whose frozen cells pair up within components
    # are valid; the others must come from retries or the hole-free fallback.
    config = GUARANTEE_CONFIGS[-1]
    lakes = to_numpy(many(jax.random.split(jax.random.key(7), BATCH), stack_configs([config] * BATCH)))
    check_batch(lakes, [config] * BATCH)
    assert (lakes.stats.attempts > 1).any(), "expected some retries"
    fallback = lakes.stats.hole_density == 0.0
    assert (lakes.stats.attempts[fallback] == 6).all()
    assert (lakes.stats.hole_density[~fallback] == 0.5).all()


def test_unreachable_distance_bounds_are_flagged_but_valid():
    # a 3x3 hole-free region has no pair 8 apart; with holes a snake could make one
    config = cfg(height=3, width=3, num_agents=1, hole_density=0.0, min_dist=8)
    lakes = to_numpy(many(jax.random.split(jax.random.key(8), BATCH), stack_configs([config] * BATCH)))
    check_batch(lakes, [config] * BATCH)
    assert not lakes.stats.dist_ok.any()
    # every regular attempt was spent; the hole-free fallback was not needed (lakes valid)
    assert (lakes.stats.attempts == 5).all()


def test_tight_bounds_are_met_when_achievable():
    config = cfg(height=8, width=8, num_agents=4, hole_density=0.2, min_dist=5, max_dist=6)
    lakes = to_numpy(many(jax.random.split(jax.random.key(9), BATCH), stack_configs([config] * BATCH)))
    check_batch(lakes, [config] * BATCH)
    assert lakes.stats.dist_ok.mean() > 0.99
    assert ((lakes.stats.path_len >= 5) & (lakes.stats.path_len <= 6)).mean() > 0.99


def test_stats_equal_lake_stats():
    configs = [GUARANTEE_CONFIGS[i % len(GUARANTEE_CONFIGS)] for i in range(BATCH)]
    lakes = many(jax.random.split(jax.random.key(10), BATCH), stack_configs(configs))
    min_dist = jnp.asarray([c.min_dist for c in configs])
    max_dist = jnp.asarray([c.effective_max_dist for c in configs])
    recomputed = to_numpy(jax.jit(jax.vmap(lake_stats))(lakes, min_dist, max_dist))
    got = to_numpy(lakes.stats)
    for name in ("hole_density", "conflict_density"):
        np.testing.assert_allclose(getattr(got, name), getattr(recomputed, name), atol=1e-6)
    np.testing.assert_array_equal(got.path_len, recomputed.path_len)
    np.testing.assert_array_equal(got.dist_ok, recomputed.dist_ok)


# ============================================================================ determinism / batching
_single = generate  # already jitted inside (one compile per canvas and options)


def test_mixed_batch_equals_per_config_generation():
    configs = [GUARANTEE_CONFIGS[i % len(GUARANTEE_CONFIGS)] for i in range(BATCH)]
    keys = jax.random.split(jax.random.key(11), BATCH)
    batch = to_numpy(many(keys, stack_configs(configs)))
    # lakes from every config, from every chunk (0-99, 100-199, 200-255)
    for i in list(range(0, 20)) + [99, 100, 150, 199, 200, 254, 255]:
        alone = to_numpy(_single(keys[i], configs[i]))
        jax.tree_util.tree_map(np.testing.assert_array_equal, lake_at(batch, i), alone)


def test_same_key_same_lake_and_keys_differ():
    config = GUARANTEE_CONFIGS[1]
    a = to_numpy(_single(jax.random.key(1), config))
    b = to_numpy(_single(jax.random.key(1), config))
    jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)
    lakes = to_numpy(many(jax.random.split(jax.random.key(2), BATCH), stack_configs([config] * BATCH)))
    signatures = {(l.holes.tobytes(), l.starts.tobytes(), l.goals.tobytes()) for l in map(lambda i: lake_at(lakes, i), range(BATCH))}
    assert len(signatures) == BATCH


def test_raw_uint32_key():
    config = GUARANTEE_CONFIGS[0]
    raw = jax.random.PRNGKey(5)
    assert raw.dtype == jnp.uint32
    check_lake(to_numpy(_single(raw, config)), config)


def test_rbg_keys_are_vmap_invariant():
    # rbg random bits differ between batched and unbatched use; the generator folds such keys
    # into threefry keys so each lake still equals the one generated alone
    config = GUARANTEE_CONFIGS[3]
    keys = jax.random.split(jax.random.key(6, impl="rbg"), BATCH)
    lakes = to_numpy(many(keys, stack_configs([config] * BATCH)))
    for i in (0, 150):
        check_lake(lake_at(lakes, i), config)
        jax.tree_util.tree_map(np.testing.assert_array_equal, lake_at(lakes, i), to_numpy(_single(keys[i], config)))


def test_generate_batch_matches_split_keys():
    config = GUARANTEE_CONFIGS[2]
    key = jax.random.key(12)
    lakes = to_numpy(generate_batch(key, config, BATCH, **OPTIONS))
    assert lakes.holes.shape == (BATCH, 8, 8)
    assert lakes.starts.shape == (BATCH, 4, 2)
    first = to_numpy(_single(jax.random.split(key, BATCH)[3], config))
    jax.tree_util.tree_map(np.testing.assert_array_equal, lake_at(lakes, 3), first)


# ============================================================================ densities
def test_batch_mean_densities_near_targets():
    # (hole density, conflict density, tolerance): the extremes are harder to hit exactly
    targets = [(0.0, 0.0, 0.05), (0.2, 0.3, 0.04), (0.3, 0.6, 0.04), (0.1, 1.0, 0.08)]
    configs = [cfg(height=8, width=8, num_agents=4, hole_density=h, conflict_density=c) for h, c, _ in targets]
    per = BATCH // len(configs)
    stacked = stack_configs([c for c in configs for _ in range(per)])
    holes, conflict = [[] for _ in configs], [[] for _ in configs]
    for round_ in range(4):
        lakes = many(jax.random.split(jax.random.key(20 + round_), per * len(configs)), stacked)
        for j in range(len(configs)):
            holes[j].append(np.asarray(lakes.stats.hole_density[j * per : (j + 1) * per]))
            conflict[j].append(np.asarray(lakes.stats.conflict_density[j * per : (j + 1) * per]))
    for j, (h, c, tolerance) in enumerate(targets):
        assert np.concatenate(holes[j]).mean() == pytest.approx(h, abs=0.005)
        assert np.concatenate(conflict[j]).mean() == pytest.approx(c, abs=tolerance), (h, c)


# ============================================================================ property test
@st.composite
def configs_8x8(draw):
    height = draw(st.integers(2, 8))
    width = draw(st.integers(2, 8))
    cells = height * width
    num_agents = draw(st.integers(1, min(4, cells // 2)))
    max_holes = (cells - 2 * num_agents) / cells
    hole_density = draw(st.floats(0.0, min(0.9, max_holes)))
    if 2 * num_agents > cells - round(hole_density * cells):
        hole_density = 0.0
    min_dist = draw(st.integers(1, cells - 1))
    max_dist = draw(st.one_of(st.none(), st.integers(min_dist, cells - 1)))
    return cfg(
        height=height, width=width, num_agents=num_agents, hole_density=hole_density,
        conflict_density=draw(st.floats(0.0, 1.0)), slip_prob=draw(st.floats(0.0, 1.0)),
        max_steps=draw(st.integers(1, 64)), min_dist=min_dist, max_dist=max_dist,
        on_goal=draw(st.sampled_from(["vanish", "stay"])),
    )


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(configs_8x8(), min_size=4, max_size=4), st.integers(0, 2**31 - 1))
def test_guarantees_property(configs, seed):
    per = BATCH // len(configs)
    batch = [c for c in configs for _ in range(per)]
    lakes = to_numpy(many(jax.random.split(jax.random.key(seed), BATCH), stack_configs(batch)))
    for i in range(0, BATCH, 4):  # every 4th lake keeps the pure-Python check quick
        check_lake(lake_at(lakes, i), batch[i])


# ============================================================================ presets and mixtures
def test_mixture_presets_load_and_generate():
    from jaxlake.mixture import load_mixture

    assert {p.stem for p in MIXTURE_PRESETS} >= {"broad"}
    for path in MIXTURE_PRESETS:
        mixture = load_mixture(path)
        lakes = to_numpy(generate_mixture(jax.random.key(4), mixture, 4 * len(mixture)))
        ids = mixture_components(mixture, 4 * len(mixture))
        assert set(ids.tolist()) == set(range(len(mixture)))  # every component drawn
        for i in range(4 * len(mixture)):
            assert int(lakes.num_agents[i]) == mixture.configs[ids[i]].num_agents


def test_presets_load_validate_and_generate():
    assert {p.stem for p in PRESETS} >= {"tiny", "small", "medium", "slippery"}
    configs = []
    for path in PRESETS:
        raw = OmegaConf.to_container(OmegaConf.load(path))
        assert set(raw) == {f for f in LakeConfig.__dataclass_fields__}, f"{path.name} must list every field"
        configs.append(LakeConfig.from_dict(OmegaConf.load(path)))
    n = 8 * len(configs)
    mixture = [(1.0, c) for c in configs]
    lakes = to_numpy(generate_mixture(jax.random.key(3), mixture, n))
    ids = mixture_components(mixture, n)
    lifted_capacity = (max(c.max_height for c in configs), max(c.max_width for c in configs))
    assert lakes.holes.shape[1:] == lifted_capacity
    for i in range(n):
        config = configs[ids[i]]
        lifted = config.replace(max_height=lifted_capacity[0], max_width=lifted_capacity[1])
        check_lake(lake_at(lakes, i), lifted)


def test_mixture_counts_largest_remainder():
    assert mixture_counts([1, 1, 1], 10) == [4, 3, 3]
    assert mixture_counts([0.5, 0.3, 0.2], 7) == [4, 2, 1]  # quotas 3.5, 2.1, 1.4
    assert mixture_counts([2, 0], 5) == [5, 0]
    assert sum(mixture_counts([0.1] * 7, 1000)) == 1000
    for bad in ([], [-1, 2], [0, 0], [float("nan")]):
        with pytest.raises(ConfigError):
            mixture_counts(bad, 4)


def test_mixture_blocks_shuffle_and_equality_with_generate():
    a = cfg(height=5, width=5, num_agents=2, hole_density=0.1)
    b = cfg(height=8, width=8, num_agents=4, hole_density=0.3, conflict_density=0.9)
    mixture = [(3.0, a), (1.0, b)]
    key = jax.random.key(4)
    ids = mixture_components(mixture, BATCH)
    np.testing.assert_array_equal(ids, [0] * 192 + [1] * 64)
    shuffled_ids = mixture_components(mixture, BATCH, key=key, shuffle=True)
    assert sorted(shuffled_ids.tolist()) == ids.tolist() and (shuffled_ids != ids).any()
    lakes = to_numpy(generate_mixture(key, mixture, BATCH, shuffle=True, **OPTIONS))
    np.testing.assert_array_equal(lakes.num_agents, np.where(shuffled_ids == 0, 2, 4))
    lake_keys = jax.random.split(jax.random.split(key)[0], BATCH)
    for i in (0, 1, 100, 255):
        alone = to_numpy(_single(lake_keys[i], mixture[shuffled_ids[i]][1]))
        jax.tree_util.tree_map(np.testing.assert_array_equal, lake_at(lakes, i), alone)
    with pytest.raises(ConfigError):
        mixture_components(mixture, 4, shuffle=True)
    with pytest.raises(ConfigError):
        generate_mixture(key, [(1.0, "not a config")], 4)


def test_bad_options_are_rejected():
    config = GUARANTEE_CONFIGS[0]
    with pytest.raises(ConfigError, match="pool_size"):
        generate(jax.random.key(0), config, pool_size=3)
    with pytest.raises(ConfigError, match="max_attempts"):
        generate(jax.random.key(0), config, max_attempts=1)
    with pytest.raises(TypeError, match="unknown generator option"):
        generate_many(jax.random.split(jax.random.key(0), 2), stack_configs([config] * 2), bogus=1)


def test_the_kernel_reads_a_typed_config_of_the_dynamic_fields():
    """The kernel's config is a pytree record of exactly the dynamic fields, in leaf order;
    the static capacity and options are its static arguments."""
    import dataclasses

    from jaxlake.config import DYNAMIC_FIELDS, config_arrays
    from jaxlake.generator import KernelConfig, _generate_many, _static_for

    assert tuple(f.name for f in dataclasses.fields(KernelConfig)) == DYNAMIC_FIELDS
    cfg = LakeConfig(height=4, width=5, num_agents=2, hole_density=0.2, max_steps=9, max_height=6, max_width=6,
                     max_agents=3, on_goal="stay")
    leaves = jax.tree_util.tree_leaves(config_arrays(cfg))
    kc = KernelConfig.from_leaves(leaves)
    assert int(kc.width) == 5 and float(kc.hole_density) == pytest.approx(0.2) and len(jax.tree_util.tree_leaves(kc)) == 10
    with pytest.raises(ValueError):
        KernelConfig.from_leaves(leaves[:-1])
    st_, key_data = _static_for(cfg, jax.random.PRNGKey(3), 6, None, 12, 0)
    batch = jax.tree_util.tree_map(lambda x: x[None], kc)
    lake = jax.tree_util.tree_map(lambda x: x[0], _generate_many(st_, key_data[None], batch))
    alone = generate(jax.random.PRNGKey(3), cfg)
    for a, b in zip(jax.tree_util.tree_leaves(lake), jax.tree_util.tree_leaves(alone)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(lake.max_steps) == 9 and int(lake.num_agents) == 2
