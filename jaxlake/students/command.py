"""What the student room's commands share (``python -m jaxlake.ippo``, ``python -m
jaxlake.students.study``): a user's mistake ends in one line.

:func:`run_guarded` runs a command's body on its Hydra config: a bad setting
(:class:`~jaxlake.config.ConfigError`), a folder another process holds
(:class:`~jaxlake.io.FolderLockError`) or a file that cannot be read or written (``OSError``)
ends with ``error: <what>`` on stderr, its whitespace folded into one line naming the field or
the file, and exit status 1; ``HYDRA_FULL_ERROR=1`` raises it with its traceback instead. Any
other exception (a bug) keeps its traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, Optional, TypeVar

from jaxlake.config import ConfigError
from jaxlake.io import FolderLockError

__all__ = ["run_guarded"]

T = TypeVar("T")


def run_guarded(main: Callable[[Any], T], cfg: Any) -> Optional[T]:
    """``main(cfg)``, a user's mistake ending the process in one line (module docstring)."""
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "Unable to initialize backend 'tpu'"
    try:
        return main(cfg)
    except (ConfigError, FolderLockError, OSError) as err:
        if os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0"):
            raise
        text = str(err)
        if isinstance(err, OSError) and err.filename and err.strerror:
            text = f"{err.filename}: {err.strerror}"
        print(f"error: {' '.join(text.split()) or type(err).__name__}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
