"""The error of a model or mesh setting out of range.

:class:`ModelConfigError` is a ``ValueError`` whose message names the field and its allowed
range in one line, in the same form as the simulator's ``jaxlake.config.ConfigError``. It lives
here so that the model layer stays free of the game package: a Qwen3 model imports nothing of
``jaxlake``. Entry points catch ``ValueError`` and print the message alone.
"""

from __future__ import annotations


from typing import Any, Iterable


class ModelConfigError(ValueError):
    """A ``Qwen3Config`` / ``MeshConfig`` field out of its range, or an unknown field."""


def reject_unknown(section: str, given: Iterable[Any], allowed: Iterable[Any],
                   error: type[Exception] = ModelConfigError) -> None:
    """The model layer's own copy of :func:`jaxlake.config.reject_unknown` (this layer imports
    nothing of jaxlake): raise ``error`` with the same one-line message,
    ``unknown <section> field(s) [...]; allowed: [...]`` (both lists sorted); nothing when every
    key of ``given`` is in ``allowed``. ``tests/llm/model`` checks that both give the same text.
    """
    allowed = set(allowed)
    unknown = [k for k in given if k not in allowed]
    if unknown:
        raise error(f"unknown {section} field(s) {sorted(unknown, key=str)}; allowed: {sorted(allowed, key=str)}")
