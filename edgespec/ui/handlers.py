"""What the chat app does with an answer. Every handler returns or yields a ``View``: one
value per output panel, ``gr.skip()`` for panels it leaves alone.

An answer asked in the page runs as three events: ``begin`` (queued but never waiting:
stores the question, shows it and opens the answer's live feed), ``run`` (queued for the
engine; no outputs, so the page keeps no progress display running while it decodes) and
``finish`` (stores the answer, shows its panels). What it answers is the message typed, or
what Regenerate or an edited message asked for (``Intent``, noted just before). Meanwhile
the page reads the live feed (``ui/live.py``). The ``/chat`` API is one event that streams
its updates through Gradio, for API clients."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import gradio as gr

from edgespec.api import settings_from
from edgespec.decoding.events import Done
from edgespec.decoding.generation import Generation
from edgespec.errors import EdgespecError
from edgespec.ui.answer import AnswerRun, answer_record
from edgespec.ui.chat_store import ChatStore, StoredChat, StoredMessage
from edgespec.ui.figures import steps_chart_html
from edgespec.ui.folders import folder_for_new_chat
from edgespec.ui.gauge import gauge_html
from edgespec.ui.live import WAITING_HTML, Feed, LiveFeeds, answer_slot, feed_tag, live_slot
from edgespec.ui.pair import PairHolder
from edgespec.ui.prompt import chat_prompt, user_content
from edgespec.ui.session import Session
from edgespec.ui.text import (
    error_markdown,
    final_stats_markdown,
    live_stats_markdown,
    provenance_legend,
    speedup_markdown,
    step_rows,
)
from edgespec.ui.views import (
    ATTACHED_MARK,
    EMPTY_MESSAGE,
    SETTING_NAMES,
    ChatInputs,
    Throttle,
    View,
    chat_messages,
    owner_of,
    parse_seed,
    takes_chat_inputs,
)

if TYPE_CHECKING:
    from edgespec.api import EdgeSpec

# The /chat API's streamed updates: text, stats and the gauge together, at most about 7
# times a second (the page itself reads the live feed instead).
UPDATE_INTERVAL_S = 0.15
BASELINE_RUNS = 2  # the baseline is timed twice: the spread of the two says how far to trust it
BUSY_IN_TAB = "an answer is still being generated in this chat: wait for it, or Stop it first"
NOTHING_TO_REGENERATE = "nothing to regenerate: send a message first"


@dataclass(frozen=True)
class Intent:
    """What the next answer answers: the first ``keep`` stored messages of the open chat,
    then ``question`` (None: the last kept message, a question, is answered again)."""

    keep: int
    question: str | None
    files: tuple[dict, ...] = ()  # an edited message keeps the files it was sent with


@dataclass
class Pending:
    """An answer begun in a tab and not yet shown whole."""

    answer: Generation
    lm: EdgeSpec
    run: AnswerRun
    prompt: list[dict[str, str]]  # what it answers, the system prompt first where there is one
    options: dict[str, Any]
    epoch: int
    chat_id: str
    asked: str | None  # the question this answer added to the chat (None: regenerated)
    feed: Feed | None = None
    problem: str | None = None  # why it failed, once it has
    started: bool = False  # ``run`` took it: an answer runs once


def empty_gauge() -> str:
    return gauge_html(None)


class ChatHandlers:
    """The app's answers, around the pair the app has now (``pair``) and its chats' store."""

    def __init__(self, pair: PairHolder, store: ChatStore, feeds: LiveFeeds | None = None):
        self.pair = pair
        self.store = store
        self.feeds = feeds if feeds is not None else LiveFeeds()

    @property
    def lm(self) -> EdgeSpec | None:
        return self.pair.lm

    @property
    def load_error(self) -> str | None:
        return self.pair.load_error

    def text_of(self, sha256: str) -> str:
        """An attachment's text, as the model reads it."""
        return self.store.attachment(sha256).text

    # -- an answer asked in the page: begin, run, finish ---------------------------------

    def note_retry(self, session: Session) -> None:
        """Regenerate: the next answer answers the open chat's last question again."""
        messages = session.chat.messages if session.chat is not None else []
        keep = len(messages) - 1 if messages and messages[-1].role == "assistant" else len(messages)
        session.intent = Intent(keep, None)

    def note_edit(self, session: Session, edit: gr.EditData) -> None:
        """An earlier message edited in the chat: the next answer answers it."""
        index = edit.index if isinstance(edit.index, int) else edit.index[0]
        value = edit.value if isinstance(edit.value, str) else _text_of(edit.value)
        self.intend_edit(int(index), value, session)

    def intend_edit(self, index: float, text: str, session: Session) -> None:
        """The next answer answers message ``index`` as ``text``; what followed it goes."""
        kept = session.chat.messages if session.chat is not None else []
        files = tuple(kept[int(index)].attachments or ()) if 0 <= int(index) < len(kept) else ()
        session.intent = Intent(int(index), _typed(str(text)), files)

    @takes_chat_inputs
    def begin(self, inputs: ChatInputs) -> tuple:
        """Store and show the question, start the answer (it waits for the engine in
        ``run``) and open its live feed."""
        session = inputs.session
        session.colour = bool(inputs.colour)
        intent, session.intent = session.intent, None
        if session.pending is not None:
            return self._failure(BUSY_IN_TAB).values()
        asked = intent is None or intent.question is not None
        try:
            pending = self._begin(intent, inputs, session)
        except EdgespecError as exc:
            chat = session.chat.messages if session.chat is not None else []
            message = inputs.message if intent is None else gr.skip()
            return self._failure(str(exc), message if asked else gr.skip(), chat, session.colour).values()
        waiting = pending.answer.ahead >= pending.lm.occupancy().total
        pending.feed = Feed(pending.run, session.colour, waiting=waiting)
        session.pending = pending
        view = self._opening(pending, session, streaming=True)
        if intent is None:  # a message typed: its files went with it
            view.attach, view.chips, view.cost = None, "", ""
        view.stats = live_slot("stats", WAITING_HTML if waiting else "Generating…")
        view.live = feed_tag(self.feeds.open(pending.feed))
        return view.values()

    def run(self, session: Session) -> None:
        """Follow the tab's begun answer as the engine decodes it; the page follows it on
        the feed."""
        pending = session.pending
        if pending is None or pending.feed is None or pending.started:
            return  # nothing began (or another message's events are past): nothing to run
        pending.started = True
        pending.feed.waiting = False
        try:
            for _ in self._drive(pending, session, self.feeds.pace.fold_s):
                pass
        except EdgespecError as exc:
            pending.problem = str(exc)
        except Exception as exc:  # an engine bug must not take the session down with it
            traceback.print_exc(file=sys.stderr)
            pending.problem = f"unexpected error: {type(exc).__name__}: {exc}"
        finally:
            pending.feed.finished = True

    def finish(self, session: Session) -> tuple:
        """Store the whole answer and show its panels, once ``run`` is over."""
        pending = session.pending
        if pending is None or pending.feed is None or not pending.feed.finished:
            return View().values()  # it failed to begin (already shown), or is not over yet
        session.pending = None
        view = self._outcome(pending, session)
        return view.values() if pending.epoch == session.epoch else View().values()

    # -- the /chat API: one event, streamed through Gradio ------------------------------

    @takes_chat_inputs
    def chat(self, inputs: ChatInputs) -> Iterator[tuple]:
        """Stream one answer to ``message``, continuing the open chat."""
        session = inputs.session
        session.colour = bool(inputs.colour)
        intent, session.intent = session.intent, None
        try:
            pending = self._begin(intent, inputs, session)
        except EdgespecError as exc:
            chat = session.chat.messages if session.chat is not None else []
            yield self._failure(str(exc), inputs.message, chat, session.colour).values()
            return
        yield self._opening(pending, session, streaming=False).values()
        throttle, gauge_stale = Throttle(UPDATE_INTERVAL_S), False
        try:
            for step_complete in self._drive(pending, session, UPDATE_INTERVAL_S / 2):
                # A finished drafting step moves the gauge, in the next update.
                gauge_stale = gauge_stale or (step_complete and pending.run.steps[-1].gamma > 0)
                if throttle.due():
                    yield self._live_view(pending, session, gauge_stale).values()
                    gauge_stale = False
        except EdgespecError as exc:
            pending.problem = str(exc)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            pending.problem = f"unexpected error: {type(exc).__name__}: {exc}"
        view = self._outcome(pending, session)
        if pending.epoch == session.epoch:
            yield view.values()

    # -- shared by both ------------------------------------------------------------------

    def _begin(self, intent: Intent | None, inputs: ChatInputs, session: Session) -> Pending:
        """Check what is asked, store the question and start the answer (it runs in
        ``_drive``); nothing is stored when the request is refused."""
        lm = self.pair.current()
        kept = session.chat.messages if session.chat is not None else []
        typed = intent is None
        intent = intent or Intent(len(kept), inputs.message)
        question = intent.question
        if question is not None and not question.strip():
            raise EdgespecError(EMPTY_MESSAGE)
        kept = kept[: intent.keep]
        if question is None and (not kept or kept[-1].role != "user"):
            raise EdgespecError(NOTHING_TO_REGENERATE)
        options = self._options(inputs.settings)
        system = inputs.system.strip()
        # A message typed takes the files attached to it; an edited one keeps its own.
        files = [f.ref() for f in session.attached] if typed else list(intent.files)
        prompt = chat_prompt(system, kept, self.text_of)
        if question is not None:
            asked = StoredMessage("user", question, attachments=files or None)
            prompt.append({"role": "user", "content": user_content(asked, self.text_of)})
        # γ as the control gives it: the request builder parses it, as for every front end.
        drafter, gamma = inputs.settings[0], inputs.settings[1]
        request = lm.request(prompt, settings_from(**options), drafter=drafter, gamma=gamma, chat=True)
        chat = self._keep_question(
            session, intent, system, dict(zip(SETTING_NAMES, inputs.settings, strict=True)), files
        )
        if typed:
            session.forget_files()  # what was read ahead stays as cache; the answer reads the rest
        # Queued now, this tab's: its Stop (or the tab closing) ends it, and no other tab's.
        answer = lm.submit(request, owner=owner_of(inputs.request))
        run = AnswerRun()
        session.current_run, session.live = run, answer.live  # the lenience slider reaches it
        return Pending(answer, lm, run, prompt, options, session.epoch, chat.id, question)

    @staticmethod
    def _options(settings: list[Any]) -> dict[str, Any]:
        _drafter, _gamma, verify, temperature, top_k, top_p, min_p, seed, max_tokens, lenience = settings
        return {
            "temperature": float(temperature),
            "top_k": int(top_k),
            "top_p": float(top_p),
            "min_p": float(min_p),
            "seed": parse_seed(seed),
            "max_tokens": int(max_tokens),
            "lenience": float(lenience),
            "verify": verify,
        }

    def _keep_question(
        self, session: Session, intent: Intent, system: str, settings: dict, files: list[dict]
    ) -> StoredChat:
        """The open chat as it is once the question is asked: made if new (in the folder the
        list shows), cut after the kept messages, the question and its files appended; each
        change committed."""
        chat = session.chat
        if chat is None:
            chat = self.store.create(system=system, settings=settings, folder=folder_for_new_chat(session))
            session.chat = chat
        else:
            if chat.system != system:
                self.store.set_system(chat.id, system)
                chat.system = system
            self.store.set_settings(chat.id, settings)
            chat.settings = settings
        if intent.keep < len(chat.messages):
            self.store.truncate(chat.id, intent.keep)
            del chat.messages[intent.keep :]
        if intent.question is not None:
            message = StoredMessage("user", intent.question, created=time.time(), attachments=files or None)
            self.store.append(chat.id, message)
            chat.messages.append(message)
        return chat

    def _drive(self, pending: Pending, session: Session, every_s: float) -> Iterator[bool]:
        """Follow the answer, folding its events into ``pending.run`` (taken from the engine
        at most every ``every_s``); yields after each event whether it completed a step."""
        try:
            with closing(pending.answer.events(every_s)) as events:
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
        messages = session.chat.messages if session.chat is not None else []
        return View(
            message="",
            chatbot=chat_messages(messages, session.colour, answer_slot() if streaming else None),
            gauge=slot("gauge", empty_gauge()),
            legend=slot("legend", provenance_legend(None, session.colour)),
            stats="Generating…",
            steps_plot=steps_chart_html([]),
            steps_table=[],
            speedup=speedup_markdown(None, None),  # the last answer's figure is not this one's
            error="",
        )

    def _live_view(self, pending: Pending, session: Session, gauge_stale: bool) -> View:
        run = pending.run
        messages = session.chat.messages if session.chat is not None else []
        answer = StoredMessage("assistant", run.text, provenance=[list(p) for p in run.runs])
        return View(
            chatbot=chat_messages([*messages, answer], session.colour),
            gauge=gauge_html(run) if gauge_stale else gr.skip(),
            legend=provenance_legend(run, session.colour),
            stats=live_stats_markdown(run),
        )

    def _outcome(self, pending: Pending, session: Session) -> View:
        """Store the finished answer in its chat; its panels, or its failure."""
        run, done = pending.run, pending.run.done
        problem = pending.problem or (None if done is not None else "the answer ended without a result")
        if problem is None and not done.text and done.stop_reason == "cancelled":
            problem = "stopped before the first token"
            self._take_back(pending, session)
        if problem is not None:
            chat = session.chat.messages if session.chat is not None else []
            asked = pending.asked if pending.asked is not None and problem.startswith("stopped") else None
            return self._failure(problem, asked if asked is not None else gr.skip(), chat, session.colour)
        try:
            self._keep_answer(pending, session, run)
        except EdgespecError as exc:  # its chat was deleted in another tab meanwhile
            return self._failure(f"the answer could not be kept: {exc}")
        session.last_run, session.last_prompt, session.last_settings = run, pending.prompt, pending.options
        record_rate(pending.lm, done)
        return self.answer_view(session, run)

    def answer_view(self, session: Session, run: AnswerRun | None) -> View:
        """The open chat with ``run`` (its latest answer, or None) in the figure panels."""
        messages = session.chat.messages if session.chat is not None else []
        done = run.done if run is not None else None
        return View(
            chatbot=chat_messages(messages, session.colour),
            gauge=gauge_html(run) if run is not None else empty_gauge(),
            legend=provenance_legend(run, session.colour),
            stats=final_stats_markdown(done.stats, done.stop_reason) if done is not None else "",
            steps_plot=steps_chart_html(run.steps if run is not None else []),
            steps_table=step_rows(run.steps) if run is not None else [],
            # A new answer: a baseline measured for an earlier one says nothing about it.
            speedup=speedup_markdown(done.stats.tokens_per_second if done else None, session.baseline()),
            error="",
        )

    def _keep_answer(self, pending: Pending, session: Session, run: AnswerRun) -> None:
        assert run.done is not None
        stats, provenance, steps = answer_record(run)
        message = StoredMessage(
            role="assistant",
            content=run.done.text,
            stats=stats,
            provenance=provenance,
            steps=steps,
            settings=dict(pending.options),
            created=time.time(),
        )
        self.store.append(pending.chat_id, message)
        if session.chat is not None and session.chat.id == pending.chat_id:
            session.chat.messages.append(message)

    def _take_back(self, pending: Pending, session: Session) -> None:
        """A question stopped before its answer's first token leaves the chat as it was."""
        if pending.asked is None or session.chat is None or session.chat.id != pending.chat_id:
            return
        keep = len(session.chat.messages) - 1
        if keep >= 0 and session.chat.messages[-1].role == "user":
            self.store.truncate(pending.chat_id, keep)
            del session.chat.messages[keep:]

    def _failure(
        self, problem: str, message: Any = None, chat: list[StoredMessage] | None = None, colour: bool = True
    ) -> View:
        """Show the problem in the error panel and as a toast; give the message back."""
        gr.Warning(problem)
        return View(
            message=gr.skip() if message is None else message,
            chatbot=gr.skip() if chat is None else chat_messages(chat, colour),
            stats="" if chat is not None else gr.skip(),
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
            return View().values()  # another answer (or chat) came meanwhile: it describes none shown
        answer_rate = self._answer_rate(session)
        if job.problem is not None:
            view = self._failure(job.problem)
            view.speedup = speedup_markdown(answer_rate, session.baseline())
            return view.values()
        session.baseline_rates, session.baseline_for = job.rates, job.measured_for
        return View(speedup=speedup_markdown(answer_rate, session.baseline()), error="").values()

    def _baseline_problem(self, session: Session) -> str | None:
        if self.lm is None:
            return f"the model could not be loaded: {self.load_error}"
        if session.last_prompt is None or session.last_settings is None or session.last_run is None:
            return "send a message first: the baseline re-runs the last prompt"
        last = session.last_run.done
        if last is not None and last.stop_reason == "cancelled":
            return "the last answer was stopped: a baseline would time a different length; send it again"
        return None

    def _run_baseline(self, session: Session, owner: str) -> Done | None:
        lm = self.pair.current()
        assert session.last_prompt is not None and session.last_settings is not None
        assert session.last_run is not None and session.last_run.done is not None
        settings = settings_from(**session.last_settings)
        request = lm.request(session.last_prompt, settings, drafter="none", gamma=0, chat=True)
        # Start from the cache the answer started from: right now it also holds the
        # answer's prompt, and reusing all of it would spare the baseline the prefill the
        # answer paid, flattering the baseline.
        request = replace(request, reuse_limit=session.last_run.done.stats.reused_tokens)
        answer = lm.submit(request, owner=owner)
        done = None
        # Read as the answer was, so that both rates are measured the same way.
        with closing(answer.events(self.feeds.pace.fold_s)) as events:
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
        self.stop_tab(session, request)

    def stop_tab(self, session: Session, request: gr.Request | None) -> None:
        """End this tab's answers, running or still waiting for the engine."""
        if self.lm is not None:
            self.lm.stop_answers(owner_of(request))

    def set_lenience(self, lenience: float, session: Session) -> None:
        """A running answer reads its live lenience at every step: λ applies from the next."""
        live = session.live
        if live is not None and lenience and 0 < lenience <= 1:
            live.set_lenience(lenience)

    def recolour(self, colour: bool, session: Session) -> tuple[Any, Any]:
        """The chat's answers coloured by provenance, or plain; and the legend."""
        session.colour = bool(colour)
        messages = session.chat.messages if session.chat is not None else []
        feed = session.pending.feed if session.pending is not None else None
        if feed is not None and not feed.finished:
            feed.colour = session.colour
            feed.shown += 1  # the feed sends the answer whole again, in the new colouring
            return chat_messages(messages, session.colour, answer_slot()), gr.skip()
        return chat_messages(messages, session.colour), provenance_legend(session.last_run, session.colour)

    def unload(self, request: gr.Request) -> None:
        """A closed tab must not keep the engine busy for everybody else."""
        if self.lm is not None:
            self.lm.stop_answers(owner_of(request))


def _typed(text: str) -> str:
    """An edited message as typed: the lines naming its files, which the chat shows above
    its text (``views.attached_line``), are not part of it."""
    lines = text.split("\n")
    while lines and lines[0].startswith(ATTACHED_MARK):
        lines.pop(0)
    return "\n".join(lines).lstrip("\n")


def _text_of(value: Any) -> str:
    """An edited message's text, whether the chat hands it over as text or as blocks."""
    if isinstance(value, list):
        return "".join(_text_of(part) for part in value)
    if isinstance(value, dict):
        return str(value.get("text", value.get("content", "")))
    return str(value)


def record_rate(lm: EdgeSpec, done: Done) -> None:
    """What the target decodes at here alone, for the model picker to show next time: an
    answer with no draft in it (one with drafts shows what speculation added, which
    depends on the answer)."""
    from edgespec.models.measured import record_rate as keep

    path = getattr(lm.target, "path", None)
    if path is not None and done.stop_reason != "cancelled" and not done.stats.drafted:
        keep(path, done.stats.decode_tokens_per_second, done.stats.tokens)


@dataclass
class BaselineJob:
    """A baseline being measured for one answer."""

    measured_for: AnswerRun | None
    epoch: int
    rates: list[float] = field(default_factory=list)
    problem: str | None = None
