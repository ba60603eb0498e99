"""Array observations (jaxlake/observations.py): every channel, scalar, crop, global state and
action mask against ``Lake`` and ``State``, under jit and vmap, and the masks against what
``jaxlake.env.step`` does.

* hypothesis: generated lakes on a 5x6 canvas with 3 agent slots (fixed shapes, so everything
  compiles once), random plans rolled out with ``env.rollout``; every state of the trajectory
  (and the reset) is observed and compared with a plain-Python reading of the module docstring;
  the crop with a slice of the zero-padded full grid; the masks with a step of every action.
* hand-drawn states: ARRIVED under ``stay`` / ``vanish``, FELL and ABSENT agents (TIMED_OUT ones, off
  the board like FELL ones, come up in the generated trajectories).
* the kinds (``global``, ``packed``, ``grids``, ``crop``) and the per-lake cache: on the same
  generated trajectories every kind carries the information of the observation this module
  built before the kinds existed (:func:`legacy_observe`, kept here as it was): the packed bits
  unpack to its grids, the shared map decodes to its global state and grids, the crop equals its
  crop, and every function gives the same with the cache as without.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxlake import observations as obs
from jaxlake.config import LakeConfig
from jaxlake.env import reset, rollout, step_from_uniforms
from jaxlake.generator import generate
from jaxlake.types import (
    ABSENT,
    ACTION_DELTAS,
    ACTIVE,
    ARRIVED,
    FELL,
    NUM_ACTIONS,
    ON_GOAL_STAY,
    STAY,
    State,
)
from tests.jaxlake.support import lake_configs
from tests.jaxlake.test_step_rules import lake_from_rows

H, W, A = 5, 6, 3
T = 6
RADIUS = 2
CANVAS = dict(max_height=H, max_width=W, max_agents=A)
PROPERTY = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])

GENERATE = jax.jit(generate)


@jax.jit
def _trajectory_states(key, lake, plan):
    """The reset and the ``T`` states after each step, stacked ``[T + 1, ...]``."""
    out = rollout(key, lake, plan)
    s0 = reset(lake)
    traj = out.trajectory
    return State(pos=jnp.concatenate([s0.pos[None], traj.pos]),
                 status=jnp.concatenate([s0.status[None], traj.status]),
                 t=jnp.concatenate([s0.t[None], traj.t]))


def _all_views(lake, state):
    return (obs.agent_grids(lake, state), obs.agent_scalars(lake, state), obs.avail_actions(lake, state),
            obs.global_state(lake, state), obs.global_scalars(lake, state),
            obs.observe(lake, state, radius=RADIUS))


# ------------------------------------------------------------ the observation before the kinds
def _legacy_id_maps(lake, state):
    H_, W_ = lake.canvas_shape
    ids = jnp.arange(lake.max_agents, dtype=jnp.int32)[:, None, None]

    def id_map(cells, on):
        rows = jnp.arange(H_)[None, :, None] == cells[:, 0, None, None]
        cols = jnp.arange(W_)[None, None, :] == cells[:, 1, None, None]
        return jnp.max(jnp.where(rows & cols & on[:, None, None], ids, -1), axis=0)

    return id_map(state.pos, obs.present_mask(lake, state)), id_map(lake.goals, state.status == ACTIVE)


def legacy_observe(lake, state, radius=None):
    """``observe`` as this module wrote it before the kinds and the cache (float32 grids, six
    planes an agent from two id maps, the mask by 20 lookups, the crop padding the grids)."""
    agent_at, goal_at = _legacy_id_maps(lake, state)
    me = jnp.arange(lake.max_agents, dtype=jnp.int32)[:, None, None, None]
    ch = jnp.arange(obs.NUM_CHANNELS)
    agent, goal = agent_at[None, :, :, None], goal_at[None, :, :, None]
    grids = jnp.where(ch == obs.REGION, lake.region[None, :, :, None],
            jnp.where(ch == obs.HOLES, (lake.holes & lake.region)[None, :, :, None],
            jnp.where(ch == obs.SELF, agent == me,
            jnp.where(ch == obs.GOAL, goal == me,
            jnp.where(ch == obs.OTHERS, (agent >= 0) & (agent != me), (goal >= 0) & (goal != me)))))).astype(jnp.float32)
    if radius is not None:
        size = 2 * radius + 1
        padded = jnp.pad(grids, ((0, 0), (radius, radius), (radius, radius), (0, 0)))
        grids = jax.vmap(lambda g, p: jax.lax.dynamic_slice(g, (p[0], p[1], 0), (size, size, obs.NUM_CHANNELS)))(
            padded, state.pos)
    H_, W_ = lake.canvas_shape
    target = state.pos[:, None, :] + jnp.asarray(ACTION_DELTAS, jnp.int32)[None]
    row, col = target[..., 0], target[..., 1]
    inside = (row >= 0) & (row < H_) & (col >= 0) & (col < W_)
    region = inside & lake.region[jnp.clip(row, 0, H_ - 1), jnp.clip(col, 0, W_ - 1)]
    mask = (jnp.arange(NUM_ACTIONS) == 0)[None] | ((state.status == ACTIVE)[:, None] & region)
    return obs.Observation(grid=grids, scalars=obs.agent_scalars(lake, state), avail_actions=mask)


def _kinds(lake, state):
    """Today's observation, every kind with and without the cache, and the legacy one."""
    cache = obs.make_cache(lake)
    kinds = {kind: obs.observe(lake, state, kind=kind, radius=RADIUS if kind == "crop" else None, cache=c)
             for kind in obs.KINDS for c in (cache,)}
    uncached = {kind: obs.observe(lake, state, kind=kind, radius=RADIUS if kind == "crop" else None)
                for kind in obs.KINDS}
    bools = obs.observe(lake, state, dtype=jnp.bool_, cache=cache)
    return (kinds, uncached, bools, legacy_observe(lake, state), legacy_observe(lake, state, RADIUS),
            obs.global_state(lake, state))


KINDS_OF_STATES = jax.jit(jax.vmap(_kinds, in_axes=(None, 0)))


def decode_global(grid):
    """``[H, W]`` shared map -> ``([A, H, W, C]`` grids, ``[H, W, 2 + 2A]`` global state) in numpy."""
    region, holes, agent, goal = (np.asarray(x) for x in obs.decode_shared_map(jnp.asarray(grid)))
    grids = np.zeros((A, H, W, obs.NUM_CHANNELS), np.float32)
    glob = np.zeros((H, W, 2 + 2 * A), np.float32)
    glob[..., 0], glob[..., 1] = region, holes
    for i in range(A):
        grids[i, ..., obs.REGION], grids[i, ..., obs.HOLES] = region, holes
        grids[i, ..., obs.SELF] = agent == i
        grids[i, ..., obs.GOAL] = goal == i
        grids[i, ..., obs.OTHERS] = (agent >= 0) & (agent != i)
        grids[i, ..., obs.OTHER_GOALS] = (goal >= 0) & (goal != i)
        glob[..., 2 + i] = agent == i
        glob[..., 2 + A + i] = goal == i
    return grids, glob


def decode_packed(packed):
    """``[A, H, W]`` packed bits -> ``[A, H, W, C]`` float32 grids, bit by bit in numpy."""
    packed = np.asarray(packed)
    return np.stack([(packed >> c) & 1 for c in range(obs.NUM_CHANNELS)], axis=-1).astype(np.float32)


#: every view of every state of a trajectory: vmap over the states of one lake, jitted
VIEWS = jax.jit(jax.vmap(_all_views, in_axes=(None, 0)))


@jax.jit
def _every_action(lake, state):
    """Step ``state`` once per action code, every agent taking it, without slips."""
    u = jnp.ones((A,), jnp.float32)  # u < slip_prob never holds: no slip

    def one(a):
        return step_from_uniforms(lake, state, jnp.full((A,), a, jnp.int32), u)

    return jax.vmap(one)(jnp.arange(NUM_ACTIONS))


# ------------------------------------------------------------------ plain-Python reference
def reference(lake, state):
    """The module docstring's channels, scalars, global state and masks, with loops."""
    region, holes = np.asarray(lake.region), np.asarray(lake.holes)
    goals, pos, status = np.asarray(lake.goals), np.asarray(state.pos), np.asarray(state.status)
    stay = int(lake.on_goal) == ON_GOAL_STAY
    present = [s == ACTIVE or (s == ARRIVED and stay) for s in status]
    active = [s == ACTIVE for s in status]
    grid = np.zeros((A, H, W, obs.NUM_CHANNELS), np.float32)
    glob = np.zeros((H, W, 2 + 2 * A), np.float32)
    avail = np.zeros((A, NUM_ACTIONS), bool)
    for r in range(H):
        for c in range(W):
            glob[r, c, 0] = region[r, c]
            glob[r, c, 1] = holes[r, c]
            for j in range(A):
                glob[r, c, 2 + j] = present[j] and tuple(pos[j]) == (r, c)
                glob[r, c, 2 + A + j] = active[j] and tuple(goals[j]) == (r, c)
            for i in range(A):
                grid[i, r, c, obs.REGION] = region[r, c]
                grid[i, r, c, obs.HOLES] = holes[r, c]
                grid[i, r, c, obs.SELF] = present[i] and tuple(pos[i]) == (r, c)
                grid[i, r, c, obs.GOAL] = active[i] and tuple(goals[i]) == (r, c)
                grid[i, r, c, obs.OTHERS] = any(present[j] and tuple(pos[j]) == (r, c) for j in range(A) if j != i)
                grid[i, r, c, obs.OTHER_GOALS] = any(active[j] and tuple(goals[j]) == (r, c)
                                                     for j in range(A) if j != i)
    for i in range(A):
        avail[i, STAY] = True
        for a in range(1, NUM_ACTIONS):
            r, c = pos[i][0] + ACTION_DELTAS[a][0], pos[i][1] + ACTION_DELTAS[a][1]
            avail[i, a] = active[i] and 0 <= r < H and 0 <= c < W and bool(region[r, c])
    horizon = int(lake.max_steps)
    scalars = np.array([min(max((horizon - int(state.t)) / horizon, 0.0), 1.0), float(lake.slip_prob)], np.float32)
    return grid, scalars, glob, avail


def crop_reference(grid, pos, radius):
    """Window of every agent, read cell by cell (0 off the canvas)."""
    size = 2 * radius + 1
    out = np.zeros((A, size, size, grid.shape[-1]), grid.dtype)
    for i in range(A):
        for dr in range(-radius, radius + 1):
            for dc in range(-radius, radius + 1):
                r, c = pos[i][0] + dr, pos[i][1] + dc
                if 0 <= r < H and 0 <= c < W:
                    out[i, dr + radius, dc + radius] = grid[i, r, c]
    return out


def at(tree, k):
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[k], tree)


# ------------------------------------------------------------------------------ strategies
def configs():
    return lake_configs(CANVAS, holes=[0.0, 0.1, 0.25, 0.4], conflicts=[0.0, 1.0],
                        slip_prob=st.sampled_from([0.0, 0.3]), max_steps=st.integers(1, T + 1))


def check_views(lake, states, views):
    grids, scalars, avail, glob, gscalars, bundle = views
    for k in range(states.t.shape[0]):
        state = at(states, k)
        ref_grid, ref_scalars, ref_glob, ref_avail = reference(lake, state)
        np.testing.assert_array_equal(grids[k], ref_grid, err_msg=f"grid, state {k}")
        assert grids[k].dtype == np.float32 and grids[k].shape == (A, H, W, obs.NUM_CHANNELS)
        np.testing.assert_allclose(scalars[k], np.broadcast_to(ref_scalars, (A, 2)), rtol=1e-6)
        np.testing.assert_allclose(gscalars[k], ref_scalars, rtol=1e-6)
        np.testing.assert_array_equal(glob[k], ref_glob, err_msg=f"global state, state {k}")
        np.testing.assert_array_equal(avail[k], ref_avail, err_msg=f"avail_actions, state {k}")
        assert avail[k].dtype == bool
        # the crop is a slice of the zero-padded full grid, and the cell-by-cell reading
        pos = np.asarray(state.pos)
        padded = np.pad(ref_grid, ((0, 0), (RADIUS, RADIUS), (RADIUS, RADIUS), (0, 0)))
        size = 2 * RADIUS + 1
        sliced = np.stack([padded[i, pos[i][0]:pos[i][0] + size, pos[i][1]:pos[i][1] + size] for i in range(A)])
        np.testing.assert_array_equal(bundle.grid[k], sliced, err_msg=f"crop, state {k}")
        np.testing.assert_array_equal(bundle.grid[k], crop_reference(ref_grid, pos, RADIUS))
        np.testing.assert_array_equal(bundle.scalars[k], scalars[k])
        np.testing.assert_array_equal(bundle.avail_actions[k], avail[k])
        # the agent is at the centre of its own window while present
        present = ref_grid[:, :, :, obs.SELF].reshape(A, -1).any(-1)
        np.testing.assert_array_equal(bundle.grid[k][:, RADIUS, RADIUS, obs.SELF], present.astype(np.float32))


def check_masks_against_step(lake, state):
    """``avail_actions`` says exactly which intended moves ``env.step`` does not void as walls."""
    avail = np.asarray(obs.avail_actions(lake, state))
    nxt, info = jax.tree_util.tree_map(np.asarray, _every_action(lake, state))
    status, pos = np.asarray(state.status), np.asarray(state.pos)
    for a in range(1, NUM_ACTIONS):
        for i in range(A):
            if status[i] == ACTIVE:
                # a move is available iff the step does not treat it as a wall bump; an
                # available move either happens or is cancelled by a conflict rule
                assert avail[i, a] == (not info.wall[a, i]), (i, a)
                if avail[i, a]:
                    assert info.moved[a, i] or info.vertex_conflict[a, i] or info.swap_conflict[a, i] \
                        or info.blocked[a, i], (i, a)
            else:
                # agents that are not ACTIVE may only STAY: whatever they choose, nothing happens
                assert not avail[i, a]
                assert nxt.status[a, i] == status[i] and tuple(nxt.pos[a, i]) == tuple(pos[i])
                assert not (info.moved[a, i] or info.wall[a, i] or info.fell[a, i] or info.arrived[a, i])
    assert avail[:, STAY].all()


# ----------------------------------------------------------------------------------- tests
@PROPERTY
@given(config=configs(), seed=st.integers(0, 2**31 - 1))
def test_every_channel_on_generated_lakes_and_trajectories(config, seed):
    k_lake, k_plan, k_roll = jax.random.split(jax.random.key(seed), 3)
    lake = GENERATE(k_lake, config)
    plan = jax.random.randint(k_plan, (A, T), 0, NUM_ACTIONS, dtype=jnp.int32)
    states = _trajectory_states(k_roll, lake, plan)
    views = jax.tree_util.tree_map(np.asarray, VIEWS(lake, states))
    lake_np = jax.tree_util.tree_map(np.asarray, lake)
    check_views(lake_np, states, views)
    for k in range(T + 1):
        check_masks_against_step(lake, at(states, k))


@PROPERTY
@given(config=configs(), seed=st.integers(0, 2**31 - 1))
def test_every_kind_carries_the_legacy_observation(config, seed):
    """Every kind, with the cache or without, against the observation built before the kinds."""
    k_lake, k_plan, k_roll = jax.random.split(jax.random.key(seed), 3)
    lake = GENERATE(k_lake, config)
    plan = jax.random.randint(k_plan, (A, T), 0, NUM_ACTIONS, dtype=jnp.int32)
    states = _trajectory_states(k_roll, lake, plan)
    kinds, uncached, bools, legacy, legacy_crop, glob = jax.tree_util.tree_map(np.asarray, KINDS_OF_STATES(lake, states))
    for kind in obs.KINDS:  # the cache changes nothing
        for x, y in zip(jax.tree_util.tree_leaves(kinds[kind]), jax.tree_util.tree_leaves(uncached[kind])):
            np.testing.assert_array_equal(x, y, err_msg=kind)
    assert kinds["global"].grid.dtype == np.uint16 and kinds["global"].grid.shape == (T + 1, H, W)
    assert kinds["packed"].grid.dtype == np.uint8 and kinds["packed"].grid.shape == (T + 1, A, H, W)
    assert bools.grid.dtype == bool
    for k in range(T + 1):
        want = legacy.grid[k]
        np.testing.assert_array_equal(kinds["grids"].grid[k], want, err_msg=f"grids, state {k}")
        np.testing.assert_array_equal(bools.grid[k], want.astype(bool))
        np.testing.assert_array_equal(decode_packed(kinds["packed"].grid[k]), want, err_msg=f"packed, state {k}")
        grids, glob_decoded = decode_global(kinds["global"].grid[k])
        np.testing.assert_array_equal(grids, want, err_msg=f"global map, state {k}")
        np.testing.assert_array_equal(glob_decoded, glob[k], err_msg=f"global map vs global_state, state {k}")
        np.testing.assert_array_equal(kinds["crop"].grid[k], legacy_crop.grid[k], err_msg=f"crop, state {k}")
        for kind in obs.KINDS:
            np.testing.assert_array_equal(kinds[kind].avail_actions[k], legacy.avail_actions[k], err_msg=kind)
        np.testing.assert_array_equal(kinds["global"].scalars[k], legacy.scalars[k][0])
        np.testing.assert_array_equal(kinds["packed"].scalars[k], legacy.scalars[k])


def test_cache_bits_and_kind_errors():
    lake = lake_from_rows(["A . a", ". ~ ."], canvas=(3, 4))
    cache = obs.make_cache(lake)
    cells = np.asarray(cache.cells)
    assert cells.dtype == np.uint8 and cells[:2, :3].tolist() == [[1, 1, 1], [1, 3, 1]] and cells[2].sum() == 0
    moves = np.asarray(cache.moves)  # bit a - 1: UP DOWN LEFT RIGHT stays on the region
    assert moves[0, 0] == 0b1010 and moves[1, 1] == 0b1101 and moves[1, 2] == 0b0101
    assert moves[2, 0] == 0b0001  # a wall cell: only UP names a region cell
    with pytest.raises(ValueError, match="kind='local' not in"):
        obs.observe(lake, reset(lake), kind="local")
    with pytest.raises(ValueError, match="radius"):
        obs.observe(lake, reset(lake), kind="crop")
    with pytest.raises(ValueError, match="radius"):
        obs.observe(lake, reset(lake), kind="packed", radius=1)


def test_vmap_over_lakes_equals_one_lake_at_a_time():
    config = LakeConfig(height=4, width=5, num_agents=3, hole_density=0.25, max_steps=5, **CANVAS)
    keys = jax.random.split(jax.random.key(7), 4)
    lakes = jax.vmap(lambda k: generate(k, config))(keys)
    plans = jax.random.randint(jax.random.key(8), (4, A, T), 0, NUM_ACTIONS, dtype=jnp.int32)
    finals = jax.vmap(lambda k, lk, p: rollout(k, lk, p).final_state)(keys, lakes, plans)
    batched = jax.jit(jax.vmap(_all_views))(lakes, finals)
    for b in range(4):
        alone = _all_views(at(lakes, b), at(finals, b))  # eager, no jit
        for x, y in zip(jax.tree_util.tree_leaves(at(batched, b)), jax.tree_util.tree_leaves(alone)):
            np.testing.assert_array_equal(x, np.asarray(y))


def _state(pos, status, t=0):
    return State(pos=jnp.asarray(pos, jnp.int32), status=jnp.asarray(status, jnp.int32), t=jnp.int32(t))


@pytest.mark.parametrize("on_goal", ["stay", "vanish"])
def test_hand_drawn_statuses(on_goal):
    # A arrived on its goal (0, 2); B fell into the hole (1, 1); C is ACTIVE; slot 3 is absent
    lake = lake_from_rows(["A . a .", "B ~ . C", "b . c ."], on_goal=on_goal, max_steps=8,
                          max_agents=4, canvas=(H, W))
    state = _state([[0, 2], [1, 1], [1, 3], [0, 0]], [ARRIVED, FELL, ACTIVE, ABSENT], t=2)
    grid = np.asarray(obs.agent_grids(lake, state))
    stay = on_goal == "stay"
    assert grid[0, 0, 2, obs.SELF] == stay and grid[0, ..., obs.SELF].sum() == stay
    assert grid[0, ..., obs.GOAL].sum() == 0  # an arrived agent's goal is no longer shown
    assert grid[1, ..., obs.SELF].sum() == 0 and grid[1, ..., obs.GOAL].sum() == 0  # fell
    assert grid[2, 1, 3, obs.SELF] == 1 and grid[2, 2, 2, obs.GOAL] == 1
    # C sees A as an obstacle only under "stay"; nobody sees B, and C's goal is the only other goal
    assert grid[2, 0, 2, obs.OTHERS] == stay and grid[2, ..., obs.OTHERS].sum() == stay
    for i in (0, 1, 3):
        assert grid[i, ..., obs.OTHER_GOALS].sum() == 1 and grid[i, 2, 2, obs.OTHER_GOALS] == 1
        assert grid[i, 1, 3, obs.OTHERS] == 1
    assert grid[3, ..., obs.SELF].sum() == 0 and grid[3, ..., obs.GOAL].sum() == 0  # absent
    assert grid[..., obs.REGION].sum() == 4 * 12 and grid[0, 1, 1, obs.HOLES] == 1
    avail = np.asarray(obs.avail_actions(lake, state))
    # C at (1, 3): UP (0, 3) and DOWN (2, 3) are in the region, LEFT (1, 2) too, RIGHT is a wall
    np.testing.assert_array_equal(avail[2], [True, True, True, True, False])
    np.testing.assert_array_equal(avail[[0, 1, 3]], np.tile([True, False, False, False, False], (3, 1)))
    np.testing.assert_allclose(np.asarray(obs.agent_scalars(lake, state))[:, 0], 6 / 8)
    glob = np.asarray(obs.global_state(lake, state))
    assert glob.shape == (H, W, 2 + 8)
    assert glob[0, 2, 2 + 0] == stay and glob[1, 3, 2 + 2] == 1 and glob[2, 2, 2 + 4 + 2] == 1
    assert glob[..., 2 + 1].sum() == 0 and glob[..., 2 + 4 + 0].sum() == 0


def test_crop_reads_outside_the_canvas_as_walls():
    lake = lake_from_rows(["A a", ". ."], max_agents=1, canvas=(2, 2))
    o = obs.observe(lake, reset(lake), radius=2)
    assert o.grid.shape == (1, 5, 5, obs.NUM_CHANNELS)
    window = np.asarray(o.grid[0])
    np.testing.assert_array_equal(window[2:4, 2:4, obs.REGION], 1)  # the 2x2 region, A at the centre
    assert window[..., obs.REGION].sum() == 4 and window[2, 2, obs.SELF] == 1 and window[2, 3, obs.GOAL] == 1
    assert window.sum() == 4 + 2  # everything else, beyond the canvas, is 0 in every channel
    with pytest.raises(ValueError, match="radius"):
        obs.egocentric(o.grid, reset(lake).pos, -1)


def test_time_left_and_dtypes():
    lake = lake_from_rows(["A a"], max_steps=4, slip_prob=0.25)
    for t, left in ((0, 1.0), (1, 0.75), (4, 0.0)):
        s = reset(lake).replace(t=jnp.int32(t))
        np.testing.assert_allclose(np.asarray(obs.global_scalars(lake, s)), [left, 0.25])
    assert obs.agent_grids(lake, reset(lake), dtype=jnp.int8).dtype == jnp.int8
    assert obs.global_state(lake, reset(lake), dtype=bool).dtype == bool
    with pytest.raises(AssertionError):  # chex: a batched lake needs vmap
        obs.agent_grids(jax.tree_util.tree_map(lambda x: x[None], lake), reset(lake))
