"""GRPO loss math against hand-computed small examples (llm/rl/grpo.py)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.rl import grpo
from llm.rl.grpo import GRPOLossConfig

# ----------------------------------------------------------------------------- advantages


def test_advantages_hand_computed_each_mode():
    rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    # group 0: mean 0.5, std 0.5; group 1: mean 2, std sqrt(0.5)
    z = grpo.group_advantages(rewards, "grpo", std_eps=1e-6, std="population")
    np.testing.assert_allclose(z[0], [1, -1, -1, 1], atol=1e-5)
    s = math.sqrt(0.5)
    np.testing.assert_allclose(z[1], [1 / s, -1 / s, 0, 0], atol=1e-5)
    # the default: the sample std (ddof 1) + 1e-4, sqrt(G / (G - 1)) = sqrt(4 / 3) times the population std
    zs = grpo.group_advantages(rewards, "grpo")
    np.testing.assert_allclose(zs[0], np.array([1, -1, -1, 1]) * 0.5 / (0.5 * math.sqrt(4 / 3) + 1e-4), rtol=1e-5)
    dr = grpo.group_advantages(rewards, "dr_grpo")
    np.testing.assert_allclose(dr, [[0.5, -0.5, -0.5, 0.5], [1, -1, 0, 0]], atol=1e-6)
    rloo = grpo.group_advantages(rewards, "rloo")
    # r_i - mean of the other three
    np.testing.assert_allclose(rloo[0], [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3], atol=1e-6)
    np.testing.assert_allclose(rloo[1], [3 - 5 / 3, 1 - 7 / 3, 2 - 2, 2 - 2], atol=1e-6)


def test_advantages_zero_for_constant_group_and_errors():
    rewards = jnp.array([[0.7, 0.7, 0.7]])
    for mode in grpo.ADVANTAGE_MODES:
        np.testing.assert_allclose(grpo.group_advantages(rewards, mode), 0.0, atol=1e-6)
    with pytest.raises(ValueError, match="advantage mode"):
        grpo.group_advantages(rewards, "ppo")
    with pytest.raises(ValueError, match="G=1"):
        grpo.group_advantages(jnp.ones((3, 1)), "grpo")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.floats(-2, 2), min_size=4, max_size=4), min_size=1, max_size=5),
       st.sampled_from(grpo.ADVANTAGE_MODES), st.floats(0, 1))
def test_negative_weight_scales_only_the_negative_advantages(rewards, mode, w):
    rewards = jnp.asarray(rewards, jnp.float32)
    full = np.asarray(grpo.group_advantages(rewards, mode))
    got = np.asarray(grpo.group_advantages(rewards, mode, negative_weight=w))
    np.testing.assert_allclose(got, np.where(full < 0, w * full, full), rtol=1e-6, atol=1e-7)
    # 0: the better-than-mean completions only; the group [1, 0, 0, 1] trains its two successes
    pos = np.asarray(grpo.group_advantages(jnp.asarray([[1.0, 0.0, 0.0, 1.0]]), mode, negative_weight=0.0))
    assert (pos[0, [0, 3]] > 0).all() and (pos[0, [1, 2]] == 0).all()


def _trl_advantages(rewards: np.ndarray) -> np.ndarray:
    """TRL GRPOTrainer's group z-score, re-derived: (r - group mean) / (group sample std + 1e-4)."""
    r = np.asarray(rewards, np.float64)
    mean = r.mean(axis=1, keepdims=True)
    std = np.sqrt(((r - mean) ** 2).sum(axis=1, keepdims=True) / (r.shape[1] - 1))
    return (r - mean) / (std + 1e-4)


def test_advantage_std_matches_trl_and_keeps_near_ties_small():
    near_tie = np.array([[0.0, 0.0, 0.0, 1e-5]])
    got = np.asarray(grpo.group_advantages(jnp.asarray(near_tie)))
    np.testing.assert_allclose(got, _trl_advantages(near_tie), rtol=1e-3, atol=1e-6)
    assert 0.06 < got[0, 3] < 0.08  # TRL's +-0.07
    # the population std + 1e-6 turns a rounding-level difference into a whole unit of advantage
    pop = np.asarray(grpo.group_advantages(jnp.asarray(near_tie), std_eps=1e-6, std="population"))
    assert 1.3 < pop[0, 3] < 1.5
    wide = np.random.RandomState(0).randn(5, 8) * [[0.01], [0.1], [1.0], [3.0], [10.0]]
    np.testing.assert_allclose(grpo.group_advantages(jnp.asarray(wide, jnp.float32)), _trl_advantages(wide),
                               rtol=1e-4, atol=1e-5)
    # G = 2: the sample std is sqrt(2) x the population std
    np.testing.assert_allclose(grpo.group_advantages(jnp.array([[0.0, 1.0]])), [[-0.5 / (0.5**0.5 + 1e-4),
                                                                                  0.5 / (0.5**0.5 + 1e-4)]], rtol=1e-5)
    with pytest.raises(ValueError, match="std='median'"):
        GRPOLossConfig(std="median")
    with pytest.raises(ValueError, match="advantage std"):
        grpo.group_advantages(jnp.asarray(near_tie), std="ddof2")


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=8, max_size=8))
def test_rloo_equals_leave_one_out_definition(values):
    rewards = jnp.asarray(values, jnp.float32).reshape(2, 4)
    got = grpo.group_advantages(rewards, "rloo")
    r = np.asarray(rewards, np.float64)
    want = np.stack([[r[n, i] - np.delete(r[n], i).mean() for i in range(4)] for n in range(2)])
    np.testing.assert_allclose(got, want, atol=1e-4)
    # all modes centre each group
    for mode in grpo.ADVANTAGE_MODES:
        np.testing.assert_allclose(grpo.group_advantages(rewards, mode).sum(axis=1), 0.0, atol=1e-3)


# ----------------------------------------------------------------------------- masks


def test_sequence_mask_dynamic_sampling_and_overlong():
    rewards = jnp.array([[1.0, 1.0], [0.0, 1.0], [0.5, 0.5]])
    truncated = jnp.array([False, False, True, False, False, True])
    none = grpo.sequence_mask(rewards, truncated, drop_tied=False, overlong_mask=False)
    np.testing.assert_array_equal(none, [1, 1, 1, 1, 1, 1])
    dyn = grpo.sequence_mask(rewards, truncated, drop_tied=True, overlong_mask=False)
    np.testing.assert_array_equal(dyn, [0, 0, 1, 1, 0, 0])
    over = grpo.sequence_mask(rewards, truncated, drop_tied=False, overlong_mask=True)
    np.testing.assert_array_equal(over, [1, 1, 0, 1, 1, 0])
    both = grpo.sequence_mask(rewards, truncated, drop_tied=True, overlong_mask=True)
    np.testing.assert_array_equal(both, [0, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(grpo.zero_variance_groups(rewards), [True, False, True])


MASK = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0]], jnp.float32)


def test_token_weights_each_mode():
    keep = jnp.ones(2)
    np.testing.assert_allclose(grpo.token_weights(MASK, keep, "token_mean"), MASK / 4)
    np.testing.assert_allclose(
        grpo.token_weights(MASK, keep, "seq_mean_token_mean"),
        [[1 / 6, 1 / 6, 1 / 6, 0], [1 / 2, 0, 0, 0]],
        atol=1e-7,
    )
    np.testing.assert_allclose(grpo.token_weights(MASK, keep, "constant"), MASK / 8)
    np.testing.assert_allclose(grpo.token_weights(MASK, keep, "constant", max_len=10), MASK / 20)
    # a dropped sequence takes no weight and does not count in the denominators
    drop = jnp.array([1.0, 0.0])
    np.testing.assert_allclose(grpo.token_weights(MASK, drop, "token_mean")[0], [1 / 3, 1 / 3, 1 / 3, 0])
    np.testing.assert_allclose(grpo.token_weights(MASK, drop, "seq_mean_token_mean")[0], [1 / 3, 1 / 3, 1 / 3, 0])
    # Dr. GRPO's constant is B * max_len whatever is dropped (2 sequences x 4 tokens)
    np.testing.assert_allclose(grpo.token_weights(MASK, drop, "constant")[0], [1 / 8, 1 / 8, 1 / 8, 0])
    np.testing.assert_allclose(grpo.token_weights(MASK, drop, "constant", max_len=10)[0], [1 / 20, 1 / 20, 1 / 20, 0])
    # nothing kept: zero weights, no NaN
    for mode in grpo.AGGREGATION_MODES:
        w = grpo.token_weights(MASK, jnp.zeros(2), mode)
        assert np.all(np.asarray(w) == 0)


# ----------------------------------------------------------------------------- objective

# Row 0 has advantage +1 and ratios 1.5 (clipped high), 0.9, 1.0; row 1 has advantage -1 and
# ratio 0.5 (clipped low).
LOGP_OLD = jnp.zeros((2, 4), jnp.float32) - 1.0
LOGP = LOGP_OLD + jnp.log(jnp.array([[1.5, 0.9, 1.0, 7.0], [0.5, 3.0, 3.0, 3.0]]))
ADV = jnp.array([1.0, -1.0])
# per-token losses: row 0: -1.28, -0.9, -1.0 ; row 1: max(0.5, 0.8) = 0.8
PER_TOKEN = np.array([[-1.28, -0.9, -1.0, 0.0], [0.8, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "aggregation, expected",
    [
        ("token_mean", (-1.28 - 0.9 - 1.0 + 0.8) / 4),
        ("seq_mean_token_mean", ((-1.28 - 0.9 - 1.0) / 3 + 0.8) / 2),
        ("constant", (-1.28 - 0.9 - 1.0 + 0.8) / (2 * 4)),
    ],
)
def test_loss_hand_computed_each_aggregation(aggregation, expected):
    cfg = GRPOLossConfig(aggregation=aggregation, eps_low=0.2, eps_high=0.28)
    w = grpo.token_weights(MASK, jnp.ones(2), aggregation)
    loss, m = grpo.grpo_loss(LOGP, LOGP_OLD, ADV, w, cfg)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    means = grpo.metric_means(m)
    # weighted clip fractions: under token_mean 2 of 4 tokens are clipped
    if aggregation == "token_mean":
        np.testing.assert_allclose(means["clip_frac"], 0.5, atol=1e-6)
        np.testing.assert_allclose(means["clip_frac_high"], 0.25, atol=1e-6)
        np.testing.assert_allclose(means["clip_frac_low"], 0.25, atol=1e-6)
        np.testing.assert_allclose(means["ratio_mean"], (1.5 + 0.9 + 1.0 + 0.5) / 4, rtol=1e-5)
    assert float(means["kl"]) == 0.0


def test_clipping_zeroes_gradient_where_active():
    cfg = GRPOLossConfig(eps_low=0.2, eps_high=0.28)
    w = grpo.token_weights(MASK, jnp.ones(2), "token_mean")
    grad = jax.grad(lambda lp: grpo.grpo_loss(lp, LOGP_OLD, ADV, w, cfg)[0])(LOGP)
    # d(-A r)/dlogp = -A r ; clipped tokens and padding: 0
    want = np.array([[0.0, -0.9 / 4, -1.0 / 4, 0.0], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(grad, want, atol=1e-6)
    # a negative-advantage token with ratio above 1 + eps_high is NOT clipped (pessimistic bound)
    lp = LOGP_OLD.at[1, 0].set(LOGP_OLD[1, 0] + jnp.log(2.0))
    loss_terms, ratio, low, high = grpo.clipped_surrogate(lp, LOGP_OLD, ADV, 0.2, 0.28)
    np.testing.assert_allclose(loss_terms[1, 0], 2.0, rtol=1e-6)
    assert not bool(low[1, 0]) and not bool(high[1, 0])


def test_separate_eps_low_and_high():
    # ratio 1.25: inside [0.8, 1.28] -> unclipped for A>0; with eps_high=0.2 it is clipped
    lp = jnp.log(jnp.array([[1.25]]))
    old = jnp.zeros((1, 1))
    loss_hi, *_ = grpo.clipped_surrogate(lp, old, jnp.array([1.0]), 0.2, 0.28)
    loss_sym, *_ = grpo.clipped_surrogate(lp, old, jnp.array([1.0]), 0.2, 0.2)
    np.testing.assert_allclose(loss_hi, [[-1.25]], rtol=1e-6)
    np.testing.assert_allclose(loss_sym, [[-1.2]], rtol=1e-6)
    # ratio 0.75 with A<0: eps_low 0.2 clips at 0.8, eps_low 0.3 does not
    lp = jnp.log(jnp.array([[0.75]]))
    a, *_ = grpo.clipped_surrogate(lp, old, jnp.array([-1.0]), 0.2, 0.28)
    b, *_ = grpo.clipped_surrogate(lp, old, jnp.array([-1.0]), 0.3, 0.28)
    np.testing.assert_allclose(a, [[0.8]], rtol=1e-6)
    np.testing.assert_allclose(b, [[0.75]], rtol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_on_policy_loss_is_the_stored_old_logp_loss(beta):
    """old_logp=None (the stop-gradient of logp) gives the loss, metrics and gradient of
    old_logp = logp stored apart: ratio 1, no clipping, gradient -A x weight per token."""
    w = grpo.token_weights(MASK, jnp.ones(2), "token_mean")
    cfg = GRPOLossConfig(beta=beta)
    ref = LOGP - 0.3

    def f(lp, old):
        return grpo.grpo_loss(lp, old, ADV, w, cfg, ref_logp=ref, entropy=jnp.ones_like(lp))

    (l_none, m_none), g_none = jax.value_and_grad(lambda lp: f(lp, None), has_aux=True)(LOGP)
    (l_old, m_old), g_old = jax.value_and_grad(lambda lp: f(lp, LOGP), has_aux=True)(LOGP)
    np.testing.assert_array_equal(l_none, l_old)
    np.testing.assert_allclose(g_none, g_old, rtol=1e-6, atol=1e-9)  # the last bit may differ (operation order)
    for k in m_old:
        np.testing.assert_array_equal(m_none[k], m_old[k], err_msg=k)
    means = grpo.metric_means(m_none)
    assert float(means["ratio_mean"]) == 1.0 and float(means["clip_frac"]) == 0.0
    if beta == 0.0:
        np.testing.assert_allclose(g_none, -np.asarray(ADV)[:, None] * np.asarray(w), atol=1e-7)


def test_kl_estimators_hand_computed():
    logp = jnp.array([[-1.0, -2.0]])
    ref = jnp.array([[-1.5, -1.0]])
    np.testing.assert_allclose(grpo.kl_estimate(logp, ref, "k2"), [[0.125, 0.5]], rtol=1e-6)
    with pytest.raises(ValueError, match="k1.*zero expected gradient"):
        grpo.kl_estimate(logp, ref, "k1")
    d = np.array([-0.5, 1.0])
    np.testing.assert_allclose(grpo.kl_estimate(logp, ref, "k3"), [np.exp(d) - d - 1], rtol=1e-6)
    assert float(jnp.min(grpo.kl_estimate(logp, ref, "k3"))) >= 0.0
    np.testing.assert_allclose(grpo.kl_estimate(logp, logp, "k3"), 0.0)


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_kl_term_added_with_beta(estimator):
    ref = LOGP - 0.3  # policy above the reference by 0.3 nats on every token
    w = grpo.token_weights(MASK, jnp.ones(2), "token_mean")
    base = grpo.grpo_loss(LOGP, LOGP_OLD, ADV, w, GRPOLossConfig(beta=0.0))[0]
    cfg = GRPOLossConfig(beta=0.1, kl_estimator=estimator)
    loss, m = grpo.grpo_loss(LOGP, LOGP_OLD, ADV, w, cfg, ref_logp=ref)
    per_token_kl = 0.5 * 0.3**2 if estimator == "k2" else math.exp(-0.3) + 0.3 - 1
    np.testing.assert_allclose(m["kl_penalty"], per_token_kl, rtol=1e-5)
    np.testing.assert_allclose(m["kl"], math.exp(-0.3) + 0.3 - 1, rtol=1e-5)  # the metric is always k3's value
    np.testing.assert_allclose(loss, base + 0.1 * per_token_kl, rtol=1e-5)
    # KL pulls the policy towards the reference: its gradient is positive on every token
    g_kl = jax.grad(lambda lp: grpo.grpo_loss(lp, LOGP_OLD, jnp.zeros(2), w, cfg, ref_logp=ref)[0])(LOGP)
    assert np.all(np.asarray(g_kl)[np.asarray(MASK) > 0] > 0)


# A categorical "policy" over 6 tokens: pi = softmax(theta), ref = softmax(phi).
THETA = jnp.array([0.3, -0.2, 1.1, 0.0, -0.7, 0.5])
PHI = jnp.array([-0.4, 0.6, 0.2, 0.1, 0.3, -0.5])


def _kl(p_logits, q_logits):
    lp, lq = jax.nn.log_softmax(p_logits), jax.nn.log_softmax(q_logits)
    return jnp.sum(jnp.exp(lp) * (lp - lq))


def _expected_penalty_grad(estimator):
    """E_{x ~ pi}[grad_theta k(log pi(x), log ref(x))], summed exactly over the 6 tokens."""
    lref = jax.nn.log_softmax(PHI)
    probs = jax.lax.stop_gradient(jax.nn.softmax(THETA))  # the sampling is not differentiated

    def penalty(theta):
        return jnp.sum(probs * grpo.kl_estimate(jax.nn.log_softmax(theta), lref, estimator))

    return jax.grad(penalty)(THETA)


def test_kl_penalty_gradients_are_the_kl_gradients():
    """k2's expected gradient is grad KL(pi||ref); k3's is grad KL(ref||pi); k1's would be 0."""
    forward = jax.grad(lambda th: _kl(th, PHI))(THETA)
    reverse = jax.grad(lambda th: _kl(PHI, th))(THETA)
    assert float(jnp.max(jnp.abs(forward - reverse))) > 0.05  # the two KLs differ here
    np.testing.assert_allclose(_expected_penalty_grad("k2"), forward, atol=1e-6)
    np.testing.assert_allclose(_expected_penalty_grad("k3"), reverse, atol=1e-6)
    # k1 = log pi - log ref: E_pi[grad log pi] = 0 whatever ref is (why it is rejected)
    probs = jax.nn.softmax(THETA)
    k1_grad = jax.grad(lambda th: jnp.sum(probs * (jax.nn.log_softmax(th) - jax.nn.log_softmax(PHI))))(THETA)
    np.testing.assert_allclose(k1_grad, 0.0, atol=1e-6)


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_kl_penalty_monte_carlo_gradient_through_the_loss(estimator):
    """Through grpo_loss (zero advantages, beta=1, token-mean weights): the mean gradient over
    tokens sampled from pi matches the exact gradient of the KL the estimator targets."""
    n = 40_000
    tokens = jax.random.categorical(jax.random.PRNGKey(0), THETA, shape=(1, n))
    ref_logp = jax.nn.log_softmax(PHI)[tokens]
    w = jnp.full((1, n), 1.0 / n)
    cfg = GRPOLossConfig(beta=1.0, kl_estimator=estimator)

    def loss(theta):
        logp = jax.nn.log_softmax(theta)[tokens]
        return grpo.grpo_loss(logp, jax.lax.stop_gradient(logp), jnp.zeros(1), w, cfg, ref_logp=ref_logp)[0]

    exact = jax.grad(lambda th: _kl(th, PHI) if estimator == "k2" else _kl(PHI, th))(THETA)
    np.testing.assert_allclose(jax.grad(loss)(THETA), exact, atol=0.02)


def test_beta_zero_needs_no_reference_and_positive_beta_does():
    w = grpo.token_weights(MASK, jnp.ones(2), "token_mean")
    loss, m = grpo.grpo_loss(LOGP, LOGP_OLD, ADV, w, GRPOLossConfig(beta=0.0), ref_logp=None)
    assert np.isfinite(float(loss)) and float(m["kl"]) == 0.0
    assert not GRPOLossConfig(beta=0.0).use_reference
    with pytest.raises(ValueError, match="ref_logp"):
        grpo.grpo_loss(LOGP, LOGP_OLD, ADV, w, GRPOLossConfig(beta=0.1), ref_logp=None)


def test_entropy_metric():
    v = 7
    uniform = jnp.zeros((2, 4, v))
    np.testing.assert_allclose(grpo.token_entropy(uniform), math.log(v), rtol=1e-6)
    peaked = jnp.zeros((1, 1, v)).at[0, 0, 0].set(100.0)
    assert float(grpo.token_entropy(peaked)[0, 0]) < 1e-6
    w = grpo.token_weights(MASK, jnp.ones(2), "token_mean")
    _, m = grpo.grpo_loss(LOGP, LOGP_OLD, ADV, w, GRPOLossConfig(), entropy=grpo.token_entropy(uniform))
    np.testing.assert_allclose(grpo.metric_means(m)["entropy"], math.log(v), rtol=1e-6)


def test_config_validation_names_field():
    with pytest.raises(ValueError, match="eps_low"):
        GRPOLossConfig(eps_low=1.5)
    with pytest.raises(ValueError, match="aggregation"):
        GRPOLossConfig(aggregation="sum")
    with pytest.raises(ValueError, match="kl_estimator"):
        GRPOLossConfig(kl_estimator="k4")
    with pytest.raises(ValueError, match="kl_estimator='k1'.*zero expected gradient"):
        GRPOLossConfig(kl_estimator="k1", beta=0.1)
    with pytest.raises(ValueError, match="beta"):
        GRPOLossConfig(beta=-1.0)
    with pytest.raises(ValueError, match=r"negative_weight=1.5 not a number in \[0, 1\]"):
        GRPOLossConfig(negative_weight=1.5)
    with pytest.raises(TypeError, match="dynamic_sampling"):  # a trainer setting now (llm.rl.dynamic)
        GRPOLossConfig(dynamic_sampling=True)


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    aggregation=st.sampled_from(grpo.AGGREGATION_MODES),
    split=st.sampled_from([1, 2, 4]),
)
def test_microbatch_sums_equal_full_batch(seed, aggregation, split):
    """Global weights make micro-batch losses, gradients and metrics add up exactly."""
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(seed), 4)
    b, t = 8, 5
    logp = -jax.random.uniform(k1, (b, t), minval=0.1, maxval=3.0)
    old = logp + 0.3 * jax.random.normal(k2, (b, t))
    ref = logp + 0.3 * jax.random.normal(k4, (b, t))
    adv = jax.random.normal(k3, (b,))
    lengths = jax.random.randint(k4, (b,), 0, t + 1)
    mask = (jnp.arange(t)[None, :] < lengths[:, None]).astype(jnp.float32)
    cfg = GRPOLossConfig(aggregation=aggregation, beta=0.05)
    w = grpo.token_weights(mask, jnp.ones(b), aggregation)

    def f(lp, o, r, a, ww):
        return grpo.grpo_loss(lp, o, a, ww, cfg, ref_logp=r)

    full_loss, full_m = f(logp, old, ref, adv, w)
    full_g = jax.grad(lambda lp: f(lp, old, ref, adv, w)[0])(logp)
    parts = [np.split(np.asarray(x), split) for x in (logp, old, ref, adv, w)]
    loss_sum, kl_sum, grads = 0.0, 0.0, []
    for lp, o, r, a, ww in zip(*parts):
        loss, m = f(lp, o, r, a, ww)
        loss_sum += float(loss)
        kl_sum += float(m["kl"])
        grads.append(jax.grad(lambda x: f(x, o, r, a, ww)[0])(jnp.asarray(lp)))
    np.testing.assert_allclose(loss_sum, full_loss, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(kl_sum, full_m["kl"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.concatenate(grads), full_g, rtol=1e-4, atol=1e-7)
