"""LakeConfig: validation messages, pytree behaviour, stacking, Hydra structured config."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from jaxlake.config import (
    DYNAMIC_FIELDS,
    FIELD_BOUNDS,
    ConfigError,
    LakeConfig,
    config_arrays,
    on_goal_code,
    repeat_config,
    stack_configs,
)
from jaxlake.types import ON_GOAL_STAY, ON_GOAL_VANISH


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(num_agents=30, max_agents=8), "num_agents=30 exceeds max_agents=8"),
        (dict(hole_density=1.2), "hole_density=1.2 not in [0.0, 0.9]"),
        (dict(height=2, width=2, num_agents=3), "2x2 region has only 4"),
        (dict(height=9), "height=9 exceeds max_height=8"),
        (dict(width=1), "width=1 not in [2, max_width=8]"),
        (dict(slip_prob=-0.1), "slip_prob=-0.1 not in [0.0, 1.0]"),
        (dict(conflict_density=1.5), "conflict_density=1.5 not in [0.0, 1.0]"),
        (dict(max_steps=0), "max_steps=0 not in [1, 1024]"),
        (dict(min_dist=0), "min_dist=0 not in [1, 24]"),
        (dict(min_dist=5, max_dist=3), "max_dist=3 not in [min_dist=5"),
        (dict(on_goal="sink"), "on_goal='sink' not in"),
        (dict(max_agents=27), "max_agents=27 not in [1, 26]"),
        (dict(height=3, width=3, num_agents=4, hole_density=0.5), "hole_density=0.5 leaves 5 frozen cells"),
        (dict(num_agents=2.5), "num_agents=2.5 must be an integer"),
        (dict(hole_density="lots"), "hole_density='lots' must be a number"),
    ],
)
def test_validation_names_field_and_range(changes, message):
    with pytest.raises(ConfigError) as err:
        LakeConfig(**changes)
    assert message in str(err.value)


def test_defaults_valid_and_integral_floats_accepted():
    cfg = LakeConfig(height=4.0, hole_density=0)
    assert cfg.height == 4 and isinstance(cfg.height, int)
    assert cfg.hole_density == 0.0 and isinstance(cfg.hole_density, float)
    assert cfg.effective_max_dist == 64


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="unknown LakeConfig field"):
        LakeConfig.from_dict({"height": 5, "heigth": 5})


def test_pytree_leaves_are_dynamic_fields_and_capacity_is_static():
    cfg = LakeConfig(on_goal="stay", max_dist=7)
    leaves, treedef = jax.tree_util.tree_flatten(cfg)
    assert len(leaves) == len(DYNAMIC_FIELDS)
    assert leaves[DYNAMIC_FIELDS.index("on_goal")] == ON_GOAL_STAY
    other = LakeConfig(max_height=9)
    assert jax.tree_util.tree_structure(other) != treedef

    traces = []

    @jax.jit
    def f(c):
        traces.append(1)
        return c.height * c.width + c.on_goal

    assert int(f(cfg)) == 26
    assert int(f(cfg.replace(height=3, on_goal="vanish"))) == 15
    assert len(traces) == 1, "changing dynamic fields must not recompile"


def test_stack_and_vmap_mixed_configs():
    a = LakeConfig()
    b = LakeConfig(height=8, width=6, num_agents=4, on_goal="stay", slip_prob=0.5)
    s = stack_configs([a, b, a])
    assert s.height.shape == (3,) and s.height.dtype == jnp.int32
    assert s.slip_prob.dtype == jnp.float32
    np.testing.assert_array_equal(s.on_goal, [ON_GOAL_VANISH, ON_GOAL_STAY, ON_GOAL_VANISH])
    cells = jax.vmap(lambda c: c.height * c.width)(s)
    np.testing.assert_array_equal(cells, [25, 48, 25])
    r = repeat_config(b, 5)
    np.testing.assert_array_equal(r.num_agents, [4] * 5)
    assert r.max_agents == 4


def test_stack_rejects_different_capacity():
    with pytest.raises(ConfigError, match="configs\\[1\\].max_height=9 differs"):
        stack_configs([LakeConfig(), LakeConfig(max_height=9)])


def test_hydra_structured_config_round_trip():
    node = OmegaConf.structured(LakeConfig)
    node.height = 6
    node.on_goal = "stay"
    cfg = LakeConfig.from_dict(OmegaConf.to_container(node))
    assert cfg == LakeConfig(height=6, on_goal="stay")
    with pytest.raises(Exception):
        node.height = "tall"  # type checked by OmegaConf


def test_on_goal_code():
    assert on_goal_code("vanish") == ON_GOAL_VANISH
    assert on_goal_code(1) == 1
    with pytest.raises(ConfigError):
        on_goal_code("gone")


@settings(max_examples=200, deadline=None)
@given(
    h=st.integers(1, 10),
    w=st.integers(1, 10),
    n=st.integers(0, 10),
    holes=st.floats(-0.5, 1.5, allow_nan=False),
    mh=st.integers(1, 10),
    ma=st.integers(0, 10),
)
def test_validation_is_total(h, w, n, holes, mh, ma):
    """Any combination either validates into a self-consistent config or raises ConfigError."""
    try:
        cfg = LakeConfig(height=h, width=w, num_agents=n, hole_density=holes, max_height=mh, max_width=10, max_agents=ma)
    except ConfigError as err:
        assert "=" in str(err)  # names a field and its value
        return
    assert 2 <= cfg.height <= cfg.max_height and 2 <= cfg.width <= cfg.max_width
    assert 1 <= cfg.num_agents <= cfg.max_agents
    assert FIELD_BOUNDS["hole_density"][0] <= cfg.hole_density <= FIELD_BOUNDS["hole_density"][1]
    assert 2 * cfg.num_agents <= cfg.height * cfg.width - round(cfg.hole_density * cfg.height * cfg.width)


def test_config_arrays_dtypes():
    arr = config_arrays(LakeConfig())
    for f in dataclasses.fields(LakeConfig):
        v = getattr(arr, f.name)
        if f.name in DYNAMIC_FIELDS:
            assert isinstance(v, jax.Array)
