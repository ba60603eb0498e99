"""The Hydra configuration tree of jaxlake, shipped inside the package.

``CONF_DIR`` is this folder: ``config.yaml`` (the staged pipeline), ``bench.yaml`` (the
simulator benchmark) and the groups ``env``, ``model``, ``train``, ``reward``, ``prompt``,
``eval``, ``engineer``, ``study``, ``bench`` and ``hydra/launcher``. Entry points find it
through this module, so it works from a clone and from an installed wheel alike; Hydra can
also reach it as ``pkg://jaxlake.conf``.
"""

from pathlib import Path

#: The folder holding the package's Hydra configs.
CONF_DIR = Path(__file__).resolve().parent
