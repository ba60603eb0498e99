"""Confidence intervals over seeds and lakes: :func:`mean_ci`, Student's t interval.

Used by the simulator's analyses (:mod:`jaxlake.analysis`) and by the reports over run folders
(:mod:`jaxlake.pipeline.report`, :mod:`jaxlake.pipeline.study`).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

#: Two-sided 95 % Student t quantiles by degrees of freedom (1..30); beyond, 1.96.
_T95 = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
]


def mean_ci(values: Sequence[float]) -> tuple[Optional[float], Optional[float], int]:
    """``(mean, half-width of the 95 % t interval, n)``; half-width None for n < 2."""
    xs = [float(v) for v in values if v is not None]
    n = len(xs)
    if n == 0:
        return None, None, 0
    m = sum(xs) / n
    if n < 2:
        return m, None, n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return m, t * sd / math.sqrt(n), n
