"""The ceiling: how fast a recorded answer could decode if every step were chosen in hindsight.

A replay (``bench.replay``) says what ``auto`` makes of a cost curve. This says what *any*
choice among the same drafters could make of it: at every position of the recorded answer
the lookups' proposals and the draft model's guesses are judged against the answer, and a
dynamic program picks the step (which drafter, how many tokens) that finishes the answer
soonest, knowing exactly how far each proposal holds. No controller can do better with
these drafters on this curve, so the distance from ``auto`` to the ceiling is what better
choices could still win, and a bar above the ceiling is one no choice can meet.

Each step is priced at or below what the replay charges for it (a target pass over the
verified tokens and the step's Python time; a draft-model token at its single-token price,
with no catch-up and no history of earlier pass sizes), so the ceiling bounds the replay's
``auto`` from above on every curve.
"""

from __future__ import annotations

from collections.abc import Callable

from edgespec.decoding.constrained import Constraint
from edgespec.decoding.drafters import AnswerSetup
from edgespec.decoding.engine import Engine
from edgespec.decoding.generation import StepProposals
from edgespec.decoding.grammar import GrammarSpec
from edgespec.runtime.model import Model
from edgespec.runtime.tokens import common_prefix


def held_runs(proposals: list[int], answer: list[int], start: int) -> int:
    """How many proposed tokens the answer confirms from ``start`` on."""
    return common_prefix(proposals, answer[start:])


def lookup_proposals(
    target: Model,
    prompt: list[int],
    answer: list[int],
    longest: int,
    grammar: GrammarSpec | None = None,
    prediction: list[int] | None = None,
) -> list[dict[str, list[int]]]:
    """For every answer position i: what each of the lookups (copy, n-gram, reflow, and
    the grammar's where the answer has one), asked after answer[:i] (with ``prediction``
    as the request's Predicted Output), proposes, at most ``longest`` tokens and no further
    than the answer's end. (Position 0, the token the prompt's prefill makes, has none: no
    step drafts it.)"""
    # the lookups auto chooses among, built and asked as an answer's generation does
    constraint = Constraint(target, grammar) if grammar is not None else None
    drafters = Engine(target).free_drafters(AnswerSetup(prompt, prediction or [], constraint))
    along: list[dict[str, list[int]]] = [{}]
    for i in range(1, len(answer)):
        context = prompt + answer[:i]
        if constraint is not None:
            constraint.commit(answer[i - 1 : i])
        proposals = StepProposals(drafters, context)
        wanted = min(longest, len(answer) - i)
        along.append({name: list(proposals.get(name, wanted).tokens) for name in drafters})
    return along


def lookup_runs(along: list[dict[str, list[int]]], answer: list[int]) -> list[int]:
    """For every answer position i: the most tokens from i on that one of the lookups
    proposes right, given their proposals ``along`` the answer (``lookup_proposals``; 0 at
    position 0)."""
    return [
        max((held_runs(p, answer, i) for p in by_name.values()), default=0) for i, by_name in enumerate(along)
    ]


def model_runs(guesses: list[int], answer: list[int]) -> list[int]:
    """For every answer position i: how many tokens from i on the draft model gets right
    drafting greedily after answer[:i] (its teacher-forced guesses, up to the first
    wrong one: drafted along the right text, its tokens are those guesses)."""
    runs = [0] * (len(answer) + 1)
    for i in range(len(answer) - 1, -1, -1):
        runs[i] = runs[i + 1] + 1 if i < len(guesses) and guesses[i] == answer[i] else 0
    runs[0] = 0
    return runs[: len(answer)]


def fastest_seconds(
    lookup: list[int],
    model: list[int] | None,
    verify_s: Callable[[int], float],
    draft_token_s: float,
    longest: int,
) -> float:
    """Least seconds to decode answer positions 1..n-1 (n = len(lookup)), each step one
    target pass over the last token and γ ≤ ``longest`` drafted ones, committing the
    drafted tokens the answer confirms and one more. A lookup draft costs
    ``verify_s(γ + 1)``; a draft-model one that plus γ × ``draft_token_s``. A draft
    longer than what holds commits no more than one cut to it, so it is chosen only where
    a measured curve charges a longer pass less."""
    n = len(lookup)
    # cheapest way to commit r + 1 tokens (r held drafted tokens), by r: a draft of any
    # γ ≥ r (a plain step is γ = 0)
    lookup_price = [verify_s(gamma + 1) for gamma in range(longest + 1)]
    model_price = [verify_s(gamma + 1) + gamma * draft_token_s for gamma in range(longest + 1)]
    for price in (lookup_price, model_price):
        for gamma in range(longest - 1, -1, -1):
            price[gamma] = min(price[gamma], price[gamma + 1])
    best = [0.0] * (n + 1)  # best[i]: positions i..n-1 still to decode
    for i in range(n - 1, 0, -1):
        left = n - 1 - i  # answer tokens after position i
        seconds = lookup_price[0] + best[i + 1]
        for held in range(1, min(lookup[i], left, longest) + 1):
            seconds = min(seconds, lookup_price[held] + best[i + held + 1])
        if model is not None:
            for held in range(1, min(model[i], left, longest) + 1):
                seconds = min(seconds, model_price[held] + best[i + held + 1])
        best[i] = seconds
    return best[1] if n > 1 else 0.0


def ceiling_ratios(
    target: Model,
    prompt: list[int],
    answer: list[int],
    guesses: list[int] | None,
    verify_s: Callable[[int], float],
    draft_token_s: float,
    longest: int,
    end_token: int | None = None,
    grammar: GrammarSpec | None = None,
    prediction: list[int] | None = None,
) -> tuple[float, float]:
    """Decode-phase speed of the fastest schedule over plain decoding's (1.0 for an
    answer of one token), with every drafter and with the lookups alone (the draft model
    left out; the lookups' proposals are judged once for both): drafts of at most
    ``longest`` tokens, the draft model's only where ``guesses`` (its teacher-forced
    tokens) are given. An answer that ended with ``end_token`` has one more step to take,
    the one that makes it (as a replay does). An answer decoded under ``grammar`` has the
    grammar's drafter among the lookups; the lookups also copy from ``prediction`` where
    one is given."""
    sequence = answer + ([end_token] if end_token is not None else [])
    if len(sequence) < 2:
        return 1.0, 1.0
    lookup = lookup_runs(lookup_proposals(target, prompt, sequence, longest, grammar, prediction), sequence)
    model = None if guesses is None else model_runs(guesses, sequence)
    plain = (len(sequence) - 1) * verify_s(1)
    lookups_alone = plain / fastest_seconds(lookup, None, verify_s, draft_token_s, longest)
    if model is None:
        return lookups_alone, lookups_alone
    return plain / fastest_seconds(lookup, model, verify_s, draft_token_s, longest), lookups_alone
