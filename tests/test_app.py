"""The chat app. First what its panels say, from synthetic Step/Token/Done events (pure,
no models); then the app over HTTP, driven with gradio_client against the real default
model pair.

The app runs in this process on a free loopback port; each test opens its own client, and
so its own Gradio session (conversation, Stop ownership).
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from gradio_client import Client
from gradio_client.utils import Status

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.decoding.drafters import AUTO, CHOICE_HELP, CHOICES, NONE, NONE_COLOUR, REGISTRY
from edgespec.decoding.events import BONUS, DRAFT, PLAIN, TARGET, Done, Event, Stats, Step, Token
from edgespec.decoding.generation import Generation
from edgespec.runtime.prompt_cache import GIB, CacheOptions
from edgespec.ui.answer import AnswerRun, answer_from_record, answer_record
from edgespec.ui.figures import (
    DRAFTED_NAME,
    DRAFTER_COLOURS,
    NO_DRAFT_NAME,
    NO_STEPS_TEXT,
    step_series,
    steps_chart_html,
)
from edgespec.ui.gauge import gauge_html
from edgespec.ui.handlers import UPDATE_INTERVAL_S, View
from edgespec.ui.layout import build_app, drafter_choices, drafter_help, launch_app
from edgespec.ui.library import WARM_MARK
from edgespec.ui.reasons import FIXED_WORDS, IDLE_WORDS, reason_words
from edgespec.ui.text import (
    PROVENANCE_STYLE,
    coloured_answer,
    final_stats_markdown,
    provenance_css,
    provenance_legend,
    speedup_markdown,
    step_rows,
)

pytestmark = [
    # Gradio's own queue metrics trip pandas 3 deprecations: noise, not ours to fix.
    pytest.mark.filterwarnings("ignore:'future.no_silent_downcasting' is deprecated"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]


def needs_models(test):
    """The tests that load the default pair: slow, and only where the GGUFs are."""
    return pytest.mark.slow(pytest.mark.needs_models(test))


APP = Path(__file__).resolve().parent.parent / "app.py"
OUT = {name: index for index, name in enumerate(View.names())}
# Explicit drafter and γ: these tests must not depend on the adaptive controller.
FAST = {
    "system": "",
    "drafter": "model",
    "gamma": "4",
    "verify": "token",
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "seed": "",
    "max_tokens": 32,
    "lenience": 1.0,
    "colour": False,
}
LISTED = len(View.names())  # where the chat list is among an opening handler's outputs
CODE_PROMPT = "Write a Python function that adds two numbers."
LONG_PROMPT = "Write a long, detailed story about a robot who learns to paint."
# An answer a test needs in flight is held there by a budget no machine decodes before the
# test has looked, then stopped: no test waits for an answer to be slow.
HELD = 1024

# -- what the panels say, from synthetic events (no models) ----------------------------------

REASON = "none:0@31.2/s, ngram:4@40.1/s, copy:8@55.0/s"


def step(drafter: str, gamma: int, accepted: int, planned: int | None = None, reason: str = "") -> Step:
    planned = gamma if planned is None else planned
    return Step(drafter, gamma, accepted, 0.01, 0.02, planned_gamma=planned, reason=reason)


def tokens(*sources: str) -> list[Token]:
    return [Token(100 + i, f"<{source}{i}>", source) for i, source in enumerate(sources)]


def fold(events: list[Event]) -> AnswerRun:
    run = AnswerRun()
    for event in events:
        run.add(event)
    return run


def done(run: AnswerRun) -> Done:
    stats = Stats(tokens=run.tokens, target_passes=len(run.steps), wall_s=1.0, ttft_s=0.2)
    return Done(text=run.text, tail="", stop_reason="eos", stats=stats)


def drafted_events() -> list[Event]:
    """A first token, then a model step all accepted, a copy step cut short, a plain step."""
    return [
        *tokens(PLAIN),
        step("model", 4, 4),
        *tokens(DRAFT, DRAFT, DRAFT, DRAFT, BONUS),
        step("copy", 8, 2, reason=REASON),
        *tokens(DRAFT, DRAFT, TARGET),
        step(NONE, 0, 0),
        *tokens(PLAIN),
    ]


def plain_events(steps: int) -> list[Event]:
    events: list[Event] = [*tokens(PLAIN)]
    for _ in range(steps):
        events += [step(NONE, 0, 0), *tokens(PLAIN)]
    return events


def finished(events: list[Event]) -> AnswerRun:
    run = fold(events)
    run.add(done(run))
    return run


def test_legend_separates_corrections_from_tokens_with_no_draft():
    assert list(PROVENANCE_STYLE) == [DRAFT, TARGET, BONUS, PLAIN]
    labels = {source: label for source, (label, _, _) in PROVENANCE_STYLE.items()}
    assert labels[TARGET] == "correction" and labels[PLAIN] == "target, no draft"
    backgrounds = [background for _, background, _ in PROVENANCE_STYLE.values()]
    assert len(set(backgrounds)) == 4, "each provenance needs its own colour"

    run = finished(drafted_events())
    legend = provenance_legend(run, colour=True)
    answer = coloured_answer(run.runs)
    for source, count in ((DRAFT, 6), (TARGET, 1), (BONUS, 1), (PLAIN, 2)):
        assert f'data-legend="{source}" data-count="{count}"' in legend
        assert f'class="prov prov-{source}"' in answer
    order = [legend.index(f'data-legend="{source}"') for source in (DRAFT, TARGET, BONUS, PLAIN)]
    assert order == sorted(order), "legend order: draft, correction, bonus, no draft"
    # Shown in the chat in place of the Markdown: one line, so no blank line ends the block.
    multi_line = coloured_answer([["a\n\nb", PLAIN]])
    assert "\n" not in multi_line and "a&#10;&#10;b" in multi_line

    plain_run = finished(plain_events(5))
    plain_legend, plain = provenance_legend(plain_run, colour=True), coloured_answer(plain_run.runs)
    assert f'data-legend="{PLAIN}" data-count="6"' in plain_legend
    assert f'data-legend="{TARGET}" data-count="0"' in plain_legend
    assert "prov-target" not in plain, "no draft, so nothing was corrected"
    assert plain.count('class="prov ') == 1 and "prov-plain" in plain
    css = provenance_css()
    assert all(f".prov-{source}{{background:" in css for source in PROVENANCE_STYLE)


def test_a_stored_answer_comes_back_with_its_figures():
    run = finished(drafted_events())
    stats, provenance, steps = answer_record(run)
    again = answer_from_record(run.text, stats, provenance, steps)
    assert again.runs == run.runs and again.steps == run.steps and again.sources == run.sources
    assert (again.tokens, again.drafted, again.accepted) == (run.tokens, run.drafted, run.accepted)
    assert again.done is not None and again.done.stats == run.done.stats
    assert again.done.stop_reason == "eos"
    assert gauge_html(again) == gauge_html(run)
    # An imported answer without figures is its text, plain.
    bare = answer_from_record("hello", None, None, None)
    assert bare.runs == [["hello", PLAIN]] and bare.text == "hello"


def test_every_drafter_has_its_registry_colour_in_the_step_chart():
    assert DRAFTER_COLOURS[NONE] == NONE_COLOUR
    assert "copy" in DRAFTER_COLOURS
    for name, spec in REGISTRY.items():
        assert DRAFTER_COLOURS[name] == spec.colour
    assert len(set(DRAFTER_COLOURS.values())) == len(DRAFTER_COLOURS)

    steps = [step(name, 3, 1 + i % 3) for i, name in enumerate(REGISTRY)]
    series = {s.name: s for s in step_series(steps)}
    markup = steps_chart_html(steps)
    for i, (name, spec) in enumerate(REGISTRY.items()):
        drawn = series[f"accepted ({name})"]
        assert drawn.colour == spec.colour
        assert [(p.step, p.value) for p in drawn.points] == [(i + 1, 1 + i % 3)]
        assert f'data-series="accepted ({name})" data-colour="{spec.colour}" fill="{spec.colour}"' in markup


def drawn_series(markup: str) -> dict[str, list[tuple[int, int]]]:
    """The chart's series as its markup draws them: (step, value) of every mark."""
    groups = re.findall(r'<g class="series" data-series="([^"]+)"[^>]*>(.*?)</g>', markup, re.S)
    return {
        name: [(int(a), int(b)) for a, b in re.findall(r'data-step="(\d+)" data-y="(\d+)"', body)]
        for name, body in groups
    }


def test_step_chart_draws_steps_without_a_draft_at_zero():
    steps = finished(drafted_events()).steps
    markup = steps_chart_html(steps)
    drawn = drawn_series(markup)
    assert drawn[DRAFTED_NAME] == [(1, 4), (2, 8)]
    assert drawn["accepted (model)"] == [(1, 4)]
    assert drawn["accepted (copy)"] == [(2, 2)]
    assert drawn[NO_DRAFT_NAME] == [(3, 0)]
    assert f'data-series="{NO_DRAFT_NAME}" data-colour="{NONE_COLOUR}"' in markup
    assert list(drawn) == [s.name for s in step_series(steps)]
    # Each mark says what its step did, and why, where the pointer rests on it.
    assert "<title>step 3: none, γ 0" in markup

    plain = drawn_series(steps_chart_html(finished(plain_events(5)).steps))
    assert plain == {NO_DRAFT_NAME: [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0)]}


def test_step_chart_bars_stand_on_the_axis_in_proportion():
    steps = finished(drafted_events()).steps  # drafted 4 then 8: the axis reaches 8
    bars = {
        (series, int(step)): (float(y), float(height))
        for series, body in re.findall(r'data-series="([^"]+)"[^>]*>(.*?)</g>', steps_chart_html(steps), re.S)
        for step, y, height in re.findall(r'data-step="(\d+)"[^>]* y="([\d.]+)"[^>]* height="([\d.]+)"', body)
    }
    floor = {round(y + h, 1) for y, h in bars.values()}
    assert len(floor) == 1, "every bar stands on the same axis"
    full = bars[(DRAFTED_NAME, 2)][1]
    assert bars[(DRAFTED_NAME, 1)][1] == pytest.approx(full / 2, rel=1e-3)
    assert bars[("accepted (copy)", 2)][1] == pytest.approx(full / 4, rel=1e-3)
    assert NO_STEPS_TEXT in steps_chart_html([]) and "<svg" not in steps_chart_html([])


def gauge_numbers(markup: str) -> tuple[int, int]:
    accepted = int(re.search(r'data-accepted="(\d+)"', markup).group(1))
    drafted = int(re.search(r'data-drafted="(\d+)"', markup).group(1))
    return accepted, drafted


def test_gauge_names_its_step_while_streaming_and_sums_up_the_answer_at_the_end():
    live = gauge_html(fold(drafted_events()))
    assert "step 2 of 3 so far: copy, 2 of 8 accepted" in live
    assert gauge_numbers(live) == (2, 8) and ">2 / 8</text>" in live

    end = gauge_html(finished(drafted_events()))
    assert "whole answer: 2 of 3 steps drafted" in end
    assert "6 of 12 drafted tokens accepted, τ 3.00" in end
    assert gauge_numbers(end) == (6, 12) and "step 2" not in end
    # The arc is as long as the share accepted: half of it here.
    dash = re.search(r'stroke-dasharray="([0-9.]+) ([0-9.]+)"', end)
    assert abs(float(dash.group(1)) / float(dash.group(2)) - 0.5) < 0.01

    nothing = gauge_html(finished(plain_events(55)))
    assert "no drafting in this answer" in nothing and "55 steps" in nothing and "τ 1.00" in nothing
    assert gauge_numbers(nothing) == (0, 0) and "waiting" not in nothing
    assert "no drafts" in nothing, "no acceptance rate over nothing drafted"

    assert "no drafting step yet (3 plain steps so far)" in gauge_html(fold(plain_events(3)))
    assert "send a message" in gauge_html(None)


@pytest.mark.parametrize(
    ("planned", "expected"),
    [
        (step("copy", 8, 5, reason=REASON), "chose copy, 8 tokens: est. 55 tok/s vs 31 plain"),
        (step(NONE, 0, 0, reason=""), FIXED_WORDS),
        (step(NONE, 0, 0, reason="idle"), IDLE_WORDS),
        (
            step(NONE, 0, 0, reason="none:0@31.2/s, ngram:4@30.0/s"),
            "no draft: est. 31 tok/s plain, best draft ngram, 4 tokens, est. 30",
        ),
        (
            step(NONE, 0, 0, reason="none:0@31.2/s, ngram:4@33.0/s"),
            "no draft: est. 31 tok/s plain, best draft ngram, 4 tokens, est. 33 (not clearly faster)",
        ),
        (
            step(NONE, 0, 0, reason="none:0@7.5/s"),
            "no draft: no drafting option to price (est. 7.5 tok/s plain)",
        ),
        (
            step("model", 4, 1, reason="none:0@31.2/s, model:6@20.4/s"),
            "tried model, 4 tokens (to keep measuring it): est. 20 tok/s vs 31 plain",
        ),
        (
            step(NONE, 0, 0, planned=8, reason=REASON),
            "chose copy, 8 tokens: est. 55 tok/s vs 31 plain; it found nothing to propose",
        ),
        (step("ngram", 2, 2, reason="a form this page does not know"), "a form this page does not know"),
    ],
)
def test_reason_in_words(planned: Step, expected: str):
    assert reason_words(planned) == expected


def test_step_table_shows_words_not_the_controller_string():
    rows = step_rows(finished(drafted_events()).steps)
    assert [row[1] for row in rows] == ["model", "copy", NONE]
    assert rows[1][5] == "chose copy, 8 tokens: est. 55 tok/s vs 31 plain"
    assert rows[0][5] == FIXED_WORDS
    assert not any("@" in str(row[5]) for row in rows)


def test_rates_say_they_are_end_to_end():
    stats = Stats(tokens=11, target_passes=10, wall_s=2.0, ttft_s=1.0)
    table = final_stats_markdown(stats, "eos")
    assert "| tokens/s, end to end | 5.5 " in table
    assert "| tokens/s, decode phase | 10.0 " in table
    figure = speedup_markdown(5.5, [4.0, 4.4])
    assert "all end to end" in figure and "×1.31" in figure and "4.0 and 4.4 tok/s" in figure


def test_a_one_token_answer_has_no_decode_phase_and_plain_tau_is_explained():
    one = final_stats_markdown(Stats(tokens=1, target_passes=0, wall_s=0.3, ttft_s=0.3), "eos")
    assert "| tokens/s, decode phase | — (the answer ended at its first token" in one
    assert "— (no pass after the first token)" in one and "τ" in one and "| 0.00 over" not in one
    plain = final_stats_markdown(Stats(tokens=37, target_passes=37, wall_s=2.0, ttft_s=0.2), "eos")
    assert "0.97 over 37 passes (1 a pass without drafts, less the pass that ended the answer)" in plain
    # Prefill holds the draft's prompt pass too, which runs after the first token.
    assert "prefill (target, then draft)" in plain and "(the target's prompt pass)" in plain


def test_the_gauge_counts_the_drafts_the_answer_kept_as_the_legend_does():
    # Four drafts accepted, but the answer ended (max tokens) after two of them.
    run = fold([*tokens(PLAIN), step("model", 4, 4), *tokens(DRAFT, DRAFT)])
    run.add(done(run))
    html = gauge_html(run)
    assert gauge_numbers(html) == (2, 4) and run.sources[DRAFT] == 2
    assert "2 of 4 drafted tokens accepted" in html


def test_drafter_choices_come_from_the_registry_with_auto_first():
    assert drafter_choices(has_draft=True) == list(CHOICES)
    assert drafter_choices(has_draft=True)[0] == AUTO
    without = drafter_choices(has_draft=False)
    assert "copy" in without and NONE in without
    assert not any(name in REGISTRY and REGISTRY[name].needs_model for name in without)
    help_text = drafter_help(list(CHOICES))
    assert all(f"**{name}**: {CHOICE_HELP[name]}" in help_text for name in CHOICES)

    app = build_app(None, load_error="no model here")
    by_id = {getattr(block, "elem_id", None): block for block in app.blocks.values()}
    radio = by_id["drafter"]
    assert [value for _, value in radio.choices] == list(CHOICES)
    assert radio.value == AUTO
    assert "**copy**" in by_id["drafter-help"].value


# -- the app over HTTP, with the real models -------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def launch(lm: EdgeSpec | None, load_error: str | None = None) -> Iterator[str]:
    demo = build_app(lm, load_error=load_error)
    port = free_port()
    launch_app(demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@pytest.fixture(scope="module")
def lm() -> Iterator[EdgeSpec]:
    # As app.py loads it: a prompt cache (a chat taken up again is warm), one engine thread.
    options = RuntimeOptions(n_ctx=4096, cache=CacheOptions(ram_bytes=GIB), engine_thread=True)
    model = EdgeSpec(options=options, quiet=True)
    yield model
    # A failed test can leave an answer running in Gradio's worker thread: close ends it,
    # and frees the models only once it let go of them.
    model.close()


@pytest.fixture(scope="module")
def app_url(lm: EdgeSpec) -> Iterator[str]:
    with launch(lm) as url:
        yield url


@pytest.fixture
def client(app_url: str) -> Iterator[Client]:
    c = Client(app_url, verbose=False)
    yield c
    # Its close waits up to a second for the heartbeat thread, which ends on its own.
    threading.Thread(target=c.close, daemon=True).start()


def ask(client: Client, message: str, **overrides: Any):
    return client.submit(message, **{**FAST, **overrides}, api_name="/chat")


def answer_text(chatbot: Any) -> str:
    """The last assistant message of a Chatbot value ("" when there is none yet)."""
    if not isinstance(chatbot, list) or not chatbot or chatbot[-1]["role"] != "assistant":
        return ""
    return "".join(part.get("text", "") for part in chatbot[-1]["content"])


def gauge_value(markup: str) -> int:
    return gauge_numbers(markup)[0]


def wait_for_text(job, timeout: float = 120) -> str:
    """Poll a running chat job until some answer text has streamed back."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for outputs in reversed(job.outputs()):
            text = answer_text(outputs[OUT["chatbot"]])
            if text:
                return text
        if job.done():
            break
        time.sleep(0.05)
    raise AssertionError("no answer text streamed back")


def read_slowly(monkeypatch) -> None:
    """Each answer's events handed to its reader (the app) a throttle interval apart after
    every step, as a slow machine hands them: the updates the app streams, whatever the
    speed of the machine decoding (a fast one ends 32 tokens before a second is due)."""
    events = Generation.events

    def paced(answer: Generation, every_s: float = 0.0) -> Iterator[Event]:
        with closing(events(answer, every_s)) as inner:
            for event in inner:
                yield event
                if isinstance(event, Step):
                    time.sleep(UPDATE_INTERVAL_S)

    monkeypatch.setattr(Generation, "events", paced)


@needs_models
def test_answer_streams_with_stats_and_continues_the_conversation(client: Client, monkeypatch):
    read_slowly(monkeypatch)
    job = ask(client, CODE_PROMPT)
    final = job.result(timeout=180)
    texts = [answer_text(o[OUT["chatbot"]]) for o in job.outputs()]
    streamed = [t for t in dict.fromkeys(texts) if t]
    assert len(streamed) >= 3, f"expected several streamed updates, got {streamed}"
    answer = answer_text(final[OUT["chatbot"]])
    assert all(answer.startswith(t) for t in streamed), "updates must only ever extend the answer"
    stats = final[OUT["stats"]]
    for label in ("tokens/s", "τ", "acceptance", "time to first token", "prefill", "verify", "other"):
        assert label in stats
    assert "32 (max tokens reached)" in stats
    assert "colouring off" in final[OUT["legend"]]
    assert final[OUT["steps_table"]]["data"][0][1] == "model"
    assert 'data-series="accepted (model)"' in final[OUT["steps_plot"]]
    gauges = [o[OUT["gauge"]] for o in job.outputs() if "data-accepted" in str(o[OUT["gauge"]])]
    assert max(gauge_value(g) for g in gauges) > 0
    assert "speedup ×" not in final[OUT["speedup"]], "no speedup figure before a measured baseline"

    second = ask(client, "Now make it multiply instead.").result(timeout=180)
    chat = second[OUT["chatbot"]]
    assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant"]
    assert answer_text(chat)
    # The first turn stayed in the caches: most of the second prompt is reused.
    assert reused_tokens(second[OUT["stats"]]) > 30
    # Coloured by provenance, the answers are drawn in the chat itself, not a second time.
    coloured, legend = client.predict(True, api_name="/recolour")
    assert 'class="prov prov-draft"' in answer_text(coloured)
    assert 'data-legend="draft"' in legend
    assert [m["role"] for m in coloured] == ["user", "assistant", "user", "assistant"]


def reused_tokens(stats: str) -> int:
    return int(stats.split(" reused")[0].rsplit(",", 1)[1].split()[0])


@needs_models
def test_chats_keep_their_histories_and_a_chat_taken_up_again_is_warm(client: Client):
    first = ask(client, CODE_PROMPT).result(timeout=180)
    assert answer_text(first[OUT["chatbot"]])
    opened = client.predict("", api_name="/new_chat")
    assert opened[OUT["chatbot"]] == []
    second = ask(client, "Name three colours, one word each.").result(timeout=180)
    listed = client.predict("", api_name="/new_chat")[LISTED]["choices"]
    titles = [title.removesuffix(WARM_MARK) for title, _ in listed]
    # Newest first, each titled by its first message; the chat in the slot is warm.
    assert titles[:2] == ["Name three colours, one word each.", CODE_PROMPT]
    first_id = listed[1][1]
    assert listed[0][0].endswith(WARM_MARK)
    back = client.predict(first_id, api_name="/open_chat")
    assert back[OUT["chatbot"]] == first[OUT["chatbot"]]  # the first chat, as it was
    assert back[LISTED]["value"] == first_id
    again = ask(client, "Now make it multiply instead.").result(timeout=180)
    assert [m["role"] for m in again[OUT["chatbot"]]] == ["user", "assistant"] * 2
    # Another conversation ran in between; its history came back from the prompt cache.
    assert reused_tokens(again[OUT["stats"]]) > 30
    assert answer_text(second[OUT["chatbot"]])


@needs_models
def test_regenerate_and_edit_replace_what_followed(client: Client):
    ask(client, "Name a colour, one word.", max_tokens=8).result(timeout=180)
    ask(client, "Name a fruit, one word.", max_tokens=8).result(timeout=180)
    # Regenerate: the last answer again (greedy: the same text), from the cached question.
    client.predict(api_name="/note_retry")
    again = ask(client, "ignored: the last question is answered again", max_tokens=8).result(timeout=180)
    roles = [m["role"] for m in again[OUT["chatbot"]]]
    assert roles == ["user", "assistant"] * 2
    assert "Name a fruit" in answer_text_of(again[OUT["chatbot"]][2])
    assert reused_tokens(again[OUT["stats"]]) > 10
    # Edit the first question: what followed it goes, and the edited one is answered.
    client.predict(0, "Name an animal, one word.", api_name="/edit_message")
    edited = ask(client, "ignored", max_tokens=8).result(timeout=180)
    chat = edited[OUT["chatbot"]]
    assert [m["role"] for m in chat] == ["user", "assistant"]
    assert answer_text_of(chat[0]) == "Name an animal, one word."


def answer_text_of(message: dict) -> str:
    return "".join(part.get("text", "") for part in message["content"])


@needs_models
def test_empty_message_shows_an_error_and_the_app_keeps_answering(client: Client):
    failed = ask(client, "   ").result(timeout=60)
    assert "empty" in failed[OUT["error"]]
    ok = ask(client, "Say hello in one word.", max_tokens=16).result(timeout=180)
    assert answer_text(ok[OUT["chatbot"]])
    assert ok[OUT["error"]] == ""


@needs_models
def test_prompt_longer_than_the_context_is_reported(client: Client, lm: EdgeSpec):
    message = "cache " * (lm.target.n_ctx + 200)
    failed = ask(client, message).result(timeout=120)
    assert "context holds" in failed[OUT["error"]]
    assert failed[OUT["message"]] == message, "the message is given back for editing"
    ok = ask(client, "Say hello in one word.", max_tokens=16).result(timeout=180)
    assert answer_text(ok[OUT["chatbot"]])


@needs_models
def test_stop_ends_the_generation_at_once_and_the_session_goes_on(client: Client):
    job = ask(client, LONG_PROMPT, max_tokens=HELD)
    wait_for_text(job)
    stopped_at = time.monotonic()
    client.predict(api_name="/stop")
    final = job.result(timeout=60)
    assert time.monotonic() - stopped_at < 10
    assert "(stopped)" in final[OUT["stats"]]
    assert answer_text(final[OUT["chatbot"]]), "the partial answer stays in the chat"

    ok = ask(client, "Say hello in one word.", max_tokens=16).result(timeout=180)
    assert answer_text(ok[OUT["chatbot"]])
    assert len(ok[OUT["chatbot"]]) == 4


@needs_models
def test_second_session_waits_its_turn_and_cannot_stop_the_first(app_url: str, client: Client):
    other = Client(app_url, verbose=False)
    try:
        # The first answer is long enough that it cannot end before the second is queued;
        # it ends when its own session stops it, at a point the test chooses.
        first = ask(client, LONG_PROMPT, max_tokens=HELD)
        wait_for_text(first)
        second = ask(other, "Say hello in one word.", max_tokens=16)
        other.predict(api_name="/stop")  # not its generation: must change nothing
        deadline = time.monotonic() + 30
        while second.status().code != Status.IN_QUEUE and time.monotonic() < deadline:
            time.sleep(0.02)
        assert second.status().code == Status.IN_QUEUE
        assert not first.done(), "another session's Stop must not end this answer"
        client.predict(api_name="/stop")
        assert "stopped" in first.result(timeout=180)[OUT["stats"]]
        assert answer_text(second.result(timeout=180)[OUT["chatbot"]])
    finally:
        other.close()


@needs_models
def test_baseline_is_measured_before_any_speedup_is_shown(client: Client):
    missing = client.predict(api_name="/measure_baseline")
    assert "send a message first" in missing[OUT["error"]]
    # Short answers: the baseline reads each twice more, and only the figures are checked.
    ask(client, CODE_PROMPT, max_tokens=12).result(timeout=180)
    measured = client.predict(api_name="/measure_baseline")
    speedup = measured[OUT["speedup"]]
    assert "speedup ×" in speedup and "vs measured baseline (" in speedup and "tok/s)" in speedup
    # A follow-up is another prompt: the figure is withdrawn, not carried over to it.
    follow_up = ask(client, "Now make it shorter.", max_tokens=12).result(timeout=180)
    assert "speedup ×" not in follow_up[OUT["speedup"]]
    assert "speedup ×" in client.predict(api_name="/measure_baseline")[OUT["speedup"]]
    # Another chat forgets the answers, and their baseline with them.
    assert "speedup ×" not in client.predict("", api_name="/new_chat")[OUT["speedup"]]


@needs_models
def test_a_new_chat_mid_generation_stops_the_answer_and_keeps_what_it_said(client: Client):
    ask(client, "Say hello in one word.", max_tokens=16).result(timeout=180)
    job = ask(client, LONG_PROMPT, max_tokens=HELD)
    wait_for_text(job)
    fresh_chat = client.predict("", api_name="/new_chat")
    assert fresh_chat[OUT["chatbot"]] == []
    job.result(timeout=60)  # the new chat also stopped it
    fresh = ask(client, "Say hello in one word.", max_tokens=16).result(timeout=180)
    assert [m["role"] for m in fresh[OUT["chatbot"]]] == ["user", "assistant"]
    # The stopped answer stayed in its own chat, as far as it had got.
    listed = client.predict("", api_name="/new_chat")[LISTED]["choices"]
    stopped_id = listed[1][1]
    stopped = client.predict(stopped_id, api_name="/open_chat")[OUT["chatbot"]]
    assert [m["role"] for m in stopped] == ["user", "assistant"] * 2
    assert answer_text(stopped)


@needs_models
def test_lenience_reaches_the_running_generation(client: Client, lm: EdgeSpec, monkeypatch):
    seen: list = []
    real_submit = lm.submit

    def spy(request, **kwargs):
        seen.append(real_submit(request, **kwargs))
        return seen[-1]

    monkeypatch.setattr(lm, "submit", spy)
    job = ask(client, LONG_PROMPT, max_tokens=HELD, temperature=0.8, seed="7")
    wait_for_text(job)
    client.predict(0.5, api_name="/set_lenience")
    assert seen[-1].live.lenience == 0.5, "the slider must reach the answer that is running"
    client.predict(api_name="/stop")
    job.result(timeout=60)


@needs_models
def test_default_settings_use_the_adaptive_controller(client: Client):
    final = client.submit(CODE_PROMPT, max_tokens=24, api_name="/chat").result(timeout=180)
    assert final[OUT["error"]] == ""
    assert answer_text(final[OUT["chatbot"]])
    # The controller's priced options reach the table in words, never as its raw string.
    why = [row[5] for row in final[OUT["steps_table"]]["data"]]
    assert why and not any("@" in text or text == FIXED_WORDS for text in why), why


@pytest.mark.slow
def test_a_model_that_failed_to_load_is_shown_and_the_app_still_runs():
    with launch(None, load_error="no such model: missing.gguf") as url:
        page_config = httpx.get(f"{url}config", timeout=30).text
        assert "could not be loaded" in page_config and "missing.gguf" in page_config
        c = Client(url, verbose=False)
        try:
            for _ in range(2):  # and again: the app keeps working
                failed = c.submit("hello", **FAST, api_name="/chat").result(timeout=60)
                assert "could not be loaded" in failed[OUT["error"]]
                assert "missing.gguf" in failed[OUT["error"]]
        finally:
            c.close()


@pytest.mark.slow
def test_app_script_reports_a_bad_model_in_one_line():
    result = subprocess.run(
        [sys.executable, str(APP), "--target", "/no/such/model.gguf", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    expected = "edgespec: error: model file not found: /no/such/model.gguf"
    assert result.stderr.strip().splitlines() == [expected]
