"""``python -m llm.benchmark``: see :mod:`llm.benchmark.cli`."""

from llm.benchmark.cli import main

main()
