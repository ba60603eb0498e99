"""``python -m jaxlake.bench [key=value ...]``: see :func:`jaxlake.bench.main`."""

from jaxlake.bench import main

if __name__ == "__main__":
    main()
