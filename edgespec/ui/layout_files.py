"""The app's controls for a person's own files and chats' places: the file input and its
chips under the message box, the edit pane (canvas) beside the chat, the folders in the
chat list, and "Branch from here" on every message; and their events. The layout itself
is ``layout.py``'s; behaviour is ``attach.py``'s, ``canvas.py``'s and ``folders.py``'s."""

from __future__ import annotations

from typing import Any

import gradio as gr

from edgespec.ui.attach import Attachments
from edgespec.ui.canvas import Canvas
from edgespec.ui.folders import DELETE_FOLDER_JS, Folders
from edgespec.ui.library import Library
from edgespec.ui.views import SETTING_NAMES, View

QUICK = {"queue": False, "show_progress": "hidden", "api_visibility": "private"}
READ_TICK_S = 1.0  # how often the chips say how far the read-ahead has read


def attach_input() -> dict[str, Any]:
    """Beside the message box: the file input (a click chooses files; files dropped on it
    or on the message box are attached too)."""
    attach = gr.File(label="Attach files", file_count="multiple", elem_id="attach", height=96, scale=2,
                     min_width=150)  # fmt: skip
    return {"attach": attach}


def attach_chips() -> dict[str, Any]:
    """Under the message box: what is attached (read ahead how far), and what the message
    costs against the context; both empty while nothing is attached."""
    with gr.Row(elem_id="attach-row"):
        chips = gr.HTML("", elem_id="attach-chips", js_on_load=None, container=False)
        cost = gr.Markdown("", elem_id="attach-cost", container=False)
    return {"chips": chips, "cost": cost, "timer": gr.Timer(READ_TICK_S, active=False)}


def canvas_column() -> dict[str, Any]:
    """The edit pane: hidden until a file is opened in it."""
    with gr.Column(scale=4, min_width=320, visible=False, elem_id="canvas") as column:
        title = gr.Markdown("", elem_id="canvas-title")
        view = gr.HTML("", elem_id="canvas-view", js_on_load=None)
        instruction = gr.Textbox(
            placeholder="What to change (e.g. rename parse to parse_line)",
            show_label=False,
            lines=2,
            max_lines=6,
            elem_id="canvas-instruction",
        )
        with gr.Row():
            narrow = {"size": "sm", "min_width": 70}
            run = gr.Button("Revise", variant="primary", elem_id="canvas-run", **narrow)
            accept = gr.Button("Accept", elem_id="canvas-accept", **narrow)
            download = gr.DownloadButton("Download", elem_id="canvas-download", value=None, **narrow)
            copy = gr.Button("Copy", elem_id="canvas-copy", **narrow)
            close = gr.Button("Close", elem_id="canvas-close", **narrow)
        stats = gr.Markdown("", elem_id="canvas-stats")
        diff = gr.HTML("", elem_id="canvas-diff", js_on_load=None)
    return {"column": column, "title": title, "view": view, "instruction": instruction, "run": run,
            "accept": accept, "download": download, "copy": copy, "close": close, "stats": stats,
            "diff": diff}  # fmt: skip


def folders_panel() -> dict[str, Any]:
    """In the chat list: which folder it shows, and what a folder can have done to it."""
    shown = gr.Dropdown(choices=[("All chats", "*")], value="*", label="Folder", elem_id="folders",
                        interactive=True)  # fmt: skip
    with gr.Accordion("Folders", open=False, elem_id="folder-actions"):
        name = gr.Textbox(placeholder="Folder name", show_label=False, lines=1, elem_id="folder-name")
        with gr.Row():
            new = gr.Button("New folder", size="sm", elem_id="folder-new")
            rename = gr.Button("Rename", size="sm", elem_id="folder-rename")
            delete = gr.Button("Delete", size="sm", variant="stop", elem_id="folder-delete")
        system = gr.Textbox(label="Folder's system prompt (for its new chats)", lines=1, max_lines=4,
                            elem_id="folder-system")  # fmt: skip
        move = gr.Dropdown(choices=[("No folder", "")], value="", label="Move this chat to",
                           elem_id="move-chat", interactive=True)  # fmt: skip
        with gr.Row():
            export = gr.Button("Export folder", size="sm", elem_id="folder-export")
            imported = gr.UploadButton(
                "Import folder", file_types=[".json"], size="sm", elem_id="folder-import"
            )
        exported = gr.File(label="Exported folder", interactive=False, elem_id="folder-file")
    return {"shown": shown, "name": name, "new": new, "rename": rename, "delete": delete, "system": system,
            "move": move, "export": export, "imported": imported, "exported": exported}  # fmt: skip


def branch_controls() -> dict[str, Any]:
    """What the page's "Branch from here" buttons (drawn by its script on every message)
    press: out of sight, but in the page, so the script can reach them."""
    with gr.Row(elem_id="branch-controls", elem_classes=["edgespec-hidden"]):
        at = gr.Number(value=0, precision=0, elem_id="branch-at", show_label=False)
        go = gr.Button("branch", elem_id="branch-go")
    return {"at": at, "go": go}


def wire_files(
    attachments: Attachments, canvas: Canvas, files: dict[str, Any], pane: dict[str, Any],
    settings: dict[str, Any], session: gr.State,
) -> None:  # fmt: skip
    """The file input, its chips' progress, and the edit pane."""
    attached = [files["chips"], files["cost"], files["timer"]]
    files["attach"].change(attachments.attach, [files["attach"], session], attached, **QUICK)
    files["timer"].tick(attachments.tick, [session], [files["chips"], files["timer"]], **QUICK)
    opened = [pane["column"], pane["title"], pane["view"], pane["diff"], pane["download"]]
    files["canvas_open"].click(canvas.open, [session], opened, **QUICK)
    pane["close"].click(canvas.close, None, pane["column"], **QUICK)
    inputs = [pane["instruction"], settings["drafter"], settings["gamma"], session]
    outputs = [pane["view"], pane["diff"], pane["download"], pane["stats"]]
    pane["run"].click(canvas.run, inputs, outputs, concurrency_id="engine", show_progress="hidden",
                      api_name="canvas_run")  # fmt: skip
    pane["instruction"].submit(canvas.run, inputs, outputs, concurrency_id="engine", show_progress="hidden",
                               api_visibility="private")  # fmt: skip
    pane["accept"].click(canvas.accept, [session], [files["chips"], pane["title"], pane["view"]], **QUICK)
    copy_js = (
        "() => navigator.clipboard?.writeText(document.querySelector('#canvas-view pre')?.innerText || '')"
    )
    pane["copy"].click(None, None, None, js=copy_js, **QUICK)


def wire_folders(
    demo: gr.Blocks, folders: Folders, library: Library, panel: dict[str, Any], chats: dict[str, Any],
    session: gr.State,
) -> None:  # fmt: skip
    """The folder picker and its actions; the chat list follows the folder shown."""
    query = chats["search"]
    refresh = [panel["shown"], panel["move"]]
    demo.load(folders.refresh, [session], refresh, **QUICK)
    chats["list"].change(folders.refresh, [session], refresh, **QUICK)
    panel["shown"].input(folders.show, [panel["shown"], session, query],
                         [chats["list"], panel["name"], panel["system"]], **QUICK)  # fmt: skip
    changed = [panel["shown"], panel["move"], chats["list"]]
    panel["new"].click(folders.create, [panel["name"], session, query], [*changed, panel["name"]], **QUICK)
    panel["rename"].click(folders.rename, [panel["name"], session], changed[:2], **QUICK)
    panel["delete"].click(folders.delete, [session, query], changed, js=DELETE_FOLDER_JS, **QUICK)
    panel["system"].blur(folders.set_system, [panel["system"], session], None, **QUICK)
    panel["move"].input(folders.move, [panel["move"], session, query], chats["list"], **QUICK)
    panel["export"].click(folders.export, [session], panel["exported"], **QUICK)
    panel["imported"].upload(folders.import_bundle, [panel["imported"], session, query], changed, **QUICK)


def wire_branch(library: Library, controls: dict[str, Any], session: gr.State, opened: list[Any]) -> None:
    controls["go"].click(library.branch, [controls["at"], session], opened, api_name="branch", queue=False,
                         show_progress="hidden")  # fmt: skip


def opened_outputs(view: dict[str, Any], chats: dict[str, Any], settings: dict[str, Any]) -> list[Any]:
    """What opening a chat redraws, in ``Library._opened``'s order."""
    return [*(view[name] for name in View.names()), chats["list"], *(settings[n] for n in SETTING_NAMES)]
