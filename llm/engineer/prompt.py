"""What an LLM engineer reads: its system and user turns, in the chat format, within a token budget.

The system turn (:func:`default_system`) names only the summary parts the prompt shows. The
user turn (:func:`build_user_prompt`) is the stage summary rendered by
:func:`jaxlake.summaries.render_summary` with each context part switchable in
``conf/engineer/<name>.yaml`` (``context: {behaviour, failures, env_stats, history}``, for
ablations), the current environment as numbered components and what may be answered: an edit of it (keep,
re-weight, drop, add, replace: :mod:`jaxlake.engineers.edits`, with an example) and the
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
from jaxlake.summaries import PARTS, brief_config, render_summary

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
        "propose the next stage's environment as a JSON edit of the current one (keep what works, shift weight, "
        "drop or add configurations). Use only the allowed values and "
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


def space_rules(space: ConfigSpace) -> str:
    """The cross-field rules an added config must meet (what :class:`LakeConfig` and
    :func:`jaxlake.engineers.check_in_space` check; the rules are in docs/rules.md), so that a
    free-text engineer does not have to learn them from rejections."""
    lines = ["- each agent needs its own frozen start and goal cell: "
             "2 * num_agents <= height * width - round(hole_density * height * width)"]
    if "min_dist" in space.editable or "max_dist" in space.editable:
        lines.append("- 1 <= min_dist <= height * width - 1, min_dist <= max_dist (null: no bound)")
    r = space.edits
    lines.append(f"- an edit drops at most {r.max_drop} and adds at most {r.max_add} component(s); the mixture "
                 f"has at most {r.max_components}")
    return "Rules:\n" + "\n".join(lines)


#: What each kind of edit does, as the prompt states it (``{...}`` filled from the rules).
_EDIT_LINES = {
    "keep": '{{"edit": "keep"}}: train on the current environment again',
    "reweight": '{{"edit": "reweight", "weights": [w0, ..., w{last}]}}: new relative weights, one per component '
                '(every component keeps at least {floor} of the mass)',
    "drop": '{{"edit": "drop", "drop": i}}: remove component i (the others keep their weights)',
    "add": '{{"edit": "add", "add": [{{"weight": share, "config": {{...}}}}]}}: add new configs, each with its '
           'share of the new mixture (the current components keep at least {keep} between them)',
    "replace": '{{"edit": "replace", "drop": i, "add": [{{"weight": share, "config": {{...}}}}]}}: remove '
               'component i and add new configs',
}


def describe_edits(ctx: EngineerContext, space: ConfigSpace) -> str:
    """What an answer may be: the kinds of edit the rules allow on the current mixture, each
    with its form, and one example."""
    r = space.edits
    n = len(ctx.current)
    lines = [f"- {_EDIT_LINES[k].format(last=n - 1, floor=r.floor, keep=r.min_keep)}" for k in r.kinds(n)]
    example = space.snap(ctx.base)
    fields = {k: v for k, v in example.to_dict().items() if k in space.editable}
    shown = "{" + ", ".join(f"{json.dumps(k)}: {format_value(v)}" for k, v in fields.items()) + "}"
    kind = "add" if "add" in r.kinds(n) else "replace"
    drop = ', "drop": 0' if kind == "replace" else ""
    lines.append('"weights" may also come with drop, add and replace. A config\'s missing fields keep the values '
                 f'of the heaviest component. Example: {{"edit": "{kind}"{drop}, "add": [{{"weight": '
                 f'{format_value(r.shares[len(r.shares) // 2])}, "config": {shown}}}]}}')
    return "\n".join(lines)


def describe_current(ctx: EngineerContext, space: ConfigSpace) -> str:
    """The current mixture, one numbered line a component (``#i``: the index an edit names):
    its weight and its editable fields."""
    lines = []
    for i, (w, c) in enumerate(ctx.current):
        fields = {k: v for k, v in c.to_dict().items() if k in space.editable}
        lines.append(f"#{i} weight {w:.3f}: " + json.dumps(fields))
    return "\n".join(lines)


def brief_answer(ctx: EngineerContext, space: ConfigSpace) -> str:
    """What an answer may be, in two lines (the brief prompt): the edit kinds the rules allow
    here and each editable field's range. Constrained decoding enforces the rest."""
    kinds = space.edits.kinds(len(ctx.current))
    ranges = []
    for name in space.editable:
        vals = space.values[name]
        ranges.append(f"{name} {format_value(vals[0])}-{format_value(vals[-1])}" if len(vals) > 1
                      else f"{name} {format_value(vals[0])}")
    return ("## Answer\nOne JSON edit of the current environment (" + ", ".join(kinds) + "); configs set "
            + ", ".join(ranges) + ".")


def build_user_prompt(
    ctx: EngineerContext,
    parts: Sequence[str],
    space: ConfigSpace,
    max_failures: Optional[int] = None,
    max_history: Optional[int] = None,
    max_summary_chars: Optional[int] = None,
    brief: bool = False,
) -> str:
    """The user turn: summary parts, the current environment (numbered components) and what
    an answer may be (an edit of it: :func:`describe_edits`).

    ``brief``: the summary in its brief form (:func:`jaxlake.summaries.render_summary`), a
    component a short line and the answer in two lines (:func:`brief_answer`): about a third
    of the tokens, for a model whose context cannot hold the full prompt (the CPU novice's
    2,048 tokens)."""
    summary = dict(ctx.summary or {})
    if max_failures is not None and summary.get("failures"):
        f = dict(summary["failures"])
        f["cases"] = list(f.get("cases", []))[:max_failures]
        summary["failures"] = f
    if max_history is not None:
        summary["history"] = list(summary.get("history") or [])[-max_history:] if max_history > 0 else []
    text = render_summary(summary, parts, brief=brief) if summary and parts else ""
    if max_summary_chars is not None and len(text) > max_summary_chars:
        text = text[: max(max_summary_chars, 0)] + "\n(summary cut)"
    n = len(ctx.current)
    if brief:
        current = "\n".join(f"#{i} weight {w:.3f}: {brief_config(c.to_dict())}" for i, (w, c) in enumerate(ctx.current))
        chunks = [f"Stage {ctx.stage} has finished. Propose stage {ctx.stage + 1}'s environment.", text,
                  f"## Current environment\n{current}", brief_answer(ctx, space)]
        return "\n\n".join(c for c in chunks if c)
    fixed = {k: v for k, v in ctx.base.to_dict().items() if k not in space.editable}
    chunks = [
        f"Stage {ctx.stage} of training has finished. Propose the environment of stage {ctx.stage + 1}.",
        text,
        f"## Current environment ({n} component{'s' if n != 1 else ''})\n{describe_current(ctx, space)}",
        f"## Answer\nOne JSON object: an edit of the current environment, naming components by their #.\n"
        f"{describe_edits(ctx, space)}\nFields you may set in a config, with their allowed values:\n"
        f"{describe_space(space)}\nFixed fields (keep them): {json.dumps(fixed)}\n{space_rules(space)}",
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
