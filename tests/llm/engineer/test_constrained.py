"""Constrained decoding chooses the edit, then values, without length bias: the choice rule on
hand-built tries; an indifferent model (every token equally likely) reaches every kind of edit
and every allowed value uniformly (chi-square); a model that prefers multi-token values writes
them greedily. (tests/llm/engineer/test_local.py: the same rule on a real tiny model.)"""

import json
import math
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2

from jaxlake.config import LakeConfig
from jaxlake.engineers import ConfigSpace, EditRules, check_edit, edit_from_obj
from jaxlake.mixture import Mixture
from llm.engineer.constrained import ChoiceScorer, choice_logprobs, constrained_edit
from llm.engineer.prompt import chat_text
from llm.game.tokenizer import build_game_tokenizer, to_hf_tokenizer

BASE = LakeConfig(height=6, width=6, num_agents=2, hole_density=0.1, conflict_density=0.5, max_steps=16,
                  max_height=12, max_width=12, max_agents=4)
# Values of 1 to 4 tokens in the game tokenizer (digits are single tokens): two-digit heights,
# 0.25 / 0.75 beside 0 / 0.5 / 1.0; no cross-field rule binds, so every draw offers the same set.
VALUES = {"height": list(range(3, 13)), "width": [3, 7, 11], "num_agents": [1, 2],
          "hole_density": [0.0, 0.1, 0.2, 0.3], "conflict_density": [0.0, 0.25, 0.5, 0.75, 1.0]}
FIELDS = tuple(VALUES)


@pytest.fixture(scope="module")
def tokenizer():
    return to_hf_tokenizer(build_game_tokenizer())


@pytest.fixture(scope="module")
def space():
    return ConfigSpace(base=BASE, editable=FIELDS, values=VALUES)


class TextScorer(ChoiceScorer):
    """A :class:`ChoiceScorer` whose language model is a rule on the text so far (no network):
    every token has logit 0 except those that keep the text a prefix of ``target`` (logit
    ``bonus``). ``target=None``: the indifferent model, every token ``-log V``."""

    def __init__(self, tokenizer, target=None, bonus=2.0):
        self.tokenizer, self.pad_id = tokenizer, 0
        self.target, self.bonus, self.vocab = target, float(bonus), len(tokenizer)
        self.log_z = math.log(math.exp(self.bonus) + self.vocab - 1)
        self.encoded: dict[str, list[int]] = {}

    def encode_many(self, texts):  # the same texts recur across draws: tokenize each once
        new = [t for t in dict.fromkeys(texts) if t not in self.encoded]
        if new:
            self.encoded.update(zip(new, super().encode_many(new)))
        return [self.encoded[t] for t in texts]

    def token_logprobs(self, context, suffixes):
        if self.target is None:
            return [np.full(len(s), -math.log(self.vocab)) for s in suffixes]
        out = []
        for s in suffixes:
            text = [self.tokenizer.decode(list(context) + list(s[: t + 1]), clean_up_tokenization_spaces=False)
                    for t in range(len(s))]
            out.append(np.array([(self.bonus if self.target.startswith(x) else 0.0) - self.log_z for x in text]))
        return out


def test_choice_rule_on_hand_built_tries():
    # "0," | "0.25," | "0.5," | "1.0," as tokens: root branches {0, 1}; after 0 {",", "."}; after 0. {2, 5}
    seqs = [[0, 9], [0, 8, 2, 5, 9], [0, 8, 5, 9], [1, 8, 0, 9]]
    flat = [np.full(len(s), -3.0) for s in seqs]
    np.testing.assert_allclose(choice_logprobs(seqs, flat), np.log(np.full(4, 0.25)), atol=1e-12)
    # non-branching tokens (the 5 of 0.25, the delimiters, all of 1.0 after its first token) never count
    noisy = [lp.copy() for lp in flat]
    noisy[1][3] = noisy[1][4] = -50.0
    noisy[3][1:] = -50.0
    np.testing.assert_allclose(choice_logprobs(seqs, noisy), np.log(np.full(4, 0.25)), atol=1e-12)
    # a preference at a branch point: p(1) = 3 p(0) at the root, so 1.0 gets log(3 / mean(1, 3)) = log 1.5
    # and each of the three 0-values log(1 / 2)
    pref = [lp.copy() for lp in flat]
    pref[3][0] = -3.0 + math.log(3.0)
    q = np.exp(choice_logprobs(seqs, pref))
    np.testing.assert_allclose(q, np.array([0.5, 0.5, 0.5, 1.5]) / 3.0, atol=1e-12)
    assert choice_logprobs([[4]], [[-7.0]]).tolist() == [0.0]
    with pytest.raises(ValueError, match="prefix"):
        choice_logprobs([[1, 2], [1, 2, 3]], [[0.0, 0.0], [0.0, 0.0, 0.0]])


def mixture_of(components):
    return Mixture([(1.0, BASE.replace(height=h)) for h in (6, 8, 10)[:components]])


def draw(scorer, space, seed, components):
    text, choices = constrained_edit(scorer.scores, "Propose an edit.\n", space, components,
                                     np.random.default_rng(seed), temperature=1.0)
    current = mixture_of(components)
    check_edit(edit_from_obj(json.loads(text), current), current, space, space.edits)  # valid by construction
    return choices


def pooled(label):
    """``add[1].height`` -> ``add.height``, ``weights[0]`` -> ``weights``: choices of one kind."""
    import re

    return re.sub(r"\[\d+\]", "", label)


@pytest.mark.parametrize("components,draws", [(1, 240), (2, 400)])
def test_indifferent_model_reaches_every_edit_and_value_uniformly(tokenizer, space, components, draws):
    """Every kind of edit the rules allow, every weight, index and share, every value of every
    field of an added config, and whether another follows: the choice counts pass a chi-square
    test of uniformity (p > 0.001; fixed seeds)."""
    scorer = TextScorer(tokenizer)
    # the former rule (summed token log-probs) would never choose a longer value
    context, suffixes = scorer.split('{"conflict_density": ', ["0.0}", "0.25}", "0.5}"])
    assert len({len(s) for s in suffixes}) > 1
    counts: dict[str, Counter] = {}
    for seed in range(draws):
        for c in draw(scorer, space, seed, components):
            counts.setdefault(pooled(c["choice"]), Counter())[json.dumps(c["chosen"])] += 1
    rules = space.edits
    want = {"edit": rules.kinds(components), "add.weight": list(rules.shares), "more_after": [False, True],
            **{f"add.{f}": VALUES[f] for f in FIELDS}}
    if components > 1:
        want.update({"weights": list(rules.weights), "drop": list(range(components))})
    else:
        want["drop"] = [0]
    assert set(counts) == set(want)
    assert set(json.loads(k) for k in counts["edit"]) == set(EditRules().kinds(components))  # every edit kind
    for label, values in want.items():
        if len(values) < 2:
            continue
        got = counts[label]
        assert set(got) == {json.dumps(v) for v in values}, (label, got)  # every value reached
        n = np.array([got[json.dumps(v)] for v in values], dtype=float)
        expected = n.sum() / len(values)
        stat = float(((n - expected) ** 2 / expected).sum())
        assert stat < chi2.ppf(0.999, len(values) - 1), (label, dict(got))


def test_a_model_that_prefers_multi_token_values_writes_them_greedily(tokenizer, space):
    first = {"height": 12, "width": 11, "num_agents": 2, "hole_density": 0.3, "conflict_density": 0.75}
    second = {"height": 10, "width": 3, "num_agents": 1, "hole_density": 0.0, "conflict_density": 0.25}
    prefix = chat_text(tokenizer, "You design environments.", "Propose an edit.")
    rng = np.random.default_rng(0)
    for target, components in [
        ({"edit": "add", "add": [{"weight": 0.25, "config": first}]}, 1),
        ({"edit": "reweight", "weights": [2.0, 0.5]}, 2),
        ({"edit": "drop", "drop": 1}, 2),
        ({"edit": "replace", "drop": 1, "add": [{"weight": 0.5, "config": second}, {"weight": 0.1, "config": first}]},
         2),
        ({"edit": "keep"}, 3),
    ]:
        scorer = TextScorer(tokenizer, target=prefix + json.dumps(target))
        text, _ = constrained_edit(scorer.scores, prefix, space, components, rng, temperature=0.0)
        assert text == json.dumps(target)
    # the former rule (summed token log-probs) would have written 0.0 for conflict density here:
    # "0.75}" is 5 tokens the model prefers (each ~ -4.9 nats), "0.0}" 2 preferred and 2 not (~ -6.9)
    head = prefix + '{"height": 12, "width": 11, "num_agents": 2, "hole_density": 0.3, "conflict_density": '
    scorer = TextScorer(tokenizer, target=prefix + json.dumps(first))
    cands = ["0.0}", "0.25}", "0.5}", "0.75}", "1.0}"]
    context, suffixes = scorer.split(head, cands)
    summed = [float(lp.sum()) for lp in scorer.token_logprobs(context, suffixes)]
    assert cands[int(np.argmax(summed))] != "0.75}"
    assert cands[int(np.argmax(scorer.scores(head, cands)))] == "0.75}"
