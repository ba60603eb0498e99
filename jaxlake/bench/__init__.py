"""``python -m jaxlake.bench``: the simulator's throughput (the lake generator and the step) on
every device JAX sees, beside the peer simulators of :mod:`jaxlake.peers`.

A leaf of the simulator: it imports the simulator and nothing of the simulator imports it
(``tests/test_layering.py``). Its modules:

* :mod:`jaxlake.bench.throughput`: the measurements (:func:`run_bench`) and the JSON they are
  written as (its docstring documents every field; ``schema == "jaxlake.bench/1"``);
* :mod:`jaxlake.bench.rollouts`: the timed rollout programs (``bench.rng``, ``bench.observations``);
* :mod:`jaxlake.bench.peers`: the peers run on our maps (``bench.peers``);
* :mod:`jaxlake.bench.kinds`: each kind of observation against the Jumanji Connector's
  (``bench.like_for_like``);
* :mod:`jaxlake.bench.report`: ours against the peers, the tables and the files written;
* ``__main__``: ``python -m jaxlake.bench`` runs :func:`main`, the Hydra entry point (primary
  config ``conf/bench.yaml``).

The public names of the five modules are importable from here as well
(``jaxlake.bench.run_bench``, ``jaxlake.bench.make_rollout``, ``jaxlake.bench.measure_peers``,
``jaxlake.bench.plot_throughput``, ...).
"""

from __future__ import annotations

from pathlib import Path

from jaxlake.bench.kinds import (OBSERVATION_KINDS, PEER_MODE, PEER_MODES, TARGETS, like_for_like,
                                 make_jaxmarl_rollout, make_kind_rollout, observation_bytes)
from jaxlake.bench.peers import measure_peers, peer_spec
from jaxlake.bench.report import autoreset_overheads, format_report, peer_ratios, plot_throughput, write_outputs
from jaxlake.bench.rollouts import (OBSERVATION_DTYPES, RNG_MODES, keyed_actions, make_autoreset_rollout, make_rollout,
                                    observation_dtype, random_actions, rng_mode)
from jaxlake.bench.throughput import (AUTORESET_FIELDS, GENERATOR_FIELDS, GENERATOR_STATS_FIELDS, LIKE_FOR_LIKE_FIELDS,
                                      META_FIELDS, OBSERVE_FIELDS, OK_ROW_FIELDS, OVERHEAD_FIELDS, RATIO_FIELDS,
                                      RESULT_FILES, ROLLOUT_FIELDS, ROW_FIELDS, SCHEMA, TOP_FIELDS, VERSION_FIELDS,
                                      cost_of, device_memory_limit, environment_info, make_generator,
                                      measure_autoreset, measure_generator, measure_jaxmarl, measure_kind,
                                      measure_rollout, memory_of, parse_envs, run_bench, time_calls)

__all__ = [
    # the entry point and the measurements (jaxlake.bench.throughput)
    "main", "run_bench", "parse_envs", "make_generator", "measure_generator", "measure_rollout", "measure_autoreset",
    "measure_kind", "measure_jaxmarl",
    "environment_info", "device_memory_limit", "cost_of", "memory_of", "time_calls",
    # the JSON's documented fields (jaxlake.bench.throughput)
    "SCHEMA", "RESULT_FILES", "TOP_FIELDS", "META_FIELDS", "VERSION_FIELDS", "ROW_FIELDS", "OK_ROW_FIELDS",
    "GENERATOR_FIELDS", "GENERATOR_STATS_FIELDS", "ROLLOUT_FIELDS", "AUTORESET_FIELDS", "RATIO_FIELDS",
    "OVERHEAD_FIELDS", "OBSERVE_FIELDS", "LIKE_FOR_LIKE_FIELDS",
    # the timed rollouts (jaxlake.bench.rollouts)
    "OBSERVATION_DTYPES", "RNG_MODES", "keyed_actions", "make_autoreset_rollout", "make_rollout",
    "observation_dtype", "random_actions", "rng_mode",
    # the observation kinds against the Connector (jaxlake.bench.kinds)
    "OBSERVATION_KINDS", "PEER_MODE", "PEER_MODES", "TARGETS", "like_for_like", "make_jaxmarl_rollout",
    "make_kind_rollout", "observation_bytes",
    # the peers (jaxlake.bench.peers)
    "measure_peers", "peer_spec",
    # the report (jaxlake.bench.report)
    "autoreset_overheads", "format_report", "peer_ratios", "plot_throughput", "write_outputs",
]


def main() -> None:
    """``python -m jaxlake.bench [key=value ...]``: compose ``conf/bench.yaml`` with the overrides,
    run :func:`run_bench` on its ``bench`` settings and write into ``bench.out_dir`` or else
    Hydra's run folder.

    Defined here, in the package, so that Hydra names the job ``bench`` (after the module
    that defines the task function): the log file ``bench.log`` and ``--help``'s title.
    """
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    from jaxlake.conf import CONF_DIR

    @hydra.main(config_path=str(CONF_DIR), config_name="bench", version_base=None)
    def _main(cfg: DictConfig) -> None:
        settings = OmegaConf.to_container(cfg.bench, resolve=True)
        out_dir = settings.get("out_dir") or HydraConfig.get().runtime.output_dir
        run_bench(settings, Path(out_dir))

    _main()
