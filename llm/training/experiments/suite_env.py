"""The warm start on the held-out suite's cells (an experiment: ``pipeline.warmstart_env=suite``, off by
default and measured inside the noise). A stage's supervised warm start, and its GRPO anchor, draw
fresh lakes of the suite's valid cells at equal weights (never the suite's own lakes) while its GRPO
stays on the engineer's mixture; the default (``stage``) warm-starts on that mixture and ``space``
on every config the engineer may choose (:func:`jaxlake.pipeline.pretrain.space_mixture`).
"""

from __future__ import annotations

from typing import Any

from jaxlake.mixture import Mixture
from jaxlake.suite import cells_mixture


def suite_mixture(suite: Any) -> Mixture:
    """The warm-start environment of ``pipeline.warmstart_env=suite``: ``suite``'s valid cells
    (a :class:`jaxlake.suite.SuiteSpec`) as one mixture of equal weights."""
    return cells_mixture(suite)
