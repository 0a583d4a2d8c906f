"""The Gradio chat app: layout and event wiring. Behaviour lives in ``handlers``.

One loaded model pair serves every browser tab. Generations (chat and the baseline
measurement) share the pair's slots (one for the app alone, ``--parallel`` with ``serve
--ui``), so a tab beyond them waits its turn and is told so. While an answer decodes the
page reads its panels from the answer's live feed (``ui/live.py``): ``launch_app`` and
``serve --ui`` mount the feed's route beside the app. Each tab keeps a list of chats;
switching, Stop, Clear, the lenience slider and the colouring toggle bypass the queue so
they act at once even while an answer streams.
"""

from __future__ import annotations

from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from edgespec.api import EdgeSpec
from edgespec.decoding.drafters import AUTO, CHOICE_HELP, CHOICES, REGISTRY
from edgespec.ui.figures import steps_chart_html
from edgespec.ui.handlers import ChatHandlers, empty_gauge
from edgespec.ui.live import LIVE_JS, HeadScript, LiveFeeds, pace_for
from edgespec.ui.session import Session
from edgespec.ui.text import LENIENCE_NOTE, STEP_HEADERS, error_markdown, provenance_html, speedup_markdown
from edgespec.ui.views import GAMMA_CHOICES, View

ENGINE_QUEUE = "engine"  # the concurrency group of everything that runs the models


def drafter_choices(has_draft: bool) -> list[str]:
    """The registry's choices, auto first; a drafter that needs the draft model only
    where one is loaded."""
    return [c for c in CHOICES if has_draft or c not in REGISTRY or REGISTRY[c].kind != "model"]


def drafter_help(choices: list[str]) -> str:
    return "  \n".join(f"**{name}**: {CHOICE_HELP[name]}" for name in choices)


def build_app(
    lm: EdgeSpec | None, load_error: str | None = None, feeds: LiveFeeds | None = None
) -> gr.Blocks:
    """The chat app around ``lm``; with ``lm=None`` the app still starts and shows
    ``load_error`` instead of answering. ``feeds``: where its answers' live feeds are
    kept (mount ``feeds.router()`` on the server that serves the app)."""
    handlers = ChatHandlers(lm, load_error, feeds if feeds is not None else LiveFeeds(pace=pace_for(lm)))
    with gr.Blocks(title="edgespec chat", analytics_enabled=False) as demo:
        session = gr.State(Session())
        gr.Markdown(_header(lm))
        if handlers.load_error:
            gr.Markdown(
                error_markdown(f"The model could not be loaded: {handlers.load_error}"), elem_id="load-error"
            )
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=160):
                chats = _chats_column()
            with gr.Column(scale=3):
                view = _chat_column()
            with gr.Column(scale=2):
                view.update(_metrics_column())
        view.update(_steps_table())
        settings = _settings_panel(drafter_choices(lm is None or lm.draft is not None))
        answered = _wire(demo, handlers, view, settings, session)
        _wire_chats(handlers, view, chats, session, answered)
    demo.live_feeds = handlers.feeds  # type: ignore[attr-defined]  # for launch_app
    return demo


def calm_queue(demo: gr.Blocks) -> gr.Blocks:
    """Gradio's queue looks for new events every millisecond and for progress every ten
    when it has nothing to do: a thousand wake-ups a second, each one taken from the
    decoding's cores (5–7 % of a core here, measured). Every 50 ms and 100 ms, as Gradio
    itself does on Windows, is still far quicker than a person notices."""
    demo._queue.sleep_when_free = 0.05
    demo._queue.progress_update_sleep_when_free = 0.1
    return demo


def launch_app(demo: gr.Blocks, **launch: Any) -> None:
    """``demo.launch(**launch)`` with the live feed's route mounted beside the app."""
    calm_queue(demo.queue())
    demo.launch(app_kwargs={"middleware": [Middleware(HeadScript)]}, **launch)
    demo.app.include_router(demo.live_feeds.router())  # type: ignore[attr-defined]


def _header(lm: EdgeSpec | None) -> str:
    if lm is None:
        return "# edgespec chat"
    draft = f"draft **{lm.draft.name}**" if lm.draft is not None else "no draft model"
    return (
        f"# edgespec chat\nTarget **{lm.target.name}**, {draft}, context {lm.target.n_ctx} tokens. "
        "Every tab shares this one engine: answers take turns."
    )


def _chats_column() -> dict[str, Any]:
    new = gr.Button("New chat", size="sm", elem_id="new-chat")
    listed = gr.Radio(
        choices=Session().titles(), value=0, type="value", label="Chats", elem_id="chats", interactive=True
    )
    return {"new": new, "list": listed}


def _chat_column() -> dict[str, Any]:
    chatbot = gr.Chatbot(label="Chat", height=380, elem_id="chatbot", feedback_options=None)
    error = gr.Markdown("", elem_id="error-box")
    with gr.Row():
        message = gr.Textbox(
            placeholder="Ask something (Enter sends)", show_label=False, scale=6, elem_id="message", lines=1
        )
        send = gr.Button("Send", variant="primary", scale=1, min_width=70, elem_id="send")
        stop = gr.Button("Stop", variant="stop", scale=1, min_width=70, elem_id="stop")
        clear = gr.Button("Clear", scale=1, min_width=70, elem_id="clear")
    colour = gr.Checkbox(value=True, label="Colour the answer by provenance", elem_id="colour-toggle")
    provenance = gr.HTML(
        provenance_html(None, True),
        label="Latest answer by provenance",
        show_label=True,
        elem_id="provenance",
        padding=True,
        container=True,
        js_on_load=None,  # a plain panel: no click events
    )
    # Empty and unseen: it names the running answer's feed, and its script reads it.
    live = gr.HTML("", elem_id="live-feed", js_on_load=LIVE_JS, container=False)
    return {
        "chatbot": chatbot,
        "live": live,
        "error": error,
        "message": message,
        "send": send,
        "stop": stop,
        "clear": clear,
        "colour": colour,
        "provenance": provenance,
    }


def _metrics_column() -> dict[str, Any]:
    gauge = gr.HTML(empty_gauge(), elem_id="gauge", padding=True, js_on_load=None)
    stats = gr.Markdown("", elem_id="stats")
    with gr.Row():
        measure = gr.Button("Measure baseline", size="sm", elem_id="measure", scale=0, min_width=150)
        speedup = gr.Markdown(speedup_markdown(None, None), elem_id="speedup")
    # Plain markup with no script: gr.HTML otherwise attaches a click listener to it.
    steps_plot = gr.HTML(steps_chart_html([]), elem_id="steps-plot", padding=True, js_on_load=None)
    return {
        "gauge": gauge,
        "stats": stats,
        "measure": measure,
        "speedup": speedup,
        "steps_plot": steps_plot,
    }


def _steps_table() -> dict[str, Any]:
    """The steps as rows, across the page: its six columns do not fit the metrics column
    (the headers would wrap letter by letter)."""
    steps_table = gr.Dataframe(
        headers=STEP_HEADERS,
        label="Drafter and γ of each step",
        interactive=False,
        max_height=220,
        # The "why" column gets the room, and wraps: it is a sentence, not a number.
        wrap=True,
        column_widths=["6%", "8%", "8%", "8%", "8%", "62%"],
        elem_id="steps-table",
    )
    return {"steps_table": steps_table}


def _settings_panel(drafters: list[str]) -> dict[str, Any]:
    with gr.Accordion("Settings", open=True):
        with gr.Row():
            drafter = gr.Radio(drafters, value=AUTO, label="drafter", elem_id="drafter")
            gamma = gr.Dropdown(
                list(GAMMA_CHOICES), value="auto", label="γ (tokens drafted per step)", elem_id="gamma"
            )
            verify = gr.Radio(["token", "block"], value="token", label="verification", elem_id="verify")
            max_tokens = gr.Slider(1, 2048, value=256, step=1, label="max tokens", elem_id="max-tokens")
        gr.Markdown(drafter_help(drafters), elem_id="drafter-help")
        with gr.Row():
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature (0 = greedy)")
            top_k = gr.Slider(0, 200, value=0, step=1, label="top-k (0 = off)")
            top_p = gr.Slider(0.01, 1.0, value=1.0, step=0.01, label="top-p (1 = off)")
            min_p = gr.Slider(0.0, 1.0, value=0.0, step=0.01, label="min-p (0 = off)")
            # A textbox, not gr.Number: an empty Number reads as 0, and "no seed" must stay possible.
            seed = gr.Textbox("", placeholder="random", label="seed (empty = random)", elem_id="seed")
        with gr.Row():
            lenience = gr.Slider(
                0.05, 1.0, value=1.0, step=0.05, label="lenience λ", scale=1, elem_id="lenience"
            )
            gr.Markdown(LENIENCE_NOTE, elem_id="lenience-note")
    return {
        "drafter": drafter,
        "gamma": gamma,
        "verify": verify,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "min_p": min_p,
        "seed": seed,
        "max_tokens": max_tokens,
        "lenience": lenience,
    }


def _wire(
    demo: gr.Blocks, handlers: ChatHandlers, view: dict[str, Any], settings: dict[str, Any], session: gr.State
) -> Any:
    """The chat's events; returns the answer's, for what follows an answer."""
    outputs = [view[name] for name in View.names()]
    chat_inputs = [
        view["message"],
        *(settings[name] for name in ("drafter", "gamma", "verify", "temperature", "top_k", "top_p")),
        *(settings[name] for name in ("min_p", "seed", "max_tokens", "lenience")),
        view["colour"],
        session,
    ]
    # Generations share the pair's slots (one for the app alone): a tab beyond them queues,
    # and is told so by its live feed. An answer asked in the page runs as begin, run
    # (queued, no outputs: no progress display redraws the page while it decodes) and
    # finish; the /chat and /measure_baseline APIs are one event each, on hidden triggers.
    slots = handlers.lm.engine.slots.count if handlers.lm is not None else 1
    engine = {"concurrency_limit": slots, "concurrency_id": ENGINE_QUEUE, "show_progress": "hidden"}
    quick = {"queue": False, "show_progress": "hidden"}
    # Queued (so that a warning reaches the page as a toast), each in a group of its own
    # that nothing long holds: they run at once.
    brief = {"concurrency_limit": None, "show_progress": "hidden", "api_visibility": "private"}
    private = {"api_visibility": "private"}
    begun = gr.on([view["message"].submit, view["send"].click], handlers.begin, chat_inputs, outputs, **brief)
    ran = begun.then(handlers.run, [session], None, **engine, **private)
    answered = ran.then(handlers.finish, [session], outputs, **brief)
    measured = view["measure"].click(handlers.baseline_begin, [session], outputs, **brief)
    measured = measured.then(handlers.baseline_run, [session], None, **engine, **private)
    measured.then(handlers.baseline_show, [session], outputs, **brief)
    api_chat, api_baseline = gr.Button(visible=False), gr.Button(visible=False)
    api_chat.click(handlers.chat, chat_inputs, outputs, api_name="chat", **engine)
    api_baseline.click(handlers.measure_baseline, [session], outputs, api_name="measure_baseline", **engine)
    # Not queued: these must act while a generation holds the engine's slot.
    view["stop"].click(handlers.stop, [session], None, api_name="stop", **quick)
    view["clear"].click(handlers.clear, [session], outputs, api_name="clear", **quick)
    settings["lenience"].change(
        handlers.set_lenience, [settings["lenience"], session], None, api_name="set_lenience", **quick
    )
    view["colour"].change(
        handlers.recolour, [view["colour"], session], [view["provenance"]], api_name="recolour", **quick
    )
    demo.unload(handlers.unload)
    return answered


def _wire_chats(
    handlers: ChatHandlers, view: dict[str, Any], chats: dict[str, Any], session: gr.State, answered: Any
) -> None:
    """The list of the tab's chats: New chat, picking one, and titles kept current. Not
    queued: switching acts at once (it stops an answer still streaming in the chat left)."""
    outputs = [*(view[name] for name in View.names()), chats["list"]]
    quick = {"queue": False, "show_progress": "hidden"}
    chats["new"].click(handlers.new_chat, [session], outputs, api_name="new_chat", **quick)
    chats["list"].input(handlers.open_chat, [chats["list"], session], outputs, api_name="open_chat", **quick)
    # A chat's title is its first message: shown once its answer is in.
    answered.then(handlers.chat_list, [session], [chats["list"]], api_visibility="private", **quick)
    view["clear"].click(handlers.chat_list, [session], [chats["list"]], api_visibility="private", **quick)
