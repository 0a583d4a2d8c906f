"""What the chat app's buttons do. Every handler returns or yields a ``View``: one value
per output panel, ``gr.skip()`` for panels it leaves alone."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field, fields
from typing import Any

import gradio as gr

from edgespec.api import EdgeSpec, settings_from
from edgespec.decoding.events import Done
from edgespec.decoding.request import GenerationSettings
from edgespec.errors import EdgespecError
from edgespec.ui.answer import AnswerRun
from edgespec.ui.figures import gauge_figure, steps_figure
from edgespec.ui.session import EngineGate, Session
from edgespec.ui.text import (
    error_markdown,
    final_stats_markdown,
    live_stats_markdown,
    provenance_html,
    speedup_markdown,
    step_rows,
)

# The browser re-renders every panel sent, and building them costs the process CPU the
# decoding needs: text, stats and the gauge go together, at most about 7 times a second.
UPDATE_INTERVAL_S = 0.15
GAMMA_CHOICES = ("auto", *(str(n) for n in range(17)))
EMPTY_MESSAGE = "Type a message first: the message is empty."
WAITING_NOTE = (
    "⏳ **Waiting for your turn**: another answer is being generated on the shared engine. "
    "Yours starts when it ends; the queue position shows on the chat."
)


@dataclass
class View:
    """One value per output panel, in the order ``build_app`` wires them."""

    message: Any = field(default_factory=gr.skip)
    chatbot: Any = field(default_factory=gr.skip)
    provenance: Any = field(default_factory=gr.skip)
    gauge: Any = field(default_factory=gr.skip)
    stats: Any = field(default_factory=gr.skip)
    steps_plot: Any = field(default_factory=gr.skip)
    steps_table: Any = field(default_factory=gr.skip)
    speedup: Any = field(default_factory=gr.skip)
    error: Any = field(default_factory=gr.skip)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def values(self) -> tuple:
        # Not dataclasses.astuple: that would deep-copy every figure on every update.
        return tuple(getattr(self, name) for name in self.names())


class Throttle:
    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._last = float("-inf")

    def due(self, force: bool = False) -> bool:
        now = time.monotonic()
        if force or now - self._last >= self.interval_s:
            self._last = now
            return True
        return False


def parse_gamma(value: str | int | float) -> int | str:
    if str(value).strip() == "auto":
        return "auto"
    try:
        gamma = int(float(value))
    except (TypeError, ValueError):
        raise EdgespecError(f"γ must be 'auto' or a number from 0 to 16 (got {value!r})") from None
    if not 0 <= gamma <= 16:
        raise EdgespecError(f"γ must be 'auto' or a number from 0 to 16 (got {gamma})")
    return gamma


def parse_seed(value: str | float | None) -> int | None:
    """Empty means a fresh random seed for every answer."""
    if value is None or not str(value).strip():
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise EdgespecError(f"the seed must be a whole number or empty (got {value!r})") from None


def chat_messages(history: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Chatbot messages. Text goes in as an explicit text block: a bare string would be
    passed through ``inspect.cleandoc``, which strips the indentation of code answers."""
    return [
        {"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
        for m in history
        if m["content"]
    ]


def owner_of(request: gr.Request | None) -> str:
    return (request.session_hash if request is not None else None) or "local"


def empty_gauge() -> Any:
    return gauge_figure(None)


class ChatHandlers:
    """The app's behaviour around one shared EdgeSpec (None when the pair failed to load)."""

    def __init__(self, lm: EdgeSpec | None, load_error: str | None = None):
        self.lm = lm
        self.load_error = load_error or ("no model is loaded" if lm is None else None)
        self.gate = EngineGate() if lm is not None else None

    # -- chat ---------------------------------------------------------------------------

    def announce(self, message: str, request: gr.Request) -> Any:
        """Runs outside the queue the moment a message is sent: if the engine is busy with
        somebody else's answer, say so plainly before ours starts waiting."""
        if self.gate is None or not message or not message.strip():
            return gr.skip()
        assert self.lm is not None
        full = self.gate.others(owner_of(request)) >= self.lm.engine.slots.count
        return WAITING_NOTE if full else gr.skip()

    def chat(
        self,
        message: str,
        drafter: str,
        gamma: str,
        verify: str,
        temperature: float,
        top_k: float,
        top_p: float,
        min_p: float,
        seed: str | float | None,
        max_tokens: float,
        lenience: float,
        colour: bool,
        session: Session,
        request: gr.Request,
    ) -> Iterator[tuple]:
        """Stream one answer to ``message``, continuing the session's conversation."""
        session.colour = bool(colour)
        try:
            self._check_ready(message)
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
            settings = settings_from(**options)
            plan = (drafter, parse_gamma(gamma))
        except EdgespecError as exc:
            yield self._failure(str(exc)).values()
            return
        yield from (
            view.values() for view in self._answer(message, plan, options, settings, session, request)
        )

    def _check_ready(self, message: str | None) -> None:
        if self.lm is None:
            raise EdgespecError(f"the model could not be loaded: {self.load_error}")
        if not message or not message.strip():
            raise EdgespecError(EMPTY_MESSAGE)

    def _answer(
        self,
        message: str,
        plan: tuple[str, int | str],
        options: dict[str, Any],
        settings: GenerationSettings,
        session: Session,
        request: gr.Request,
    ) -> Iterator[View]:
        assert self.lm is not None and self.gate is not None
        prompt = [*session.history, {"role": "user", "content": message}]
        epoch = session.epoch
        run = AnswerRun()
        session.current_run = run
        yield View(
            message="",
            chatbot=chat_messages(prompt),
            provenance=provenance_html(None, session.colour),
            gauge=empty_gauge(),
            stats="Generating…",
            steps_plot=None,
            steps_table=[],
            speedup=speedup_markdown(None, None),  # the last answer's figure is not this one's
            error="",
        )
        throttle = Throttle(UPDATE_INTERVAL_S)
        gauge_stale = False
        try:
            answer = self.lm.start(
                self.lm.request(prompt, settings, drafter=plan[0], gamma=plan[1], chat=True)
            )
            session.live = answer.live  # the lenience slider changes it while we run
            stream = self.lm.events(answer)
            with self.gate.hold(owner_of(request), answer), closing(stream) as events:
                for event in events:
                    step_complete = run.add(event)
                    if session.epoch != epoch or isinstance(event, Done):
                        continue  # cleared: run out quietly (Clear already stopped us)
                    # A finished drafting step moves the gauge, in the next update.
                    gauge_stale = gauge_stale or (step_complete and run.steps[-1].gamma > 0)
                    if throttle.due():
                        yield self._live_view(prompt, run, session.colour, gauge_stale)
                        gauge_stale = False
        except EdgespecError as exc:
            if session.epoch == epoch:
                yield self._failure(str(exc), message=message, history=session.history)
            return
        except Exception as exc:  # an engine bug must not take the session down with it
            traceback.print_exc(file=sys.stderr)
            if session.epoch == epoch:
                yield self._failure(
                    f"unexpected error: {type(exc).__name__}: {exc}", message, session.history
                )
            return
        finally:
            session.live = None
            session.current_run = None
        if session.epoch == epoch and run.done is not None:
            yield self._finish(prompt, run, options, session)

    def _live_view(
        self, prompt: list[dict[str, str]], run: AnswerRun, colour: bool, gauge_stale: bool
    ) -> View:
        return View(
            chatbot=chat_messages([*prompt, {"role": "assistant", "content": run.text}]),
            provenance=provenance_html(run, colour),
            gauge=gauge_figure(run) if gauge_stale else gr.skip(),
            stats=live_stats_markdown(run),
        )

    def _finish(
        self, prompt: list[dict[str, str]], run: AnswerRun, options: dict[str, Any], session: Session
    ) -> View:
        done = run.done
        assert done is not None
        if not done.text and done.stop_reason == "cancelled":
            # Nothing was said: leave the conversation as it was and give the message back.
            return self._failure("stopped before the first token", prompt[-1]["content"], session.history)
        session.history = [*prompt, {"role": "assistant", "content": done.text}]
        session.last_run = run
        session.last_prompt = prompt
        session.last_settings = options
        return View(
            chatbot=chat_messages(session.history),
            provenance=provenance_html(run, session.colour),
            gauge=gauge_figure(run),
            stats=final_stats_markdown(done.stats, done.stop_reason),
            steps_plot=steps_figure(run.steps),
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
        """Re-run the last prompt with the target alone and store its tokens/s."""
        if self.lm is None or self.gate is None:
            yield self._failure(f"the model could not be loaded: {self.load_error}").values()
            return
        if session.last_prompt is None or session.last_settings is None or session.last_run is None:
            yield self._failure("send a message first: the baseline re-runs the last prompt").values()
            return
        last = session.last_run.done
        if last is not None and last.stop_reason == "cancelled":
            yield self._failure(
                "the last answer was stopped: a baseline would time a different length; send it again"
            ).values()
            return
        answer_rate = self._answer_rate(session)
        measured_for = session.last_run
        yield View(speedup="Measuring the target-only baseline on the last prompt…", error="").values()
        try:
            done = self._run_baseline(session, owner_of(request))
        except EdgespecError as exc:
            yield self._failure(str(exc)).values()
            return
        if done is None or done.stop_reason == "cancelled":
            view = self._failure("baseline measurement stopped: nothing was stored")
            view.speedup = speedup_markdown(answer_rate, session.baseline())
            yield view.values()
            return
        if session.last_run is not measured_for:
            return  # another answer (or Clear) came meanwhile: this baseline describes none shown
        session.baseline_rate, session.baseline_for = done.stats.tokens_per_second, measured_for
        yield View(speedup=speedup_markdown(answer_rate, session.baseline()), error="").values()

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
            with closing(self.lm.events(answer)) as events:
                for event in events:
                    if isinstance(event, Done):
                        done = event
            return done

    @staticmethod
    def _answer_rate(session: Session) -> float | None:
        run = session.last_run
        return run.done.stats.tokens_per_second if run is not None and run.done is not None else None

    # -- quick handlers (never queued behind a generation) -------------------------------

    def stop(self, request: gr.Request) -> None:
        if self.gate is not None:
            self.gate.stop(owner_of(request))

    def clear(self, session: Session, request: gr.Request) -> tuple:
        if self.gate is not None:
            self.gate.stop(owner_of(request))
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
        if self.gate is not None:
            self.gate.stop(owner_of(request))
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
            steps_plot=None,
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
        return provenance_html(session.current_run or session.last_run, session.colour)

    def unload(self, request: gr.Request) -> None:
        """A closed tab must not keep the engine busy for everybody else."""
        if self.gate is not None:
            self.gate.stop(owner_of(request))
