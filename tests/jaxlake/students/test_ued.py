"""UED inside the IPPO jit (jaxlake.students.ued): regret scores against NumPy, the level
buffer's insertion, staleness and replay distribution, ACCEL's mutations, ``dr`` equal to the
plain trainer bit for bit, and PLR / ACCEL updates under jit and vmap."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlake.config import LakeConfig
from jaxlake.students import ued
from jaxlake.students.compiled import jit
from jaxlake.students.config import IPPOConfig, StudentConfigError, UEDConfig
from jaxlake.students.envs import lake_env
from jaxlake.students.ippo import advantages, build, collect, log
from jaxlake.students.lakes import fresh_pool, is_held_out, lake_hash
from jaxlake.students.update import update_epochs
from tests.jaxlake.test_generator import check_lake, to_numpy

ENV = LakeConfig()  # env=tiny's values


class _Obs(NamedTuple):
    valid: jax.Array


class _Traj(NamedTuple):
    """The fields of a :class:`~jaxlake.students.ippo.Transition` the scores read."""

    level: jax.Array
    obs: _Obs
    reward: jax.Array
    done: jax.Array
    value: jax.Array


SMALL = dict(num_envs=4, num_steps=8, num_updates=4, update_epochs=2, num_minibatches=2, hidden=(16,),
             pool_lakes=8, eval_every=2, eval_lakes=8)


# --------------------------------------------------------------------------- scores
def _trajectory():
    """T=6 steps, E=2 instances, K=2 actors; instance 0 plays level 0 then level 2, instance 1
    level 1 then a lake outside the pool (-1)."""
    T, E, K = 6, 2, 2
    rng = np.random.default_rng(0)
    level = np.array([[0, 1], [0, 1], [0, 1], [2, 1], [2, -1], [2, -1]], np.int32)
    valid = np.ones((T, E, K), bool)
    valid[2, 0, 1] = False  # actor 1 of instance 0 finished at step 1
    done = np.zeros((T, E, K), bool)
    done[1, 0, 1] = done[2, 0, 0] = True  # level 0's episode ends at step 2
    done[3, 1, :] = True  # level 1's episode ends at step 3
    reward = np.zeros((T, E, K), np.float32)
    reward[1, 0, 1], reward[2, 0, 0], reward[3, 1, 0], reward[3, 1, 1] = 1.0, -1.0, 1.0, 1.0
    reward[0, 0, 0] = 0.25  # a mid-episode reward, to test the running sums
    value = rng.normal(size=(T, E, K)).astype(np.float32)
    adv = rng.normal(size=(T, E, K)).astype(np.float32)
    return level, valid, done, reward, value, adv


def _reference(level, valid, done, reward, value, adv, prior, score):
    P = len(prior)
    T, E, K = reward.shape
    best = np.array(prior, np.float64)
    g = np.zeros((E, K))
    for t in range(T):
        for e in range(E):
            for k in range(K):
                if valid[t, e, k]:
                    g[e, k] += reward[t, e, k]
                if done[t, e, k]:
                    if valid[t, e, k] and level[t, e] >= 0:
                        best[level[t, e]] = max(best[level[t, e]], g[e, k])
                    g[e, k] = 0.0
    for e in range(E):  # an episode the rollout cut off counts with its partial return
        for k in range(K):
            if valid[T - 1, e, k] and not done[T - 1, e, k] and level[T - 1, e] >= 0:
                best[level[T - 1, e]] = max(best[level[T - 1, e]], g[e, k])
    scores, played = np.zeros(P), np.zeros(P, bool)
    for p in range(P):
        xs = []
        for t in range(T):
            for e in range(E):
                for k in range(K):
                    if level[t, e] == p and valid[t, e, k]:
                        xs.append(max(adv[t, e, k], 0.0) if score == "pvl" else best[p] - value[t, e, k])
        ok = bool(xs) and (score == "pvl" or np.isfinite(best[p]))
        played[p] = ok
        scores[p] = np.mean(xs) if ok else 0.0
    return scores, best, played


@pytest.mark.parametrize("score", ["pvl", "maxmc"])
def test_scores_equal_a_numpy_reference(score):
    level, valid, done, reward, value, adv = _trajectory()
    prior = np.array([-np.inf, -np.inf, -np.inf, 0.5], np.float32)  # level 3 never played, level 2 no end
    traj = _Traj(level=jnp.asarray(level), obs=_Obs(valid=jnp.asarray(valid)),
                  reward=jnp.asarray(reward), done=jnp.asarray(done), value=jnp.asarray(value))
    scores, best, played = jax.jit(lambda t, a, p: ued.level_scores(score, t, a, p))(traj, jnp.asarray(adv),
                                                                                    jnp.asarray(prior))
    ref_scores, ref_best, ref_played = _reference(level, valid, done, reward, value, adv, prior, score)
    np.testing.assert_array_equal(np.asarray(played), ref_played)
    np.testing.assert_allclose(np.asarray(best), ref_best, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(scores)[ref_played], ref_scores[ref_played], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ref_best[:2], [1.0, 1.0])  # level 0: actor 0 had 0.25 - 1, actor 1 had +1
    # level 2's episode is cut off by the rollout's end: its partial return (0) counts, so MaxMC
    # scores it too (it once dropped such levels: the long, hard ones)
    assert ref_best[2] == 0.0 and ref_best[3] == 0.5
    assert list(ref_played) == [True, True, True, False]
    assert float(best[2]) == 0.0 and bool(played[2])


# --------------------------------------------------------------------------- the buffer
@pytest.fixture(scope="module")
def lakes():
    return fresh_pool(jax.random.PRNGKey(0), ENV, 8)


INSERT = jax.jit(ued.insert)


def _take(tree, idx):
    return jax.tree_util.tree_map(lambda x: x[np.asarray(idx)], tree)


def test_insertion_keeps_the_top_scores_and_updates_duplicates_and_staleness(lakes):
    template = jax.tree_util.tree_map(lambda x: x[0], lakes)
    buf = ued.empty_buffer(template, 4).replace(clock=jnp.int32(3))
    scores = jnp.asarray([0.5, 0.1, 0.9, 0.3, 0.7, 0.2], jnp.float32)
    ok = jnp.asarray([True, True, True, True, True, False])  # the last one was not played
    buf = INSERT(buf, _take(lakes, range(6)), scores, jnp.zeros(6), ok)
    assert bool(jnp.all(buf.filled))
    assert sorted(np.asarray(buf.scores).tolist()) == pytest.approx([0.3, 0.5, 0.7, 0.9])
    kept = set(np.asarray(buf.hashes).tolist())
    want = set(np.asarray(jax.vmap(lake_hash)(_take(lakes, [0, 2, 3, 4]))).tolist())
    assert kept == want
    np.testing.assert_array_equal(np.asarray(buf.last_seen), 3)
    # a level already in the buffer takes its new score (no second copy); a low one is dropped
    buf = buf.replace(clock=jnp.int32(5))
    again = INSERT(buf, _take(lakes, [3, 5]), jnp.asarray([0.05, 0.01]), jnp.asarray([1.0, 0.0]),
                                jnp.asarray([True, True]))
    slot = int(np.flatnonzero(np.asarray(again.hashes) == int(lake_hash(_take(lakes, 3))))[0])
    assert float(again.scores[slot]) == pytest.approx(0.05)
    assert float(again.max_returns[slot]) == 1.0
    assert int(again.last_seen[slot]) == 5
    assert set(np.asarray(again.hashes).tolist()) == want
    # drawing a replay marks nothing; update_played writes the played slots' scores and marks
    # them (and only them) as played now
    buf = again.replace(clock=jnp.int32(9))
    idx = jax.jit(ued.sample_replay, static_argnums=2)(jax.random.PRNGKey(1), buf, 3, 0.3, 0.3)
    played = jnp.asarray([True, False, False])
    buf3 = jax.jit(ued.update_played)(buf, idx, jnp.asarray([2.0, 2.0, 2.0]), jnp.zeros(3), played)
    first = int(idx[0])
    assert float(buf3.scores[first]) == 2.0 and int(buf3.last_seen[first]) == 9
    for j in set(np.asarray(idx[1:]).tolist()) - {first}:  # drawn, never reached by the rollout
        assert int(buf3.last_seen[j]) == int(buf.last_seen[j]) and float(buf3.scores[j]) == float(buf.scores[j])


def _reference_insert(scores, filled, last_seen, hashes, clock, new, temperature, rho, by="weight"):
    """JaxUED's insertion, level by level, with the replay weights recomputed from scratch
    (``by="score"``: the rule it replaced, the lowest score)."""
    scores, filled, last_seen, hashes = list(scores), list(filled), list(last_seen), list(hashes)
    for h, score in new:
        if h in [hashes[i] for i in range(len(scores)) if filled[i]]:
            slot = [i for i in range(len(scores)) if filled[i] and hashes[i] == h][0]
        elif not all(filled):
            slot = filled.index(False)
        else:
            w = _reference_weights(np.asarray(scores), np.asarray(filled), np.asarray(last_seen), clock, temperature, rho)
            slot = int(np.argmin(w if by == "weight" else scores))
            if not score > scores[slot]:
                continue
        scores[slot], filled[slot], last_seen[slot], hashes[slot] = score, True, clock, h
    return scores, filled, last_seen, hashes


def _full(lakes, idx, scores, last_seen, clock):
    """A filled buffer of ``lakes[idx]`` (built directly, nothing compiled)."""
    chosen = _take(lakes, idx)
    n = len(idx)
    template = jax.tree_util.tree_map(lambda x: x[0], lakes)
    return ued.empty_buffer(template, n).replace(
        lakes=chosen, scores=jnp.asarray(scores, jnp.float32), filled=jnp.ones((n,), bool),
        hashes=jax.vmap(lake_hash)(chosen), last_seen=jnp.asarray(last_seen, jnp.int32), clock=jnp.int32(clock))


def test_insertion_replaces_the_lowest_weight_not_the_lowest_score(lakes):
    """A full buffer whose lowest-scored level is the stalest: its staleness weight keeps it,
    and a new level replaces the slot of lowest replay weight (JaxUED), not of lowest score;
    level by level, the weights before every insertion are exact (the ranks kept up to date)."""
    buf = _full(lakes, [0, 1, 2, 3], [0.1, 0.2, 0.9, 0.8], [0, 10, 10, 10], 10)
    w = np.asarray(ued.replay_weights(buf, 0.3, 0.3))
    assert np.argmin(np.asarray(buf.scores)) == 0 and np.argmin(w) == 1
    order, scores = [4, 5, 6, 7, 1, 2], np.asarray([0.5, 0.05, 0.3, 0.95, 0.4, 0.9], np.float32)  # a tie, two dups
    out = INSERT(buf, _take(lakes, order), jnp.asarray(scores), jnp.zeros(6), jnp.ones(6, bool))
    hashes = np.asarray(jax.vmap(lake_hash)(lakes))
    args = (np.asarray(buf.scores), np.asarray(buf.filled), np.asarray(buf.last_seen), np.asarray(buf.hashes), 10,
            list(zip(hashes[order], scores)), 0.3, 0.3)
    ref = _reference_insert(*args)
    np.testing.assert_allclose(np.asarray(out.scores), ref[0], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(out.hashes), ref[3])
    np.testing.assert_array_equal(np.asarray(out.last_seen), ref[2])
    assert _reference_insert(*args, by="score")[3] != ref[3]  # the old rule keeps other levels


def _reference_weights(scores, filled, last_seen, clock, temperature, rho):
    n = len(scores)
    order = sorted([i for i in range(n) if filled[i]], key=lambda i: -scores[i])
    h = np.zeros(n)
    for r, i in enumerate(order, 1):
        h[i] = (1.0 / r) ** (1.0 / temperature)
    stale = np.array([clock - last_seen[i] if filled[i] else 0 for i in range(n)], float)
    p_stale = stale / stale.sum() if stale.sum() > 0 else h / h.sum()
    return (1 - rho) * h / h.sum() + rho * p_stale


def test_rank_prioritisation_equals_a_reference(lakes):
    template = jax.tree_util.tree_map(lambda x: x[0], lakes)
    scores = np.array([0.2, 1.5, -0.3, 0.9, 0.0, 0.4], np.float32)
    filled = np.array([True, True, True, True, False, True])
    last_seen = np.array([1, 4, 2, 7, 0, 7], np.int32)
    buf = ued.empty_buffer(template, 6).replace(scores=jnp.asarray(scores), filled=jnp.asarray(filled),
                                                last_seen=jnp.asarray(last_seen), clock=jnp.int32(7))
    for temperature, rho in ((0.3, 0.3), (1.0, 0.0), (2.0, 1.0)):
        got = np.asarray(ued.replay_weights(buf, temperature, rho))
        np.testing.assert_allclose(got, _reference_weights(scores, filled, last_seen, 7, temperature, rho), rtol=1e-5)
        assert got[4] == 0.0 and got.sum() == pytest.approx(1.0)


def test_replay_only_samples_filled_slots(lakes):
    template = jax.tree_util.tree_map(lambda x: x[0], lakes)
    filled = np.zeros(16, bool)
    filled[[2, 5, 11]] = True
    buf = ued.empty_buffer(template, 16).replace(filled=jnp.asarray(filled), clock=jnp.int32(4),
                                                 scores=jnp.arange(16, dtype=jnp.float32))
    idx = jax.jit(ued.sample_replay, static_argnums=2)(jax.random.PRNGKey(0), buf, 512, 0.3, 0.3)
    assert set(np.asarray(idx).tolist()) == {2, 5, 11}


def test_config_names_the_bad_field():
    for bad, field in ((dict(method="paired"), "ippo.ued.method"), (dict(score="x"), "ippo.ued.score"),
                       (dict(replay_prob=1.5), "ippo.ued.replay_prob"), (dict(buffer_size=0), "ippo.ued.buffer_size"),
                       (dict(robust="yes"), "ippo.ued.robust"), (dict(bogus=1), "ippo.ued"),
                       (dict(budget="time"), "ippo.ued.budget"), (dict(num_edits=0), "ippo.ued.num_edits"),
                       (dict(sfl_ratio=2), "ippo.ued.sfl_ratio"), (dict(sfl_buffer=9, sfl_levels=8), "ippo.ued.sfl_buffer"),
                       (dict(method="sfl", sfl_every=3), "ippo.ued.sfl_every")):
        with pytest.raises(StudentConfigError, match=field.replace(".", r"\.")):
            IPPOConfig(ued=bad)
    with pytest.raises(StudentConfigError, match="ippo.pool_lakes"):
        IPPOConfig(pool_lakes=0, ued=dict(method="plr"))
    assert IPPOConfig().ued == UEDConfig() and UEDConfig().method == "dr"
    # JaxUED's example's replay probability and a buffer far larger than a pool; 1-2 edits a child
    d = UEDConfig()
    assert (d.replay_prob, d.buffer_size, d.num_edits, d.budget) == (0.8, 4096, 2, "grad_steps")


# --------------------------------------------------------------------------- ACCEL's mutations
@pytest.fixture(scope="module")
def accel():
    """An ACCEL hook over pools of 4 and its jitted ``start`` and ``finish`` (every branch compiled once)."""
    P = 4
    env = lake_env(ENV, pool_lakes=P)
    config = UEDConfig(method="accel", buffer_size=8, num_edits=2, replay_prob=1.0, min_fill=0.0)
    hook = ued.make_levels(config, env, P, min_dist=ENV.min_dist, max_dist=ENV.max_dist)
    return P, hook, jax.jit(hook.start), jax.jit(hook.finish)


def _played(P, upto, value=0.0):
    """A two-step trajectory that reached pool levels ``0 .. upto-1`` (every step valid and done;
    MaxMC scores ``-value``)."""
    T, K = 2, 2
    level = np.tile(np.arange(P, dtype=np.int32), (T, 1))
    level[:, upto:] = -1
    return _Traj(level=jnp.asarray(level), obs=_Obs(valid=jnp.ones((T, P, K), bool)), reward=jnp.zeros((T, P, K)),
                 done=jnp.ones((T, P, K), bool), value=jnp.full((T, P, K), value)), jnp.zeros((T, P, K))


def test_accel_children_are_small_in_support_edits_of_the_buffer_top(lakes, accel):
    """ACCEL's parents are the buffer's top-scored levels (not the replay draws, most of them
    copies of one lake); each child is 1-2 in-support edits: starts and goals frozen, distinct,
    reachable, the hole count and the conflicting pairs kept (a lake the generator could make)."""
    P, hook, start, finish = accel
    scores = np.asarray([3, 7, 0, 5, 1, 6, 2, 4], np.float32)
    state = hook.init(jax.random.PRNGKey(0))
    state = state._replace(buffer=_full(lakes, range(8), scores, [0] * 8, 1), mode=jnp.int32(ued.REPLAY))
    state, plan = start(jax.random.PRNGKey(2), state)  # the update after a replay
    assert int(plan.mode) == ued.MUTATE and not bool(hook.learns(plan))
    top = np.argsort(-scores)[:P]  # best first
    kids, dads = to_numpy(plan.pool), to_numpy(_take(lakes, top))
    changed = 0
    for i in range(P):
        kid, dad = (jax.tree_util.tree_map(lambda x: x[i], t) for t in (kids, dads))
        check_lake(kid, ENV)  # the generator's own checker, with the config's bounds
        np.testing.assert_array_equal(kid.region, dad.region)
        assert kid.holes.sum() == dad.holes.sum()
        assert kid.stats.conflict_density == dad.stats.conflict_density
        moved = (np.any(kid.starts != dad.starts, axis=1).sum() + np.any(kid.goals != dad.goals, axis=1).sum()
                 + (kid.holes != dad.holes).sum() // 2)
        assert moved <= 2, (i, moved)
        changed += int(moved > 0)
    assert changed >= 1
    assert not bool(jnp.any(jax.vmap(is_held_out)(plan.pool)))
    # every child played with a score above the buffer's enters it (a child equal to its parent updates it)
    state, metrics = finish(state, plan, *_played(P, P, value=-10.0))
    assert set(np.asarray(jax.vmap(lake_hash)(plan.pool)).tolist()) <= set(np.asarray(state.buffer.hashes).tolist())


def test_a_replay_marks_only_the_levels_its_rollout_played(lakes, accel):
    P, hook, start, finish = accel
    state = hook.init(jax.random.PRNGKey(0))
    state = state._replace(buffer=_full(lakes, range(8), np.arange(8), [0] * 8, 4))
    state, plan = start(jax.random.PRNGKey(1), state)
    assert int(plan.mode) == ued.REPLAY
    after, _ = finish(state, plan, *_played(P, 2))  # the rollout reached only pool levels 0 and 1
    seen = np.asarray(after.buffer.last_seen)
    reached = set(np.asarray(plan.idx)[:2].tolist())
    for slot in range(8):
        assert seen[slot] == (5 if slot in reached else 0), (slot, seen, reached)


def test_dr_equals_the_plain_trainer_bit_for_bit():
    config = IPPOConfig(**SMALL, ued=dict(method="dr"))
    env = lake_env(ENV, pool_lakes=config.pool_lakes)
    trainer = build(config, env)

    # the plain IPPO update, written out from the public phases
    apply, tx = trainer.network.apply, None
    import optax
    steps = config.update_epochs * config.num_minibatches
    tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                     optax.adam(optax.linear_schedule(config.lr, 0.0, config.num_updates * steps), eps=1e-5))

    def plain(key):
        runner = trainer.init(key)

        def update(runner, _):
            key, k_refresh, k_update = jax.random.split(runner.key, 3)
            runner = runner._replace(env_state=env.refresh(k_refresh, runner.env_state), key=key)
            runner, traj = collect(runner, env, apply, config.num_steps)
            _, last = apply(runner.params, runner.obs.grid, runner.obs.scalars, runner.obs.avail)
            params, opt, loss = update_epochs(k_update, runner.params, runner.opt_state, advantages(traj, last, config),
                                              apply=apply, tx=tx, epochs=config.update_epochs,
                                              minibatches=config.num_minibatches, clip_eps=config.clip_eps,
                                              vf_coef=config.vf_coef, ent_coef=config.ent_coef)
            return runner._replace(params=params, opt_state=opt, update=runner.update + 1), log(traj, loss, 0, 0)

        return jax.lax.scan(update, runner, None, config.num_updates)

    def ours(key):
        runner, chunks = jax.lax.scan(lambda r, _: trainer.chunk(r), trainer.init(key), None, config.num_chunks)
        return runner, jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), chunks.updates)

    key = jax.random.PRNGKey(3)
    a, b = jax.jit(plain)(key), jax.jit(ours)(key)
    assert a[0].ued is None and b[0].ued is None
    for x, y in zip(jax.tree_util.tree_leaves((a[0].params, a[0].opt_state, a[1])),
                    jax.tree_util.tree_leaves((b[0].params, b[0].opt_state, b[1]))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _counts(opt_state):
    """(Adam's count, the learning-rate schedule's count) of the trainer's optimiser state."""
    import optax

    leaves = jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(x, (optax.ScaleByAdamState,
                                                                                 optax.ScaleByScheduleState)))
    adam = [x for x in leaves if isinstance(x, optax.ScaleByAdamState)][0]
    sched = [x for x in leaves if isinstance(x, optax.ScaleByScheduleState)][0]
    return np.asarray(adam.count), np.asarray(sched.count)


def test_accel_trains_under_jit_and_vmap_at_equal_gradient_steps():
    """At the grad_steps budget every step of the loop is a policy update on replayed levels
    (new levels and ACCEL's children played before it): the same gradient steps as dr, and the
    learning-rate schedule (Adam's count) runs to its end, lr 0 (it once ended at 1/2 for PLR
    and 2/3 for ACCEL, whose skipped updates did not advance it)."""
    config = IPPOConfig(**SMALL, ued=dict(method="accel", buffer_size=16, min_fill=0.25, replay_prob=0.5))
    env = lake_env(ENV, pool_lakes=config.pool_lakes)
    trainer = build(config, env)  # no held-out evaluation: the UED loop alone
    runner, chunks = jit(jax.vmap(trainer.train))(jax.random.split(jax.random.PRNGKey(0), 2))
    u = chunks.updates.ued
    modes, plays, learned = (np.asarray(x).reshape(2, -1) for x in (u.mode, u.plays, u.learned))  # [seed, step]
    fill = np.asarray(runner.ued.buffer.filled)
    assert fill.shape == (2, 16) and fill.sum(axis=1).min() > 0
    for x in jax.tree_util.tree_leaves(runner.params):
        assert np.isfinite(np.asarray(x)).all()
    assert (learned == 1).all() and (modes == ued.REPLAY).all()
    assert (plays[:, 0] >= 2).all()  # an empty buffer cannot replay: new levels first
    assert (plays[:, 1:] >= 2).all()  # a replay is followed by its children, unless the step is the first
    assert (np.asarray(chunks.updates.loss.loss) != 0).all()
    adam, sched = _counts(runner.opt_state)
    steps = config.num_updates * config.update_epochs * config.num_minibatches
    np.testing.assert_array_equal(adam, steps)
    np.testing.assert_array_equal(sched, steps)


def test_a_play_without_a_policy_update_advances_only_the_schedule():
    """At the lake_steps budget a skipped update moves the learning-rate schedule on (not Adam's
    count or moments), so the schedule ends at 0 after every play, as dr's does."""
    import optax

    from jaxlake.students.ippo import advance_schedule

    tx = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(optax.linear_schedule(1e-3, 0.0, 8), eps=1e-5))
    state = tx.init({"w": jnp.ones(3)})
    moved = advance_schedule(state, 4)
    adam, sched = _counts(moved)
    assert int(adam) == 0 and int(sched) == 4
    for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(moved)):
        if a.shape:  # the moments
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    updates, _ = tx.update({"w": jnp.ones(3)}, advance_schedule(state, 8), {"w": jnp.ones(3)})
    np.testing.assert_array_equal(np.asarray(updates["w"]), 0.0)  # lr 0 at the schedule's end
