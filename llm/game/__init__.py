"""llm.game: the MAPF-FrozenLake game as seen by a language model.

Imports :mod:`llm.model`, :mod:`llm.generation`, :mod:`llm.rl` and the simulator ``jaxlake``.

* :mod:`llm.game.tokenizer` -- the game tokenizer of the embedded tiny planner;
* :mod:`llm.game.prompts` / :mod:`llm.game.prompter` -- lake prompts and their chat templates;
* :mod:`llm.game.rewards` -- plans parsed and scored by the simulator;
* :mod:`llm.game.lakes` -- drawing a stage's lakes from its environment mixture;
* :mod:`llm.game.default` -- the embedded default model (tiny Qwen3 + game tokenizer).
"""
