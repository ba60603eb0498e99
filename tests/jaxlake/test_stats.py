"""jaxlake.stats: the t quantile against published values and SciPy's ``t.ppf``, and the
intervals built on it (:func:`mean_ci`, :func:`paired_difference`) beyond the 30 degrees of
freedom the old table stopped at."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from jaxlake.stats import mean_ci, paired_difference, t_quantile

# Two-sided quantiles of Student's t as printed in the standard tables (four decimals):
# (degrees of freedom, level, t with P(|T| <= t) = level).
KNOWN = [
    (1, 0.95, 12.7062), (2, 0.95, 4.3027), (7, 0.95, 2.3646), (30, 0.95, 2.0423),
    (40, 0.95, 2.0211), (60, 0.95, 2.0003), (120, 0.95, 1.9799),
    (10, 0.99, 3.1693), (40, 0.90, 1.6839), (5, 0.80, 1.4759),
]


@pytest.mark.parametrize("df, level, want", KNOWN)
def test_t_quantile_matches_the_tables(df, level, want):
    assert t_quantile(df, level) == pytest.approx(want, abs=5e-5)


def test_t_quantile_is_scipys_t_ppf_and_tends_to_the_normal():
    for level in (0.8, 0.9, 0.95, 0.99):
        for df in [*range(1, 101), 250, 767, 10_000]:
            assert t_quantile(df, level) == pytest.approx(scipy_stats.t.ppf(0.5 + level / 2, df), rel=1e-12)
    normal = scipy_stats.norm.ppf(0.975)  # 1.95996...
    assert t_quantile(10**7) == pytest.approx(normal, abs=1e-6)
    qs = [t_quantile(df) for df in range(1, 2000)]
    assert all(a > b for a, b in zip(qs, qs[1:])) and qs[-1] > normal  # always wider than 1.96


@pytest.mark.parametrize("df, level", [(0, 0.95), (-3, 0.95), (5, 0.0), (5, 1.0), (5, 1.5)])
def test_t_quantile_refuses_bad_arguments(df, level):
    with pytest.raises(ValueError, match="t_quantile"):
        t_quantile(df, level)


def test_mean_ci_beyond_thirty_degrees_of_freedom():
    """41 values: 40 degrees of freedom, t = 2.0211 (the old table's 1.96 was 3 % short)."""
    xs = [float(i % 2) for i in range(41)]
    m, h, n = mean_ci(xs)
    sd = float(np.std(xs, ddof=1))
    assert (m, n) == (pytest.approx(20 / 41), 41)
    assert h == pytest.approx(2.021075 * sd / math.sqrt(41), rel=1e-6)
    assert h / (1.96 * sd / math.sqrt(41)) == pytest.approx(1.0312, abs=1e-4)
    assert mean_ci(xs + [None]) == (m, h, n)  # missing values are left out


def test_paired_difference_interval_uses_the_exact_quantile():
    """768 lakes, as an evaluation on the large suite: t(767) = 1.96306, not 1.96."""
    rng = np.random.default_rng(0)
    a = rng.random(768) < 0.85
    b = rng.random(768) < 0.88
    d = b.astype(float) - a.astype(float)
    got = paired_difference(a.tolist(), b.tolist())
    assert got.n == 768 and got.diff == pytest.approx(d.mean())
    assert got.half_width == pytest.approx(1.963062 * d.std(ddof=1) / math.sqrt(768), rel=1e-6)
