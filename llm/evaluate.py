"""``python -m llm.evaluate``: the command-line name of :mod:`llm.training.evaluate`."""

import sys

from llm.training.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
