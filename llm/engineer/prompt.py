"""What an LLM engineer reads: its system and user turns, in the chat format, within a token budget.

The system turn (:func:`default_system`) names only the summary parts the prompt shows. The
user turn (:func:`build_user_prompt`) is the stage summary rendered by
:func:`jaxlake.summaries.render_summary` with each context part switchable in
``conf/engineer/<name>.yaml`` (``context: {behaviour, failures, env_stats, history}``, for
ablations), the current environment as JSON and the schema of what may be proposed: the
editable fields with their allowed values (a :class:`jaxlake.engineers.ConfigSpace`).

The user turn also states the cross-field rules of the space (:func:`space_rules`), and
:func:`fit_user_prompt` keeps the richest prompt that fits a budget (fewer failure cases
first, then a shorter history, then a cut summary). :mod:`llm.engineer.local` (local models) and
:mod:`llm.engineer.external` (an HTTP endpoint) both build their prompts here.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Optional, Sequence

from jaxlake.config import reject_unknown
from jaxlake.engineers import ConfigSpace, EngineerContext, format_value
from jaxlake.mixture import mixture_to_obj
from jaxlake.summaries import PARTS, render_summary

#: How the system turn names each summary part (only the parts the prompt shows are named).
_PART_NAMES = {"behaviour": "the policy's behaviour", "failures": "its failure cases",
               "env_stats": "the environment statistics", "history": "the stage history"}


def default_system(parts: Sequence[str] = PARTS) -> str:
    """The system turn for an engineer whose prompt shows ``parts`` of the summary (an
    ablation without a part must not be told it has it)."""
    names = [_PART_NAMES[p] for p in PARTS if p in parts]
    if not names:
        reads = "you read the current configuration"
    elif len(names) == 1:
        reads = f"you read a summary of {names[0]}"
    else:
        reads = f"you read a summary of {', '.join(names[:-1])} and {names[-1]}"
    aim = "and target the failures you see. " if "failures" in parts else ""
    return (
        "You are the environment engineer of a training curriculum for a policy that plans paths for "
        f"several agents on a frozen lake grid. After each stage {reads}, and you "
        "propose the configuration of the next stage as a JSON object. Use only the allowed values and "
        "follow the rules the prompt states. Make the environment harder when the success rate is high "
        f"and easier when it is low{', ' + aim if aim else '. '}Reply with a single JSON object and nothing else."
    )


DEFAULT_SYSTEM = default_system(PARTS)
#: Added to the system turn when the engineer reasons first.
REASONING_SYSTEM = (
    " Before the JSON object, think in a <think> block: what does the policy fail at, why, and "
    "which change of the environment would teach it most? Then close the block and answer."
)


def context_flags(context: Optional[Mapping[str, Any]]) -> dict[str, bool]:
    """``engineer.context`` as ``{part: shown}`` (every part shown unless switched off)."""
    flags = {p: True for p in PARTS}
    context = dict(context or {})
    reject_unknown("engineer.context", context, PARTS)
    for k, v in context.items():
        flags[k] = bool(v)
    return flags


def describe_space(space: ConfigSpace) -> str:
    """One line per editable field with its allowed values."""
    lines = []
    for name in space.editable:
        vals = space.values[name]
        shown = ", ".join(format_value(v) for v in vals)
        if len(vals) > 12 and all(isinstance(v, int) for v in vals):
            shown = f"an integer from {vals[0]} to {vals[-1]}"
        elif len(vals) > 12:
            shown = f"one of {', '.join(format_value(v) for v in vals[:4])}, ..., {format_value(vals[-1])}"
        else:
            shown = f"one of {shown}"
        lines.append(f"- {name}: {shown}")
    return "\n".join(lines)


def space_rules(space: ConfigSpace, max_components: int = 1) -> str:
    """The cross-field rules a proposal must meet (what :class:`LakeConfig` and
    :func:`jaxlake.engineers.check_in_space` check; the rules are in docs/rules.md), so that a
    free-text engineer does not have to learn them from rejections."""
    lines = ["- each agent needs its own frozen start and goal cell: "
             "2 * num_agents <= height * width - round(hole_density * height * width)"]
    if "min_dist" in space.editable or "max_dist" in space.editable:
        lines.append("- 1 <= min_dist <= height * width - 1, min_dist <= max_dist (null: no bound)")
    n = int(max_components)
    lines.append(f"- at most {n} component{'s' if n != 1 else ''}" + (", weights > 0" if n > 1 else ""))
    return "Rules:\n" + "\n".join(lines)


def build_user_prompt(
    ctx: EngineerContext,
    parts: Sequence[str],
    space: ConfigSpace,
    max_components: int = 1,
    max_failures: Optional[int] = None,
    max_history: Optional[int] = None,
    max_summary_chars: Optional[int] = None,
) -> str:
    """The user turn: summary parts, the current environment and the answer schema."""
    summary = dict(ctx.summary or {})
    if max_failures is not None and summary.get("failures"):
        f = dict(summary["failures"])
        f["cases"] = list(f.get("cases", []))[:max_failures]
        summary["failures"] = f
    if max_history is not None:
        summary["history"] = list(summary.get("history") or [])[-max_history:] if max_history > 0 else []
    text = render_summary(summary, parts) if summary and parts else ""
    if max_summary_chars is not None and len(text) > max_summary_chars:
        text = text[: max(max_summary_chars, 0)] + "\n(summary cut)"
    current = json.dumps({"mixture": mixture_to_obj(ctx.current)})
    fixed = {k: v for k, v in ctx.base.to_dict().items() if k not in space.editable}
    if max_components > 1:
        fmt = (
            '{"mixture": [{"weight": w, "config": {<fields>}}, ...]} with up to '
            f"{max_components} components (weights are normalised)"
        )
    else:
        fmt = '{"height": ..., "width": ..., ...} with the fields below'
    chunks = [
        f"Stage {ctx.stage} of training has finished. Propose the environment of stage {ctx.stage + 1}.",
        text,
        f"## Current environment\n{current}",
        f"## Answer\nOne JSON object {fmt}. Fields you may set, with their allowed values:\n{describe_space(space)}\n"
        f"Fixed fields (keep them): {json.dumps(fixed)}\n{space_rules(space, max_components)}",
    ]
    return "\n\n".join(c for c in chunks if c)


def chat_text(tokenizer: Any, system: str, user: str, thinking: bool = False) -> str:
    """The chat-formatted prompt ending with the assistant turn's opening (Qwen3: with an
    empty think block unless ``thinking``)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=bool(thinking))
    except (ValueError, AttributeError, TypeError):
        # no chat template: a plain transcript
        head = f"{system}\n\n" if system else ""
        return f"{head}{user}\n\nAnswer:\n"


def fit_user_prompt(
    build: Callable[..., str], count: Callable[[str], int], budget: int, num_failures: int, num_history: int
) -> str:
    """The richest prompt within ``budget`` tokens: fewer failure cases first, then a
    shorter history, then a cut summary."""
    for k in range(num_failures, -1, -1):
        text = build(max_failures=k)
        if count(text) <= budget:
            return text
    for h in (3, 1, 0):
        if h >= num_history:
            continue
        text = build(max_failures=0, max_history=h)
        if count(text) <= budget:
            return text
    chars = 4000
    while chars > 0:
        text = build(max_failures=0, max_history=0, max_summary_chars=chars)
        if count(text) <= budget:
            return text
        chars //= 2
    return build(max_failures=0, max_history=0, max_summary_chars=0)
