"""Hydra entry point of the staged pipeline: ``python -m jaxlake.run``.

* ``python -m jaxlake.run``: all ``stages`` (train -> evaluate -> summarize -> engineer each)
  in ``runs/<experiment>/``; rerunning the same command resumes where it stopped.
* ``python -m jaxlake.run +stage=K``: stage ``K`` alone (stage ``K > 1`` reads stage
  ``K - 1``'s artifacts and names the missing file and the command that makes it when they
  are absent). ``stage`` is a plain key, not a config group: Hydra rejects numeric
  config-group options.
* ``python -m jaxlake.run -m engineer=policy,heuristic,fixed seed=0,1,2``: a sweep
  (``runs/<experiment>/multirun/<job>``); ``python -m jaxlake.report runs/<experiment>``
  tabulates it.

The configuration is ``conf/config.yaml``, shipped in the package (groups ``env``,
``model``, ``train``, ``reward``, ``prompt``, ``engineer``, ``eval``; Hydra finds it as
``pkg://jaxlake.conf`` from any folder, and ``--config-dir DIR`` or
``hydra.searchpath=[file://DIR]`` adds a folder of one's own beside it). Runs go to
``runs/<experiment>`` under the current folder. The stage logic is :mod:`jaxlake.pipeline.stages` and
:func:`llm.training.stage.train_stage`. ``train.distributed.enabled=true`` (or
``JAXLAKE_DISTRIBUTED=1``) calls ``jax.distributed.initialize`` before anything else
touches JAX.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from jaxlake.conf import CONF_DIR


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    # orbax logs every checkpoint step at INFO through absl; keep the console for progress
    logging.getLogger("absl").setLevel(logging.WARNING)
    from jaxlake.pipeline.stages import main as pipeline_main

    pipeline_main(cfg)


if __name__ == "__main__":
    import os
    import sys

    from jaxlake.pipeline.cluster import follower_hydra_overrides

    sys.argv += follower_hydra_overrides(sys.argv[1:], os.environ)  # processes 1..N-1 leave .hydra/ to process 0
    main()
