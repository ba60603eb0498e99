"""``python -m jaxlake.pretrain``: pretrain the embedded tiny planner (:mod:`jaxlake.pipeline.pretrain`).

The Hydra config is ``conf/pretrain.yaml``: the run's config (``conf/config.yaml``) with the
warm start sized for pretraining, GRPO off, and the ``pretrain`` node (``curve``, ``ship``).
Errors, SIGTERM and sweeps behave as for ``python -m jaxlake.run`` (:func:`jaxlake.run.guarded`)::

    python -m jaxlake.pretrain                              # runs/pretrain: train, then the suite curve
    python -m jaxlake.pretrain pretrain.ship=true           # ... and ship it as the package's planner
    python -m jaxlake.pretrain -m train.warmstart.optim.lr=1e-3,3e-3   # a sweep of settings
"""

from __future__ import annotations

from typing import Any, Optional

import hydra
from omegaconf import DictConfig

from jaxlake.conf import CONF_DIR
from jaxlake.run import guarded, serve


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="pretrain")
def _hydra_main(cfg: DictConfig) -> Optional[Any]:
    from jaxlake.pipeline.pretrain import main as pretrain_main

    return guarded(pretrain_main, cfg)


def main() -> None:
    """``python -m jaxlake.pretrain``."""
    serve(_hydra_main)


if __name__ == "__main__":
    main()
