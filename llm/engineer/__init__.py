"""llm.engineer: language-model environment engineers.

Imports :mod:`llm.model`, :mod:`llm.generation`, :mod:`llm.game` and ``jaxlake`` (its
``jaxlake.engineers`` protocol and configuration space); never :mod:`llm.training`.

* :mod:`llm.engineer.local` -- the policy and base-model engineers (``engineer=policy|base``);
* :mod:`llm.engineer.external` -- an OpenAI-compatible endpoint (``engineer=external``);
* :mod:`llm.engineer.prompt` -- the engineer's prompt from the stage summaries;
* :mod:`llm.engineer.constrained` -- constrained JSON decoding over the configuration space.
"""
