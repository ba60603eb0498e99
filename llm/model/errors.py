"""The error of a model or mesh setting out of range.

:class:`ModelConfigError` is a ``ValueError`` whose message names the field and its allowed
range in one line, in the same form as the simulator's ``jaxlake.config.ConfigError``. It lives
here so that the model layer stays free of the game package: a Qwen3 model imports nothing of
``jaxlake``. Entry points catch ``ValueError`` and print the message alone.
"""

from __future__ import annotations


class ModelConfigError(ValueError):
    """A ``Qwen3Config`` / ``MeshConfig`` field out of its range, or an unknown field."""
