"""``python -m jaxlake.report``: the command-line name of :mod:`jaxlake.pipeline.report`."""

from jaxlake.pipeline.report import main

if __name__ == "__main__":
    raise SystemExit(main())
