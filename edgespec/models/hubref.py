"""Hugging Face hub references as a user types them, and GGUF file names read for their
quantization and split parts. Pure functions: nothing here touches the network, and only
``hub_reference`` looks at the disk (whether a local folder claims a name).

Accepted forms (``hf://`` may prefix any of them)::

    owner/repo:QUANT              the GGUF of that quantization in the repo (Q4_K_M, q8_0 …)
    owner/repo/path/file.gguf     one file of the repo (the first part of a split GGUF)
    hf://owner/repo               the repo's only GGUF model

A split GGUF is ``NAME-00001-of-0000N.gguf`` … ``NAME-0000N-of-0000N.gguf``: llama.cpp
loads the first part and finds the others by that pattern next to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PREFIX = "hf://"
# Hub repository ids: owner and name of letters, digits, "-", "_", "."; names up to 96.
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_REPO = re.compile(rf"^({_PART})/({_PART})$")
_QUANT_REF = re.compile(rf"^({_PART}/{_PART}):([A-Za-z0-9._-]+)$")
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# llama.cpp's quantization names as they appear in file names: Q4_K_M, IQ3_XXS, Q8_0, F16,
# BF16, TQ1_0, MXFP4 … bounded by "-", "." or the ends of the name.
_QUANT = re.compile(
    r"(?:^|[-.])((?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|B?F16|F32|TQ\d_\d|MXFP4(?:_MOE)?))(?=$|[-.])",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class HubRef:
    """A parsed reference: the repository and either a quantization or a file in it
    (neither: the repository's only GGUF)."""

    repo: str
    quant: str = ""
    file: str = ""
    text: str = ""  # as the user wrote it, for messages

    @property
    def owner(self) -> str:
        return self.repo.split("/", 1)[0]


def parse(arg: str) -> HubRef | None:
    """The hub reference ``arg`` spells, or None when it is no hub reference (a catalog
    name, or a path). Whether a local file of that name exists is the caller's question."""
    text = arg.strip()
    explicit = text.startswith(PREFIX)
    body = text[len(PREFIX) :] if explicit else text
    if "\\" in body or body.startswith(("/", ".", "~")):
        return None
    quant = _QUANT_REF.match(body)
    if quant:
        return HubRef(repo=quant.group(1), quant=quant.group(2), text=text)
    parts = body.split("/")
    if len(parts) >= 3 and _REPO.match("/".join(parts[:2])) and body.lower().endswith(".gguf"):
        if any(p in ("", ".", "..") for p in parts[2:]):
            return None
        return HubRef(repo="/".join(parts[:2]), file="/".join(parts[2:]), text=text)
    if explicit and _REPO.match(body):
        return HubRef(repo=body, text=text)
    return None


def split_info(filename: str) -> tuple[str, int, int] | None:
    """(stem, part number, part count) of a split GGUF's part, else None."""
    m = _SPLIT.match(PurePosixPath(filename).name)
    if not m or int(m.group("count")) < 1:
        return None
    return m.group("stem"), int(m.group("no")), int(m.group("count"))


def split_parts(filename: str) -> list[str]:
    """Every part of the split GGUF ``filename`` belongs to, in order (itself alone when
    it is not split). Keeps the directory and the case of the name."""
    info = split_info(filename)
    if info is None:
        return [filename]
    _, _, count = info
    head = filename[: -len("00001-of-00000.gguf")]
    tail = filename[-len(".gguf") :]
    return [f"{head}{n:05d}-of-{count:05d}{tail}" for n in range(1, count + 1)]


def part_name(stem: str, number: int, count: int) -> str:
    """The file name of part ``number`` of ``count`` in llama.cpp's split naming."""
    return f"{stem}-{number:05d}-of-{count:05d}.gguf"


def model_stem(filename: str) -> str:
    """A GGUF's name without directory, split suffix or extension: the model's name."""
    name = PurePosixPath(filename).name
    info = split_info(name)
    if info:
        return info[0]
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def quant_of(filename: str) -> str:
    """The quantization a GGUF file name states (upper case), or "" when it states none."""
    found = _QUANT.findall(model_stem(filename))
    return found[-1].upper() if found else ""


def is_model_file(path: str) -> bool:
    """A GGUF holding a language model: not a vision projector or an imatrix."""
    name = PurePosixPath(path).name.lower()
    return name.endswith(".gguf") and not name.startswith(("mmproj", "imatrix")) and "mmproj" not in name


def matches_quant(filename: str, quant: str) -> bool:
    """Whether ``filename`` is of quantization ``quant`` (case-insensitive): the name's
    quantization is exactly it, or ``quant`` stands in the name between separators
    (for names such as ``UD-Q4_K_XL``)."""
    wanted = quant.upper()
    if quant_of(filename) == wanted:
        return True
    stem = model_stem(filename).upper()
    return re.search(rf"(?:^|[-.]){re.escape(wanted)}(?=$|[-.])", stem) is not None


@dataclass(frozen=True)
class Candidate:
    """One GGUF model of a repository: its files (several for a split model)."""

    files: tuple[str, ...]

    @property
    def first(self) -> str:
        return self.files[0]

    @property
    def quant(self) -> str:
        return quant_of(self.first)


def group_models(paths: list[str]) -> list[Candidate]:
    """The GGUF models among a repository's files, a split model's parts as one."""
    groups: dict[str, list[str]] = {}
    for path in sorted(paths):
        if not is_model_file(path):
            continue
        info = split_info(path)
        key = path if info is None else split_parts(path)[0]
        groups.setdefault(key, []).append(path)
    return [Candidate(files=tuple(sorted(files))) for _, files in sorted(groups.items())]


def quantizations(candidates: list[Candidate]) -> list[str]:
    """The distinct quantizations among ``candidates``, in a stable order."""
    seen = dict.fromkeys(c.quant or PurePosixPath(c.first).name for c in candidates)
    return sorted(seen)


def select(ref: HubRef, paths: list[str]) -> tuple[Candidate | None, str]:
    """The model ``ref`` names among a repository's ``paths``: (candidate, "") or
    (None, the one-line reason)."""
    candidates = group_models(paths)
    if ref.file:
        wanted = ref.file
        for cand in candidates:
            if wanted in cand.files:
                if split_info(wanted) and wanted != cand.first:
                    return None, f"{wanted} is not the first part of its split model; name {cand.first}"
                return cand, ""
        return None, f"{ref.repo} has no file {wanted}"
    if not candidates:
        return None, f"{ref.repo} holds no GGUF model file"
    listing = ", ".join(quantizations(candidates))
    if not ref.quant:
        if len(candidates) == 1:
            return candidates[0], ""
        return None, f"{ref.repo} holds several GGUF models; name one as {ref.repo}:QUANT ({listing})"
    found = [c for c in candidates if matches_quant(c.first, ref.quant)]
    if len(found) == 1:
        return found[0], ""
    if not found:
        return None, f"{ref.repo} has no {ref.quant} GGUF; its quantizations: {listing}"
    names = ", ".join(c.first for c in found)
    return None, (
        f"{ref.repo}:{ref.quant} is ambiguous ({names}); name the file as {ref.repo}/FILE; "
        f"its quantizations: {listing}"
    )


def looks_like_path(arg: str) -> bool:
    return "/" in arg or "\\" in arg or arg.endswith(".gguf") or arg.startswith(".")


def hub_reference(arg: str) -> HubRef | None:
    """The hub reference ``arg`` is, if it is one and no local path claims it: a bare
    ``dir/sub/file.gguf`` stays a path when ``dir`` is a local directory."""
    ref = parse(arg)
    if ref is None or arg.startswith(PREFIX) or ref.quant:
        return ref
    return None if Path(arg.split("/", 1)[0]).expanduser().is_dir() else ref
