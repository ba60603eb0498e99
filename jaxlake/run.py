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

A user's mistake -- a bad value, a missing, corrupt or unwritable file, a run folder locked by
another command (:func:`jaxlake.pipeline.folder.run_lock`) -- ends with one line on stderr,
``error: <what>``, naming the field and its allowed range or the file, and exit status 1,
instead of Hydra's "Error executing job" and a traceback
(:func:`jaxlake.pipeline.settings.user_error` says what counts). ``HYDRA_FULL_ERROR=1``, the
variable Hydra reads for its own errors, re-raises it with the full traceback. In a multirun
each failed job prints its line (prefixed with its folder), the other jobs still run, and the
sweep exits 1 at the end (with a launcher that runs jobs in other processes, Hydra collects
the failure and reports it compactly). Hydra writes nothing into the run folder before the task
(``hydra.output_subdir: null``, the log file opened at its first record:
``conf/hydra/job_logging/jaxlake.yaml``); the pipeline writes ``.hydra/`` once the settings are
checked and the folder is locked.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any, Optional

import hydra
from omegaconf import DictConfig

from jaxlake.conf import CONF_DIR

#: Set (to anything but ``0``) to get the full traceback of a user's mistake instead of its one
#: line: the variable Hydra itself reads for its own errors.
DEBUG_ENV = "HYDRA_FULL_ERROR"
#: The one-line errors of the jobs of a multirun that stopped on a user's mistake.
_FAILED: list[str] = []


def debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _sweep() -> Optional[str]:
    """``"here"`` for a multirun whose jobs run in this process (Hydra's basic launcher),
    ``"elsewhere"`` for one whose launcher runs them in other processes, None outside a multirun."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode != RunMode.MULTIRUN:
            return None
        target = str((hydra_cfg.launcher or {}).get("_target_", ""))
        return "here" if target.endswith(".BasicLauncher") else "elsewhere"
    except (ValueError, ImportError):
        return None


try:
    from hydra.errors import CompactHydraException as _Compact
except ImportError:  # pragma: no cover - hydra ships it
    _Compact = RuntimeError


class JobStopped(_Compact):
    """A sweep job (run by a launcher in another process) stopped on a user's mistake: Hydra
    reports the job as failed with this one-line message, no traceback."""


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM: drop this process's locks, then end as the default action would (no exception
    raised into the interrupted code, which might swallow it; the folder is left as a kill
    leaves it, and the same command resumes)."""
    from jaxlake.io import release_all

    release_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def guarded(task: Any, cfg: DictConfig) -> Optional[Any]:
    """``task(cfg)``, a user's mistake ending in one line (see :func:`main`); the body of a
    Hydra entry point (``jaxlake.run``, ``jaxlake.pretrain``)."""
    # orbax logs every checkpoint step at INFO through absl; keep the console for progress
    logging.getLogger("absl").setLevel(logging.WARNING)
    from jaxlake.pipeline.settings import user_error

    try:
        return task(cfg)
    except Exception as err:  # noqa: BLE001 - a user's mistake ends in one line, anything else as before
        line = None if debug() else user_error(err)
        if line is None:
            raise
        sweep = _sweep()
        if sweep is not None:
            from hydra.core.hydra_config import HydraConfig

            line = f"{HydraConfig.get().runtime.output_dir}: {line}"
            print(f"error: {line}", file=sys.stderr, flush=True)
            if sweep == "elsewhere":  # the launcher's process collects the failure and exits 1
                raise JobStopped(line) from None
            _FAILED.append(line)
            return None  # the other jobs of the sweep still run
        print(f"error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def _hydra_main(cfg: DictConfig) -> Optional[Any]:
    from jaxlake.pipeline.stages import main as pipeline_main

    return guarded(pipeline_main, cfg)


def serve(entry: Any) -> None:
    """Run the Hydra entry point ``entry`` as a command: SIGTERM releases this process's
    locks first, and a sweep whose jobs stopped on a user's mistake exits 1 after them."""
    _FAILED.clear()
    import threading

    previous = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        entry()
    finally:
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)
    if _FAILED:
        print(f"error: {len(_FAILED)} job(s) of the sweep stopped; the first: {_FAILED[0]}", file=sys.stderr,
              flush=True)
        raise SystemExit(1)


def _env_choice(argv: list[str]) -> Optional[str]:
    """The ``env`` group option the command line picks (its last ``env=NAME``), else
    conf/config.yaml's default."""
    choice = None
    for arg in argv:
        key, eq, value = arg.lstrip("+").partition("=")
        if eq and key == "env":
            choice = value
    if choice is None:
        import yaml

        defaults = yaml.safe_load((CONF_DIR / "config.yaml").read_text()).get("defaults", [])
        choice = next((d["env"] for d in defaults if isinstance(d, dict) and "env" in d), None)
    return choice


def mixture_field_error(argv: list[str]) -> Optional[str]:
    """The one line for ``env.<field>=...`` given while ``env`` is a mixture (the default
    ``env=broad``): a mixture has no single field to set, and Hydra's own message (``Could not
    override 'env.height'. To append to your config use +env.height=...``) suggests a key the
    pipeline would reject. None when the override is fine, or when the environment is not one
    of the shipped ones (a ``--config-dir`` of the user's own: Hydra and the pipeline check it)."""
    import yaml

    fields = [a.split("=", 1)[0] for a in argv if "=" in a and a.lstrip("+").startswith("env.")
              and not a.lstrip("+").startswith("env.mixture")]
    if not fields:
        return None
    choice = _env_choice(argv)
    path = CONF_DIR / "env" / f"{choice}.yaml"
    if choice is None or not path.is_file():
        return None
    node = yaml.safe_load(path.read_text()) or {}
    if not isinstance(node, dict) or "mixture" not in node:
        return None
    override = next(a for a in argv if a.split("=", 1)[0] == fields[0])
    name = fields[0].lstrip("+").split(".", 1)[1]
    return (f"{override}: env={choice} is a mixture of {len(node['mixture'])} configs, with no single {name!r} to set; "
            f"pick a one-config environment and set it there (env=tiny env.{name}=...), or set it on one "
            f"component (env.mixture.0.config.{name}=...)")


def main() -> None:
    """``python -m jaxlake.run``: Hydra's entry point. A user's mistake (a bad value, a missing,
    corrupt or unwritable file, a locked run folder) ends with one line, ``error: <what>``,
    naming the field or file, and exit status 1; ``HYDRA_FULL_ERROR=1`` raises it with its full
    traceback instead. In a multirun the other jobs still run, and the sweep exits 1 after them
    if any job stopped so. SIGTERM (a cluster's preemption, ``kill``) removes the run folder's
    lock before the process ends as it would have, so a requeued job on another host is not
    refused."""
    line = None if debug() else mixture_field_error(sys.argv[1:])
    if line is not None:
        print(f"error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    serve(_hydra_main)


if __name__ == "__main__":
    import os
    import sys

    from jaxlake.pipeline.cluster import follower_hydra_overrides

    sys.argv += follower_hydra_overrides(sys.argv[1:], os.environ)  # processes 1..N-1 leave .hydra/ to process 0
    main()
