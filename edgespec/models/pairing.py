"""A draft for a target named alone.

When the user names only a target, the runtime still speculates: with a draft model of
the same vocabulary when one is at hand, else from the context alone (the lookup
drafters need no second model). A missing draft is never an error.

Where a draft comes from, first match wins:

1. a cached catalog model the target's catalog entry lists as its draft;
2. any other cached catalog model (role draft or any), or any cached hub download,
   small enough to draft (under half the target's size) — in that order, smallest first;
3. the first draft the target's catalog entry lists, pulled now (it is small).

Every candidate passes the vocabulary rule (``models/vocab.py``) on its GGUF file before
it is taken, so a catalog listing can never pair models llama.cpp would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models import catalog, fetch, hubref, store
from edgespec.models.resolve import ResolvedModel
from edgespec.models.vocab import gguf_difference

# A draft worth running costs a small fraction of a target step.
MAX_DRAFT_SHARE = 0.5


@dataclass(frozen=True)
class DraftChoice:
    draft: ResolvedModel | None
    note: str  # one line saying which draft, or why the context drafts alone


def _size(path: Path) -> int:
    """Bytes of a model, every part of a split one counted."""
    parts = [path.with_name(p) for p in hubref.split_parts(path.name)]
    return sum(p.stat().st_size for p in parts if p.is_file())


def _cached_candidates(target: ResolvedModel) -> list[ResolvedModel]:
    listed = target.entry.drafts if target.entry else ()
    models = catalog.all_models()
    out: list[ResolvedModel] = []
    for name in listed:
        if name in models and (path := store.cached(models[name])) is not None:
            out.append(ResolvedModel(path=path, name=name, entry=models[name]))
    others: list[ResolvedModel] = []
    for model in models.values():
        if model.name in listed or model.role not in ("draft", "any"):
            continue
        if (path := store.cached(model)) is not None:
            others.append(ResolvedModel(path=path, name=model.name, entry=model))
    base = store.hub_dir()
    if base.is_dir():
        for path in sorted(base.rglob("*.gguf")):
            info = hubref.split_info(path.name)
            if hubref.is_model_file(path.name) and (info is None or info[1] == 1) and store.stamped(path):
                others.append(ResolvedModel(path=path, name=hubref.model_stem(path.name)))
    others.sort(key=lambda r: _size(r.path))
    return out + others


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or a.samefile(b)
    except OSError:
        return False


def choose_draft(target: ResolvedModel, *, download: bool = True, quiet: bool = False) -> DraftChoice:
    """The draft for ``target`` named alone, and the line that says what was chosen."""
    limit = _size(target.path) * MAX_DRAFT_SHARE
    for candidate in _cached_candidates(target):
        if _same_file(candidate.path, target.path) or _size(candidate.path) > limit:
            continue
        if gguf_difference(target.path, candidate.path) is None:
            return DraftChoice(
                candidate, f"draft model: {candidate.name} (cached, same vocabulary as {target.name})"
            )
    problem = ""
    listed = target.entry.drafts if target.entry else ()
    if listed and download:
        model = catalog.all_models().get(listed[0])
        if model is not None and store.cached(model) is None:  # a cached one was judged above
            try:
                path = fetch.pull(model, quiet=quiet)
            except EdgespecError as exc:
                problem = f" (pulling {model.name} failed: {exc})"
            else:
                why = gguf_difference(target.path, path)
                if why is None:
                    drafted = ResolvedModel(path=path, name=model.name, entry=model)
                    return DraftChoice(
                        drafted, f"draft model: {model.name} (pulled, same vocabulary as {target.name})"
                    )
                problem = f" ({model.name}: {why})"
    return DraftChoice(
        None,
        f"no draft model of {target.name}'s vocabulary is cached{problem}: drafting from the context alone",
    )
