"""DAPO dynamic sampling's group selection (llm/rl/dynamic.py): the batch keeps its N slots,
informative groups first in sampling order, tied fillers last, the surplus dropped."""

import numpy as np
import pytest

from llm.rl.dynamic import DynamicSamplingConfig, all_groups, enough, select_groups


def test_refill_takes_informative_groups_in_sampling_order_then_tied_fillers():
    r0 = np.array([False, True, False, True])
    r1 = np.array([True, False, True, True])
    assert not enough([r0], 4) and enough([r0, r1], 4)
    sel = select_groups([r0, r1], 4)
    # round 0's two informative groups, then round 1's first two; round 1's last one is surplus
    assert list(zip(sel.round, sel.group)) == [(0, 1), (0, 3), (1, 0), (1, 2)]
    assert sel.informative.all() and sel.kept == 4 and sel.found == 5
    which, rows = sel.rows(2)
    assert list(which) == [0, 0, 0, 0, 1, 1, 1, 1] and list(rows) == [2, 3, 6, 7, 0, 1, 4, 5]
    # the rounds ran out: 3 informative groups found for 4 slots -> one tied filler, marked
    short = select_groups([r0, np.array([True, False, False, False])], 4)
    assert list(zip(short.round, short.group)) == [(0, 1), (0, 3), (1, 0), (0, 0)]
    assert list(short.informative) == [True, True, True, False] and short.kept == 3
    # nothing informative: N tied slots, none kept (the trainer skips the update)
    none = select_groups([np.zeros(3, bool), np.zeros(3, bool)], 3)
    assert none.kept == 0 and none.found == 0 and len(none.round) == 3
    # dynamic sampling off: round 0 as sampled
    every = all_groups(r0)
    assert list(every.group) == [0, 1, 2, 3] and not every.round.any() and every.kept == 2


def test_config_and_bad_rounds_name_the_field():
    assert DynamicSamplingConfig().rounds_cap() == 1 and DynamicSamplingConfig(True, 4).rounds_cap() == 4
    with pytest.raises(ValueError, match="grpo.dynamic_sampling.max_rounds=0"):
        DynamicSamplingConfig(enabled=True, max_rounds=0)
    with pytest.raises(ValueError, match="round 1 has 2 groups"):
        select_groups([np.ones(3, bool), np.ones(2, bool)], 3)
