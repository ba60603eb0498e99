"""The one mixture type (jaxlake.mixture): validation, normalisation, equality, serialisation,
and the consumers that share its validator (generator, trainer's lake sampling, engineers)."""

import copy
import pickle

import jax
import numpy as np
import pytest

from jaxlake.config import ConfigError, LakeConfig
from jaxlake.generator import generate_mixture, mixture_counts
from jaxlake.mixture import (
    Mixture,
    MixtureError,
    check_weights,
    load_mixture,
    mixture_from_node,
    mixture_to_obj,
    mixture_to_yaml,
    same_mixture,
)

A = LakeConfig(height=4, width=4, num_agents=1, hole_density=0.0, max_height=4, max_width=4, max_agents=2)
B = A.replace(num_agents=2, max_steps=24)


def test_built_valid_normalised_and_equal_to_its_pairs():
    m = Mixture([(3, A), (0, B), (1, B)])
    assert m == [(0.75, A), (0.25, B)] and m.weights == (0.75, 0.25) and m.configs == (A, B)
    assert m.main == A and m.horizon == 24 and isinstance(m, tuple)
    assert Mixture.of(A) == [(1.0, A)] and Mixture.of(m) is m
    assert pickle.loads(pickle.dumps(m)) == m and copy.deepcopy(m) == m
    assert m + [(1.0, A)] == [(0.375, A), (0.125, B), (0.5, A)]  # concatenation re-normalises
    assert same_mixture(m, [(0.75 + 1e-12, A), (0.25, B)]) and not same_mixture(m, [(0.5, A), (0.5, B)])


@pytest.mark.parametrize("items, message", [
    ([], "mixture is empty"),
    ([(-1, A)], "mixture[0].weight=-1.0 not in [0, inf)"),
    ([(1, A), (float("nan"), B)], "mixture[1].weight=nan not in [0, inf)"),
    ([(0, A)], "weights sum to 0"),
    ([(True, A)], "mixture[0].weight=True must be a number"),
    ([(1, {"height": 4})], "mixture[0].config must be a LakeConfig, got dict"),
    ([A], "mixture[0] must be a (weight, LakeConfig) pair"),
])
def test_errors_name_the_component(items, message):
    with pytest.raises(MixtureError) as err:
        Mixture(items)
    assert message in str(err.value) and isinstance(err.value, ConfigError)


def test_the_generator_shares_the_validator():
    with pytest.raises(MixtureError, match=r"mixture\[1\].weight=-2.0 not in \[0, inf\)"):
        mixture_counts([1, -2], 4)
    with pytest.raises(MixtureError, match=r"mixture\[0\].config must be a LakeConfig"):
        generate_mixture(jax.random.key(0), [(1.0, "not a config")], 4)
    assert check_weights([2, 0]) == [2.0, 0.0] and mixture_counts([2, 0], 5) == [5, 0]


def test_yaml_obj_and_node_roundtrip(tmp_path):
    m = Mixture([(1, A), (3, B)])
    path = tmp_path / "env.yaml"
    path.write_text(mixture_to_yaml(m))
    assert load_mixture(path) == m
    assert mixture_from_node({"mixture": mixture_to_obj(m)}) == m
    assert mixture_from_node(A.to_dict()) == [(1.0, A)]
    with pytest.raises(MixtureError, match=r"mixture\[0\].config: height=9 exceeds max_height=4"):
        mixture_from_node({"mixture": [{"weight": 1, "config": {**A.to_dict(), "height": 9}}]})


def test_a_bad_env_file_is_named(tmp_path):
    """A hand-edited env.yaml / next_env.yaml with a bad value, or one that is not YAML."""
    path = tmp_path / "next_env.yaml"
    path.write_text(mixture_to_yaml(Mixture([(1, A)])).replace("hole_density: 0.0", "hole_density: 1.5"))
    with pytest.raises(MixtureError, match=rf"^{path}: mixture\[0\].config: hole_density=1.5 not in \[0.0, 0.9\]$"):
        load_mixture(path)
    path.write_text("mixture: [\n")
    with pytest.raises(MixtureError, match=rf"^{path}: not a valid env YAML file"):
        load_mixture(path)


def test_trainer_lakes_come_from_the_mixture():
    from llm.game.lakes import env_description, env_horizon, sample_lakes
    from jaxlake.generator import generate_batch

    key = jax.random.PRNGKey(3)
    one = sample_lakes(key, Mixture.of(A), 4)  # a one-component mixture draws as its config does
    alone = generate_batch(key, A, 4)
    jax.tree_util.tree_map(np.testing.assert_array_equal, one, alone)
    jax.tree_util.tree_map(np.testing.assert_array_equal, sample_lakes(key, A, 4), alone)
    assert env_horizon([(1, A), (1, B)]) == 24 and env_description(A) == A.to_dict()
    assert env_description(Mixture([(1, A), (3, B)]))[1] == {"weight": 0.75, **B.to_dict()}
