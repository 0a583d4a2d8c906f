"""The grammar's drafter on constructed grammars (it proposes exactly what the grammar
forces, in the target's tokenization, a copied value between forced runs, and nothing where
the grammar leaves a choice), and sampling under a grammar by enumeration: one speculative
round with the real grammar masks emits exactly what target-only constrained sampling does."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest

from edgespec.decoding.acceptance import residual, token_acceptance_probabilities
from edgespec.decoding.constrained import Constraint
from edgespec.decoding.drafters import AnswerSetup, GrammarDrafter
from edgespec.decoding.grammar import GrammarSpec, GrammarState

NAME = 'root ::= "{\\"name\\":\\"" [a-z]+ "\\"}"'
RECORD = 'root ::= "{\\"city\\":\\"" [A-Za-z ]+ "\\",\\"zip\\":\\"" [0-9]{5} "\\"}"'


def drafter_on(pair, gbnf: str, context: list[int]) -> tuple[GrammarDrafter, Constraint]:
    constraint = Constraint(pair.target, GrammarSpec(gbnf))
    drafter = GrammarDrafter(pair.target)
    drafter.begin(AnswerSetup(context, [], constraint))
    return drafter, constraint


def text_of(pair, tokens: list[int]) -> bytes:
    return b"".join(pair.target.piece(t) for t in tokens if not pair.target.is_eog(t))


def test_forced_text_is_proposed_and_a_choice_ends_it(pair):
    target = pair.target
    context = target.tokenize("Name: ada", add_special=False)
    drafter, constraint = drafter_on(pair, NAME, context)
    proposal, forced = drafter.lookup(context, 16)
    assert text_of(pair, proposal) == b'{"name":"' and forced == len(proposal)
    assert proposal == target.tokenize('{"name":"', add_special=False)  # the target's own split
    assert drafter.lookup(context, 2)[0] == proposal[:2]  # the budget is kept
    constraint.commit(target.tokenize('{"name":"ad', add_special=False))
    assert drafter.lookup(context, 16) == ([], 0)  # [a-z] or the closing quote: a choice


def test_a_grammar_that_must_end_proposes_the_end(pair):
    target = pair.target
    drafter, constraint = drafter_on(pair, 'root ::= "yes" | "no"', [1])
    assert drafter.lookup([1], 8) == ([], 0)  # "y" or "n"
    constraint.commit(target.tokenize("y", add_special=False))
    proposal, _ = drafter.lookup([1], 8)
    assert text_of(pair, proposal) == b"es" and target.is_eog(proposal[-1])


def test_a_copied_value_joins_two_forced_runs(pair):
    target = pair.target
    source = target.tokenize('Old: {"city":"Porto Alegre","zip":"90010"}\nNew: ', add_special=False)
    drafter, constraint = drafter_on(pair, RECORD, source)
    constraint.commit(target.tokenize('{"city":"Porto Alegre', add_special=False))
    answer = target.tokenize('{"city":"Porto Alegre', add_special=False)
    proposal, forced = drafter.lookup(source + answer, 32)
    # the city may go on, so nothing is forced first: the source's value is copied (the
    # key between is text the grammar allows), and the forced end follows it
    assert text_of(pair, proposal) == b'","zip":"90010"}' and target.is_eog(proposal[-1])
    assert forced == 0
    assert text_of(pair, proposal[-2:-1]) == b'"}'
    # the proposal is one the grammar allows throughout, and the constraint did not move
    assert constraint.allowed_prefix(proposal[:-1]) == len(proposal) - 1


def test_no_grammar_no_proposal(pair):
    drafter = GrammarDrafter(pair.target)
    drafter.begin(AnswerSetup([1, 2, 3]))
    assert drafter.lookup([1, 2, 3], 8) == ([], 0)


def test_advance_forced_follows_only_the_one_continuation(pair):
    with GrammarState(pair.target, GrammarSpec('root ::= "ab" ("c" | "d") "ef"')) as state:
        assert state.advance_forced(64) == (b"ab", False)
        assert sorted(state.next_bytes()) == [ord("c"), ord("d")]
        state.accept(pair.target.tokenize("c", add_special=False)[0])
        assert state.advance_forced(1) == (b"e", False)  # the limit holds
        assert state.advance_forced(64) == (b"f", True)


# -- sampling under a grammar, by enumeration ---------------------------------------------

GAMMA = 2
CHOICE = "root ::= [ab] [ac] [bc]"  # every position forbids one of the three letters


def softmax(row: np.ndarray) -> np.ndarray:
    finite = np.isfinite(row)
    out = np.zeros(row.shape, dtype=np.float64)
    e = np.exp(row[finite].astype(np.float64) - row[finite].max())
    out[finite] = e / e.sum()
    return out


def tables(pair, letters: list[int], seed: int) -> tuple[dict, dict]:
    """The target's raw rows and the draft's q rows at every prefix, over three letters."""
    rng = np.random.default_rng(seed)
    width = pair.target.n_vocab
    raw, q = {}, {}
    for n in range(GAMMA + 1):
        for prefix in itertools.product(letters, repeat=n):
            row = np.full(width, -np.inf, dtype=np.float32)
            row[letters] = rng.normal(0, 1.5, len(letters))
            raw[prefix] = row
            draft_row = np.zeros(width, dtype=np.float32)
            draft_row[letters] = rng.dirichlet(np.ones(len(letters)))
            q[prefix] = draft_row
    return raw, q


def constrained_rows(pair, raw: dict) -> dict:
    """What target-only constrained sampling draws from after each prefix the grammar allows."""
    want = {}
    for prefix, row in raw.items():
        with GrammarState(pair.target, GrammarSpec(CHOICE)) as state:
            if all(state.allows(t) and state.accept(t) is None for t in prefix):
                want[prefix] = softmax(state.mask(row))
    return want


def emission(pair, letters, raw, q, want, keep_forbidden: bool) -> dict:
    """The exact distribution of γ+1 tokens after one speculative round as the engine runs
    it: the draft model samples from q (the grammar unseen), the draft is cut after its
    first forbidden token (``keep_forbidden``) or before it (the mistake the engine avoids),
    every kept row is masked by its own prefix's state, and the target continues."""
    constraint = Constraint(pair.target, GrammarSpec(CHOICE))
    result: dict[tuple[int, ...], float] = defaultdict(float)

    def extend(prefix: tuple[int, ...], mass: float) -> None:
        if mass == 0.0:  # (past a forbidden draft token, which is never accepted)
            return
        if len(prefix) == GAMMA + 1:
            result[prefix] += mass
            return
        for y in letters:
            if want[prefix][y] > 0:
                extend((*prefix, y), mass * want[prefix][y])

    for d in itertools.product(letters, repeat=GAMMA):
        weight = math.prod(float(q[d[:i]][d[i]]) for i in range(GAMMA))
        allowed = constraint.allowed_prefix(list(d))
        kept = list(d[: min(allowed + 1, GAMMA)] if keep_forbidden else d[:allowed])
        rows = np.stack([raw[tuple(kept[:i])] for i in range(len(kept) + 1)])
        prob = np.stack([softmax(r) for r in constraint.mask_rows(kept, rows)])
        q_rows = np.stack([q[tuple(kept[:i])] for i in range(len(kept))]) if kept else None
        accept = token_acceptance_probabilities(kept, q_rows, prob) if kept else []
        alive = 1.0
        for i in range(len(kept)):
            r = residual(prob[i], q_rows[i])
            for y in letters:
                if r[y] > 0:
                    extend((*kept[:i], y), weight * alive * (1 - accept[i]) * r[y])
            alive *= accept[i]
        for y in letters:
            if prob[len(kept)][y] > 0:
                extend((*kept, y), weight * alive * prob[len(kept)][y])
    return result


def deviation(got: dict, want: dict) -> float:
    return max(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in set(got) | set(want))


@pytest.mark.parametrize("seed", [3, 11])
def test_speculative_sampling_under_a_grammar_is_exact(pair, seed):
    letters = [pair.target.tokenize(c, add_special=False)[0] for c in "abc"]
    raw, q = tables(pair, letters, seed)
    want = constrained_rows(pair, raw)
    joint = {
        s: math.prod(want[s[:i]][s[i]] for i in range(GAMMA + 1))
        for s in itertools.product(letters, repeat=GAMMA + 1)
        if all(s[:i] in want and want[s[:i]][s[i]] > 0 for i in range(GAMMA + 1))
    }
    got = emission(pair, letters, raw, q, want, keep_forbidden=True)
    assert math.isclose(sum(got.values()), 1.0, abs_tol=1e-6)  # (q rows are float32)
    assert deviation(got, joint) < 1e-6
    # Negative control: a sampled draft cut before its forbidden token skews the answer.
    assert deviation(emission(pair, letters, raw, q, want, keep_forbidden=False), joint) > 1e-3


def test_the_draft_model_drafts_a_forced_run_whole(pair):
    """Guided by the grammar, a greedy draft model drafts the forced text (a key no model
    would guess) in the target's tokenization, then writes the value itself, all in one
    draft, and reads the forced run in decodes the controller does not take for a catch-up."""
    from edgespec.decoding.drafters import DraftRequest, ModelDrafter
    from edgespec.decoding.sampling import SamplingParams

    target = pair.target
    context = target.tokenize("Give the count as JSON: there are 42 of them.", add_special=False)
    gbnf = 'root ::= "{\\"qzx_count\\":" [0-9]+ "}"'
    constraint = Constraint(target, GrammarSpec(gbnf))
    drafter = ModelDrafter(pair.draft, target)
    drafter.begin(AnswerSetup(context, [], constraint))
    rng = np.random.default_rng(0)
    draft = drafter.propose(context, DraftRequest(6, SamplingParams(), rng))
    head = target.tokenize('{"qzx_count":', add_special=False)
    assert draft.tokens[: len(head)] == head
    assert all(math.isnan(c) for c in draft.confidences[: len(head)])  # no guess of the model's
    assert len(draft.tokens) == 6 and text_of(pair, draft.tokens[len(head) :]).isdigit()
    assert constraint.allowed_prefix(draft.tokens) == len(draft.tokens)
    assert all(size <= 4 for size, _ in draft.decodes[1:])  # (the first reads the context)
    pair.draft.sequence(0).reset()
