"""``python -m llm.memory``: the command-line name of :mod:`llm.benchmark.memory` (one update) and,
with ``--plan``, of :mod:`llm.benchmark.step_plan` (every phase of one GRPO step)."""

import sys
from typing import Optional


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--plan" in argv:
        from llm.benchmark.step_plan import plan_main

        argv.remove("--plan")
        return plan_main(argv)
    from llm.benchmark.memory import main as update_main

    return update_main(argv)


if __name__ == "__main__":
    sys.exit(main())
