"""Property and statistical tests of ``jaxlake.env.step`` (docs/rules.md#one-step).

* hypothesis: random small hand-built lakes (5x5 canvas, 4 agent slots, fixed shapes so
  everything compiles once) and random action sequences, checked against an independent
  plain-Python implementation of the rules and against the invariants (no two present agents
  share a cell, statuses only leave ACTIVE, ARRIVED only on the own goal, FELL only on a
  hole), plus permutation equivariance.
* statistics: slip frequencies against ``slip_prob``; with one agent and ``slip_prob = 2/3``
  the transition frequencies against gymnasium's slippery ``FrozenLake-v1``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxlake.env import reset, rollout, step, step_from_uniforms
from jaxlake.types import (
    ABSENT,
    ACTION_DELTAS,
    ACTIVE,
    ARRIVED,
    DOWN,
    FELL,
    LEFT,
    ON_GOAL_STAY,
    RIGHT,
    STAY,
    TIMED_OUT,
    UP,
    State,
)
from tests.jaxlake.test_step_rules import MAX_AGENTS, lake_from_rows

T = 8
A = MAX_AGENTS
STEP_U = jax.jit(step_from_uniforms)
INFO_FIELDS = ("reward", "arrived", "fell", "timed_out", "slipped", "wall", "vertex_conflict",
               "swap_conflict", "blocked", "moved", "done")


# ------------------------------------------------------------------ reference implementation
def reference_step(lake, pos, status, t, actions, u, arrive_reward=1.0, fall_reward=-1.0):
    """docs/rules.md#one-step written as plainly as possible: Python loops, sets, a while-loop fixed point."""
    holes, region = np.asarray(lake.holes), np.asarray(lake.region)
    goals = [tuple(g) for g in np.asarray(lake.goals).tolist()]
    p = np.float32(lake.slip_prob)
    n_slots = len(status)
    pos = [tuple(x) for x in pos]
    status = list(status)
    info = {k: [False] * n_slots for k in INFO_FIELDS if k not in ("reward", "done")}
    reward = [0.0] * n_slots
    active = [s == ACTIVE for s in status]
    if not any(active):
        return pos, status, t, dict(info, reward=reward, done=True)
    target = list(pos)
    mover = [False] * n_slots
    for i in range(n_slots):
        a = int(actions[i])
        if not active[i] or not 0 <= a <= 4 or a == STAY:
            continue
        if u[i] < p:
            info["slipped"][i] = True
            first, second = (LEFT, RIGHT) if a in (UP, DOWN) else (UP, DOWN)
            a = first if u[i] < np.float32(0.5) * p else second
        r, c = pos[i][0] + ACTION_DELTAS[a][0], pos[i][1] + ACTION_DELTAS[a][1]
        if 0 <= r < region.shape[0] and 0 <= c < region.shape[1] and region[r, c]:
            target[i], mover[i] = (r, c), True
        else:
            info["wall"][i] = True
    present = [active[i] or (status[i] == ARRIVED and int(lake.on_goal) == ON_GOAL_STAY) for i in range(n_slots)]
    movers = [i for i in range(n_slots) if mover[i]]
    for i in movers:
        for j in movers:
            if j != i and target[j] == target[i]:
                info["vertex_conflict"][i] = True
            if j != i and target[j] == pos[i] and target[i] == pos[j]:
                info["swap_conflict"][i] = True
    moving = {i for i in movers if not info["vertex_conflict"][i] and not info["swap_conflict"][i]}
    changed = True
    while changed:
        changed = False
        for i in sorted(moving):
            if any(present[j] and j not in moving and pos[j] == target[i] for j in range(n_slots)):
                moving.discard(i)
                info["blocked"][i] = True
                changed = True
    t = t + 1
    for i in range(n_slots):
        if not active[i]:
            continue
        if i in moving:
            pos[i] = target[i]
            info["moved"][i] = True
            if holes[pos[i]]:
                status[i], info["fell"][i], reward[i] = FELL, True, fall_reward
                continue
        if pos[i] == goals[i]:
            status[i], info["arrived"][i], reward[i] = ARRIVED, True, arrive_reward
        elif t >= int(lake.max_steps):
            status[i], info["timed_out"][i] = TIMED_OUT, True
    return pos, status, t, dict(info, reward=reward, done=ACTIVE not in status)


# -------------------------------------------------------------------------- strategies
@st.composite
def small_lakes(draw):
    """A random lake on the 5x5 / 4-agent canvas, built through the hand-drawn-rows helper."""
    h, w = draw(st.sampled_from([2, 3, 4, 5, 5])), draw(st.sampled_from([2, 3, 4, 5, 5]))
    n = min(draw(st.sampled_from([1, 2, 3, 4, 4, 4])), (h * w) // 2)
    cells = draw(st.permutations(range(h * w)))
    hole_p = draw(st.sampled_from([0.0, 0.15, 0.3]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    grid = np.where(rng.random((h, w)) < hole_p, "~", ".").astype(object)
    for i in range(n):
        grid[divmod(cells[i], w)] = chr(ord("A") + i)
        grid[divmod(cells[n + i], w)] = chr(ord("a") + i)
    rows = [" ".join(row) for row in grid]
    return lake_from_rows(
        rows,
        slip_prob=draw(st.sampled_from([0.0, 0.0, 0.3, 1.0])),
        max_steps=draw(st.sampled_from([1, 3, 6, T + 2, T + 2])),
        on_goal=draw(st.sampled_from(["vanish", "stay"])),
    )


@st.composite
def plans(draw, batch=None):
    """``[A, T]`` (or ``[batch, A, T]``) actions: uniform moves for dense interaction, now and
    then an out-of-range integer (which means STAY)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (A, T) if batch is None else (batch, A, T)
    plan = rng.integers(0, 5, size=shape)
    odd = rng.random(shape) < 0.05
    return np.where(odd, rng.choice([-1, 5, 9], size=shape), plan).astype(np.int32)


def uniforms(key, steps=T):
    """``[steps, A]``: the per-step slip noise that ``rollout`` draws from ``key``."""
    keys = jax.random.split(key, steps)
    return jax.vmap(lambda k: jax.random.uniform(k, (A,)))(keys)


_UNIFORMS = jax.jit(jax.vmap(uniforms))


def UNIFORMS(keys):
    """``[E, T, A]`` numpy slip noise of the rollouts keyed by ``keys``."""
    return np.asarray(_UNIFORMS(keys))


PROPERTY_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------ tests
EPISODES = 8  # episodes per hypothesis example (one lake, several plans and keys)
ROLLOUTS = jax.jit(jax.vmap(rollout, in_axes=(0, None, 0)))


@PROPERTY_SETTINGS
@given(lake=small_lakes(), plans=plans(batch=EPISODES), seed=st.integers(0, 2**31 - 1))
def test_step_matches_reference_and_keeps_the_invariants(lake, plans, seed):
    keys = jax.random.split(jax.random.key(seed), EPISODES)
    out = jax.tree.map(np.asarray, ROLLOUTS(keys, lake, jnp.asarray(plans)))
    noise = UNIFORMS(keys)
    for e in range(EPISODES):
        check_episode(lake, plans[e], noise[e], jax.tree.map(lambda x: x[e], out))


def check_episode(lake, plan, u, out):
    """Compare one rolled-out episode step by step with the reference, and check invariants.

    ``u`` is the ``[T, A]`` slip noise the rollout drew; ``out`` the rollout as numpy.
    """
    traj = out.trajectory
    lake = jax.tree.map(np.asarray, lake)
    holes, region = np.asarray(lake.holes), np.asarray(lake.region)
    goals = np.asarray(lake.goals)
    stay = int(lake.on_goal) == ON_GOAL_STAY

    state0 = jax.tree.map(np.asarray, reset(lake))
    pos, status, t = np.asarray(state0.pos).tolist(), np.asarray(state0.status).tolist(), 0
    absent = np.asarray(state0.status) == ABSENT
    for k in range(T):
        prev_status = np.asarray(status)
        prev_pos = np.asarray(pos)
        pos, status, t, info = reference_step(lake, pos, status, t, plan[:, k], u[k])
        # Exactly the reference.
        np.testing.assert_array_equal(traj.pos[k], np.asarray(pos), err_msg=f"pos, step {k}")
        np.testing.assert_array_equal(traj.status[k], np.asarray(status), err_msg=f"status, step {k}")
        assert traj.t[k] == t
        for name in INFO_FIELDS:
            np.testing.assert_array_equal(getattr(traj.info, name)[k], np.asarray(info[name]), err_msg=f"{name}, step {k}")

        # Invariants, checked directly on the JAX result.
        st_k, pos_k = traj.status[k], traj.pos[k]
        present = (st_k == ACTIVE) | ((st_k == ARRIVED) & stay)
        cells = [tuple(p) for p in pos_k[present]]
        assert len(cells) == len(set(cells)), f"two present agents share a cell: {pos_k}, {st_k}"
        for p in pos_k[present]:
            assert region[tuple(p)] and not holes[tuple(p)]
        changed = st_k != prev_status
        assert (prev_status[changed] == ACTIVE).all(), "a status left a terminal state"
        assert (st_k[absent] == ABSENT).all() and (st_k[~absent] != ABSENT).all()
        new_arrived = changed & (st_k == ARRIVED)
        assert (pos_k[new_arrived] == goals[new_arrived]).all(), "ARRIVED off its goal"
        new_fell = changed & (st_k == FELL)
        assert all(holes[tuple(p)] for p in pos_k[new_fell]), "FELL off a hole"
        step_len = np.abs(pos_k - prev_pos).sum(-1)
        assert (step_len <= 1).all()
        assert (step_len[prev_status != ACTIVE] == 0).all(), "an agent off the board moved"
    np.testing.assert_array_equal(out.final_state.pos, traj.pos[-1])


@PROPERTY_SETTINGS
@given(
    lake=small_lakes(),
    plan=plans(),
    seed=st.integers(0, 2**31 - 1),
    warmup=st.integers(0, 3),
    perm=st.permutations(range(A)),
)
def test_permuting_agent_slots_permutes_the_result(lake, plan, seed, warmup, perm):
    """Permute slots (agents, their goals, actions and per-agent slip noise): results permute."""
    perm = np.asarray(perm)
    noise = np.asarray(jax.random.uniform(jax.random.key(seed), (warmup + 1, A)))
    state = reset(lake)
    for k in range(warmup):  # reach a mid-episode state (some agents may have finished)
        state, _ = STEP_U(lake, state, plan[:, k], noise[k])
    actions, u = plan[:, warmup], noise[warmup]
    nxt, info = STEP_U(lake, state, actions, u)

    p_lake = lake.replace(starts=lake.starts[perm], goals=lake.goals[perm])
    p_state = State(pos=state.pos[perm], status=state.status[perm], t=state.t)
    p_nxt, p_info = STEP_U(p_lake, p_state, actions[perm], u[perm])

    np.testing.assert_array_equal(np.asarray(p_nxt.pos), np.asarray(nxt.pos)[perm])
    np.testing.assert_array_equal(np.asarray(p_nxt.status), np.asarray(nxt.status)[perm])
    assert int(p_nxt.t) == int(nxt.t)
    for name in INFO_FIELDS[:-1]:
        np.testing.assert_array_equal(np.asarray(getattr(p_info, name)), np.asarray(getattr(info, name))[perm], err_msg=name)
    assert bool(p_info.done) == bool(info.done)


# --------------------------------------------------------------------------- statistics
N_SLIP = 16000
BATCH_STEP = jax.jit(jax.vmap(step, in_axes=(0, None, None, 0)))


def within(count, n, p, sigmas=4.0):
    """``count / n`` is within ``sigmas`` binomial standard deviations of ``p``."""
    sd = np.sqrt(max(p * (1 - p), 1e-12) / n)
    return abs(count / n - p) <= sigmas * sd + 1e-12


@pytest.mark.parametrize("slip_prob", [0.0, 0.1, 0.5, 2 / 3, 0.9])
def test_slip_frequencies_match_slip_prob(slip_prob):
    """Two agents that cannot interact (their neighbourhoods are disjoint), every direction.

    Sample ``n`` gives agent 0 direction ``n % 4`` and agent 1 direction ``(n // 4) % 4``.
    """
    lake = lake_from_rows(
        [
            "a . . . .",
            ". A . . .",
            ". . . . .",
            ". . . B .",
            ". . . . b",
        ],
        slip_prob=slip_prob,
    )
    state = reset(lake)
    moves = np.asarray([UP, DOWN, LEFT, RIGHT], np.int32)
    sample = np.arange(N_SLIP)
    actions = np.zeros((N_SLIP, A), np.int32)
    actions[:, 0], actions[:, 1] = moves[sample % 4], moves[(sample // 4) % 4]
    keys = jax.random.split(jax.random.key(123), N_SLIP)
    nxt, info = BATCH_STEP(keys, lake, state, jnp.asarray(actions))
    delta = np.asarray(nxt.pos) - np.asarray(state.pos)[None]  # [N, A, 2]
    slipped = np.asarray(info.slipped)
    assert not np.asarray(info.vertex_conflict | info.swap_conflict | info.blocked | info.wall).any()
    for i in range(2):
        for move in moves:
            rows = actions[:, i] == move
            n = rows.sum()
            d = delta[rows, i]
            intended = np.asarray(ACTION_DELTAS[move])
            perp = [np.asarray(ACTION_DELTAS[x]) for x in ((LEFT, RIGHT) if move in (UP, DOWN) else (UP, DOWN))]
            straight = (d == intended).all(-1)
            first, second = (d == perp[0]).all(-1), (d == perp[1]).all(-1)
            assert (straight | first | second).all()
            np.testing.assert_array_equal(slipped[rows, i], ~straight)
            assert within(slipped[rows, i].sum(), n, slip_prob), (i, move, slipped[rows, i].mean())
            assert within(first.sum(), n, slip_prob / 2) and within(second.sum(), n, slip_prob / 2)
    # Agents slip independently of each other: both slip with frequency p^2.
    assert within((slipped[:, 0] & slipped[:, 1]).sum(), N_SLIP, slip_prob**2)
    assert not slipped[:, 2:].any()


GYM_MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]
N_GYM = 4000


def test_one_agent_with_slip_two_thirds_matches_gymnasium_frozenlake():
    gym = pytest.importorskip("gymnasium")
    env = gym.make("FrozenLake-v1", is_slippery=True, desc=GYM_MAP)
    P = env.unwrapped.P
    rows = [" ".join({"S": "A", "F": ".", "H": "~", "G": "a"}[ch] for ch in row) for row in GYM_MAP]
    lake = lake_from_rows(rows, slip_prob=2 / 3, max_steps=100)  # 4x4 region in a 5x5 canvas
    gym_to_ours = {0: LEFT, 1: DOWN, 2: RIGHT, 3: UP}
    states = [s for s in range(16) if GYM_MAP[s // 4][s % 4] in "SF"]
    cases = [(s, a) for s in states for a in range(4)]
    n_cases = len(cases)

    # One batch: every (state, action) pair N_GYM times.
    pos0 = np.zeros((n_cases, A, 2), np.int32)
    pos0[:, 0] = [divmod(s, 4) for s, _ in cases]
    status0 = np.full((n_cases, A), ABSENT, np.int32)
    status0[:, 0] = ACTIVE
    acts = np.zeros((n_cases, A), np.int32)
    acts[:, 0] = [gym_to_ours[a] for _, a in cases]
    rep = lambda x: jnp.asarray(np.repeat(x, N_GYM, axis=0))
    batch_state = State(pos=rep(pos0), status=rep(status0), t=jnp.zeros((n_cases * N_GYM,), jnp.int32))
    keys = jax.random.split(jax.random.key(2024), n_cases * N_GYM)
    step_states = jax.jit(jax.vmap(step, in_axes=(0, None, 0, 0)))
    nxt, info = step_states(keys, lake, batch_state, rep(acts))
    cell = np.asarray(nxt.pos[:, 0, 0] * 4 + nxt.pos[:, 0, 1]).reshape(n_cases, N_GYM)
    status = np.asarray(nxt.status[:, 0]).reshape(n_cases, N_GYM)
    reward = np.asarray(info.reward[:, 0]).reshape(n_cases, N_GYM)

    for c, (s, a) in enumerate(cases):
        expected = {}
        for prob, ns, r, terminated in P[s][a]:
            expected[ns] = expected.get(ns, 0.0) + prob
            hit = cell[c] == ns
            # Terminal in gymnasium <=> the agent left ACTIVE here (a hole or the goal).
            assert ((status[c][hit] != ACTIVE) == terminated).all(), (s, a, ns)
            assert ((reward[c][hit] == 1.0) == (r == 1.0)).all(), (s, a, ns)
        assert set(np.unique(cell[c])) <= set(expected), (s, a, np.unique(cell[c]), expected)
        for ns, prob in expected.items():
            assert within((cell[c] == ns).sum(), N_GYM, prob), (s, a, ns, (cell[c] == ns).mean(), prob)
