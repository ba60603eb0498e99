"""The engineer's role as supervised examples: a context's prompt and the teacher's answer,
written exactly as the policy engineer reads and answers at a stage's end.

* the **prompt** is :meth:`llm.engineer.local.LLMEngineer.prompt_turns` of the context (the
  same system turn, summary parts, budget fitting and chat template as a run);
* the **answer** is the teacher's edit (:func:`jaxlake.engineers.teacher.teacher_edit`) in the
  JSON that constrained decoding writes (:func:`answer_text`): the same keys, order, spacing
  and number spelling, so the model's preference at each choice point of
  :func:`llm.engineer.constrained.constrained_edit` is what it learned.
  :func:`check_answer` replays constrained decoding with a scorer that prefers the answer's
  next characters and fails unless it writes the answer back, character for character.

:func:`make_examples` turns a :class:`jaxlake.engineers.contexts.ContextPool` into examples;
:func:`example_rows` into :class:`llm.rl.batches.TokenBatch` rows (the prompt left-padded to
``P``, the answer and the end-of-turn token right-padded to ``T``, loss on the answer only),
the rows the warm start adds to its plan batches when pretraining teaches the role.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from jaxlake.engineers import ConfigSpace, format_value
from jaxlake.engineers.edits import Edit
from llm.engineer.constrained import constrained_edit
from llm.engineer.prompt import chat_text
from llm.generation.stops import eos_and_pad
from llm.rl.batches import TokenBatch


def _config_text(edit_config: Any, space: ConfigSpace) -> str:
    fields = edit_config.to_dict()
    return "{" + ", ".join(f"{json.dumps(k)}: {format_value(fields[k])}" for k in space.editable) + "}"


def answer_text(edit: Edit, space: ConfigSpace) -> str:
    """``edit`` as constrained decoding writes it (keys in its order, editable fields only)."""
    out = '{"edit": "' + edit.kind + '"'
    if edit.kind == "keep":
        return out + "}"
    if edit.kind == "reweight":
        return out + ', "weights": [' + ", ".join(format_value(float(w)) for w in edit.weights) + "]}"
    if edit.kind in ("drop", "replace"):
        out += f', "drop": {int(edit.drop[0])}'
        if edit.kind == "drop":
            return out + "}"
    adds = [f'{{"weight": {format_value(float(w))}, "config": {_config_text(c, space)}}}' for w, c in edit.add]
    return out + ', "add": [' + ", ".join(adds) + "]}"


def check_answer(answer: str, space: ConfigSpace, components: int) -> None:
    """Replay constrained decoding toward ``answer``; raise ``ValueError`` unless it writes
    exactly ``answer`` (a value off the space's grid, a share it does not offer, a kind its
    rules forbid for ``components`` components)."""
    def score(text: str, cands: Sequence[str]) -> np.ndarray:
        sofar = text[len("P"):]
        return np.asarray([0.0 if answer.startswith(sofar + c) else -1e9 for c in cands])

    written, _ = constrained_edit(score, "P", space, components, np.random.default_rng(0), 0.0)
    if written != answer:
        raise ValueError(f"constrained decoding cannot write the teacher's answer {answer!r} (it writes {written!r})")


def make_examples(pool: Any, engineer: Any, model: Any, tokenizer: Any, indices: Sequence[int],
                  progress: Optional[Any] = None) -> list[dict]:
    """Examples of contexts ``indices`` of ``pool``: ``{"index", "stage", "prompt" (the chat
    text), "answer", "read" (what the teacher read: success, rates, level, focus), "shows"
    (whether the prompt holds the line the teacher read: a prompt cut to fit the model's context
    may not, and then the example teaches a prior, not a reading)}``.

    An engineer that reasons (``engineer.reasoning.enabled: true``) reads the prompt with its
    ``<think>`` block opened, and the answer is the teacher's analysis
    (:func:`jaxlake.engineers.teacher.teacher_analysis`), the block's close and the JSON: what
    :class:`llm.engineer.local.LLMEngineer` writes and then decodes after it."""
    from jaxlake.engineers import space_from_conf
    from jaxlake.engineers.teacher import teacher_analysis
    from llm.generation.reasoning import THINK_OPEN

    out = []
    for i in indices:
        ctx, label = pool.context(int(i))
        thinking = engineer.reasons(ctx)
        system, user = engineer.prompt_turns(ctx, model, tokenizer)
        space = space_from_conf(ctx.base, engineer.space_node)
        answer = answer_text(label["edit"], space)
        check_answer(answer, space, len(ctx.current))
        prompt = chat_text(tokenizer, system, user, thinking)
        if thinking:
            prompt += THINK_OPEN + "\n"
            answer = teacher_analysis(label["read"]) + engineer.reasoning["close_text"] + answer
        read = {k: v for k, v in label["read"].items()}
        line = "on the training environment (" if read.get("where") == "current_env" else "## Policy behaviour"
        out.append({"index": int(i), "stage": ctx.stage, "prompt": prompt, "answer": answer, "read": read,
                    "kind": label["edit"].kind, "shows": line in prompt})
        if progress is not None:
            progress.update(1)
    return out


def example_rows(examples: Sequence[Mapping[str, Any]], tokenizer: Any, prompt_len: int,
                 answer_len: int) -> TokenBatch:
    """``TokenBatch`` rows of ``examples`` (numpy): prompts left-padded (cut from the left when
    longer than ``prompt_len``), answers plus the end-of-turn token right-padded to
    ``answer_len``; weights are the answer tokens over their count in these rows."""
    eos, pad = eos_and_pad(tokenizer)
    end = tokenizer.eos_token_id if getattr(tokenizer, "eos_token_id", None) is not None else eos[0]
    n = len(examples)
    ids = np.full((n, prompt_len), pad, np.int32)
    pmask = np.zeros((n, prompt_len), bool)
    toks = np.full((n, answer_len), pad, np.int32)
    mask = np.zeros((n, answer_len), bool)
    for r, ex in enumerate(examples):
        p = tokenizer.encode(ex["prompt"], add_special_tokens=False)[-prompt_len:]
        a = (tokenizer.encode(ex["answer"], add_special_tokens=False) + [int(end)])[:answer_len]
        ids[r, prompt_len - len(p):] = p
        pmask[r, prompt_len - len(p):] = True
        toks[r, : len(a)] = a
        mask[r, : len(a)] = True
    weights = mask / max(mask.sum(), 1)
    return TokenBatch(prompt_ids=ids, prompt_mask=pmask, tokens=toks, mask=mask, weights=weights.astype(np.float32))
