"""Reasoning mode (llm/generation/reasoning.py): reading think blocks, the reward's format terms, the
thinking budget on models built to ramble / close / end, forced tokens kept out of the loss,
and the warm start's templated reasoning."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlake import planner
from jaxlake.text import parse_lake
from llm.rl import grpo
from llm.generation import reasoning
from llm.game import rewards
from llm.generation.decode import GenerationConfig
from llm.model.config import Qwen3Config
from llm.model.qwen3 import Qwen3ForCausalLM
from llm.generation.reasoning import ReasoningConfig, ReasoningError, split_completion
from llm.game.rewards import RewardConfig

PLAN = "A: R R"
GOOD = "<think>\nA walks right twice\n</think>\n\n" + PLAN

# text -> (answer, think_format, closed, answer_empty, trailing_text)
CASES = {
    "think_then_plan": (GOOD, PLAN, False, True, False, False),
    "no_closing_tag": ("<think>\nA walks right and right and", "", False, False, True, False),
    "closing_tag_and_nothing": ("<think>\nA walks\n</think>\n\n", "", False, True, True, False),
    "plan_without_block": (PLAN, PLAN, True, False, False, False),
    "nested_tags": ("<think>a <think>b</think> c</think>\n" + PLAN, PLAN, True, True, False, False),
    "repeated_block": ("<think>a</think><think>b</think>\n" + PLAN, PLAN, True, True, False, False),
    "close_before_open": ("</think> x <think>\n" + PLAN, " x <think>\n" + PLAN, True, True, False, False),
    "text_before_block": ("Sure. <think>a</think>\n" + PLAN, PLAN, True, True, False, False),
    "text_after_plan": (GOOD + "\nThat is all.", PLAN + "\nThat is all.", False, True, False, True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_split_completion_cases(name):
    text, answer, fmt, closed, empty, trailing = CASES[name]
    p = split_completion(text)
    assert (p.answer, p.think_format, p.closed, p.answer_empty, p.trailing_text) == (answer, fmt, closed, empty,
                                                                                      trailing)
    assert bool(p.problems) == (fmt or empty or trailing or not closed)
    if name == "think_then_plan":
        assert p.thinking == "A walks right twice"
    assert reasoning.strip_thinking(text) == (answer if "</think>" in text else text)


@pytest.fixture(scope="module")
def one_lake():
    return parse_lake("A . a\n. . .", max_steps=4, max_height=4, max_width=4, max_agents=2)


def _batch(lake, n):
    return jax.tree_util.tree_map(lambda x: np.stack([np.asarray(x)] * n), lake)


def test_reward_terms_for_every_format_case(one_lake):
    names = sorted(CASES)
    texts = [CASES[n][0] for n in names] + [GOOD]
    forced = np.zeros(len(texts), bool)
    forced[-1] = True  # the same good completion, but its close was forced at the budget
    lakes = _batch(one_lake, len(texts))
    cfg = RewardConfig()
    res = rewards.compute_rewards(lakes, texts, jax.random.PRNGKey(0), cfg, reasoning=True, forced_close=forced)
    assert set(res.terms) == set(rewards.ALL_TERMS)
    row = {n: i for i, n in enumerate(names)}
    t = {k: np.asarray(v) for k, v in res.terms.items()}
    # the plan is read after </think>: think-then-plan succeeds with no format term
    i = row["think_then_plan"]
    assert res.success[i] and all(t[k][i] == 0 for k in rewards.THINK_TERMS) and t["malformed"][i] == 0
    assert res.reward[i] == pytest.approx(cfg.arrived + cfg.all_arrived + cfg.efficiency)
    i = row["no_closing_tag"]
    assert t["think_unclosed"][i] == 1 and t["answer_empty"][i] == 1 and not res.success[i]
    i = row["closing_tag_and_nothing"]
    assert t["think_unclosed"][i] == 0 and t["answer_empty"][i] == 1 and not res.success[i]
    for name in ("plan_without_block", "nested_tags", "repeated_block", "text_before_block"):
        i = row[name]
        assert t["think_format"][i] == 1 and res.success[i], name
        assert res.reward[i] == pytest.approx(cfg.arrived + cfg.all_arrived + cfg.efficiency + cfg.think_format)
    i = row["text_after_plan"]
    assert t["trailing_text"][i] == 1 and t["malformed"][i] == 1 and res.success[i]
    assert res.reward[i] == pytest.approx(cfg.arrived + cfg.all_arrived + cfg.efficiency + cfg.malformed
                                          + cfg.trailing_text)
    # a forced close is a think_unclosed even though the text has </think>
    assert t["think_unclosed"][-1] == 1 and res.success[-1]
    m = rewards.reward_metrics(res)
    assert m["term/think_unclosed"] == pytest.approx(2 / len(texts))  # never closed + forced
    # answer-only mode reads the think block as stray text and adds no format term
    plain = rewards.compute_rewards(_batch(one_lake, 1), [GOOD], jax.random.PRNGKey(0), cfg)
    assert set(plain.terms) == set(rewards.TERMS) and plain.malformed[0]


def test_reasoning_config_validation():
    assert ReasoningConfig.from_value(None) == ReasoningConfig()
    assert ReasoningConfig.from_value({"enabled": True, "thinking_tokens": 8}).thinking_tokens == 8
    with pytest.raises(ReasoningError, match=r"prompt.reasoning.thinking_tokens=0 not an integer in \[1, inf\)"):
        ReasoningConfig(thinking_tokens=0)
    with pytest.raises(ReasoningError, match="prompt.reasoning.close_text"):
        ReasoningConfig(close_text="done")
    with pytest.raises(ReasoningError, match="unknown prompt.reasoning field"):
        ReasoningConfig.from_value({"budget": 3})
    from llm.game.prompts import PromptConfig, load_prompt_config

    cfg = load_prompt_config("reasoning")
    assert cfg.reasoning.enabled and cfg.template_kwargs == {"enable_thinking": True}
    assert not PromptConfig().reasoning.enabled
    assert PromptConfig.from_dict({"reasoning": {"enabled": True}}).reasoning.enabled


# ----------------------------------------------------------------------------- sampling
V, CLOSE, EOS, PAD, WORD = 64, 60, 2, 0, 11
FORCED = (7, CLOSE, 7)


def _fixed_model(token: int):
    """A model that always puts (almost) all mass on ``token``: attention and MLP outputs are
    zero, every embedding is the same vector, so the last hidden state is constant and the LM
    head's column ``token`` is the only one that scores."""
    cfg = Qwen3Config(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=8, tie_word_embeddings=False, max_position_embeddings=256)
    graphdef, state = nnx.split(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    new = []
    for path, x in flat:
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            new.append(jnp.ones_like(x))
        elif "embed_tokens" in name:
            new.append(jnp.ones_like(x))
        elif "lm_head" in name:
            new.append(jnp.zeros_like(x).at[:, token].set(0.25))
        else:
            new.append(jnp.zeros_like(x))
    return graphdef, jax.tree_util.tree_unflatten(treedef, new)


def _prompts(b=3):
    ids = np.full((b, 8), PAD, np.int32)
    mask = np.zeros((b, 8), bool)
    for r in range(b):
        ids[r, 8 - 3 - r:] = 20 + r
        mask[r, 8 - 3 - r:] = True
    return ids, mask


def _sample(model, budget=6, answer=5, temperature=0.0, key=None):
    ids, mask = _prompts()
    cfg = GenerationConfig(max_new_tokens=answer, temperature=temperature)
    return reasoning.generate_with_thinking(model, ids, mask, key, cfg, ReasoningConfig(enabled=True, thinking_tokens=budget),
                                            close_id=CLOSE, forced_ids=FORCED, eos_token_ids=(EOS,), pad_token_id=PAD)


def test_rambling_model_is_closed_at_the_budget():
    s = _sample(_fixed_model(WORD), budget=6, answer=5)
    b, f = 3, len(FORCED)
    assert s.tokens.shape == (b, 6 + f + 5)
    assert s.hit_budget.all() and (s.thinking_lengths == 6).all() and (s.forced_lengths == f).all()
    # rambles for the whole budget, then the forced close, then it answers (rambling) to its budget
    np.testing.assert_array_equal(s.tokens[:, :6], WORD)
    np.testing.assert_array_equal(s.tokens[:, 6:6 + f], np.broadcast_to(FORCED, (b, f)))
    np.testing.assert_array_equal(s.tokens[:, 6 + f:], WORD)
    assert s.mask.all() and (s.lengths == 6 + f + 5).all() and not s.hit_eos.any()
    # forced tokens are attended to but take no loss and carry no log-prob
    assert not s.loss_mask[:, 6:6 + f].any() and s.loss_mask[:, :6].all() and s.loss_mask[:, 6 + f:].all()
    assert (s.logprobs[:, 6:6 + f] == 0).all() and (s.logprobs[:, :6] < 0).all()
    m = reasoning.thinking_metrics(s)
    assert m == {"thinking_len": 6.0, "thinking_budget_hit": 1.0, "answer_len": 5.0, "thinking_ended_turn": 0.0}


def test_model_that_closes_itself_gets_nothing_forced():
    s = _sample(_fixed_model(CLOSE), budget=6, answer=4)
    assert not s.hit_budget.any() and (s.thinking_lengths == 1).all() and (s.forced_lengths == 0).all()
    assert (s.tokens[:, 0] == CLOSE).all() and s.loss_mask[:, 0].all()
    assert (s.answer_lengths == 4).all() and (s.lengths == 5).all()
    np.testing.assert_array_equal(s.mask, s.loss_mask)


def test_model_that_ends_its_turn_while_thinking_stops_there():
    s = _sample(_fixed_model(EOS), budget=6, answer=4)
    assert s.hit_eos.all() and not s.hit_budget.any()
    assert (s.lengths == 1).all() and (s.answer_lengths == 0).all()
    assert reasoning.thinking_metrics(s)["thinking_ended_turn"] == 1.0


def test_two_phase_logprobs_equal_one_forward_over_the_whole_completion():
    """The packed completion is one contiguous sequence: teacher-forcing it through the model
    gives back the sampler's log-probs on every sampled token."""
    from llm.rl.updates import completion_forward

    # the rambler's architecture and shapes (its compiled sampler is reused), random weights
    graphdef, state = _fixed_model(WORD)
    state = jax.tree_util.tree_map(lambda x: 0.5 * jax.random.normal(jax.random.PRNGKey(3), x.shape, x.dtype), state)
    ids, mask = _prompts()
    s = _sample((graphdef, state), budget=6, answer=5)
    assert s.hit_budget.any() and (s.hit_eos & (s.answer_lengths == 0)).any()  # forced rows and a row that ended
    logp, _, _ = completion_forward(graphdef, state, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(s.tokens),
                                    jnp.asarray(s.mask))
    np.testing.assert_allclose(np.where(s.loss_mask, np.asarray(logp), 0.0), s.logprobs, atol=2e-5)
    # masks are prefixes (right padding) and the loss mask is the mask minus the forced span
    for r in range(3):
        assert s.mask[r, : s.lengths[r]].all() and not s.mask[r, s.lengths[r]:].any()
        assert s.mask[r].sum() - s.loss_mask[r].sum() == s.forced_lengths[r]


def test_forced_tokens_get_no_policy_gradient():
    """What the trainer does with the sample: token weights from the loss mask, so the GRPO
    loss has zero gradient on the forced tokens' log-probs (and they are not counted)."""
    s = _sample(_fixed_model(WORD), budget=4, answer=3)
    weights = grpo.token_weights(jnp.asarray(s.loss_mask), jnp.ones((3,)), "token_mean")
    forced = s.mask & ~s.loss_mask
    assert forced.any() and (np.asarray(weights)[forced] == 0).all()
    assert float(weights.sum()) == pytest.approx(1.0)
    adv = jnp.asarray([1.0, -1.0, 0.5])

    def loss(logp):
        return grpo.grpo_loss(logp, jnp.asarray(s.logprobs), adv, weights, grpo.GRPOLossConfig())[0]

    g = np.asarray(jax.grad(loss)(jnp.asarray(s.logprobs)))
    assert (g[forced] == 0).all() and (np.abs(g[s.loss_mask]) > 0).all()


def test_close_text_must_hold_the_close_id():
    with pytest.raises(ReasoningError, match="do not contain the </think> id"):
        reasoning.generate_with_thinking(_fixed_model(WORD), *_prompts(), None, GenerationConfig(max_new_tokens=2,
                                         temperature=0.0), ReasoningConfig(enabled=True, thinking_tokens=2),
                                         close_id=CLOSE, forced_ids=(7, 7), eos_token_ids=(EOS,), pad_token_id=PAD)


# ----------------------------------------------------------------------------- warm start
def test_warmstart_reasoning_is_true_and_fits_the_budget():
    from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer
    from llm.training.warmstart import plan_targets, reasoning_lines, reasoning_text

    lake = parse_lake("A . . ~ .\n. ~ . b .\n. . . . .\nB . ~ . a\n. . . . .", max_steps=12)
    sol = planner.solve(lake)
    assert sol.found
    lines = reasoning_lines(sol, 2)
    # each agent line states the planner's own path: start, goal, moves, waits, arrival
    for i, line in enumerate(lines[:2]):
        path = np.asarray(sol.paths[i])
        waits = sum(int((path[t + 1] == path[t]).all()) for t in range(len(path) - 1))
        assert line.startswith(f"{'AB'[i]}: {path[0][0]} {path[0][1]} to {path[-1][0]} {path[-1][1]}, "
                               f"{len(path) - 1 - waits} moves")
        assert line.endswith(f"arrives at step {len(path) - 1}")
    # the shared-cell line names a cell both paths visit at the steps it says
    shared = lines[2]
    assert shared.startswith("A and B both use ")
    r, c = (int(x) for x in shared.split("use ")[1].split(":")[0].split())
    ta, tb = (int(x.split("step ")[1]) for x in shared.split(": ")[1].split(", "))
    assert tuple(sol.paths[0][ta]) == (r, c) and tuple(sol.paths[1][tb]) == (r, c)
    tok = to_hf_tokenizer(build_game_tokenizer())
    full = reasoning_text(sol, 2)
    cut = reasoning_text(sol, 2, tok, 40)
    assert len(tok.encode(full)) > 40 >= len(tok.encode(cut)) and cut.startswith("<think>\n")
    assert cut.endswith("\n</think>") and lines[0] in cut
    # the warm-start target: think block, blank line, plan, end of turn; the plan parses after it
    batch = _batch(lake, 2)
    tokens, mask, solved, texts = plan_targets(batch, tok, 160, thinking_tokens=64)
    assert solved.all() and texts[0].startswith("<think>\n")
    p = split_completion(texts[0])
    assert not p.problems and p.answer.startswith("A: ")
    assert tokens[0, mask[0].sum() - 1] == tok.eos_token_id


# ----------------------------------------------------------------------------- summaries
def test_warmstart_paths_are_the_plans_cells():
    """Style ``paths``: each agent's line is its planner path cell by cell, so consecutive
    cells differ by the plan's moves (a wait repeats the cell), and the budget cuts whole
    agents. Checked on every lake of a batch drawn from a crowded config."""
    import jax

    from jaxlake.config import LakeConfig
    from jaxlake.generator import generate_batch
    from jaxlake.text import format_plan, parse_plan
    from llm.game.prompts import unbatch
    from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer
    from llm.training.warmstart import path_lines, plan_targets, reasoning_text

    tok = to_hf_tokenizer(build_game_tokenizer())
    lakes = generate_batch(jax.random.PRNGKey(3), LakeConfig(height=5, width=5, num_agents=3, hole_density=0.2,
                                                             conflict_density=1.0, max_steps=14), 12)
    step = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1), "S": (0, 0)}
    checked = 0
    for lake in unbatch(lakes):
        sol = planner.solve(lake)
        if not sol.found:
            continue
        n = int(lake.num_agents)
        lines = path_lines(sol, n)
        plan = format_plan(sol.actions, n).splitlines()
        for i, (line, moves) in enumerate(zip(lines, plan)):
            letter, *cells = line.split(" ")
            assert letter == "ABC"[i]
            cells = [(int(c[0]), int(c[1])) for c in cells]
            assert cells[0] == tuple(int(v) for v in lake.starts[i])
            assert cells[-1] == tuple(int(v) for v in lake.goals[i])
            letters = moves.split(":")[1].split()
            for t, (a, b) in enumerate(zip(cells, cells[1:])):
                move = letters[t] if t < len(letters) else "S"
                assert (b[0] - a[0], b[1] - a[1]) == step[move]
                assert not lake.holes[b]
        checked += 1
    assert checked >= 8
    text = reasoning_text(sol, n, style="paths")
    assert text == "<think>\n" + "\n".join(lines) + "\n</think>"
    cut = reasoning_text(sol, n, tok, len(tok.encode(text, add_special_tokens=False)) - 1, style="paths")
    assert cut == "<think>\n" + "\n".join(lines[:-1]) + "\n</think>"
    _, mask, solved, texts = plan_targets(lakes, tok, 200, 96, style="paths")
    assert solved.any() and all(t.startswith("<think>\nA ") for t, s in zip(texts, solved) if s)
    answer = texts[int(np.argmax(solved))].split("</think>\n\n")[1]
    assert not parse_plan(answer, n, 14)[1]
    with pytest.raises(ValueError, match="style"):
        reasoning_text(sol, n, style="story")
    with pytest.raises(ReasoningError, match="prompt.reasoning.warmstart_style"):
        ReasoningConfig(warmstart_style="story")


def test_warmstart_checks_mark_the_holes_tried_toward_the_goal():
    """Style ``checks``: without its marked cells a line is the ``paths`` line; before each
    step the cells toward the goal (the row move, then the column move) are written and
    marked while they are holes, and the first one that is not a hole ends the marks. Checked
    on every lake of a batch of holed lakes, some of which must have marks."""
    from jaxlake.config import LakeConfig
    from jaxlake.generator import generate_batch
    from llm.game.prompts import unbatch
    from llm.training.warmstart import HOLE_MARK, check_lines, path_lines, reasoning_text, toward_goal

    assert toward_goal((2, 3), (1, 0)) == [(1, 3), (2, 2)] and toward_goal((1, 3), (1, 0)) == [(1, 2)]
    assert toward_goal((1, 0), (1, 0)) == []
    lakes = generate_batch(jax.random.PRNGKey(5), LakeConfig(height=6, width=6, num_agents=2, hole_density=0.3,
                                                             max_steps=16), 24)
    marked = checked = 0
    for lake in unbatch(lakes):
        sol = planner.solve(lake)
        if not sol.found:
            continue
        n, holes = int(lake.num_agents), np.asarray(lake.holes)
        for line, plain in zip(check_lines(sol, n, holes), path_lines(sol, n)):
            letter, *cells = line.split(" ")
            assert " ".join([letter] + [c for c in cells if not c.endswith(HOLE_MARK)]) == plain
            goal = tuple(int(v) for v in cells[-1])
            here, tried = None, []
            for c in cells:
                cell = (int(c[0]), int(c[1]))
                if c.endswith(HOLE_MARK):
                    tried.append(cell)
                    assert holes[cell]
                    continue
                if here is not None:  # the marks are the leading holes of the cells toward the goal
                    ahead = toward_goal(here, goal)
                    k = next((j for j, a in enumerate(ahead) if not holes[a]), len(ahead))
                    assert tried == ahead[:k], (line, here, tried)
                here, tried = cell, []
            marked += HOLE_MARK in line
        checked += 1
    assert checked >= 12 and marked >= 3, (checked, marked)
    assert reasoning_text(sol, n, style="checks", holes=holes) == "<think>\n" + "\n".join(check_lines(sol, n, holes)) + "\n</think>"
    with pytest.raises(ValueError, match="holes"):
        reasoning_text(sol, n, style="checks")


def test_blocked_share_picks_lakes_whose_straight_walk_meets_a_hole():
    """``straight_blocked`` is the straight walk (jaxlake.baselines.straight_plan) played on
    the lake, stepping on a hole; ``select_blocked`` keeps at least the asked share of them."""
    from jaxlake.baselines import straight_plan
    from jaxlake.config import LakeConfig
    from jaxlake.generator import generate_batch
    from jaxlake.types import ACTION_DELTAS
    from llm.game.prompts import unbatch
    from llm.training.config import WarmStartConfig
    from jaxlake.baselines import straight_blocked
    from llm.training.warmstart import select_blocked

    lakes = generate_batch(jax.random.PRNGKey(2), LakeConfig(height=6, width=5, num_agents=3, hole_density=0.15,
                                                             max_steps=14), 64)
    expected = []
    for lake in unbatch(lakes):
        holes, hit = np.asarray(lake.holes), False
        for i, moves in enumerate(straight_plan(lake)[: int(lake.num_agents)]):
            r, c = (int(v) for v in lake.starts[i])
            for a in moves:
                r, c = r + ACTION_DELTAS[a][0], c + ACTION_DELTAS[a][1]
                hit |= bool(holes[r, c])
        expected.append(hit)
    blocked = straight_blocked(lakes)
    np.testing.assert_array_equal(blocked, expected)
    assert 0 < blocked.mean() < 0.9
    for share in (0.0, 0.5, 1.0):
        picked = select_blocked(lakes, 16, share)
        assert picked.holes.shape[0] == 16
        assert straight_blocked(picked).sum() >= min(int(np.ceil(share * 16)), blocked.sum())
    with pytest.raises(ValueError, match="warmstart.blocked_share"):
        WarmStartConfig(blocked_share=1.5)



def test_detour_share_picks_lakes_whose_reference_path_steps_away_from_a_goal():
    """``detour_lakes`` flags a lake when some agent's reference path has a step that lengthens its
    Manhattan distance to its goal (checked here by walking the paths); ``select_shares`` takes
    the asked shares in order (detours first), then the rest, keeping pool order."""
    from jaxlake.baselines import straight_blocked
    from jaxlake.config import LakeConfig
    from jaxlake.generator import generate_batch
    from llm.training.config import WarmStartConfig
    from llm.training.warmstart import detour_lakes, select_shares

    lakes = generate_batch(jax.random.PRNGKey(5), LakeConfig(height=6, width=6, num_agents=2, hole_density=0.3,
                                                             max_steps=16), 48)
    flags = detour_lakes(lakes)
    expected = []
    for sol in planner.solve_batch(lakes).solutions:
        away = False
        for path in (sol.paths if sol.found else ()):
            goal = tuple(int(v) for v in path[-1])
            dist = [abs(int(r) - goal[0]) + abs(int(c) - goal[1]) for r, c in path]
            away |= any(b > a for a, b in zip(dist, dist[1:]))
        expected.append(away)
    np.testing.assert_array_equal(flags, expected)
    assert 0 < flags.sum() < 24  # rarer than not: why the warm start asks for them
    blocked = straight_blocked(lakes)
    picked = select_shares(lakes, 12, [(flags, 0.5), (blocked, 0.25)])
    assert picked.holes.shape[0] == 12
    assert detour_lakes(picked).sum() >= min(6, int(flags.sum()))
    # pool order kept: the picked lakes are a sorted subset of the pool
    starts = np.asarray(lakes.starts).reshape(48, -1)
    rows = [int(np.flatnonzero((starts == s).all(1) & (np.asarray(lakes.holes).reshape(48, -1)
                                                       == h).all(1))[0])
            for s, h in zip(np.asarray(picked.starts).reshape(12, -1), np.asarray(picked.holes).reshape(12, -1))]
    assert rows == sorted(rows)
    # nothing asked: the first lakes of the pool
    np.testing.assert_array_equal(select_shares(lakes, 5, [(flags, 0.0)]).holes, np.asarray(lakes.holes)[:5])
    with pytest.raises(ValueError, match="warmstart.detour_share"):
        WarmStartConfig(detour_share=-0.1)


def test_crowded_share_picks_lakes_whose_crowd_trace_marks_an_agent():
    """``crowded_lakes`` flags exactly the lakes whose ``crowd`` reference trace writes an agent
    mark (checked here on the completions the warm start writes), they are rare on drawn lakes,
    and ``reference_lakes`` with ``crowded_share`` fills that share of a batch with them."""
    from types import SimpleNamespace

    from jaxlake.config import LakeConfig
    from jaxlake.generator import generate_batch
    from jaxlake.mixture import Mixture
    from llm.training.config import WarmStartConfig
    from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer
    from llm.training.warmstart import AGENT_MARK, crowded_lakes, plan_targets, reference_lakes

    config = LakeConfig(height=5, width=5, num_agents=2, hole_density=0.1, conflict_density=1.0, max_steps=16)
    lakes = generate_batch(jax.random.PRNGKey(3), config, 64)
    flags = crowded_lakes(lakes)
    *_, texts = plan_targets(lakes, to_hf_tokenizer(build_game_tokenizer()), 400, thinking_tokens=300,
                             style="crowd")
    np.testing.assert_array_equal(flags, [AGENT_MARK in t for t in texts])
    assert 0 < flags.sum() < 32
    wc = SimpleNamespace(blocked_share=0.0, detour_share=0.0, crowded_share=0.5)
    batch = reference_lakes(jax.random.PRNGKey(4), Mixture.of(config), 16, wc)
    assert crowded_lakes(batch).sum() >= 8
    plain = reference_lakes(jax.random.PRNGKey(4), Mixture.of(config), 16,
                            SimpleNamespace(blocked_share=0.0, detour_share=0.0, crowded_share=0.0))
    assert crowded_lakes(plain).sum() < 8
    with pytest.raises(ValueError, match="warmstart.crowded_share"):
        WarmStartConfig(crowded_share=2)


def _solution(*paths):
    from types import SimpleNamespace

    return SimpleNamespace(found=True, paths=[np.asarray(p) for p in paths])


def test_crowd_marks_the_cells_an_earlier_agent_takes_over_the_same_step():
    """Style ``crowd`` (docs/rules.md, Conflicts): a tried cell an earlier agent enters at the
    next step (vertex), or leaves toward this agent's cell (swap), is written and marked ``!``;
    an agent that arrived is an obstacle only under ``on_goal: stay``."""
    from llm.training.warmstart import AGENT_MARK, check_lines, reasoning_text

    assert AGENT_MARK == "!"
    no_holes = np.zeros((3, 3), bool)
    # vertex: A enters 01 at t = 1, where B's step up would go; B waits, then goes
    vertex = _solution([(0, 0), (0, 1), (0, 2)], [(1, 1), (1, 1), (0, 1)])
    assert check_lines(vertex, 2, no_holes, agents=True) == ["A 00 01 02", "B 11 01! 11 01"]
    assert check_lines(vertex, 2, no_holes) == ["A 00 01 02", "B 11 11 01"]  # style checks: no agent marks
    # swap: A goes 00 -> 01 while B's step toward its goal is 01 -> 00
    swap = _solution([(0, 0), (0, 1)], [(0, 1), (1, 1), (1, 0), (0, 0)])
    assert check_lines(swap, 2, no_holes, agents=True) == ["A 00 01", "B 01 00! 11 10 00"]
    # an arrived agent: gone under vanish, still on its goal under stay
    # (A enters 01 at t = 1 and arrives; B's first step there meets it either way)
    arrived = _solution([(0, 0), (0, 1)], [(0, 2), (0, 2), (0, 1), (0, 0)])
    assert check_lines(arrived, 2, no_holes, agents=True, stays=False)[1] == "B 02 01! 02 01 00"
    assert check_lines(arrived, 2, no_holes, agents=True, stays=True)[1] == "B 02 01! 02 01! 01 00"
    # a hole is checked first: a cell that is both gets the hole mark only (a labeller's
    # check: these paths step on the hole, no reference path would)
    holed = no_holes.copy()
    holed[0, 1] = True
    assert check_lines(vertex, 2, holed, agents=True)[1] == "B 11 01~ 11 01~ 01"
    assert reasoning_text(vertex, 2, style="crowd", holes=no_holes) == "<think>\nA 00 01 02\nB 11 01! 11 01\n</think>"


def test_crowd_lines_are_the_checks_lines_plus_agent_marks_on_real_lakes():
    """On crowded lakes of both arrival rules: without its ``!`` cells a ``crowd`` line is the
    ``checks`` line; the first agent has none; every ``!`` cell is a free cell one step from
    where the agent stands; and some lakes have marks."""
    from jaxlake.config import LakeConfig
    from jaxlake.generator import generate_batch
    from jaxlake.types import ON_GOAL_STAY
    from llm.game.prompts import unbatch
    from llm.training.warmstart import AGENT_MARK, check_lines

    marked = 0
    for on_goal in ("vanish", "stay"):
        cfg = LakeConfig(height=5, width=5, num_agents=3, hole_density=0.1, conflict_density=1.0, max_steps=16,
                         on_goal=on_goal)
        for lake in unbatch(generate_batch(jax.random.PRNGKey(3), cfg, 16)):
            sol = planner.solve(lake)
            if not sol.found:
                continue
            n, holes = int(lake.num_agents), np.asarray(lake.holes)
            stays = int(lake.on_goal) == ON_GOAL_STAY
            crowd = check_lines(sol, n, holes, agents=True, stays=stays)
            assert AGENT_MARK not in crowd[0]
            for line, plain in zip(crowd, check_lines(sol, n, holes)):
                letter, *cells = line.split(" ")
                assert " ".join([letter] + [c for c in cells if not c.endswith(AGENT_MARK)]) == plain
                here = None
                for c in cells:
                    cell = (int(c[0]), int(c[1]))
                    if c.endswith(AGENT_MARK):
                        assert not holes[cell] and abs(cell[0] - here[0]) + abs(cell[1] - here[1]) == 1
                    elif not c.endswith("~"):
                        here = cell
            marked += sum(AGENT_MARK in line for line in crowd)
    assert marked >= 3, marked


def test_mark_weight_scales_the_marks_only():
    from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer
    from llm.training.config import WarmStartConfig
    from llm.training.warmstart import HOLE_MARK, token_weights

    tok = to_hf_tokenizer(build_game_tokenizer())
    ids = np.asarray([tok.encode("A 23 13~ 22\nB 21 22! 21", add_special_tokens=False) + [0, 0]])
    mask = np.arange(ids.shape[1])[None] < ids.shape[1] - 2
    mark = (ids == tok.encode(HOLE_MARK, add_special_tokens=False)[0]) | (ids == tok.encode("!", add_special_tokens=False)[0])
    assert mark.sum() == 2  # the hole mark and style crowd's agent mark
    np.testing.assert_array_equal(token_weights(ids, mask, tok, 1.0), mask.astype(np.float32))
    w = token_weights(ids, mask, tok, 5.0)
    assert (w[mark] == 5.0).all() and (w[mask & ~mark] == 1.0).all() and (w[~mask] == 0.0).all()
    for bad in (0.5, 101, True):
        with pytest.raises(ValueError, match="warmstart.mark_weight"):
            WarmStartConfig(mark_weight=bad)


def test_history_shows_the_engineers_analysis():
    from jaxlake.config import LakeConfig
    from jaxlake.summaries import ANALYSIS_CHARS, history_entry, render_summary

    why = "Success is 0.9 on 4x4 lakes: wider lakes next. " * 20
    record = {"engineer": "policy", "decision": "proposed", "reason": "valid proposal on attempt 1", "analysis": why,
              "prompt": "not shown"}
    h = [history_entry(1, [(1.0, LakeConfig())], None, None, record),
         history_entry(2, [(1.0, LakeConfig())], None, None, {"engineer": "heuristic", "decision": "kept"})]
    assert h[0]["engineer"]["analysis"] == why and "prompt" not in h[0]["engineer"]
    assert "analysis" not in h[1]["engineer"]
    text = render_summary({"history": h}, ["history"])
    shown = [line for line in text.splitlines() if line.startswith("  analysis: ")]
    assert len(shown) == 1 and shown[0].startswith("  analysis: Success is 0.9 on 4x4 lakes: wider lakes next.")
    assert len(shown[0]) == len("  analysis: ") + ANALYSIS_CHARS and shown[0].endswith("...")


# ----------------------------------------------------------------------------- engineer replies
def test_engineer_reply_is_the_last_object_after_the_think_block():
    from jaxlake.engineers import ProposalError, extract_json

    quoted = '{"height": 4, "width": 4}'
    assert extract_json(f"<think>now {quoted}, so wider</think>\n{{\"height\": 4, \"width\": 6}}") == \
        {"height": 4, "width": 6}
    # no think block: the last complete object, not the quoted current one
    assert extract_json(f"The current config is {quoted}. I propose {{\"height\": 5}}.") == {"height": 5}
    # a nested object belongs to its parent; a broken object after a good one leaves the good one
    mix = '{"mixture": [{"weight": 1, "config": {"height": 3}}]}'
    assert extract_json(mix + ' and {"height": ') == {"mixture": [{"weight": 1, "config": {"height": 3}}]}
    with pytest.raises(ProposalError, match="never closed"):
        extract_json(f"<think>thinking about {quoted}")
    with pytest.raises(ProposalError, match="no JSON object"):
        extract_json(f"<think>{quoted}</think> no answer")
