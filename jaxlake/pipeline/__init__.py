"""jaxlake.pipeline: the orchestration room, the one part of ``jaxlake`` that imports ``llm``.

* :mod:`jaxlake.pipeline.settings` -- the run's typed settings (:class:`~jaxlake.pipeline.settings.
  RunSettings`), resolved once from the Hydra config at the entry point;
* :mod:`jaxlake.pipeline.stages` -- the staged pipeline: train -> evaluate -> summarize ->
  engineer, one stage after another, resumable (``python -m jaxlake.run``);
* :mod:`jaxlake.pipeline.study` -- the engineer study sweep and its results page
  (``python -m jaxlake.study``);
* :mod:`jaxlake.pipeline.report` -- tables and plots over run folders
  (``python -m jaxlake.report``).

The simulator (every other module of ``jaxlake``) never imports this room nor ``llm``;
``tests/test_layering.py`` checks both directions.
"""
