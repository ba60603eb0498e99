"""Thin adapters from the functional core to the standard JAX RL interfaces (the ``ecosystem``
extra: ``pip install "jaxlake[ecosystem]"``; docs/guides/ecosystem.md).

One module per client, each importing only its client and the core:

* :mod:`jaxlake.adapters.jaxmarl`: a JaxMARL ``MultiAgentEnv`` whose ``reset`` draws a lake from
  a pre-generated pool;
* :mod:`jaxlake.adapters.jumanji`: a Jumanji ``Environment`` with specs, registered as
  ``"MAPFFrozenLake-v0"`` when the module is imported;
* :mod:`jaxlake.adapters.jaxued`: a JaxUED ``UnderspecifiedEnv`` whose levels are lakes, with
  :func:`jaxlake.levels.mutate` as its mutator and the generator as its level sampler;
* :mod:`jaxlake.adapters.pools`: what they share, pools of lakes from a pool, a config or a
  mixture, and a jittable level sampler over a mixture (no client import).

The game logic stays in the core (:mod:`jaxlake.env`, :mod:`jaxlake.observations`,
:mod:`jaxlake.levels`); an adapter only renames, reshapes and routes keys. This package's
``__init__`` imports nothing, so ``import jaxlake.adapters.jumanji`` loads Jumanji alone, and
``import jaxlake`` loads no client at all (``tests/test_layering.py``).
"""
