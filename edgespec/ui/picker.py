"""The model picker: the pairs on disk and the catalog's, and the GGUFs other programs
keep on this computer or a person's folders hold (size, whether they fit this machine,
what ``models recommend`` suggests, the speed measured here or estimated), and picking
one: downloaded with its progress shown (sha256-checked, resumable, Cancel stops it),
then loaded in place of the pair the app has, without restarting the app. A file listed
with a problem (gone, not a GGUF, a part missing) is refused in one line."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from edgespec.errors import EdgespecError
from edgespec.models.choices import ModelChoice, model_choices
from edgespec.models.local import LocalFolders
from edgespec.ui.pair import PairChoice, PairHolder

PROGRESS_EVERY_S = 0.5  # how often the page is told how far a download or a switch is


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


class Picker:
    """What the model picker's controls do, for the app's lifetime."""

    def __init__(
        self,
        pair: PairHolder,
        *,
        models_dirs: list[Path] | None = None,
        remember: Callable[[list[str]], None] | None = None,
    ):
        """``models_dirs``: folders to search for GGUFs beside other programs' own
        (``--models-dir``, and those added in the page before); ``add_models_dir`` adds
        more while the app runs, and hands the whole list to ``remember`` (the store)."""
        self._remember = remember
        self.pair = pair
        self.folders = LocalFolders(models_dirs or ())
        self._cancel = threading.Event()
        self._choices: dict[str, ModelChoice] = {}

    def choices(self) -> list[tuple[str, str]]:
        """(label, key) of every pair the picker offers, on disk first."""
        from edgespec.decoding.costs import measured_speed

        try:
            listed = model_choices(measured_speed(), extra_dirs=self.folders.dirs)
        except EdgespecError:
            listed = []
        self._choices = {choice.key: choice for choice in listed}
        return [(choice.label, choice.key) for choice in listed]

    def current_key(self) -> str | None:
        lm = self.pair.lm
        if lm is None:
            return None
        for key, choice in self._choices.items():
            if choice.target in (lm.target.name, str(lm.target.path)):
                return key
        return None

    def refresh(self) -> Any:
        choices = self.choices()
        return gr.update(choices=choices, value=self.current_key())

    def add_models_dir(self, folder: str) -> tuple[str, Any]:
        """A folder typed in the page: (status line, the picker listed again with its
        models), or the one line saying why it was not added."""
        try:
            added = self.folders.add(folder)
        except EdgespecError as exc:
            return f"**Not added:** {exc}", gr.skip()
        if self._remember is not None:
            self._remember([str(path) for path in self.folders.dirs])
        return f"Looking in {added} too.", self.refresh()

    def cancel(self) -> str:
        self._cancel.set()
        return "Cancelling…"

    def use(self, key: str | None) -> Iterator[tuple[Any, Any, Any]]:
        """Download (when needed) and load the picked pair; yields (status, header,
        picker) as it goes."""
        if self.pair.loader is None:
            yield (
                "The models are fixed here (`edgespec serve --ui`): restart it with `--target`.",
                gr.skip(),
                gr.skip(),
            )
            return
        choice = self._choices.get(key or "")
        if choice is None:
            yield "Pick a model from the list first.", gr.skip(), gr.skip()
            return
        if choice.problem is not None:
            yield f"**Cannot use {choice.target}:** {choice.problem}", gr.skip(), gr.skip()
            return
        self._cancel.clear()
        try:
            if not choice.on_disk:
                yield from self._download(choice)
            yield from self._switch(choice)
        except EdgespecError as exc:
            yield f"**Not switched:** {exc}", header_markdown(self.pair), self.refresh()
            return
        yield self._loaded_line(choice), header_markdown(self.pair), self.refresh()

    def _download(self, choice: ModelChoice) -> Iterator[tuple[Any, Any, Any]]:
        from edgespec.models.download import pull_pair_with_progress

        progress = {"done": 0, "total": choice.download_bytes}
        failure: list[BaseException] = []

        def on_progress(done: int, total: int) -> None:
            progress.update(done=done, total=total)

        def pull() -> None:
            try:
                pull_pair_with_progress(choice.target, choice.draft, on_progress, self._cancel)
            except BaseException as exc:  # shown in the page, not a thread's traceback
                failure.append(exc)

        worker = threading.Thread(target=pull, name="edgespec-download", daemon=True)
        worker.start()
        while worker.is_alive():
            done, total = progress["done"], max(progress["total"], 1)
            line = (
                f"Downloading {choice.target}: {_size(done)} of {_size(total)} ({100 * done / total:.0f} %)"
            )
            yield line + " · Cancel stops it; picking it again resumes.", gr.skip(), gr.skip()
            worker.join(PROGRESS_EVERY_S)
        if failure:
            exc = failure[0]
            raise exc if isinstance(exc, EdgespecError) else EdgespecError(f"download failed: {exc}")
        yield f"Downloaded {choice.target}; its sha256 matched.", gr.skip(), gr.skip()

    def _switch(self, choice: ModelChoice) -> Iterator[tuple[Any, Any, Any]]:
        said: list[str] = []
        failure: list[BaseException] = []

        def switch() -> None:
            try:
                self.pair.switch(PairChoice(choice.target, choice.draft), said.append)
            except BaseException as exc:
                failure.append(exc)

        worker = threading.Thread(target=switch, name="edgespec-switch", daemon=True)
        worker.start()
        started = time.monotonic()
        while worker.is_alive():
            lines = " ".join(said) or "Switching models…"
            yield f"{lines} ({time.monotonic() - started:.0f} s)", gr.skip(), gr.skip()
            worker.join(PROGRESS_EVERY_S)
        if failure:
            exc = failure[0]
            raise exc if isinstance(exc, EdgespecError) else EdgespecError(f"switching failed: {exc}")

    def _loaded_line(self, choice: ModelChoice) -> str:
        lm = self.pair.lm
        draft = f" with {lm.draft.name}" if lm is not None and lm.draft is not None else ""
        return f"Ready: now answering with {choice.target}{draft}."


def header_markdown(pair: PairHolder) -> str:
    lm = pair.lm
    if lm is None:
        return "### edgespec chat"
    draft = f"draft **{lm.draft.name}**" if lm.draft is not None else "no draft model"
    split = f" ({lm.target.placement.describe()})" if lm.target.placement is not None else ""
    return (
        f"### edgespec chat · target **{lm.target.name}**{split}, {draft}, context {lm.target.n_ctx} tokens"
    )
