"""``python -m llm.memory``: the command-line name of :mod:`llm.benchmark.memory`."""

import sys

from llm.benchmark.memory import main

if __name__ == "__main__":
    sys.exit(main())
