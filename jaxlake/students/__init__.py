"""Neural students: agents trained on the lakes with gradient-based RL, in one ``jax.jit``.

The room of the neural learners (docs/guides/ippo.md): it may use ``optax`` and ``flax.linen``,
which the simulator does not, and never imports ``llm`` (tests/test_layering.py). Its modules:

* :mod:`~jaxlake.students.ippo` -- ``make_train(config, mixture)``: IPPO in PureJaxRL's shape;
* :mod:`~jaxlake.students.config` -- :class:`~jaxlake.students.config.IPPOConfig`, the typed settings;
* :mod:`~jaxlake.students.network` -- the parameter-shared, action-masked actor-critic;
* :mod:`~jaxlake.students.envs` -- the environment interface and the lakes behind it;
* :mod:`~jaxlake.students.lakes` -- fresh training lakes from any mixture, the held-out split;
* :mod:`~jaxlake.students.gae`, :mod:`~jaxlake.students.update` -- GAE and the PPO update;
* :mod:`~jaxlake.students.evaluate` -- greedy evaluation on held-out lakes;
* :mod:`~jaxlake.students.ued` -- DR, robust PLR, ACCEL and SFL over lakes inside the trainer's jit;
* :mod:`~jaxlake.students.checkpoint`, :mod:`~jaxlake.students.plots`,
  :mod:`~jaxlake.students.run` -- the command ``python -m jaxlake.ippo`` and its run folder;
* :mod:`~jaxlake.students.marl_ippo` -- IPPO written the way JaxMARL's baselines write it
  (batchify / unbatchify), the peer of the benchmark;
* :mod:`~jaxlake.students.bench` -- training throughput against JaxMARL's IPPO on the lakes and
  on MPE (``python -m jaxlake.students.bench``);
* :mod:`~jaxlake.students.study` -- the UED study: every method over seeds on a held-out
  suite, paired with domain randomisation (``python -m jaxlake.students.study``).

Nothing is imported here: ``import jaxlake.students`` stays cheap.
"""
