"""Jitted functions built once per process for equal arguments.

A staged run trains several stages in one process, and each stage builds its updates again
from its settings (:func:`llm.rl.optim.make_optimizer`, :func:`llm.rl.updates.make_grpo_update`,
:func:`llm.training.warmstart.make_sft_update`, ...). A fresh ``jax.jit`` of a fresh closure
compiles again even when nothing changed, so a run would recompile its GRPO update every stage.
:func:`reused` returns the function built before for equal arguments (hashable ones: frozen
config dataclasses, a model's graph definition, a mesh), and builds it when an argument is
unhashable (a hand-made optax transformation compares by identity and is never shared).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any, Callable

#: Factories' results kept per factory (oldest dropped first).
MAX_KEPT = 16


def reused(factory: Callable) -> Callable:
    """``factory``, returning the result built before for equal (hashable) arguments; its
    ``cache_clear()`` forgets them (tests that count compilations)."""
    kept: OrderedDict = OrderedDict()

    @functools.wraps(factory)
    def build(*args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items())))
        try:
            hash(key)
        except TypeError:  # an unhashable argument: build afresh, keep nothing
            return factory(*args, **kwargs)
        if key in kept:
            kept.move_to_end(key)
            return kept[key]
        out = kept[key] = factory(*args, **kwargs)
        while len(kept) > MAX_KEPT:
            kept.popitem(last=False)
        return out

    build.cache_clear = kept.clear  # type: ignore[attr-defined]
    return build
