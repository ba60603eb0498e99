"""``python -m jaxlake.study``: the command-line name of :mod:`jaxlake.pipeline.study`."""

from jaxlake.pipeline.study import main

if __name__ == "__main__":
    raise SystemExit(main())
