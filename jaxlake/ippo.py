"""``python -m jaxlake.ippo``: train the IPPO student (the command of the student room,
:mod:`jaxlake.students.run`; config ``conf/ippo.yaml``, guide docs/guides/ippo.md).

* ``python -m jaxlake.ippo``: IPPO on ``env=tiny`` in ``runs/ippo/``; rerunning resumes;
* ``python -m jaxlake.ippo env=small experiment=ippo_small ippo.num_updates=1000``.

The room is imported only when the command runs, so importing the simulator never loads the
learner's stack (optax, flax linen).
"""

from __future__ import annotations


def main() -> None:
    from jaxlake.students.run import main as run_main

    run_main()


if __name__ == "__main__":
    main()
