"""LLM engineers: constrained decoding from a random tiny model always yields valid configs;
scoring matches a direct forward pass; prompt parts switchable; free decoding falls back."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlake.config import LakeConfig
from jaxlake.engineers import ConfigSpace, EngineerContext, check_edit, edit_from_obj
from jaxlake.mixture import Mixture
from llm.engineer.constrained import ChoiceScorer, choice_logprobs, constrained_edit
from llm.engineer.local import BaseEngineer, PolicyEngineer
from llm.engineer.prompt import build_user_prompt, chat_text, fit_user_prompt
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM
from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer

BASE = LakeConfig(height=5, width=5, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=16)


@pytest.fixture(scope="module")
def tokenizer():
    return to_hf_tokenizer(build_game_tokenizer())


def random_model(tokenizer, seed):
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048)
    return Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(seed))


@pytest.fixture(scope="module")
def scorers(tokenizer):
    return [ChoiceScorer(random_model(tokenizer, s), tokenizer) for s in (0, 1)]


def test_scores_match_direct_forward(tokenizer, scorers):
    scorer = scorers[0]
    model = nnx.merge(scorer.graphdef, scorer.state)
    prefix, cands = '<|im_start|>user\nPropose.<|im_end|>\n<|im_start|>assistant\n{"height": ', ["4, ", "12, ", '"x"}']
    context, suffixes = scorer.split(prefix, cands)
    got = scorer.token_logprobs(context, suffixes)
    base = scorer.encode(prefix)
    fulls = [scorer.encode(prefix + c) for c in cands]
    assert [context + x for x in suffixes] == fulls

    def lcp(a, b):
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i

    shared = min(lcp(base, f) for f in fulls)
    assert shared >= len(base) - 2  # the candidates only touch the last prefix tokens
    # one plain causal forward of the right-padded full sequences (padding after a sequence
    # cannot change its logits)
    width = max(len(f) for f in fulls)
    ids = jnp.asarray([f + [0] * (width - len(f)) for f in fulls])
    logits, _ = model(ids)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    assert len(context) == shared
    for b, (f, g) in enumerate(zip(fulls, got)):
        want = [float(logp[b, t - 1, f[t]]) for t in range(shared, len(f))]
        np.testing.assert_allclose(g, want, atol=1e-4)
    # the choice distribution is built from exactly these token log-probs
    np.testing.assert_allclose(scorer.scores(prefix, cands), choice_logprobs(suffixes, got), atol=1e-6)


def test_a_model_with_a_zeroed_output_chooses_uniformly(tokenizer, scorers):
    """Every logit 0 (every token equally likely): each candidate set, whatever its values'
    lengths in tokens, gets exactly the uniform choice distribution (issue 13 item 1; the
    graph of ``scorers``, so nothing new compiles)."""
    model = nnx.merge(scorers[0].graphdef, scorers[0].state, copy=True)
    model.norm.weight[...] = jnp.zeros_like(model.norm.weight[...])
    scorer = ChoiceScorer(model, tokenizer)
    prefix = chat_text(tokenizer, "You design environments.", "Propose a config.") + '{"mixture": [{"weight": '
    for cands in (["0.25, ", "0.5, ", "0.75, ", "1.0, "], [f"{h}, " for h in range(2, 13)],
                  ["null}", "1}", "12}", "32}"], ["]}", ', {"weight": ']):
        context, suffixes = scorer.split(prefix, cands)
        assert len({len(x) for x in suffixes}) > 1  # the former summed score differed by ~log V a token
        np.testing.assert_allclose(scorer.scores(prefix, cands), np.full(len(cands), -np.log(len(cands))), atol=1e-5)


SPACES = [
    None,
    ("height", "width", "num_agents", "hole_density"),
    ("num_agents", "slip_prob", "max_steps", "min_dist", "max_dist", "on_goal"),
]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), model_i=st.integers(0, 1), space_i=st.integers(0, 2),
       components=st.sampled_from([1, 1, 3]), temperature=st.sampled_from([0.0, 1.0, 5.0]),
       base_agents=st.integers(1, 4))
def test_constrained_decoding_always_valid(scorers, tokenizer, seed, model_i, space_i, components, temperature,
                                           base_agents):
    base = BASE.replace(num_agents=base_agents, height=6, width=6, hole_density=0.2)
    editable = SPACES[space_i]
    space = ConfigSpace(base=base) if editable is None else ConfigSpace(base=base, editable=editable)
    prefix = chat_text(tokenizer, "You design environments.", "Propose an edit.")
    current = Mixture([(1.0, base)] + [(0.5, base.replace(height=h)) for h in (4, 5)][: components - 1])
    text, choices = constrained_edit(scorers[model_i].scores, prefix, space, len(current), np.random.default_rng(seed),
                                     temperature=temperature)
    edit = edit_from_obj(json.loads(text), current, base)
    mixture = check_edit(edit, current, space, space.edits)  # valid by construction
    assert abs(sum(w for w, _ in mixture) - 1.0) < 1e-9 and choices[0]["choice"] == "edit"
    for _, cfg in edit.add:
        cfg.validate()
        assert cfg.capacity == base.capacity
        for name in space.editable:
            assert getattr(cfg, name) in space.values[name]


def summary_for_prompt():
    behaviour = {"mode": "greedy", "n": 8, "overall": {k: 0.25 for k in (
        "score", "arrived_share", "fall_rate", "timeout_rate", "conflict_rate", "malformed_rate", "agents_fell",
        "agents_timed_out", "conflicts_per_episode", "plan_len", "soc_ratio", "solvable")},
        "by_dim": {"size": {"4": {"score": 0.5, "fall_rate": 0.1, "conflict_rate": 0.0, "timeout_rate": 0.2, "n": 4}}},
        "scores": {"greedy": 0.25}}
    cases = [{"mode": "greedy", "lake": i, "cell": {"size": 4}, "failure_types": ["fell"], "grid": "A . ~\n. . a",
              "plan": "A: R R", "completion": "A: R R", "step": 2, "cause": "step 2: agent A fell",
              "causes": ["step 2: agent A fell into the hole at row 0 col 2"], "arrived_share": 0.0} for i in range(5)]
    return {"behaviour": behaviour,
            "failures": {"types_present": ["fell"], "types_covered": ["fell"], "cases": cases},
            "env_stats": None,
            "history": [{"stage": 1, "env": [{"weight": 1.0, "config": BASE.to_dict()}], "scores": {"greedy": 0.25}}]}


def make_ctx(model, tokenizer, stage=1):
    loaded = []

    def load(which):
        loaded.append(which)
        return model, tokenizer

    ctx = EngineerContext(stage=stage, current=[(1.0, BASE)], initial=[(1.0, BASE)], eval_result={},
                          summary=summary_for_prompt(), history=[], state={}, seed=3, load_model=load)
    return ctx, loaded


def test_policy_engineer_records_prompt_output_and_choices(tokenizer, scorers):
    model = nnx.merge(scorers[0].graphdef, scorers[0].state)
    ctx, loaded = make_ctx(model, tokenizer)
    eng = PolicyEngineer(space={"editable": ["height", "width", "num_agents", "hole_density"]}, temperature=1.0,
                         prompt="full")
    p = eng.propose(ctx)
    assert loaded == ["policy"] and p.record["prompt_form"] == "full"
    assert p.decision == "proposed" and p.record["validation_errors"] == []
    assert json.loads(p.record["raw_output"]) == p.record["parsed"] and p.edit is not None
    for _, cfg in p.mixture:
        assert cfg.slip_prob == BASE.slip_prob and cfg.max_steps == BASE.max_steps  # fixed fields kept
    prompt = p.record["prompt"]
    for text in ("## Policy behaviour", "## Failure cases", "## Stage history", "## Current environment",
                 "- hole_density: one of 0.0, 0.05", "Propose the environment of stage 2", '{"edit": "keep"}',
                 "#0 weight 1.000"):
        assert text in prompt
    labels = [c["choice"] for c in p.record["choices"]]
    assert labels[0] == "edit" and p.record["choices"][0]["chosen"] == p.edit.kind
    if p.edit.add:  # each added config's fields, in order
        assert labels[-4:] in (["add[0].height", "add[0].width", "add[0].num_agents", "add[0].hole_density"],
                               ["add[1].height", "add[1].width", "add[1].num_agents", "add[1].hole_density"],
                               ) or labels[-1].startswith("more_after")
    # ablation: no behaviour and no failures in the prompt; the base backend loads stage 0
    ctx2, loaded2 = make_ctx(model, tokenizer)
    ablated = BaseEngineer(context={"behaviour": False, "failures": False}).propose(ctx2)
    assert loaded2 == ["base"]
    assert "## Policy behaviour" not in ablated.record["prompt"] and "## Failure cases" not in ablated.record["prompt"]
    assert "## Stage history" in ablated.record["prompt"]
    assert ablated.record["context_parts"] == ["env_stats", "history"]


def test_free_decoding_from_random_model_retries_then_keeps_current(tokenizer, scorers):
    model = nnx.merge(scorers[1].graphdef, scorers[1].state)
    ctx, _ = make_ctx(model, tokenizer)
    p = PolicyEngineer(decoding="free", temperature=1.0, retries=1, max_new_tokens=8).propose(ctx)
    assert p.decision == "fallback" and p.mixture == ctx.current
    assert len(p.record["attempts"]) == 2
    assert "It was rejected:" in p.record["attempts"][1]["prompt"]
    assert p.record["validation_errors"]


def test_prompt_budget_drops_failures_first(tokenizer):
    ctx, _ = make_ctx(None, tokenizer)
    space = ConfigSpace(base=BASE)

    def build(**kw):
        return build_user_prompt(ctx, ["behaviour", "failures", "history"], space, **kw)

    full = build()
    count = len
    assert fit_user_prompt(build, count, len(full), 5, 1) == full
    fewer = fit_user_prompt(build, count, len(full) - 1, 5, 1)
    assert fewer.count("### Case") == 4
    tight = fit_user_prompt(build, count, len(build(max_failures=0, max_history=0)), 5, 1)
    assert "### Case" not in tight and "stage 1: env" not in tight


def test_free_text_answers_outside_the_space_are_retried_with_the_error(tokenizer, scorers, monkeypatch):
    """Hand-written free-text replies (issue 13 item 2): an off-grid value and a fixed field are
    rejected like the external endpoint's, the error naming the field and its allowed values."""
    model = nnx.merge(scorers[1].graphdef, scorers[1].state)
    ctx, _ = make_ctx(model, tokenizer)
    replies = iter(['{"hole_density": 0.37}', '{"max_steps": 64}', '{"height": 6, "hole_density": 0.2}'])
    monkeypatch.setattr(PolicyEngineer, "_free", lambda self, *a, **k: next(replies))
    space = {"editable": ["height", "width", "num_agents", "hole_density"], "values": {"hole_density": [0.0, 0.1, 0.2]}}
    p = PolicyEngineer(decoding="free", retries=2, space=space).propose(ctx)
    assert p.decision == "proposed" and (p.mixture[0][1].height, p.mixture[0][1].hole_density) == (6, 0.2)
    errors = p.record["validation_errors"]
    assert errors[0] == "add[0]: hole_density=0.37 is not an allowed value; allowed: [0.0, 0.1, 0.2]"
    assert errors[1].startswith("add[0]: max_steps=64 is fixed at 16 in this run")
    assert errors[0] in p.record["attempts"][1]["prompt"] and errors[1] in p.record["attempts"][2]["prompt"]


def test_free_text_hostile_answers_are_failed_attempts_never_raises(tokenizer, scorers, monkeypatch):
    """Free decoding shares the external engineer's parser (issue 23 item 3): deep nesting and
    an integer over Python's digit limit used to escape it (RecursionError, ValueError); they
    are failed attempts now, and a long raw output is kept cut to max_raw_chars."""
    model = nnx.merge(scorers[1].graphdef, scorers[1].state)
    ctx, _ = make_ctx(model, tokenizer)
    long_chatter = "I think " * 20_000 + '{"height": 6}'
    replies = iter(["[" * 100_000, '{"a":' * 5000, '{"height": ' + "9" * 5000 + "}", long_chatter])
    monkeypatch.setattr(PolicyEngineer, "_free", lambda self, *a, **k: next(replies))
    p = PolicyEngineer(decoding="free", retries=3).propose(ctx)
    assert p.decision == "proposed" and p.mixture[0][1].height == 6
    errors = p.record["validation_errors"]
    assert errors[0] == errors[1] == "no parseable JSON object in the output (nested deeper than 32 levels)"
    assert "ValueError" in errors[2] and "digits" in errors[2]
    raw = p.record["raw_output"]
    assert len(raw) < len(long_chatter) and raw.endswith('{"height": 6}') and "characters cut" in raw


def test_a_random_models_constrained_edits_cover_every_kind(tokenizer, scorers):
    """A random (untrained) model decoding under constraints reaches every kind of edit the rules
    allow on a three-component mixture, each a valid edit (the kinds: jaxlake.engineers.EDIT_KINDS)."""
    from jaxlake.engineers import EDIT_KINDS

    base = BASE.replace(height=6, width=6, hole_density=0.2)
    space = ConfigSpace(base=base, editable=("height", "num_agents"), values={"height": [4, 6], "num_agents": [1, 2]})
    current = Mixture([(0.5, base), (0.25, base.replace(height=4)), (0.25, base.replace(num_agents=1))])
    prefix = chat_text(tokenizer, "You design environments.", "Propose an edit.")
    kinds = set()
    for seed in range(40):
        text, _ = constrained_edit(scorers[seed % 2].scores, prefix, space, len(current), np.random.default_rng(seed),
                                   temperature=3.0)
        edit = edit_from_obj(json.loads(text), current, base)
        check_edit(edit, current, space, space.edits)
        kinds.add(edit.kind)
        if kinds == set(EDIT_KINDS):
            break
    assert kinds == set(EDIT_KINDS)


def test_a_budget_that_leaves_no_room_for_the_summary_is_said(tokenizer, scorers):
    """A prompt budget the answer's rules alone fill sends the engineer in blind (the summary
    cut to nothing): a warning naming the field, and the record's ``blind``; not silent."""
    model = nnx.merge(scorers[0].graphdef, scorers[0].state)
    summary = {"behaviour": {"mode": "greedy", "n": 4, "overall": {k: 0.5 for k in (
        "score", "arrived_share", "fall_rate", "conflict_rate", "timeout_rate", "malformed_rate", "plan_len",
        "soc_ratio", "solvable")}, "by_dim": {}, "scores": {}},
        "failures": {"types_present": [], "types_covered": [], "cases": []}, "env_stats": None, "history": []}
    ctx = EngineerContext(stage=1, current=Mixture.of(BASE), initial=Mixture.of(BASE), eval_result={},
                          summary=summary, history=[], state={}, seed=0)
    system, user = PolicyEngineer().prompt_turns(ctx, model, tokenizer)
    assert "success 0.50" in user
    engineer = PolicyEngineer()
    engineer.prompt_turns(ctx, model, tokenizer)
    assert engineer.blind is None
    tight = PolicyEngineer(max_prompt_tokens=300)
    with pytest.warns(UserWarning, match=r"engineer.max_prompt_tokens: a budget of 300 tokens leaves no room for "
                                         r"the summary"):
        system, user = tight.prompt_turns(ctx, model, tokenizer)
    assert "success 0.50" not in user and "answers blind" in tight.blind


def test_a_cached_prompt_gives_the_same_choices_as_the_full_context(tokenizer, scorers):
    """``set_base`` caches the prompt's KV once; a choice whose context starts with it runs only
    its tail (here an analysis and the answer so far) on that cache: the candidates' token
    log-probs and the choice distribution are those of the full context, and a context that
    does not start with the base (or outgrows its room) takes the full pass."""
    prompt = chat_text(tokenizer, "You design environments.", "Propose a config. " * 20)
    plain = ChoiceScorer(nnx.merge(scorers[0].graphdef, scorers[0].state), tokenizer)
    cached = ChoiceScorer(nnx.merge(scorers[0].graphdef, scorers[0].state), tokenizer)
    cached.set_base(prompt, room=192)
    for tail, cands in (('{"edit": "', ["keep", "add", "reweight"]),
                        ("success 0.5\n</think>\n\n" + '{"edit": "add", "add": [{"weight": ', ["0.25", "0.5", "0.1"]),
                        ('{"edit": "add", "add": [{"weight": 0.25, "config": {"height": ', [f"{h}, " for h in range(2, 9)])):
        np.testing.assert_allclose(cached.scores(prompt + tail, cands), plain.scores(prompt + tail, cands), atol=1e-4)
    assert cached.calls["cached"] == 3 and cached.calls["full"] == 0
    cached.scores("another prompt " + '{"edit": "', ["keep", "add"])  # not the base: the full pass
    cached.scores(prompt + "x " * 300, ["keep", "add"])  # a tail beyond the room: the full pass
    assert cached.calls["full"] == 2


def test_a_session_scores_each_round_as_the_full_context_does(tokenizer, scorers):
    """``ChoiceSession`` keeps each answer so far in its own cache row and runs only what a
    round adds, the candidates packed after it: over rounds of two rows that grow, one row
    whose context rewrites tokens it already holds, and a row that sits a round out, every
    choice distribution is the full context's, and a context off the base takes the full pass."""
    from llm.engineer.constrained import ChoiceSession

    prompt = chat_text(tokenizer, "You design environments.", "Propose a config. " * 20)
    plain = ChoiceScorer(nnx.merge(scorers[1].graphdef, scorers[1].state), tokenizer)
    cached = ChoiceScorer(nnx.merge(scorers[1].graphdef, scorers[1].state), tokenizer)
    cached.set_base(prompt, room=256)
    session = cached.session(2)
    heights = [f"{h}, " for h in range(2, 9)]
    rounds = [
        [('{"edit": "', ["keep", "add", "reweight"]), ('{"edit": "', ["keep", "add"])],
        [('{"edit": "add", "add": [{"weight": ', ["0.25", "0.5", "0.1"]), None],
        [('{"edit": "add", "add": [{"weight": 0.25, "config": {"height": ', heights),
         ('{"edit": "drop", "drop": ', ["0}", "1}", "2}"])],
        # row 1 rewrites what it holds (another edit kind): its stale slots are masked out
        [('{"edit": "add", "add": [{"weight": 0.25, "config": {"height": 12, "width": ', heights),
         ('{"edit": "reweight", "weights": [', ["0.5, ", "1, ", "2, "])],
    ]
    for requests in rounds:
        got = session.scores_many([None if q is None else (prompt + q[0], q[1]) for q in requests])
        for q, g in zip(requests, got):
            if q is None:
                assert g is None
                continue
            np.testing.assert_allclose(g, plain.scores(prompt + q[0], q[1]), atol=1e-4)
    assert cached.calls["session"] == len(rounds) and cached.calls["full"] == 0
    off = session.scores_many([("another prompt " + '{"edit": "', ["keep", "add"]), None])
    assert cached.calls["full"] == 1 and off[0].shape == (2,)
    with pytest.raises(ValueError, match="2 rows"):
        session.scores_many([None])
    with pytest.raises(ValueError, match="set_base first"):
        ChoiceSession(plain, 1)
    with pytest.raises(ValueError, match="branches need a cache"):
        nnx.merge(plain.graphdef, plain.state)(jnp.ones((1, 3), jnp.int32), branches=jnp.zeros((1, 3), jnp.int32))


def test_proposals_written_side_by_side_are_those_written_one_by_one(tokenizer, scorers):
    """``constrained_edits`` writes answers side by side in one session, each the answer that
    ``constrained_edit`` writes alone with the full-context scorer, the same generator and the
    same temperature; they differ between generators (sampled), so the rows are not one answer."""
    from llm.engineer.constrained import constrained_edits

    prompt = chat_text(tokenizer, "You design environments.", "Propose a config. " * 20)
    space = ConfigSpace(BASE, editable=("height", "width", "num_agents", "hole_density"))
    plain = ChoiceScorer(nnx.merge(scorers[0].graphdef, scorers[0].state), tokenizer)
    cached = ChoiceScorer(nnx.merge(scorers[0].graphdef, scorers[0].state), tokenizer)
    cached.set_base(prompt, room=448)
    seeds = range(6)
    alone = [constrained_edit(plain.scores, prompt, space, 2, np.random.default_rng(s), 1.0) for s in seeds]
    together = constrained_edits(cached.session(len(seeds)).scores_many, [prompt] * len(seeds), space, 2,
                                 [np.random.default_rng(s) for s in seeds], 1.0)
    assert [t for t, _ in together] == [t for t, _ in alone]
    assert [[c["chosen"] for c in ch] for _, ch in together] == [[c["chosen"] for c in ch] for _, ch in alone]
    assert len({t for t, _ in together}) > 1
    scored = [sum(1 for c in ch if len(c["top"]) > 1) for _, ch in together]
    assert cached.calls["full"] == 0 and cached.calls["session"] == max(scored)  # one pass a round


def test_texts_after_the_base_tokenize_as_the_whole_text(tokenizer, scorers):
    """A scorer with a base tokenizes only what follows the base's last special token: every
    text gives the ids the tokenizer gives the whole text, whatever follows (answers, special
    tokens, unicode, a text that leaves the base)."""
    prompt = chat_text(tokenizer, "You design environments.", "Propose a config. " * 20)
    scorer = ChoiceScorer(nnx.merge(scorers[0].graphdef, scorers[0].state), tokenizer)
    scorer.set_base(prompt, room=64)
    assert scorer.head is not None and prompt.startswith(scorer.head[0]) and len(scorer.head[0]) > len(prompt) - 20
    assert any(scorer.head[0].endswith(t) for t in tokenizer.get_added_vocab())
    rests = ['{"edit": "add", "add": [{"weight": 0.25', "<|im_end|>\n<|im_start|>user\nagain", "é ü 0.5, 12 ",
             "", " \n\n  x"]
    texts = [prompt + r for r in rests]
    want = [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    assert scorer.encode_many(texts) == want
    assert scorer.encode_many(texts + ["no base here"]) == want + [scorer.encode("no base here")]
