"""The local LLM environment engineers: ``policy`` (this stage's checkpoint, the paper's
method) and ``base`` (the stage-0 model).

The house: :mod:`llm.engineer.prompt` (system and user turns, fitted to the context),
:mod:`llm.engineer.constrained` (the length-unbiased constrained JSON decoding), this module
(:class:`LLMEngineer` and its reasoning phase) and :mod:`llm.engineer.external` (any
OpenAI-compatible chat endpoint).

Every backend runs :func:`jaxlake.engineers.propose_with_retries`: parse, validate
(an edit of the current mixture, :func:`jaxlake.engineers.check_edit`: the edit rules, and
every added config's allowed values and fixed fields), retry with the error shown in the prompt, keep the
current environment as the last resort (a ``fallback``); the record keeps the prompt, the raw outputs, the parsed object, the
validation errors and, for constrained decoding, the top-scored values at every choice.
Malformed output never raises.

**Reasoning** (``reasoning: {enabled: auto | true | false, thinking_tokens, temperature}``;
``auto``: on when the run's policy thinks in its own words, or was taught the engineer's
analysis in pretraining, :func:`run_reasons`): the model first writes a free
analysis in a ``<think>`` block (sampled or greedy, at most ``thinking_tokens`` tokens; then
``</think>`` is forced, :func:`llm.generation.reasoning.think_phase`), and the configuration is decoded
after it (constrained or free) conditioned on that analysis. The analysis is saved in the
record (``engineer.json`` key ``analysis``) and shown in the next summaries' stage history.
``conf/engineer/policy_answer_only.yaml`` is the ablation without it. Replies of free and
external engineers are read after any think block (the last complete JSON object,
:func:`jaxlake.engineers.extract_json`: linear in the reply, bounded in depth and span, and a
failed attempt at worst), and each raw output is kept cut to
:data:`jaxlake.engineers.protocol.MAX_RAW_CHARS`.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Optional, Sequence

from jaxlake.config import ConfigError, reject_unknown
from jaxlake.engineers import Engineer, EngineerContext, Proposal, propose_with_retries, space_from_conf
from jaxlake.summaries import PARTS
from llm.engineer.constrained import ChoiceScorer, constrained_edit, constrained_edits
from llm.engineer.prompt import (
    REASONING_SYSTEM,
    build_user_prompt,
    chat_text,
    context_flags,
    default_system,
    fit_user_prompt,
)

_REASONING_KEYS = ("enabled", "thinking_tokens", "temperature", "close_text")
#: ``prompt: auto`` writes the brief prompt for models whose context is shorter than this:
#: the full one for an eight-component mixture is about 5,000 game tokens.
BRIEF_BELOW = 8192

#: The cached prompt's room for what follows it in constrained decoding (beyond an analysis):
#: the answer so far (a ~150-token edit, its rounds padded to 8 tokens) and one choice's
#: candidates packed after it (``ChoiceSession``).
CHOICE_ROOM = 448


def reasoning_settings(node: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """Validated ``engineer.reasoning``: ``enabled`` (``auto`` | true | false), ``thinking_tokens``
    (>= 1), ``temperature`` (>= 0; 0 greedy) and ``close_text`` (forced at the budget)."""
    out: dict[str, Any] = {"enabled": "auto", "thinking_tokens": 256, "temperature": 0.0, "close_text": "\n</think>\n\n"}
    node = dict(node or {})
    reject_unknown("engineer.reasoning", node, _REASONING_KEYS)
    out.update(node)
    if out["enabled"] not in ("auto", True, False):
        raise ConfigError(f"engineer.reasoning.enabled={out['enabled']!r} not in ['auto', true, false]")
    t = out["thinking_tokens"]
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise ConfigError(f"engineer.reasoning.thinking_tokens={t!r} not an integer in [1, inf)")
    if not isinstance(out["temperature"], (int, float)) or not out["temperature"] >= 0:
        raise ConfigError(f"engineer.reasoning.temperature={out['temperature']!r} not in [0, inf)")
    c = out["close_text"]
    if not isinstance(c, str) or c.count("</think>") != 1 or "<think>" in c:
        raise ConfigError(f"engineer.reasoning.close_text={c!r} must contain '</think>' exactly once and no '<think>'")
    out["temperature"] = float(out["temperature"])
    return out


def run_reasons(ctx: EngineerContext) -> bool:
    """Whether the run's policy reasons before it answers as the engineer: it thinks in its
    own words (``prompt.reasoning.enabled`` and not ``prompt.reasoning.warmstart``), or the
    shipped policy the run starts from was taught the engineer's analysis
    (:func:`taught_analysis`). A policy whose plan thinking the warm start templated (the
    shipped planner traces paths cell by cell) has learned no analysis to write, so ``auto``
    leaves the engineer's think block off for it unless it was taught one."""
    cfg = ctx.run_cfg
    if cfg is None:
        return False
    model = cfg.get("model") if isinstance(cfg, Mapping) else getattr(cfg, "model", None)
    if taught_analysis(model):
        return True
    node = cfg.get("prompt") if isinstance(cfg, Mapping) else getattr(cfg, "prompt", None)
    if node is None:
        return False
    node = node.get("reasoning") if isinstance(node, Mapping) else getattr(node, "reasoning", None)
    if node is None:
        return False
    get = (lambda k: node.get(k, False)) if isinstance(node, Mapping) else (lambda k: getattr(node, k, False))
    return bool(get("enabled")) and not bool(get("warmstart"))


def taught_analysis(model: Any) -> bool:
    """Whether ``model`` (a run's model settings) is a policy pretrained on engineer examples
    with the teacher's analysis: its folder's ``pretrain.json`` (``model.path``, or the shipped
    policy ``model.shipped``) says ``engineer.analysis`` (:mod:`jaxlake.pipeline.engineer_role`)."""
    if model is None:
        return False
    import json
    from pathlib import Path

    from llm.game.default import SHIPPED_DIRS

    get = (lambda k, d=None: model.get(k, d)) if isinstance(model, Mapping) else (lambda k, d=None: getattr(model, k, d))
    if get("path") is not None:
        record = Path(str(get("path")))
    elif get("pretrained", True):
        record = SHIPPED_DIRS.get(str(get("shipped", "novice")))
    else:
        return False
    if record is None or not (record / "pretrain.json").is_file():
        return False
    engineer = json.loads((record / "pretrain.json").read_text()).get("engineer") or {}
    return bool(engineer.get("rows")) and bool(engineer.get("analysis"))


def write_analysis(model: Any, tokenizer: Any, text: str, thinking_tokens: int, temperature: float,
                   key: Any) -> tuple[str, int, bool]:
    """The engineer's free analysis after the chat prompt ``text`` (a ``<think>\n`` is appended).

    Samples (``temperature > 0``) or decodes greedily up to ``thinking_tokens`` tokens, stopping
    at ``</think>`` or the end of the turn (:func:`llm.generation.reasoning.think_phase`). Returns
    ``(analysis, tokens, hit_budget)``: the analysis text without the tags, the number of
    tokens the model wrote, and whether the budget ran out before it closed the block.
    """
    from llm.generation import reasoning
    from llm.generation.decode import GenerationConfig, pad_prompts
    from llm.generation.stops import eos_and_pad

    eos, pad = eos_and_pad(tokenizer)
    close = reasoning.close_token_id(tokenizer)
    ids, mask = pad_prompts([tokenizer.encode(text + reasoning.THINK_OPEN + "\n", add_special_tokens=False)], pad, 64)
    cfg = GenerationConfig(max_new_tokens=int(thinking_tokens), temperature=float(temperature))
    out = reasoning.think_phase(model, ids, mask, None if temperature == 0 else key, cfg, thinking_tokens, close,
                                eos_token_ids=eos, pad_token_id=pad)
    n = int(out["lengths"][0])
    toks = out["tokens"][0, :n].tolist()
    if toks and (out["closed"][0] or out["ended"][0]):
        toks = toks[:-1]  # drop the </think> or end-of-turn token the model ended with
    # as written (special tokens shown, so an untrained model's output is visible), without
    # think tags, which would nest inside the block the answer is decoded after
    analysis = tokenizer.decode(toks, skip_special_tokens=False)
    analysis = analysis.replace(reasoning.THINK_OPEN, "").replace(reasoning.THINK_CLOSE, "").strip()
    return analysis, n, bool(out["hit_budget"][0])


class LLMEngineer(Engineer):
    """An engineer that is a local Qwen3 checkpoint: ``source`` ``policy`` (this stage's
    trained checkpoint, the paper's method) or ``base`` (the stage-0 model).

    Args:
      context: which summary parts the prompt shows (``behaviour failures env_stats
        history``; all by default).
      decoding: ``constrained`` (valid by construction) or ``free`` (sampled text).
      temperature: 0 = best-scored value / greedy text.
      retries: attempts after the first one.
      space: ``{editable, values, edits}`` of the :class:`ConfigSpace` (``edits``: what an
        answer, an edit of the current mixture, may do: :class:`jaxlake.engineers.EditRules`).
      max_new_tokens: text length for ``free`` decoding.
      max_prompt_tokens: prompt budget (default: the model's context minus the answer room).
      system: the system turn (default :data:`llm.engineer.prompt.DEFAULT_SYSTEM`, plus :data:`REASONING_SYSTEM`
        when reasoning).
      reasoning: ``{enabled: auto | true | false, thinking_tokens, temperature, close_text}``
        (:func:`reasoning_settings`): write a free analysis first (see the module doc).
      prompt: ``full``, ``brief`` (the summary, the current environment and the answer's rules
        in about a third of the tokens: :func:`llm.engineer.prompt.build_user_prompt`) or
        ``auto``: brief when the model's context is shorter than :data:`BRIEF_BELOW` tokens
        (the CPU novice and expert; Qwen3 reads the full prompt).
    """

    source = "policy"

    def __init__(
        self,
        name: Optional[str] = None,
        context: Optional[Mapping[str, Any]] = None,
        decoding: str = "constrained",
        temperature: float = 0.0,
        retries: int = 2,
        space: Optional[Mapping[str, Any]] = None,
        max_new_tokens: int = 256,
        max_prompt_tokens: Optional[int] = None,
        system: Optional[str] = None,
        reasoning: Optional[Mapping[str, Any]] = None,
        prompt: str = "auto",
        **_: Any,
    ) -> None:
        if prompt not in ("auto", "full", "brief"):
            raise ConfigError(f"engineer.prompt={prompt!r} not in ['auto', 'full', 'brief']")
        self.prompt_form = prompt
        self.reasoning = reasoning_settings(reasoning)
        self.custom_system = system is not None
        if decoding not in ("constrained", "free"):
            raise ConfigError(f"engineer.decoding={decoding!r} not in ['constrained', 'free']")
        if not temperature >= 0:
            raise ConfigError(f"engineer.temperature={temperature} not in [0, inf)")
        if int(retries) < 0:
            raise ConfigError(f"engineer.retries={retries} not in [0, inf)")
        self.name = name or self.source
        self.flags = context_flags(context)
        self.decoding, self.temperature, self.retries = decoding, float(temperature), int(retries)
        self.space_node, self.max_new_tokens = space, int(max_new_tokens)
        self.max_prompt_tokens = max_prompt_tokens
        self.system = default_system(self.parts) if system is None else system

    @property
    def parts(self) -> list[str]:
        return [p for p in PARTS if self.flags[p]]

    def brief(self, model: Any) -> bool:
        """Whether this engineer writes the brief prompt for ``model`` (``prompt``)."""
        if self.prompt_form != "auto":
            return self.prompt_form == "brief"
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", 4096)
        return int(limit) < BRIEF_BELOW

    def reasons(self, ctx: EngineerContext) -> bool:
        """Whether this proposal starts with an analysis (``auto``: the run's prompt decides)."""
        enabled = self.reasoning["enabled"]
        return run_reasons(ctx) if enabled == "auto" else bool(enabled)

    def _model(self, ctx: EngineerContext):
        if ctx.load_model is None:
            raise ConfigError(f"engineer={self.name} needs a model: the pipeline passes load_model in the context")
        return ctx.load_model(self.source)

    def prompt_turns(self, ctx: EngineerContext, model: Any, tokenizer: Any) -> tuple[str, str]:
        """The ``(system, user)`` turns this engineer sends for ``ctx``: the richest user prompt
        that fits the model's context beside the system turn and the answer room (see
        :func:`fit_user_prompt`). :meth:`propose` and notebook 03 both build it here."""
        space = space_from_conf(ctx.base, self.space_node)
        count = ChoiceScorer(model, tokenizer).count
        thinking = self.reasons(ctx)
        system = self.system + (REASONING_SYSTEM if thinking and not self.custom_system else "")
        answer_room = 64 + 8 * len(ctx.current) + 24 * len(space.editable) * max(1, space.edits.max_add)
        if self.decoding == "free":
            answer_room = max(answer_room, self.max_new_tokens)
        if thinking:
            answer_room += self.reasoning["thinking_tokens"] + count(self.reasoning["close_text"]) + 8
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", 4096)
        budget = int(self.max_prompt_tokens) if self.max_prompt_tokens else int(limit) - answer_room
        system_tokens = count(chat_text(tokenizer, system, "", thinking))
        brief = self.brief(model)

        def build(**kw):
            return build_user_prompt(ctx, self.parts, space, brief=brief, **kw)

        failures = len(((ctx.summary or {}).get("failures") or {}).get("cases", []))
        history = len((ctx.summary or {}).get("history") or [])
        user = fit_user_prompt(build, count, budget - system_tokens, failures, history)
        self.blind = None
        if ctx.summary and self.parts and user == build(max_failures=0, max_history=0, max_summary_chars=0):
            # the engineer answers blind: nothing of the summary fits beside the rest. Said in the
            # record (``blind``) and as a warning, not raised: a run goes on as configured.
            rest = count(build(max_failures=0, max_history=0, max_summary_chars=0)) + system_tokens
            field = "engineer.max_prompt_tokens" if self.max_prompt_tokens else "the model's context"
            self.blind = (f"{field}: a budget of {budget} tokens leaves no room for the summary (the system turn, "
                          f"the current environment and the answer's rules take {rest}): the engineer answers blind")
            warnings.warn(self.blind, stacklevel=2)
        return system, user

    def scorer(self, model: Any, tokenizer: Any) -> ChoiceScorer:
        """The constrained decoder's scorer for ``model``: kept while the model is the same
        object, so that the proposals one model makes in a row (self-play's) share the cached
        prompt (:meth:`ChoiceScorer.set_base`)."""
        held = getattr(self, "_scorer", None)
        if held is None or held[0] is not model:
            held = (model, ChoiceScorer(model, tokenizer))
            self._scorer = held
        return held[1]

    def propose(self, ctx: EngineerContext) -> Proposal:
        return self.propose_many([ctx])[0]

    def propose_many(self, ctxs: Sequence[EngineerContext]) -> list[Proposal]:
        """One proposal per context, each the one :meth:`propose` makes. Contexts with the same
        prompt and constrained decoding without an analysis (self-play's proposals) are written
        side by side, every round's choices in one forward pass (:func:`constrained_edits`)."""
        ctxs = list(ctxs)
        if not ctxs:
            return []
        model, tokenizer = self._model(ctxs[0])
        turns = [self.prompt_turns(c, model, tokenizer) for c in ctxs]
        texts = [chat_text(tokenizer, system, user, self.reasons(c)) for c, (system, user) in zip(ctxs, turns)]
        ready: list = [None] * len(ctxs)
        side_by_side = (len(ctxs) > 1 and self.decoding == "constrained" and len(set(texts)) == 1
                        and not any(self.reasons(c) for c in ctxs)
                        and len({len(c.current) for c in ctxs}) == 1)
        if side_by_side:
            scorer = self.scorer(model, tokenizer)
            scorer.set_base(texts[0], room=CHOICE_ROOM)
            space = space_from_conf(ctxs[0].base, self.space_node)
            ready = constrained_edits(scorer.session(len(ctxs)).scores_many, texts, space, len(ctxs[0].current),
                                      [c.rng(7) for c in ctxs], self.temperature)
        return [self._propose_one(c, model, tokenizer, t, r) for c, t, r in zip(ctxs, turns, ready)]

    def _propose_one(self, ctx: EngineerContext, model: Any, tokenizer: Any, turns: tuple[str, str],
                     ready: Optional[tuple[str, list]]) -> Proposal:
        space = space_from_conf(ctx.base, self.space_node)
        scorer = self.scorer(model, tokenizer)
        thinking = self.reasons(ctx)
        system, user = turns
        rng = ctx.rng(7)
        traces: list = []
        analyses: list = []

        def ask(prompt: str, attempt: int) -> str:
            if ready is not None and attempt == 0:  # written side by side (propose_many)
                traces.append(ready[1])
                return ready[0]
            text = chat_text(tokenizer, system, prompt, thinking)
            head = ""
            if thinking:
                import jax

                from llm.generation.reasoning import THINK_OPEN

                key = jax.random.PRNGKey(int(ctx.seed) * 1000 + int(ctx.stage) * 10 + attempt + 5)
                analysis, n_tok, hit = write_analysis(model, tokenizer, text, self.reasoning["thinking_tokens"],
                                                      self.reasoning["temperature"], key)
                analyses.append({"attempt": attempt, "analysis": analysis, "tokens": n_tok, "hit_budget": hit})
                head = f"{THINK_OPEN}\n{analysis}{self.reasoning['close_text']}"
                text += head
            if self.decoding == "constrained":
                # the prompt's KV once; the analysis, the answer so far and the candidates run on it
                scorer.set_base(chat_text(tokenizer, system, prompt, thinking),
                                room=CHOICE_ROOM + (self.reasoning["thinking_tokens"] if thinking else 0))
                session = scorer.session(1)
                out, choices = constrained_edit(lambda t, c: session.scores_many([(t, c)])[0], text, space,
                                                len(ctx.current), rng, self.temperature)
                traces.append(choices)
                return head + out
            return head + self._free(model, tokenizer, text, ctx, attempt)

        proposal = propose_with_retries(ask, user, ctx, self.retries, space=space)
        proposal.record.update(
            {"system": system, "decoding": self.decoding, "context_parts": self.parts, "source": self.source,
             "reasoning": thinking, "prompt_form": "brief" if self.brief(model) else "full"}
        )
        if self.blind:
            proposal.record["blind"] = self.blind
        if traces:
            proposal.record["choices"] = traces[-1]
        if analyses:
            proposal.record["analysis"] = analyses[-1]["analysis"]
            proposal.record["analyses"] = analyses
            proposal.record["thinking_budget"] = self.reasoning["thinking_tokens"]
        return proposal

    def _free(self, model, tokenizer, text: str, ctx: EngineerContext, attempt: int) -> str:
        import jax

        from llm.generation.decode import GenerationConfig
        from llm.generation.text import generate

        cfg = GenerationConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature)
        key = jax.random.PRNGKey(int(ctx.seed) * 1000 + int(ctx.stage) * 10 + attempt)
        return generate(model, tokenizer, [text], cfg, key=key).texts[0]


class PolicyEngineer(LLMEngineer):
    """The current (just trained) policy checkpoint designs its next environment."""

    source = "policy"


class BaseEngineer(LLMEngineer):
    """The stage-0 (untrained) model as the engineer: isolates the effect of training."""

    source = "base"
