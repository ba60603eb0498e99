"""The IPPO student's pieces at the smallest settings: GAE against a plain loop, masked actions,
a few updates, vmap over seeds, the held-out split, the typed config."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlake.config import LakeConfig
from jaxlake.students.compiled import jit
from jaxlake.students.config import IPPOConfig, StudentConfigError
from jaxlake.students.gae import gae
from jaxlake.students.ippo import collect, lake_student
from jaxlake.students.lakes import HELD_OUT_BUCKETS, heldout_lakes, is_held_out, lake_hash
from jaxlake import levels
from jaxlake.observations import observe, unpack
from jaxlake.students.network import MASKED, ActorCritic, entropy, greedy, log_prob, sample

def _smoke() -> dict:
    """conf/ippo/smoke.yaml (4 lakes, 8 steps, 2 updates in 2 chunks), as the entry point's
    tests run it: the same compiled programs."""
    from hydra import compose, initialize_config_dir

    from jaxlake.conf import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("ippo", overrides=["ippo=smoke"])
    return IPPOConfig.from_node(cfg.ippo).to_dict()


SMALL = _smoke()
ENV = LakeConfig()  # env=tiny's values


@pytest.fixture(scope="module")
def student():
    return lake_student(IPPOConfig(**SMALL), ENV)


@pytest.fixture(scope="module")
def jitted(student):
    """The student's ``init`` and ``chunk``, compiled once for the module."""
    return jit(student.init), jit(student.chunk)


def _gae_loop(rewards, values, dones, last_value, gamma, lam):
    T = len(rewards)
    adv = np.zeros_like(rewards)
    next_adv, next_value = np.zeros_like(last_value), last_value
    for t in reversed(range(T)):
        nd = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * nd - values[t]
        next_adv = delta + gamma * lam * nd * next_adv
        adv[t] = next_adv
        next_value = values[t]
    return adv, adv + values


def test_gae_equals_a_python_loop():
    rng = np.random.default_rng(0)
    T, B = 9, 5
    rewards = rng.normal(size=(T, B)).astype(np.float32)
    values = rng.normal(size=(T, B)).astype(np.float32)
    dones = rng.random((T, B)) < 0.3
    last = rng.normal(size=(B,)).astype(np.float32)
    adv, target = gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(dones), jnp.asarray(last), 0.97, 0.9)
    ref_adv, ref_target = _gae_loop(rewards, values, dones.astype(np.float32), last, 0.97, 0.9)
    np.testing.assert_allclose(np.asarray(adv), ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(target), ref_target, rtol=1e-5, atol=1e-5)


def test_masked_actions_are_never_sampled_nor_chosen():
    key = jax.random.PRNGKey(0)
    logits = 3.0 * jax.random.normal(key, (4096, 5))
    avail = jax.random.bernoulli(jax.random.PRNGKey(1), 0.4, (4096, 5)).at[:, 0].set(True)
    masked = jnp.where(avail, logits, MASKED)
    for k in jax.random.split(jax.random.PRNGKey(2), 8):
        a = sample(k, masked)
        assert bool(jnp.all(jnp.take_along_axis(avail, a[:, None], 1)))
    assert bool(jnp.all(jnp.take_along_axis(avail, greedy(masked)[:, None], 1)))
    assert bool(jnp.all(jnp.isfinite(entropy(masked))))
    assert bool(jnp.all(jnp.isfinite(log_prob(masked, greedy(masked)))))
    # an unavailable action has probability exactly 0
    assert float(jnp.max(jnp.where(avail, 0.0, jax.nn.softmax(masked)))) == 0.0


def test_a_rollout_takes_available_actions_only(student, jitted):
    runner = jitted[0](jax.random.PRNGKey(0))
    _, traj = jax.jit(lambda r: collect(r, student.env, student.network.apply, 8))(runner)
    taken = jnp.take_along_axis(traj.obs.avail, traj.action[..., None], -1)[..., 0]
    assert bool(jnp.all(taken))
    # agents that are not ACTIVE only have STAY, and some moves were masked somewhere
    assert bool(jnp.all(traj.obs.valid | (traj.action == 0)))
    assert not bool(jnp.all(traj.obs.avail))


def test_the_rollout_observes_packed_crops_of_the_actors_only(student, jitted):
    """The rollout's grids are packed crops of the actor slots, equal to the observations'
    float crops; the network reads them as it reads those floats (the same parameters)."""
    runner = jitted[0](jax.random.PRNGKey(0))
    k, radius = student.env.actors, SMALL["radius"]
    obs, rs = runner.obs, runner.env_state.rs
    assert obs.grid.dtype == jnp.uint8 and obs.grid.shape == (SMALL["num_envs"], k, 2 * radius + 1, 2 * radius + 1)
    assert student.network.crop and runner.env_state.cache is not None
    floats = ActorCritic(num_actions=5, hidden=student.network.hidden)

    @jax.jit
    def both(runner):
        full = jax.vmap(lambda lake, st: observe(lake, st, radius=radius))(rs.lake, levels.observe(rs))
        ours = student.network.apply(runner.params, obs.grid, obs.scalars, obs.avail)
        theirs = floats.apply(runner.params, full.grid[:, :k], full.scalars[:, :k], obs.avail)
        return unpack(obs.grid), full.grid[:, :k], full.avail_actions[:, :k], ours, theirs

    grid, full_grid, full_avail, ours, theirs = both(runner)
    np.testing.assert_array_equal(np.asarray(grid), np.asarray(full_grid))
    np.testing.assert_array_equal(np.asarray(obs.avail), np.asarray(full_avail))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_a_few_updates_change_the_parameters_and_keep_shapes(jitted):
    init, chunk = jitted
    runner = init(jax.random.PRNGKey(0))
    after, metrics = chunk(runner)
    before_leaves, after_leaves = jax.tree_util.tree_leaves(runner.params), jax.tree_util.tree_leaves(after.params)
    assert jax.tree_util.tree_structure(runner.params) == jax.tree_util.tree_structure(after.params)
    assert [x.shape for x in before_leaves] == [x.shape for x in after_leaves]
    assert any(not np.array_equal(a, b) for a, b in zip(before_leaves, after_leaves))
    assert int(after.update) == SMALL["eval_every"]
    loss = metrics.updates.loss
    assert metrics.updates.success.shape == (SMALL["eval_every"],)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in loss)
    assert 0.0 <= float(metrics.heldout.success) <= 1.0 and metrics.heldout.per_lake.shape == (SMALL["eval_lakes"],)


def test_vmap_over_seeds_equals_separate_runs(student, jitted):
    """``vmap(train)`` over two keys equals two separate runs, each ``init`` then ``chunk``
    once per chunk (what ``train`` scans, and what the entry point runs between checkpoints)."""
    init, chunk = jitted
    keys = jax.random.split(jax.random.PRNGKey(7), 2)
    both_state, both_metrics = jit(jax.vmap(student.train))(keys)
    for i in range(2):
        state, chunks = init(keys[i]), []
        for _ in range(SMALL["num_updates"] // SMALL["eval_every"]):
            state, m = chunk(state)
            chunks.append(m)
        metrics = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *chunks)
        for a, b in zip(jax.tree_util.tree_leaves((state.params, metrics)),
                        jax.tree_util.tree_leaves((both_state.params, both_metrics))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b[i]), rtol=2e-5, atol=2e-6)
    assert both_metrics.heldout.success.shape == (2, SMALL["num_updates"] // SMALL["eval_every"])


def test_training_and_held_out_lakes_are_disjoint(jitted):
    """Training pools hold no held-out lake and the held-out set only those; the hash ignores
    the generator's report and holds out about one lake in HELD_OUT_BUCKETS."""
    runner = jitted[0](jax.random.PRNGKey(3))
    pool = runner.env_state.pool
    assert not bool(jnp.any(jax.vmap(is_held_out)(pool)))
    lakes, comp = heldout_lakes(ENV, SMALL["eval_lakes"], seed=IPPOConfig().eval_seed)  # the student's own
    assert bool(jnp.all(jax.vmap(is_held_out)(lakes))) and comp.shape == (SMALL["eval_lakes"],)
    assert int(lakes.num_agents.min()) == ENV.num_agents
    one = jax.tree_util.tree_map(lambda x: x[0], pool)
    assert int(lake_hash(one)) == int(lake_hash(one.replace(stats=one.stats.replace(attempts=one.stats.attempts + 5))))
    assert int(lake_hash(one)) != int(lake_hash(one.replace(goals=one.goals[::-1])))
    from jaxlake.generator import generate_batch

    many = generate_batch(jax.random.PRNGKey(9), ENV, 256)  # heldout_lakes' batch shape: compiled already
    share = float(jnp.mean(jax.vmap(is_held_out)(many)))
    assert abs(share - 1 / HELD_OUT_BUCKETS) < 0.05


@pytest.mark.parametrize("values, words", [
    ({"num_envs": 0}, "ippo.num_envs=0 must be an integer in [1, inf)"),
    ({"lr": -1}, "ippo.lr=-1.0 must be a number in (0, 1]"),
    ({"hidden": [64, 0]}, "ippo.hidden=[64, 0]"),
    ({"num_updates": 30, "eval_every": 20}, "ippo.num_updates=30 must be a multiple of ippo.eval_every=20"),
    ({"pool_lakes": 100}, "ippo.pool_lakes=100 must be 0 or a multiple of ippo.num_envs=64"),
    ({"nonesuch": 1}, "unknown ippo field(s) ['nonesuch']"),
])
def test_a_bad_setting_names_its_field(values, words):
    with pytest.raises(StudentConfigError) as err:
        IPPOConfig.from_node(values)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_minibatch_split_is_checked():
    with pytest.raises(StudentConfigError, match="num_minibatches=3 must divide"):
        IPPOConfig(num_minibatches=3).check_batch(2)


def test_room_jit_hands_its_options_to_xla():
    """The room's programs compile with COMPILER_OPTIONS (the option that keeps XLA's CPU
    runtime from wedging in the vmapped UED trainer): a name XLA does not know fails the
    compile, so the options do reach it, and the room's own option is one XLA knows; an option
    given by the caller wins over the room's."""
    from jaxlake.students.compiled import COMPILER_OPTIONS

    assert COMPILER_OPTIONS == {"xla_cpu_enable_concurrency_optimized_scheduler": False}
    assert float(jit(lambda x: x * 2.0)(1.5)) == 3.0
    assert float(jit(lambda x: x * 3.0, compiler_options={"xla_cpu_enable_concurrency_optimized_scheduler": True})(
        1.0)) == 3.0
    with pytest.raises(Exception, match="xla_no_such_option"):
        jit(lambda x: x * 5.0, compiler_options={"xla_no_such_option": True})(1.0)
