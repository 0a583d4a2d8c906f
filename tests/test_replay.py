"""The controller's decisions on cost curves this machine does not have.

Answers and the draft's guesses are recorded with the real llama.cpp and the shipped
GGUFs; the replay runs the real engine, drafters and controller over them with a virtual
clock priced by a curve (edgespec.bench.replay). A benchmark on this CPU can only show the
CPU's regime; these tests pin down what auto does where verification is nearly free (a
GPU, Apple Silicon) and where it is dear, whatever machine runs them."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import REPLAYED_TOKENS
from synthetic_costs import LONG_ANSWER

from edgespec.bench.corpus import prompt_tokens, select
from edgespec.bench.recording import cached_record, record
from edgespec.bench.replay import CURVES, add_ceiling, cost_model, curve_from_costs, replay
from edgespec.decoding.costs import CostModel
from edgespec.errors import EdgespecError

CONFIGS = ("target only", "auto", "model γ=2", "model γ=4")
TOKENS = REPLAYED_TOKENS


@pytest.fixture(scope="module")
def recordings(replay_recordings):
    return replay_recordings


def ratios(results, prompt: str) -> dict[str, float]:
    runs = results[prompt]
    return {label: run.decode_tps / runs["target only"].decode_tps for label, run in runs.items()}


@pytest.mark.needs_models
def test_the_recording_is_what_the_models_compute(pair, recordings):
    chat = recordings[0]
    assert len(chat.answer) == TOKENS and not chat.ended
    # the target's answer is its greedy decode; the draft's first guess is its argmax
    target, draft = pair.target.sequence(0), pair.draft.sequence(0)
    target.reset()
    logits = target.decode(chat.prompt, 1)
    assert int(np.argmax(logits[0])) == chat.answer[0]
    draft.reset()
    row = np.array(draft.decode(chat.prompt, 1)[0], dtype=np.float64)
    assert int(np.argmax(row)) == chat.guesses[0]
    # (batched and single-token passes differ in the last digits of the logits)
    assert chat.confidences[0] == pytest.approx(1.0 / np.exp(row - row.max()).sum(), rel=0.05)
    target.reset()
    draft.reset()
    # the draft guesses much of a chat answer, and not all of it: the replay has work to do
    agree = np.mean([g == a for g, a in zip(chat.guesses, chat.answer, strict=False)])
    assert 0.4 < agree < 0.98


@pytest.mark.needs_models
@pytest.mark.parametrize("curve", sorted(CURVES))
def test_a_replay_commits_exactly_the_recorded_answer(pair, recordings, curve):
    results = replay(recordings, pair.target, pair.draft, CURVES[curve], CONFIGS)
    for rec in recordings:
        for label, run in results[rec.id].items():
            assert run.exact, (rec.id, label)
            assert run.decode_tps > 0


@pytest.mark.needs_models
def test_where_verification_is_nearly_free_auto_finds_the_draft_model(pair, recordings):
    """(As in answers long enough to afford the draft's reading of the prompt, which the
    bound on what an answer may lose does not let a 64-token answer risk: the choices are
    what this pins down; the bound has tests of its own, test_replay_bound.py.)"""
    results = replay(recordings, pair.target, pair.draft, CURVES["gpu"], CONFIGS, tuning=LONG_ANSWER)
    for prompt in ("chat-explain-interest-2", "math-bakery-1"):
        r = ratios(results, prompt)
        best_fixed = max(r["target only"], r["model γ=2"], r["model γ=4"])
        assert best_fixed > 1.15, r  # the draft pays here: a replay that shows it
        assert r["auto"] >= 0.9 * best_fixed, (prompt, r)
        steps = results[prompt]["auto"].steps
        assert steps["model"] == max(steps.values()), (prompt, steps)  # its most frequent choice


@pytest.mark.needs_models
def test_where_every_verified_token_is_dear_auto_leaves_the_draft_model_alone(pair, recordings):
    """(As in a long answer, like the test above.)"""
    results = replay(recordings, pair.target, pair.draft, CURVES["cpu"], CONFIGS, tuning=LONG_ANSWER)
    for prompt in ("chat-explain-interest-2", "math-bakery-1"):
        r = ratios(results, prompt)
        assert r["model γ=4"] < 0.8, r  # the draft cannot pay on this curve
        assert results[prompt]["auto"].steps["model"] == 0, (prompt, results[prompt]["auto"].steps)
        assert r["auto"] >= 0.97, (prompt, r)
    # ... while copying a rename pays even here
    assert ratios(results, "edit-rename-py-1")["auto"] >= 1.15


@pytest.mark.needs_models
def test_the_replay_shows_a_controller_that_never_tries_the_draft(pair, recordings):
    """The GPU test above can fail: a controller that never tries the draft (its best case
    below plain decoding) and asks ten times plain decoding's rate before choosing it never
    chooses it, and stays below the draft model's speed where the draft pays."""
    timid = dataclasses.replace(LONG_ANSWER, optimistic=0.3, model_gain=10.0)
    results = replay(recordings, pair.target, pair.draft, CURVES["gpu"], CONFIGS, tuning=timid)
    r = ratios(results, "chat-explain-interest-2")
    assert results["chat-explain-interest-2"]["auto"].steps["model"] == 0
    # It fails the test above by its choices, and it is slower than the draft model
    # (by how much depends on the recorded answer: its copies alone give it about 1.1).
    best_fixed = max(r["target only"], r["model γ=2"], r["model γ=4"])
    assert r["auto"] < best_fixed, r


@pytest.mark.needs_models
def test_recordings_are_kept_and_a_damaged_one_is_recorded_again(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    chosen = [(p, prompt_tokens(pair, p)) for p in select(ids=["math-bakery-1"])]
    first = cached_record(pair.target, pair.draft, chosen, 8)
    (kept,) = (tmp_path / "replay").glob("*.json")
    assert cached_record(pair.target, pair.draft, chosen, 8) == first
    kept.write_text('{"id": "math-bak')  # cut off mid-write by a crash, say
    assert cached_record(pair.target, pair.draft, chosen, 8) == first
    assert json.loads(kept.read_text())["answer"] == first[0].answer
    # another token budget is another recording
    assert len(cached_record(pair.target, pair.draft, chosen, 4)[0].answer) == 4
    assert len(list((tmp_path / "replay").glob("*.json"))) == 2
    # one file per prompt: a selection that adds a prompt records only that one
    more = chosen + [(p, prompt_tokens(pair, p)) for p in select(ids=["short-git-undo-1"])]
    recorded: list[str] = []
    both = cached_record(pair.target, pair.draft, more, 8, recorded.append)
    assert both[0] == first[0] and [line.split(":")[0] for line in recorded] == ["short-git-undo-1"]


def test_a_measured_profile_replays_as_the_curve_it_measured():
    costs = CostModel.empty(17)
    for k, seconds in {1: 0.030, 2: 0.050, 5: 0.110, 17: 0.300}.items():
        costs.target.set(k, seconds)
    costs.draft.set(1, 0.020)
    costs.draft.set(4, 0.040)
    curve = curve_from_costs(costs)
    assert curve.target_seconds(1) == pytest.approx(0.030)
    assert curve.target_seconds(5) == pytest.approx(0.110)
    assert curve.target_seconds(17) == pytest.approx(0.300)
    assert curve.target_seconds(3) == pytest.approx(0.070)  # between measured sizes: a line
    assert curve.draft_seconds(1) == pytest.approx(0.020)
    assert curve.draft_seconds(4) == pytest.approx(0.040)
    # the controller handed this curve prices every size as the profile did
    rebuilt = cost_model(curve, 17)
    for k in (1, 2, 3, 5, 9, 17):
        assert rebuilt.target.estimate(k) == pytest.approx(costs.target.estimate(k))
    with pytest.raises(EdgespecError, match="single-token"):
        curve_from_costs(CostModel.empty(4))


@pytest.mark.needs_models
def test_a_structured_answer_replays_under_its_grammar(pair):
    """A recording keeps its prompt's schema: the replay decodes under the grammar again, so
    the grammar's drafter drafts and the ceiling counts its proposals."""
    chosen = [(p, prompt_tokens(pair, p)) for p in select(ids=["json-rewrite-user-1"])]
    (rec,) = record(pair.target, pair.draft, chosen, 48)
    assert rec.extras["json_schema"] and rec.settings(48).grammar is not None
    configs = ("target only", "auto", "grammar γ=8")
    results = replay([rec], pair.target, pair.draft, CURVES["gpu"], configs)
    runs = results[rec.id]
    assert all(run.exact for run in runs.values())
    assert runs["grammar γ=8"].steps["grammar"] > 0 and runs["auto"].steps["grammar"] > 0
    assert runs["grammar γ=8"].decode_tps > runs["target only"].decode_tps
    add_ceiling([rec], pair.target, CURVES["gpu"], results)
    assert runs["ceiling"].decode_tps >= max(
        run.decode_tps for run in runs.values() if run is not runs["ceiling"]
    )


def test_a_replay_keeps_every_step_and_replays_them_again_the_same(pair, recordings):
    """The trace ``--trace`` writes: every step, in order, the same on a second replay
    (what a change meant to keep the controller's decisions is checked against)."""
    configs = ["target only", "auto", "model γ=4"]
    first = replay(recordings, pair.target, pair.draft, CURVES["gpu"], configs)
    again = replay(recordings, pair.target, pair.draft, CURVES["gpu"], configs)
    for rec in recordings:
        for label in configs:
            played = first[rec.id][label]
            assert len(played.trace) == sum(played.steps.values()) > 0
            assert sum(accepted + 1 for _, _, accepted, _ in played.trace) >= len(rec.answer) - 1
            assert played.trace == again[rec.id][label].trace
        assert {drafter for drafter, *_ in first[rec.id]["target only"].trace} == {"none"}
