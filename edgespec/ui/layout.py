"""The Gradio chat app: layout and event wiring. Behaviour lives in ``handlers`` (answers),
``library`` (the chats kept on disk) and ``picker`` (the models).

Chat first: the chat list folds away at the side (a narrow window shows it on demand),
the chat with its system prompt above it and the accepted-tokens gauge beside it; the
stats, the step table and the settings are folded panels that remember whether they were
open. One loaded model pair serves every browser tab; generations share the pair's slots
(one for the app alone, ``--parallel`` with ``serve --ui``), so a tab beyond them waits its
turn and is told so. While an answer decodes the page reads its panels from the answer's
live feed (``ui/live.py``): ``launch_app`` and ``serve --ui`` mount the feed's route beside
the app. Stop, switching chats, the lenience slider and the colouring toggle bypass the
queue so they act at once even while an answer streams.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from edgespec.api import EdgeSpec
from edgespec.decoding.drafters import AUTO, CHOICE_HELP, CHOICES, REGISTRY
from edgespec.ui.attach import Attachments
from edgespec.ui.canvas import Canvas
from edgespec.ui.chat_store import ChatStore
from edgespec.ui.figures import steps_chart_html
from edgespec.ui.folders import Folders
from edgespec.ui.handlers import ChatHandlers, empty_gauge
from edgespec.ui.layout_files import (
    attach_chips,
    attach_input,
    branch_controls,
    canvas_column,
    folders_panel,
    opened_outputs,
    wire_branch,
    wire_files,
    wire_folders,
)
from edgespec.ui.library import PANELS, Library
from edgespec.ui.live import LIVE_JS, HeadScript, LiveFeeds, pace_for
from edgespec.ui.pair import Loader, PairHolder
from edgespec.ui.picker import Picker, header_markdown
from edgespec.ui.session import Session
from edgespec.ui.text import LENIENCE_NOTE, STEP_HEADERS, provenance_legend, speedup_markdown
from edgespec.ui.views import GAMMA_CHOICES, SETTING_NAMES, View

MODELS_DIRS = "models_dirs"  # the preference: folders of models the person added in the page
ENGINE_QUEUE = "engine"  # the concurrency group of everything that runs the models
DELETE_JS = "(...args) => confirm('Delete this chat? It cannot be undone.') ? args : null"


def drafter_choices(has_draft: bool) -> list[str]:
    """The registry's choices, auto first; a drafter that needs the draft model only
    where one is loaded."""
    return [c for c in CHOICES if has_draft or c not in REGISTRY or not REGISTRY[c].needs_model]


def drafter_help(choices: list[str]) -> str:
    return "  \n".join(f"**{name}**: {CHOICE_HELP[name]}" for name in choices)


def build_app(
    lm: EdgeSpec | None,
    load_error: str | None = None,
    feeds: LiveFeeds | None = None,
    *,
    store: ChatStore | None = None,
    loader: Loader | None = None,
    models_dirs: list[Path] | None = None,
) -> gr.Blocks:
    """The chat app around ``lm``; with ``lm=None`` the app still starts and shows
    ``load_error`` instead of answering. ``feeds``: where its answers' live feeds are
    kept (mount ``feeds.router()`` on the server that serves the app). ``store``: where
    its chats are kept (None: a new temporary one). ``loader``: how to load a pair picked
    in the app (None: the pair is fixed)."""
    store = store if store is not None else ChatStore.open(Path(tempfile.mkdtemp(prefix="edgespec-chats-")))
    pair = PairHolder(lm, load_error, loader)
    handlers = ChatHandlers(pair, store, feeds if feeds is not None else LiveFeeds(pace=pace_for(lm)))
    # Folders of models added in the page earlier are looked in again (those still there).
    kept_dirs = [Path(p) for p in store.get_pref(MODELS_DIRS, []) or [] if Path(p).is_dir()]
    picker = Picker(pair, models_dirs=[*(models_dirs or []), *kept_dirs],
                    remember=lambda dirs: store.set_pref(MODELS_DIRS, dirs))  # fmt: skip
    library = Library(handlers, store)
    attachments = Attachments(handlers, store)
    canvas, folders = Canvas(attachments, store), Folders(library.chat_list, store)
    library.folders = folders
    with gr.Blocks(title="edgespec chat", analytics_enabled=False) as demo:
        session = gr.State(Session())
        with gr.Sidebar(label="Chats", open=True, elem_id="sidebar", width=300):
            folder_panel = folders_panel()
            chats = _chats_panel()
            models = _models_panel(picker)
        header = gr.Markdown(header_markdown(pair), elem_id="header")
        notice = gr.Markdown("", elem_id="store-notice")
        if pair.load_error:
            gr.Markdown(f"⚠️ **The model could not be loaded: {pair.load_error}**", elem_id="load-error")
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=320):
                view = _chat_column()
                files = view.pop("files")
                view.update({name: files[name] for name in ("attach", "chips", "cost")})
            pane = canvas_column()
            with gr.Column(scale=1, min_width=220, elem_id="gauge-column"):
                view.update(_gauge_column())
        panels, more = _folded_panels(drafter_choices(lm is None or lm.draft is not None))
        view.update(more)
        settings = {name: more[name] for name in SETTING_NAMES}
        answered = _wire_answers(demo, handlers, view, settings, session)
        _wire_library(demo, library, view, chats, more, panels, session, answered, notice)
        _wire_models(picker, models, header, more)
        opened = opened_outputs(view, chats, more)
        wire_files(attachments, canvas, files, pane, settings, session)
        wire_folders(demo, folders, library, folder_panel, chats, session)
        wire_branch(library, branch_controls(), session, opened)
    demo.live_feeds = handlers.feeds  # type: ignore[attr-defined]  # for launch_app
    demo.chat_store = store  # type: ignore[attr-defined]  # closed with the app
    demo.pair = pair  # type: ignore[attr-defined]  # the pair answering now
    return demo


def calm_queue(demo: gr.Blocks) -> gr.Blocks:
    """Gradio's queue looks for new events every millisecond and for progress every ten
    when it has nothing to do: a thousand wake-ups a second, each one taken from the
    decoding's cores (docs/app-cost.md). Every 50 ms and 100 ms, as Gradio
    itself does on Windows, is still far quicker than a person notices."""
    demo._queue.sleep_when_free = 0.05
    demo._queue.progress_update_sleep_when_free = 0.1
    return demo


def launch_app(demo: gr.Blocks, **launch: Any) -> None:
    """``demo.launch(**launch)`` with the live feed's route mounted beside the app."""
    calm_queue(demo.queue())
    demo.launch(app_kwargs={"middleware": [Middleware(HeadScript)]}, **launch)
    demo.app.include_router(demo.live_feeds.router())  # type: ignore[attr-defined]


def _chats_panel() -> dict[str, Any]:
    new = gr.Button("+ New chat", size="sm", elem_id="new-chat", variant="primary")
    search = gr.Textbox(placeholder="Search chats", show_label=False, elem_id="chat-search", lines=1)
    listed = gr.Radio(choices=[], label="Chats (newest first)", elem_id="chats", interactive=True)
    with gr.Accordion("This chat", open=False, elem_id="chat-actions"):
        rename = gr.Textbox(placeholder="New name (empty: its first message)", show_label=False,
                            elem_id="rename", lines=1)  # fmt: skip
        with gr.Row():
            rename_button = gr.Button("Rename", size="sm", elem_id="rename-button")
            delete = gr.Button("Delete", size="sm", variant="stop", elem_id="delete-chat")
        with gr.Row():
            export_md = gr.Button("Export Markdown", size="sm", elem_id="export-md")
            export_json = gr.Button("Export JSON", size="sm", elem_id="export-json")
        exported = gr.File(label="Exported", interactive=False, elem_id="export-file")
        imported = gr.UploadButton("Import JSON", file_types=[".json"], size="sm", elem_id="import-json")
    return {
        "new": new,
        "search": search,
        "list": listed,
        "rename": rename,
        "rename_button": rename_button,
        "delete": delete,
        "export_md": export_md,
        "export_json": export_json,
        "exported": exported,
        "imported": imported,
    }


def _models_panel(picker: Picker) -> dict[str, Any]:
    with gr.Accordion("Model", open=False, elem_id="model-panel"):
        choice = gr.Dropdown(choices=[], label="Pairs on disk and in the catalog", elem_id="model-picker")
        with gr.Row():
            use = gr.Button("Use this model", size="sm", variant="primary", elem_id="use-model")
            cancel = gr.Button("Cancel", size="sm", elem_id="cancel-download")
        status = gr.Markdown("", elem_id="model-status")
        folder = gr.Textbox(placeholder="Add a folder of GGUF files (Enter)", show_label=False, lines=1,
                            elem_id="models-dir")  # fmt: skip
    return {"choice": choice, "use": use, "cancel": cancel, "status": status, "folder": folder}


def _chat_column() -> dict[str, Any]:
    system = gr.Textbox("", label="System prompt", placeholder="(none): how the model answers in this chat",
                        lines=1, max_lines=6, elem_id="system")  # fmt: skip
    chatbot = gr.Chatbot(
        label="Chat",
        # The page's height less the header, the system prompt and the message box.
        height="calc(100vh - 330px)",
        min_height=260,
        elem_id="chatbot",
        feedback_options=None,
        editable="user",
        buttons=["copy", "copy_all"],
        group_consecutive_messages=False,
    )
    error = gr.Markdown("", elem_id="error-box")
    with gr.Row():
        message = gr.Textbox(placeholder="Ask something (Enter sends, Shift+Enter: a new line, Esc stops)",
                             show_label=False, scale=6, elem_id="message", lines=1, max_lines=12)  # fmt: skip
        files = attach_input()
        with gr.Column(scale=1, min_width=90):
            send = gr.Button("Send", variant="primary", elem_id="send", size="sm")
            stop = gr.Button("Stop", variant="stop", elem_id="stop", size="sm")
            regenerate = gr.Button("Regenerate", elem_id="regenerate", size="sm")
            files["canvas_open"] = gr.Button("Edit the file", size="sm", elem_id="canvas-open")
    files.update(attach_chips())
    # Empty and unseen: it names the running answer's feed, and its script reads it.
    live = gr.HTML("", elem_id="live-feed", js_on_load=LIVE_JS, container=False)
    return {
        "system": system,
        "chatbot": chatbot,
        "live": live,
        "error": error,
        "message": message,
        "send": send,
        "stop": stop,
        "regenerate": regenerate,
        "files": files,
    }


def _gauge_column() -> dict[str, Any]:
    gauge = gr.HTML(empty_gauge(), elem_id="gauge", padding=True, js_on_load=None)
    colour = gr.Checkbox(value=True, label="Colour answers by provenance", elem_id="colour-toggle")
    legend = gr.HTML(provenance_legend(None, True), elem_id="legend", js_on_load=None)
    speedup = gr.Markdown(speedup_markdown(None, None), elem_id="speedup")
    measure = gr.Button("Measure baseline", size="sm", elem_id="measure")
    return {"gauge": gauge, "colour": colour, "legend": legend, "speedup": speedup, "measure": measure}


def _folded_panels(drafters: list[str]) -> tuple[dict[str, gr.Accordion], dict[str, Any]]:
    """Stats, steps and settings, each folded until opened (the page remembers)."""
    with gr.Accordion("Stats", open=False, elem_id="stats-panel") as stats_panel:
        stats = gr.Markdown("", elem_id="stats")
        # Plain markup with no script: gr.HTML otherwise attaches a click listener to it.
        steps_plot = gr.HTML(steps_chart_html([]), elem_id="steps-plot", padding=True, js_on_load=None)
    with gr.Accordion("Steps", open=False, elem_id="steps-panel") as steps_panel:
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
    with gr.Accordion("Settings", open=False, elem_id="settings-panel") as settings_panel:
        controls = _settings(drafters)
    panels = dict(zip(PANELS, (stats_panel, steps_panel, settings_panel), strict=True))
    return panels, {"stats": stats, "steps_plot": steps_plot, "steps_table": steps_table, **controls}


def _settings(drafters: list[str]) -> dict[str, Any]:
    default_system = gr.Textbox(label="Default system prompt (for new chats)", lines=1, max_lines=6,
                                elem_id="default-system")  # fmt: skip
    with gr.Row():
        drafter = gr.Radio(drafters, value=AUTO, label="drafter", elem_id="drafter")
        gamma = gr.Dropdown(
            list(GAMMA_CHOICES), value="auto", label="γ (tokens drafted per step)", elem_id="gamma"
        )
        verify = gr.Radio(["token", "block"], value="token", label="verification", elem_id="verify")
        max_tokens = gr.Slider(1, 2048, value=256, step=1, label="max tokens", elem_id="max-tokens")
    drafter_words = gr.Markdown(drafter_help(drafters), elem_id="drafter-help")
    with gr.Row():
        temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature (0 = greedy)")
        top_k = gr.Slider(0, 200, value=0, step=1, label="top-k (0 = off)")
        top_p = gr.Slider(0.01, 1.0, value=1.0, step=0.01, label="top-p (1 = off)")
        min_p = gr.Slider(0.0, 1.0, value=0.0, step=0.01, label="min-p (0 = off)")
        # A textbox, not gr.Number: an empty Number reads as 0, and "no seed" must stay possible.
        seed = gr.Textbox("", placeholder="random", label="seed (empty = random)", elem_id="seed")
    with gr.Row():
        lenience = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="lenience λ", scale=1, elem_id="lenience")
        gr.Markdown(LENIENCE_NOTE, elem_id="lenience-note")
    return {
        "default_system": default_system,
        "drafter_help": drafter_words,
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


def _wire_answers(
    demo: gr.Blocks, handlers: ChatHandlers, view: dict[str, Any], settings: dict[str, Any], session: gr.State
) -> Any:
    """The chat's events; returns the answer's, for what follows an answer."""
    outputs = [view[name] for name in View.names()]
    chat_inputs = [
        view["message"],
        view["system"],
        *(settings[name] for name in SETTING_NAMES),
        view["colour"],
        session,
    ]
    # Generations share the pair's slots (one for the app alone): a tab beyond them queues,
    # and is told so by its live feed. An answer asked in the page runs as begin, run
    # (queued, no outputs: no progress display redraws the page while it decodes) and
    # finish; the /chat and /measure_baseline APIs are one event each, on hidden triggers.
    slots = handlers.lm.occupancy().total if handlers.lm is not None else 1
    engine = {"concurrency_limit": slots, "concurrency_id": ENGINE_QUEUE, "show_progress": "hidden"}
    quick = {"queue": False, "show_progress": "hidden"}
    # Queued (so that a warning reaches the page as a toast), each in a group of its own
    # that nothing long holds: they run at once.
    brief = {"concurrency_limit": None, "show_progress": "hidden", "api_visibility": "private"}
    private = {"api_visibility": "private"}
    asked = [
        gr.on([view["message"].submit, view["send"].click], lambda: None, None, None, **quick),
        view["regenerate"].click(handlers.note_retry, [session], None, **quick),
        view["chatbot"].retry(handlers.note_retry, [session], None, **quick),
        view["chatbot"].edit(handlers.note_edit, [session], None, **quick),
    ]
    answered = []
    for trigger in asked:
        ran = trigger.then(handlers.begin, chat_inputs, outputs, **brief)
        ran = ran.then(handlers.run, [session], None, **engine, **private)
        answered.append(ran.then(handlers.finish, [session], outputs, **brief))
    measured = view["measure"].click(handlers.baseline_begin, [session], outputs, **brief)
    measured = measured.then(handlers.baseline_run, [session], None, **engine, **private)
    measured.then(handlers.baseline_show, [session], outputs, **brief)
    api_chat, api_baseline, api_edit = (gr.Button(visible=False) for _ in range(3))
    edit_at, edited = gr.Number(visible=False, precision=0), gr.Textbox(visible=False)
    api_edit.click(handlers.intend_edit, [edit_at, edited, session], None, api_name="edit_message", **quick)
    api_chat.click(handlers.chat, chat_inputs, outputs, api_name="chat", **engine)
    api_baseline.click(handlers.measure_baseline, [session], outputs, api_name="measure_baseline", **engine)
    # Not queued: these must act while a generation holds the engine's slot.
    view["stop"].click(handlers.stop, [session], None, api_name="stop", **quick)
    settings["lenience"].change(
        handlers.set_lenience, [settings["lenience"], session], None, api_name="set_lenience", **quick
    )
    view["colour"].input(
        handlers.recolour,
        [view["colour"], session],
        [view["chatbot"], view["legend"]],
        api_name="recolour",
        **quick,
    )
    demo.unload(handlers.unload)
    return answered


def _wire_library(
    demo: gr.Blocks,
    library: Library,
    view: dict[str, Any],
    chats: dict[str, Any],
    settings: dict[str, Any],
    panels: dict[str, gr.Accordion],
    session: gr.State,
    answered: list[Any],
    notice: Any,
) -> None:
    """The chat list and what changes a chat. Not queued: each acts at once (switching
    stops an answer still streaming in the chat left)."""
    opened = [*(view[name] for name in View.names()), chats["list"], *(settings[n] for n in SETTING_NAMES)]
    quick = {"queue": False, "show_progress": "hidden"}
    private = {**quick, "api_visibility": "private"}
    folds = [panels[name] for name in PANELS]
    demo.load(library.load, [session], [*opened, *folds, notice], **private).then(
        lambda: library.store.get_pref("default_system", "") or "",
        None,
        settings["default_system"],
        **private,
    )
    chats["new"].click(
        library.new_chat, [session, settings["default_system"]], opened, api_name="new_chat", **quick
    )
    # The chat's own clear button (its bin) starts a new chat: the old one stays in the list.
    view["chatbot"].clear(library.new_chat, [session, settings["default_system"]], opened, **private)
    chats["list"].input(library.open_chat, [chats["list"], session], opened, api_name="open_chat", **quick)
    chats["search"].change(library.search, [chats["search"], session], chats["list"], **private)
    rename = [chats["rename"], session]
    for trigger in (chats["rename"].submit, chats["rename_button"].click):
        trigger(library.rename, rename, [chats["rename"], chats["list"]], **private)
    chats["delete"].click(library.delete, [session], opened, js=DELETE_JS, api_name="delete_chat", **quick)
    chats["export_md"].click(lambda s: library.export(s, "md"), [session], chats["exported"], **private)
    chats["export_json"].click(lambda s: library.export(s, "json"), [session], chats["exported"], **private)
    chats["imported"].upload(library.import_chat, [chats["imported"], session], opened, **private)
    view["system"].blur(library.set_system, [view["system"], session], None, **private)
    view["system"].submit(library.set_system, [view["system"], session], None, **private)
    settings["default_system"].blur(library.set_default_system, [settings["default_system"]], None, **private)
    view["colour"].input(library.remember_colour, [view["colour"]], None, **private)
    for name, panel in panels.items():
        panel.expand(lambda name=name: library.remember_panel(name, True), None, None, **private)
        panel.collapse(lambda name=name: library.remember_panel(name, False), None, None, **private)
    # A chat's title is its first message, and its warmth changes as answers come: the
    # list is read again once an answer is in.
    for event in answered:
        event.then(
            lambda s, q: library.chat_list(s, q or ""), [session, chats["search"]], chats["list"], **private
        )


def _wire_models(picker: Picker, models: dict[str, Any], header: Any, settings: dict[str, Any]) -> None:
    """The model picker: listed when opened, a pick downloaded and loaded in its own queue
    (one at a time), Cancel at once."""
    private = {"api_visibility": "private", "show_progress": "hidden"}
    models["choice"].focus(picker.refresh, None, models["choice"], queue=False, **private)
    used = models["use"].click(
        picker.use,
        [models["choice"]],
        [models["status"], header, models["choice"]],
        concurrency_limit=1,
        concurrency_id="models",
        **private,
    )

    def drafters() -> tuple[Any, Any]:
        """The drafter choices of the pair loaded now (no draft model: no ``model``)."""
        lm = picker.pair.lm
        choices = drafter_choices(lm is None or lm.draft is not None)
        return gr.update(choices=choices), drafter_help(choices)

    used.then(drafters, None, [settings["drafter"], settings["drafter_help"]], queue=False, **private)
    models["cancel"].click(picker.cancel, None, models["status"], queue=False, **private)
    models["folder"].submit(
        picker.add_models_dir,
        [models["folder"]],
        [models["status"], models["choice"]],
        queue=False,
        **private,
    )
