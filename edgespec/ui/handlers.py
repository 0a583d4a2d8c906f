"""What the chat app's buttons do. Every handler returns or yields a ``View``: one value
per output panel, ``gr.skip()`` for panels it leaves alone.

An answer asked in the page runs as three events: ``begin`` (outside the queue: shows the
question and opens the answer's live feed), ``run`` (queued for the engine; no outputs,
so the page keeps no progress display running while it decodes) and ``finish`` (the
whole answer's panels). Meanwhile the page reads the live feed (``ui/live.py``). The
``/chat`` API is one event that streams its updates through Gradio, for API clients."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from edgespec.api import EdgeSpec, settings_from
from edgespec.decoding.events import Done
from edgespec.decoding.generation import Generation
from edgespec.errors import EdgespecError
from edgespec.ui.answer import AnswerRun
from edgespec.ui.figures import steps_chart_html
from edgespec.ui.gauge import gauge_html
from edgespec.ui.live import WAITING_HTML, Feed, LiveFeeds, answer_slot, feed_tag, live_slot
from edgespec.ui.session import EngineGate, Session
from edgespec.ui.text import (
    error_markdown,
    final_stats_markdown,
    live_stats_markdown,
    provenance_html,
    speedup_markdown,
    step_rows,
)
from edgespec.ui.views import (
    EMPTY_MESSAGE,
    ChatInputs,
    Throttle,
    View,
    chat_messages,
    owner_of,
    parse_gamma,
    parse_seed,
    takes_chat_inputs,
)

# The /chat API's streamed updates: text, stats and the gauge together, at most about 7
# times a second (the page itself reads the live feed instead).
UPDATE_INTERVAL_S = 0.15
BASELINE_RUNS = 2  # the baseline is timed twice: the spread of the two says how far to trust it
BUSY_IN_TAB = "an answer is still being generated in this chat: wait for it, or Stop it first"


@dataclass
class Pending:
    """An answer begun in a tab and not yet shown whole."""

    answer: Generation
    run: AnswerRun
    prompt: list[dict[str, str]]
    options: dict[str, Any]
    epoch: int
    feed: Feed | None = None
    problem: str | None = None  # why it failed, once it has
    started: bool = False  # ``run`` took it: an answer runs once


def empty_gauge() -> str:
    return gauge_html(None)


class ChatHandlers:
    """The app's behaviour around one shared EdgeSpec (None when the pair failed to load)."""

    def __init__(self, lm: EdgeSpec | None, load_error: str | None = None, feeds: LiveFeeds | None = None):
        self.lm = lm
        self.load_error = load_error or ("no model is loaded" if lm is None else None)
        self.gate = EngineGate() if lm is not None else None
        self.feeds = feeds if feeds is not None else LiveFeeds()

    # -- an answer asked in the page: begin, run, finish ---------------------------------

    @takes_chat_inputs
    def begin(self, inputs: ChatInputs) -> tuple:
        """Show the question, start the answer (it waits for the engine in ``run``) and
        open its live feed."""
        message, session, request = inputs.message, inputs.session, inputs.request
        session.colour = bool(inputs.colour)
        if session.pending is not None:
            return self._failure(BUSY_IN_TAB).values()
        try:
            pending = self._begin(message, inputs.settings, session)
        except EdgespecError as exc:
            return self._failure(str(exc), message, session.history).values()
        assert self.gate is not None and self.lm is not None
        waiting = self.gate.others(owner_of(request)) >= self.lm.engine.slots.count
        pending.feed = Feed(pending.run, session.colour, waiting=waiting)
        session.pending = pending
        view = self._opening(pending, session, streaming=True)
        view.stats = live_slot("stats", WAITING_HTML if waiting else "Generating…")
        view.live = feed_tag(self.feeds.open(pending.feed))
        return view.values()

    def run(self, session: Session, request: gr.Request) -> None:
        """Decode the tab's begun answer on the engine; the page follows it on the feed."""
        pending = session.pending
        if pending is None or pending.feed is None or pending.started:
            return  # nothing began (or another message's events are past): nothing to run
        pending.started = True
        pending.feed.waiting = False
        try:
            for _ in self._drive(pending, session, owner_of(request), self.feeds.pace.fold_s):
                pass
        except EdgespecError as exc:
            pending.problem = str(exc)
        except Exception as exc:  # an engine bug must not take the session down with it
            traceback.print_exc(file=sys.stderr)
            pending.problem = f"unexpected error: {type(exc).__name__}: {exc}"
        finally:
            pending.feed.finished = True

    def finish(self, session: Session) -> tuple:
        """The whole answer's panels, once ``run`` is over."""
        pending = session.pending
        if pending is None or pending.feed is None or not pending.feed.finished:
            return View().values()  # it failed to begin (already shown), or is not over yet
        session.pending = None
        if pending.epoch != session.epoch:
            return View().values()  # cleared meanwhile
        return self._outcome(pending, session).values()

    # -- the /chat API: one event, streamed through Gradio ------------------------------

    @takes_chat_inputs
    def chat(self, inputs: ChatInputs) -> Iterator[tuple]:
        """Stream one answer to ``message``, continuing the session's conversation."""
        message, session, request = inputs.message, inputs.session, inputs.request
        session.colour = bool(inputs.colour)
        try:
            pending = self._begin(message, inputs.settings, session)
        except EdgespecError as exc:
            yield self._failure(str(exc), message, session.history).values()
            return
        yield self._opening(pending, session, streaming=False).values()
        throttle, gauge_stale = Throttle(UPDATE_INTERVAL_S), False
        try:
            for step_complete in self._drive(pending, session, owner_of(request), UPDATE_INTERVAL_S / 2):
                # A finished drafting step moves the gauge, in the next update.
                gauge_stale = gauge_stale or (step_complete and pending.run.steps[-1].gamma > 0)
                if throttle.due():
                    yield self._live_view(pending, session.colour, gauge_stale).values()
                    gauge_stale = False
        except EdgespecError as exc:
            pending.problem = str(exc)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            pending.problem = f"unexpected error: {type(exc).__name__}: {exc}"
        if pending.epoch == session.epoch:
            yield self._outcome(pending, session).values()

    # -- shared by both ------------------------------------------------------------------

    def _begin(self, message: str, settings: list[Any], session: Session) -> Pending:
        """Check the message and settings and start the answer (it runs in ``_drive``)."""
        if self.lm is None:
            raise EdgespecError(f"the model could not be loaded: {self.load_error}")
        if not message or not message.strip():
            raise EdgespecError(EMPTY_MESSAGE)
        drafter, gamma, verify, temperature, top_k, top_p, min_p, seed, max_tokens, lenience = settings
        options = {
            "temperature": float(temperature),
            "top_k": int(top_k),
            "top_p": float(top_p),
            "min_p": float(min_p),
            "seed": parse_seed(seed),
            "max_tokens": int(max_tokens),
            "lenience": float(lenience),
            "verify": verify,
        }
        generation = settings_from(**options)
        prompt = [*session.history, {"role": "user", "content": message}]
        request = self.lm.request(prompt, generation, drafter=drafter, gamma=parse_gamma(gamma), chat=True)
        answer = self.lm.start(request)
        run = AnswerRun()
        session.current_run, session.live = run, answer.live  # the lenience slider reaches it
        return Pending(answer, run, prompt, options, session.epoch)

    def _drive(self, pending: Pending, session: Session, owner: str, every_s: float) -> Iterator[bool]:
        """Run the answer, folding its events into ``pending.run`` (taken from the engine
        at most every ``every_s``); yields after each event whether it completed a step."""
        assert self.lm is not None and self.gate is not None
        try:
            stream = self.lm.events(pending.answer, every_s)
            with self.gate.hold(owner, pending.answer), closing(stream) as events:
                for event in events:
                    step_complete = pending.run.add(event)
                    if session.epoch == pending.epoch and not isinstance(event, Done):
                        yield step_complete
        finally:
            if session.current_run is pending.run:
                session.live = session.current_run = None

    def _opening(self, pending: Pending, session: Session, streaming: bool) -> View:
        """The panels as an answer starts: the question in the chat, no figures yet. In
        the page, each live panel is a slot the feed writes into."""
        slot = live_slot if streaming else (lambda _name, markup: markup)
        return View(
            message="",
            chatbot=chat_messages(pending.prompt, answer_slot() if streaming else None),
            provenance=provenance_html(pending.run if streaming else None, session.colour, live=streaming),
            gauge=slot("gauge", empty_gauge()),
            stats="Generating…",
            steps_plot=steps_chart_html([]),
            steps_table=[],
            speedup=speedup_markdown(None, None),  # the last answer's figure is not this one's
            error="",
        )

    def _live_view(self, pending: Pending, colour: bool, gauge_stale: bool) -> View:
        run = pending.run
        return View(
            chatbot=chat_messages([*pending.prompt, {"role": "assistant", "content": run.text}]),
            provenance=provenance_html(run, colour),
            gauge=gauge_html(run) if gauge_stale else gr.skip(),
            stats=live_stats_markdown(run),
        )

    def _outcome(self, pending: Pending, session: Session) -> View:
        """The finished answer's panels, or its failure."""
        message = pending.prompt[-1]["content"]  # given back to edit when nothing came of it
        run, done = pending.run, pending.run.done
        if pending.problem is not None:
            return self._failure(pending.problem, message, session.history)
        if done is None:
            return self._failure("the answer ended without a result", message, session.history)
        if not done.text and done.stop_reason == "cancelled":
            # Nothing was said: leave the conversation as it was.
            return self._failure("stopped before the first token", message, session.history)
        session.history = [*pending.prompt, {"role": "assistant", "content": done.text}]
        session.last_run, session.last_prompt, session.last_settings = run, pending.prompt, pending.options
        return View(
            chatbot=chat_messages(session.history),
            provenance=provenance_html(run, session.colour),
            gauge=gauge_html(run),
            stats=final_stats_markdown(done.stats, done.stop_reason),
            steps_plot=steps_chart_html(run.steps),
            steps_table=step_rows(run.steps),
            # A new answer: a baseline measured for an earlier one says nothing about it.
            speedup=speedup_markdown(done.stats.tokens_per_second, session.baseline()),
            error="",
        )

    def _failure(
        self, problem: str, message: Any = None, history: list[dict[str, str]] | None = None
    ) -> View:
        """Show the problem in the error panel and as a toast; give the message back."""
        gr.Warning(problem)
        return View(
            message=gr.skip() if message is None else message,
            chatbot=gr.skip() if history is None else chat_messages(history),
            stats="" if history is not None else gr.skip(),
            error=error_markdown(problem),
        )

    # -- baseline -----------------------------------------------------------------------

    def measure_baseline(self, session: Session, request: gr.Request) -> Iterator[tuple]:
        """The /measure_baseline API: check, measure and show, in one event."""
        yield self.baseline_begin(session)
        if session.baseline_job is not None:
            self.baseline_run(session, request)
            yield self.baseline_show(session)

    def baseline_begin(self, session: Session) -> tuple:
        """Check that the last answer can be re-timed, and say it is being measured."""
        session.baseline_job = None
        problem = self._baseline_problem(session)
        if problem is not None:
            return self._failure(problem).values()
        session.baseline_job = BaselineJob(session.last_run, session.epoch)
        return View(speedup="Measuring the target-only baseline on the last prompt…", error="").values()

    def baseline_run(self, session: Session, request: gr.Request) -> None:
        """Re-run the last prompt with the target alone, ``BASELINE_RUNS`` times."""
        job = session.baseline_job
        if job is None:
            return
        try:
            for _ in range(BASELINE_RUNS):
                done = self._run_baseline(session, owner_of(request))
                if done is None or done.stop_reason == "cancelled":
                    job.problem = "baseline measurement stopped: nothing was stored"
                    return
                job.rates.append(done.stats.tokens_per_second)
        except EdgespecError as exc:
            job.problem = str(exc)

    def baseline_show(self, session: Session) -> tuple:
        job, session.baseline_job = session.baseline_job, None
        if job is None or job.epoch != session.epoch or session.last_run is not job.measured_for:
            return View().values()  # another answer (or Clear) came meanwhile: it describes none shown
        answer_rate = self._answer_rate(session)
        if job.problem is not None:
            view = self._failure(job.problem)
            view.speedup = speedup_markdown(answer_rate, session.baseline())
            return view.values()
        session.baseline_rates, session.baseline_for = job.rates, job.measured_for
        return View(speedup=speedup_markdown(answer_rate, session.baseline()), error="").values()

    def _baseline_problem(self, session: Session) -> str | None:
        if self.lm is None or self.gate is None:
            return f"the model could not be loaded: {self.load_error}"
        if session.last_prompt is None or session.last_settings is None or session.last_run is None:
            return "send a message first: the baseline re-runs the last prompt"
        last = session.last_run.done
        if last is not None and last.stop_reason == "cancelled":
            return "the last answer was stopped: a baseline would time a different length; send it again"
        return None

    def _run_baseline(self, session: Session, owner: str) -> Done | None:
        assert self.lm is not None and self.gate is not None
        assert session.last_prompt is not None and session.last_settings is not None
        assert session.last_run is not None and session.last_run.done is not None
        settings = settings_from(**session.last_settings)
        answer = self.lm.start(
            self.lm.request(session.last_prompt, settings, drafter="none", gamma=0, chat=True)
        )
        # Start from the cache the answer started from: right now it also holds the
        # answer's prompt, and reusing all of it would spare the baseline the prefill the
        # answer paid, flattering the baseline.
        answer.reuse_limit = session.last_run.done.stats.reused_tokens
        with self.gate.hold(owner, answer):
            done = None
            # Read as the answer was, so that both rates are measured the same way.
            with closing(self.lm.events(answer, self.feeds.pace.fold_s)) as events:
                for event in events:
                    if isinstance(event, Done):
                        done = event
            return done

    @staticmethod
    def _answer_rate(session: Session) -> float | None:
        run = session.last_run
        return run.done.stats.tokens_per_second if run is not None and run.done is not None else None

    # -- quick handlers (never queued behind a generation) -------------------------------

    def stop(self, session: Session, request: gr.Request) -> None:
        self._stop_tab(session, request)

    def _stop_tab(self, session: Session, request: gr.Request) -> None:
        """End this tab's answer, running or still waiting for the engine."""
        if self.gate is not None:
            self.gate.stop(owner_of(request))
        if session.pending is not None:
            session.pending.answer.stop()

    def clear(self, session: Session, request: gr.Request) -> tuple:
        self._stop_tab(session, request)
        session.reset()
        return self._opened(session).values()

    def new_chat(self, session: Session, request: gr.Request) -> tuple:
        """Open an empty chat; the others keep their histories (and, in the pair's slots
        or prompt cache, their KV states)."""
        return self._switch(session, None, request)

    def open_chat(self, index: int | None, session: Session, request: gr.Request) -> tuple:
        """Open one of the tab's chats, as picked in the list."""
        if index is None or index == session.current:
            return (*(gr.skip() for _ in View.names()), gr.skip())
        return self._switch(session, int(index), request)

    def chat_list(self, session: Session) -> Any:
        return gr.update(choices=session.titles(), value=session.current)

    def _switch(self, session: Session, index: int | None, request: gr.Request) -> tuple:
        # An answer still streaming in the chat that is left would write into it unseen.
        self._stop_tab(session, request)
        session.open_chat(index)
        return (*self._opened(session).values(), self.chat_list(session))

    def _opened(self, session: Session) -> View:
        """The panels of the open chat, with no answer's figures yet."""
        return View(
            message="",
            chatbot=chat_messages(session.history),
            provenance=provenance_html(None, session.colour),
            gauge=empty_gauge(),
            stats="",
            steps_plot=steps_chart_html([]),
            steps_table=[],
            speedup=speedup_markdown(None, None),
            error="",
        )

    def set_lenience(self, lenience: float, session: Session) -> None:
        """A running answer reads its live lenience at every step: λ applies from the next."""
        live = session.live
        if live is not None and lenience and 0 < lenience <= 1:
            live.set_lenience(lenience)

    def recolour(self, colour: bool, session: Session) -> str:
        session.colour = bool(colour)
        feed = session.pending.feed if session.pending is not None else None
        if feed is not None and not feed.finished:
            feed.colour = session.colour
            feed.shown += 1  # the feed sends the text whole again, in the new colouring
            return provenance_html(feed.run, session.colour, live=True)
        return provenance_html(session.current_run or session.last_run, session.colour)

    def unload(self, request: gr.Request) -> None:
        """A closed tab must not keep the engine busy for everybody else."""
        if self.gate is not None:
            self.gate.stop(owner_of(request))


@dataclass
class BaselineJob:
    """A baseline being measured for one answer."""

    measured_for: AnswerRun | None
    epoch: int
    rates: list[float] = field(default_factory=list)
    problem: str | None = None
