"""Idle prompts' KV states, kept so that a conversation that comes back costs only its new
tokens: the ``PromptCache`` of a loaded pair, shared by its models.

Each sequence of a model's context holds one conversation at a time. When a prompt
arrives that would throw away much of what its sequence holds (another conversation's
history), the cache first copies that state out (``llama_state_seq_get_data``: the KV
bytes themselves), then looks for the stored state sharing the longest token prefix with
the new prompt (a prefix tree over token ids) and, when it saves more than a few tokens
of prefill, copies it back in and truncates it to the shared prefix. Restoring writes the
very bytes that were saved, so the next decode computes on exactly the state the
conversation left.

States live in host memory within a byte budget, least recently used out first, and, with
a directory, on disk too: a restarted server or app answers a returning conversation warm.
Files are checked (model sha256, context, llama.cpp version, checksum) before they are
trusted; one that fails is named in one warning and never loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import queue
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp

from edgespec.models import store
from edgespec.runtime import state_file
from edgespec.runtime.prefix_tree import PrefixTree
from edgespec.runtime.state_file import Provenance, StateFileError

if TYPE_CHECKING:
    from edgespec.runtime.model import Model
    from edgespec.runtime.sequence import Sequence

log = logging.getLogger("edgespec.cache")

GIB = 1 << 30
# A state this short is re-read about as fast as it is copied back: not kept.
MIN_TOKENS = 16
# Restoring a stored state copies all of it; a match that saves fewer prompt tokens than
# this over what the context already holds is prefilled instead.
MIN_GAIN = 16


@dataclass(frozen=True)
class CacheOptions:
    """ram_bytes: host memory for idle states (0: no prompt cache);
    directory: where states are also written, to survive a restart (None: memory only);
    disk_bytes: the most the directory's state files may take (oldest removed first)."""

    ram_bytes: int = 0
    directory: Path | None = None
    disk_bytes: int = 16 * GIB


_Write = tuple[Path, tuple[Provenance, list[int], ctypes.Array] | None]


@dataclass
class _State:
    """One stored state: its bytes while in memory, its file when on disk."""

    model: int  # the index of the model it belongs to, in attach order
    tokens: tuple[int, ...]
    data: ctypes.Array | None
    path: Path | None = None
    header: state_file.Header | None = None


class PromptCache:
    """The pair's idle KV states, by model and token prefix (lives as long as the pair)."""

    def __init__(self, options: CacheOptions):
        self.options = options
        self._tree: PrefixTree[_State] = PrefixTree(options.ram_bytes)
        self._models: list[Model] = []
        self._provenance: list[Provenance] = []
        self._lock = threading.Lock()
        self._writes: queue.Queue[_Write | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._warmer: threading.Thread | None = None
        self._closing = threading.Event()
        self.warm = threading.Event()  # set once the directory's states are read in
        self.hits = self.misses = self.saved = 0

    def attach(self, *models: Model) -> None:
        """Cache these models' prompts from now on (their ``sync`` asks this cache), and
        index the directory's states of them."""
        for model in models:
            self._models.append(model)
            on_disk = self.options.directory is not None  # only files need the model's sha
            self._provenance.append(provenance_of(model) if on_disk else Provenance("", model.n_ctx, ""))
            model.prompt_cache = self
        if self.options.directory is not None:
            self._index_directory()
        if self._warmer is not None:
            return  # already reading what the directory held
        if waiting := self._waiting():
            self._warmer = threading.Thread(
                target=self._warm_up, args=(waiting,), name="edgespec-cache-warm", daemon=True
            )
            self._warmer.start()
        else:
            self.warm.set()

    def _key(self, model: Model, tokens: list[int] | tuple[int, ...]) -> tuple[int, ...]:
        # One tree for every model: keys start with a negative tag (token ids never are).
        return (-1 - self._models.index(model), *tokens)

    def held(self, model: Model, tokens: list[int] | tuple[int, ...]) -> int:
        """How many of ``tokens`` a state stored for ``model`` holds at most: what a sync
        could bring into any of its sequences."""
        with self._lock:
            return max(0, self._tree.shared(self._key(model, tokens)) - 1)

    # -- the exchange a sync makes ----------------------------------------------------------

    def exchange(self, sequence: Sequence, wanted: list[int], common: int) -> int:
        """Before ``sequence`` keeps only ``common`` tokens to go on with ``wanted``: store
        what it would lose, and bring in a stored state that shares more of ``wanted``.
        Returns how many of ``wanted``'s tokens the sequence now holds."""
        with self._lock:
            if len(sequence.tokens) - common >= MIN_TOKENS:
                self._store(sequence)
            if len(wanted) - common < MIN_GAIN:
                return common  # the context holds (nearly) all of it already
            match = self._tree.match(self._key(sequence.model, wanted))
            if match is None or match.length - 1 - common < MIN_GAIN:
                self.misses += 1
                return common
            state = match.stored.value
            data = state.data if state.data is not None else self._load(match.stored.key, state)
            if data is None:
                self.misses += 1
                return common
            sequence.load_state(list(state.tokens), data)
            self.hits += 1
            return match.length - 1

    def _store(self, sequence: Sequence) -> None:
        key = self._key(sequence.model, sequence.tokens)
        found = self._tree.match(key)
        if found is not None and found.length == len(key):
            return  # already stored, whole (or as part of a longer state)
        index = self._models.index(sequence.model)
        state = _State(index, tuple(sequence.tokens), sequence.snapshot().data)
        if self.options.directory is not None:
            provenance = self._provenance[index]
            state.path = self.options.directory / f"{_file_id(provenance, key)}{state_file.SUFFIX}"
            self._write_later(state.path, (provenance, list(state.tokens), state.data))
        self._put(key, state)
        self.saved += 1

    def _put(self, key: tuple[int, ...], state: _State) -> None:
        """Into the tree, charged for its bytes in memory. A state it replaces (the same
        tokens, or a prefix of them) goes, file and all; one the budget pushes out stays
        findable if it is on disk, charged nothing (its bytes are read back on a hit)."""
        size = len(state.data) if state.data is not None else 0
        for gone in self._tree.insert(key, state, size):
            old = gone.value
            if old is state and gone.key == key and gone.size != size:
                continue  # itself, charged again now that its bytes were read back in
            pushed_out = old is state or key[: len(gone.key)] != gone.key
            if pushed_out and old.path is not None:
                old.data = None
                self._tree.insert(gone.key, old, 0)
            elif not pushed_out and old.path is not None and old.path != state.path:
                self._write_later(old.path, None)

    def _load(self, key: tuple[int, ...], state: _State) -> ctypes.Array | None:
        """A disk state's bytes, checked; a file that fails is dropped with one warning.
        (A state written in this run and then pushed out of memory has no header read yet.)"""
        try:
            data = self._read(state)
        except (OSError, StateFileError) as e:
            self._drop(key, state, e)
            return None
        state.data = data
        self._put(key, state)
        return data

    @staticmethod
    def _read(state: _State) -> ctypes.Array:
        assert state.path is not None
        header = state.header or state_file.read_header(state.path)[0]
        return state_file.read_payload(state.path, header)

    def _drop(self, key: tuple[int, ...], state: _State, error: Exception) -> None:
        """Forget a state whose file failed (once: the first to find out names it)."""
        found = self._tree.get(key)
        if found is None or found.value is not state:
            return
        if not isinstance(error, FileNotFoundError):  # trimmed away since it was indexed
            log.warning("ignoring prompt cache file %s: %s", state.path, error)
        self._tree.remove(key)

    def _waiting(self) -> list[tuple[int, ...]]:
        """The keys of states held on disk alone that fit in memory together, most
        recently used first."""
        room, keys = self.options.ram_bytes - self._tree.total, []
        for stored in reversed(self._tree.entries()):
            state = stored.value
            if state.data is None and state.header is not None and state.header.payload_size <= room:
                room -= state.header.payload_size
                keys.append(stored.key)
        return keys

    def _warm_up(self, keys: list[tuple[int, ...]]) -> None:
        """Read the directory's most recent states into memory while the models wait for
        requests, at the lowest priority: a restarted server then answers a returning
        conversation as one that never left. Read by its first request instead, a state
        cost that request a quarter to a third of what a GPU takes to read the whole
        prompt again (docs/gpu.md)."""
        _lowest_priority()
        for key in keys:
            if self._closing.is_set():
                break
            with self._lock:
                found = self._tree.get(key)
                state = found.value if found is not None and found.value.data is None else None
            if state is None:
                continue  # a request read it first, or it was replaced
            try:
                data = self._read(state)  # outside the lock: requests go on meanwhile
            except (OSError, StateFileError) as e:
                with self._lock:
                    self._drop(key, state, e)
                continue
            with self._lock:
                found = self._tree.get(key)
                if found is not None and found.value is state and state.data is None:
                    state.data = data
                    self._put(key, state)
                    put = self._tree.get(key)
                    if put is not None:
                        put.used = found.used  # as recently used as before: reading is no use
        self.warm.set()

    # -- the directory ---------------------------------------------------------------------

    def _index_directory(self) -> None:
        """Every state file of the directory, known by its header (its bytes are read on a
        hit); a file no attached model can use is named once and left alone."""
        directory = self.options.directory
        assert directory is not None
        directory.mkdir(parents=True, exist_ok=True)
        by_sha = {p.model_sha256: i for i, p in enumerate(self._provenance)}
        for path in sorted(directory.glob(f"*{state_file.SUFFIX}"), key=lambda p: p.stat().st_mtime):
            try:
                header, tokens = state_file.read_header(path)
            except (OSError, StateFileError) as e:
                log.warning("ignoring prompt cache file %s: %s", path, e)
                continue
            index = by_sha.get(header.provenance.model_sha256)
            if index is None:
                log.warning("ignoring prompt cache file %s: made for another model", path)
                continue
            if header.provenance != self._provenance[index]:
                log.warning("ignoring prompt cache file %s: made with other settings (%s)", path,
                            _difference(header.provenance, self._provenance[index]))  # fmt: skip
                continue
            self._put((-1 - index, *tokens), _State(index, tuple(tokens), None, path, header))

    def _write_later(self, path: Path, state: tuple[Provenance, list[int], ctypes.Array] | None) -> None:
        """Files are written (or, for None, removed) in order by one thread of their own:
        a request never waits for a disk."""
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="edgespec-cache-files", daemon=True)
            self._writer.start()
        self._writes.put((path, state))

    def _write_loop(self) -> None:
        _lowest_priority()
        while (item := self._writes.get()) is not None:
            path, state = item
            try:
                if state is None:
                    path.unlink(missing_ok=True)
                else:
                    state_file.write(path, *state)
                    self._trim_directory()
            except OSError as e:
                log.warning("could not write prompt cache file %s: %s", path, e)

    def _trim_directory(self) -> None:
        directory = self.options.directory
        assert directory is not None
        files = sorted(directory.glob(f"*{state_file.SUFFIX}"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        while files and total > self.options.disk_bytes:
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            oldest.unlink(missing_ok=True)

    def close(self) -> None:
        """Keep what the models hold now, every sequence (on disk, where there is a
        directory), and wait for the files still being written."""
        self._closing.set()
        if self._warmer is not None:
            self._warmer.join()
            self._warmer = None
        if self.options.directory is not None:
            with self._lock:
                for model in self._models:
                    for sequence in model.sequences:
                        if len(sequence.tokens) >= MIN_TOKENS:
                            self._store(sequence)
        if self._writer is not None:
            self._writes.put(None)
            self._writer.join()
            self._writer = None
        for model in self._models:
            model.prompt_cache = None
        self._models.clear()

    def describe(self) -> dict[str, int | float | str | None]:
        """What the cache holds, for /props, doctor and the benchmark."""
        return {
            "ram_gib": round(self.options.ram_bytes / GIB, 2),
            "ram_used_mib": round(self._tree.total / (1 << 20), 1),
            "states": len(self._tree),
            "directory": str(self.options.directory) if self.options.directory else None,
            "hits": self.hits,
            "misses": self.misses,
            "saved": self.saved,
        }


def _lowest_priority() -> None:
    """The calling thread yields the CPU to every other: a file's checksum and write take
    a few hundred milliseconds of a core, which on a machine whose cores llama.cpp keeps
    busy stalled the next request's prefill (a returning conversation's first token came
    0.28 s later, docs/sessions.md). Files are then written while the models are idle.
    Linux only: there a thread id names one thread; elsewhere it could name a process."""
    if sys.platform != "linux":
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError as e:
        log.debug("could not lower the cache writer's priority: %s", e)


def provenance_of(model: Model) -> Provenance:
    """What a state of ``model`` depends on. The sha256 is the one the model store recorded
    when it fetched the file, if the file is unchanged since; else it is computed (once per
    start, and only where states go to disk)."""
    stamp = store.read_stamp(model.path)
    fresh = stamp is not None and stamp.matches(model.path)
    sha = stamp.sha256 if fresh and stamp is not None else store.sha256_file(model.path)
    return Provenance(model_sha256=sha, n_ctx=model.n_ctx, llama_cpp=llama_cpp.__version__)


def _file_id(provenance: Provenance, key: tuple[int, ...]) -> str:
    digest = hashlib.sha256(provenance.model_sha256.encode())
    digest.update(repr(key[1:]).encode())
    return digest.hexdigest()[:32]


def _difference(found: Provenance, mine: Provenance) -> str:
    return ", ".join(
        f"{name} {getattr(found, name)} here {getattr(mine, name)}"
        for name in found.__dataclass_fields__
        if getattr(found, name) != getattr(mine, name)
    )
