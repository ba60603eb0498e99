"""Lake -> chat-formatted policy prompt, and prompts -> left-padded token ids.

The wording lives in one place, ``conf/prompt/<name>.yaml`` (``default`` and ``compact``),
read into a :class:`PromptConfig`. A prompt is a list of chat messages (an optional system
turn with the rules, a user turn with the rendered grid, each agent's position and goal and
the answer format) passed through the tokenizer's own chat template
(``apply_chat_template(..., add_generation_prompt=True)``), so the same code serves the
embedded game tokenizer and a real Qwen3 tokenizer.

Public API:

* :class:`PromptConfig`, :func:`load_prompt_config`
* :func:`build_messages` (one lake -> messages), :func:`render_prompt` (-> chat text)
* :func:`render_prompts` (a batched lake -> list of chat texts)
* :func:`encode_prompts` (texts -> ``[N, P]`` left-padded ids and mask)
* :func:`completion_ids` (a completion text -> ids ending with the end-of-turn token)
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np

from jaxlake.config import reject_unknown
from jaxlake.text import format_plan, render_text
from jaxlake.types import Lake
from jaxlake.conf import CONF_DIR
from llm.generation.reasoning import ReasoningConfig

#: ``conf/prompt``, shipped in the package (the wording's home).
PROMPT_DIR = CONF_DIR / "prompt"

_USER_FIELDS = ("grid", "holes", "height", "width", "num_agents", "max_steps", "letters", "agents", "slip_note", "example",
                "slip_prob")
_CELL_FIELDS = ("row", "col")
_AGENT_FIELDS = ("agent", "row", "col", "goal", "goal_row", "goal_col")


class PromptError(ValueError):
    """A prompt template or setting is invalid; the message names the field."""


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """Prompt wording (see ``conf/prompt/default.yaml`` for the placeholders).

    Attributes:
      system: system turn (the rules); skipped when ``use_system`` is False or it is empty.
      user: user turn template; placeholders ``{grid} {holes} {height} {width} {num_agents}
        {max_steps} {letters} {agents} {slip_note} {example} {slip_prob}``. ``{holes}`` is
        every hole cell, row-major, each written by ``cell`` (empty on a lake without holes).
      agent_line: one line per agent, joined into ``{agents}``; placeholders ``{agent} {row}
        {col} {goal} {goal_row} {goal_col}``.
      cell: how one cell is written in ``{holes}`` and in the warm start's path traces
        (``prompt.reasoning.warmstart_style: paths``); placeholders ``{row} {col}``. The
        ``planner`` prompt writes `` {row}{col}`` (``" 23"``), one token per digit, which is
        unambiguous on lakes up to 10x10.
      slip_note: inserted as ``{slip_note}`` when the lake is slippery (else empty);
        placeholder ``{slip_prob}``.
      chat_template_kwargs: extra keywords of ``apply_chat_template`` (``enable_thinking``).
      use_system: whether to send the system turn.
      reasoning: :class:`llm.generation.reasoning.ReasoningConfig` (a mapping is converted): think
        before answering, the thinking budget (``conf/prompt/reasoning.yaml``); off by default.
    """

    system: str = ""
    user: str = "{grid}\n{agents}"
    agent_line: str = "{agent}: {row} {col} {goal}: {goal_row} {goal_col}"
    cell: str = " {row} {col}"
    slip_note: str = ""
    chat_template_kwargs: tuple = (("enable_thinking", False),)
    use_system: bool = True
    reasoning: ReasoningConfig = ReasoningConfig()

    def __post_init__(self) -> None:
        object.__setattr__(self, "reasoning", ReasoningConfig.from_value(self.reasoning))
        kwargs = self.chat_template_kwargs
        if isinstance(kwargs, Mapping):
            object.__setattr__(self, "chat_template_kwargs", tuple(sorted(dict(kwargs).items())))
        _check_template("prompt.user", self.user, _USER_FIELDS)
        _check_template("prompt.agent_line", self.agent_line, _AGENT_FIELDS)
        _check_template("prompt.cell", self.cell, _CELL_FIELDS)
        _check_template("prompt.slip_note", self.slip_note, ("slip_prob",))
        _check_template("prompt.system", self.system, ())

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "PromptConfig":
        """From a mapping (a Hydra node or parsed YAML); unknown keys are an error."""
        values = dict(values)
        reject_unknown("prompt", values, (f.name for f in dataclasses.fields(cls)), PromptError)
        if "chat_template_kwargs" in values and values["chat_template_kwargs"] is not None:
            values["chat_template_kwargs"] = dict(values["chat_template_kwargs"])
        elif "chat_template_kwargs" in values:
            values["chat_template_kwargs"] = {}
        return cls(**values)

    @property
    def template_kwargs(self) -> dict[str, Any]:
        return dict(self.chat_template_kwargs)


def _check_template(name: str, template: str, allowed: Sequence[str]) -> None:
    """Raise :class:`PromptError` when ``template`` names a placeholder outside ``allowed``."""
    import string

    if not isinstance(template, str):
        raise PromptError(f"{name} must be a string, got {type(template).__name__}")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as err:
        raise PromptError(f"{name} is not a valid format string: {err}") from None
    for field in fields:
        if field not in allowed:
            raise PromptError(f"{name} uses unknown placeholder {{{field}}}; allowed: {sorted(allowed)}")


def default_prompt_name() -> str:
    """The prompt ``python -m jaxlake.run`` uses unless told otherwise: the one the default
    ``start`` of ``conf/config.yaml`` sets (``conf/start/<name>.yaml``: ``override /prompt``),
    else the ``prompt`` choice of that defaults list."""
    from omegaconf import OmegaConf

    def defaults(path: Path) -> list:
        return list(OmegaConf.to_container(OmegaConf.load(path)).get("defaults", []))

    chosen = "default"
    for entry in defaults(PROMPT_DIR.parent / "config.yaml"):
        if isinstance(entry, dict) and "prompt" in entry:
            chosen = str(entry["prompt"])
        if isinstance(entry, dict) and "start" in entry:
            for inner in defaults(PROMPT_DIR.parent / "start" / f"{entry['start']}.yaml"):
                if isinstance(inner, dict) and "override /prompt" in inner:
                    return str(inner["override /prompt"])
    return chosen


def load_prompt_config(name_or_path: str | os.PathLike = "default") -> PromptConfig:
    """Read ``conf/prompt/<name>.yaml`` (or a YAML file path) into a :class:`PromptConfig`."""
    from omegaconf import OmegaConf

    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = PROMPT_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise PromptError(f"prompt config {str(path)!r} not found (choices in {PROMPT_DIR}: "
                          f"{sorted(p.stem for p in PROMPT_DIR.glob('*.yaml'))})")
    values = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    values.pop("defaults", None)
    return PromptConfig.from_dict(values)


# ----------------------------------------------------------------------------- rendering
def _example_plan(num_agents: int) -> str:
    """A short well-formed plan for the answer-format example (``A: R R D`` ...)."""
    patterns = ((4, 4, 2), (2, 3), (1, 1, 4), (3, 2))
    rows = []
    for i in range(num_agents):
        rows.append(list(patterns[i % len(patterns)]) + [0] * (3 - len(patterns[i % len(patterns)])))
    return format_plan(np.asarray(rows, dtype=np.int32), num_agents)


def build_messages(lake: Lake, config: PromptConfig) -> list[dict[str, str]]:
    """Chat messages for one unbatched lake."""
    n = int(np.asarray(lake.num_agents))
    starts = np.asarray(lake.starts)
    goals = np.asarray(lake.goals)
    region = np.asarray(lake.region)
    height = int(region.any(axis=1).sum())
    width = int(region.any(axis=0).sum())
    slip = float(np.asarray(lake.slip_prob))
    lines = []
    for i in range(n):
        lines.append(
            config.agent_line.format(
                agent=chr(ord("A") + i),
                row=int(starts[i, 0]),
                col=int(starts[i, 1]),
                goal=chr(ord("a") + i),
                goal_row=int(goals[i, 0]),
                goal_col=int(goals[i, 1]),
            )
        )
    slip_text = f"{slip:.2f}".rstrip("0").rstrip(".") if slip > 0 else "0"
    holes = np.asarray(lake.holes)[:height, :width]
    user = config.user.format(
        grid=render_text(lake),
        holes="".join(config.cell.format(row=int(r), col=int(c)) for r, c in np.argwhere(holes)),
        height=height,
        width=width,
        num_agents=n,
        max_steps=int(np.asarray(lake.max_steps)),
        letters=", ".join(chr(ord("A") + i) for i in range(n)),
        agents="\n".join(lines),
        slip_note=config.slip_note.format(slip_prob=slip_text) if slip > 0 else "",
        example=_example_plan(n),
        slip_prob=slip_text,
    )
    messages = []
    if config.use_system and config.system:
        messages.append({"role": "system", "content": config.system})
    messages.append({"role": "user", "content": user})
    return messages


def render_prompt(lake: Lake, tokenizer: Any, config: PromptConfig) -> str:
    """Chat text of one lake's prompt, ending with the assistant turn's opening."""
    return tokenizer.apply_chat_template(
        build_messages(lake, config), tokenize=False, add_generation_prompt=True, **config.template_kwargs
    )


def unbatch(lakes: Lake) -> list[Lake]:
    """Split a batched lake (leading axis on every leaf) into host-side single lakes."""
    host = jax.tree_util.tree_map(np.asarray, lakes)
    n = host.num_agents.shape[0]
    return [jax.tree_util.tree_map(lambda x, i=i: x[i], host) for i in range(n)]


def render_prompts(lakes: Lake, tokenizer: Any, config: PromptConfig) -> list[str]:
    """Chat texts for every lake of a batch (leading axis ``N``)."""
    return [render_prompt(lake, tokenizer, config) for lake in unbatch(lakes)]


# ----------------------------------------------------------------------------- tokens
def encode_prompts(
    texts: Sequence[str], tokenizer: Any, length: Optional[int] = None
) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize chat texts, left-padded to a common length.

    Args:
      texts: chat texts from :func:`render_prompt` (special tokens are in the text).
      tokenizer: a ``transformers`` tokenizer (``pad_token_id`` used for padding).
      length: pad to this many tokens (static shapes for ``jit``); ``None``: the longest.

    Returns:
      ``(ids [N, P] int32, mask [N, P] bool)``, real tokens right-aligned.

    Raises:
      PromptError: a prompt is longer than ``length`` (names the length and the limit).
    """
    encoded = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    longest = max((len(e) for e in encoded), default=0)
    if length is None:
        length = longest
    if longest > length:
        raise PromptError(f"a prompt has {longest} tokens, more than max_prompt_tokens={length}; raise it")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = np.full((len(texts), length), pad, dtype=np.int32)
    mask = np.zeros((len(texts), length), dtype=bool)
    for i, e in enumerate(encoded):
        if e:
            ids[i, length - len(e):] = e
            mask[i, length - len(e):] = True
    return ids, mask


def end_of_turn_id(tokenizer: Any) -> int:
    """The token that ends an assistant turn (``<|im_end|>`` for Qwen chat models)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise PromptError("the tokenizer has no eos_token_id; set one (Qwen chat: <|im_end|>)")
    return int(eos)


def completion_ids(text: str, tokenizer: Any) -> list[int]:
    """Token ids of an assistant answer as the policy should write it: text then end of turn."""
    return list(tokenizer.encode(text, add_special_tokens=False)) + [end_of_turn_id(tokenizer)]
