"""The prompt cache's prefix tree and state files, without a model: longest match over token
ids, least-recently-used eviction within the byte budget, and files that are refused when
they cannot be trusted."""

from __future__ import annotations

import ctypes
import random
import sys
import threading
import time
from pathlib import Path

import pytest

from edgespec.runtime import state_file
from edgespec.runtime.prefix_tree import PrefixTree
from edgespec.runtime.state_file import Provenance, StateFileError


def test_a_look_at_what_is_shared_marks_nothing_used():
    tree: PrefixTree[str] = PrefixTree(2)
    tree.insert([1, 2, 3], "old", 1)
    tree.insert([4, 5], "new", 1)
    assert (tree.shared([1, 2, 3, 4]), tree.shared([1, 9]), tree.shared([6])) == (3, 1, 0)
    gone = tree.insert([7], "newest", 1)  # over the budget: the least recently used goes
    assert [entry.value for entry in gone] == ["old"]


def test_longest_match_is_the_key_sharing_most():
    tree: PrefixTree[str] = PrefixTree(1000)
    tree.insert([1, 2, 3, 4, 5], "a", 1)
    tree.insert([1, 2, 9, 9], "b", 1)
    tree.insert([7, 8], "c", 1)
    found = tree.match([1, 2, 3, 4, 6, 6])
    assert (found.length, found.stored.value) == (4, "a")
    found = tree.match([1, 2, 9])
    assert (found.length, found.stored.value) == (3, "b")
    found = tree.match([1, 2])  # both share two: the shorter key is cheaper to restore
    assert (found.length, found.stored.value) == (2, "b")
    assert tree.match([5, 5]) is None
    assert tree.match([]) is None


def test_longest_match_agrees_with_brute_force_on_random_keys():
    rng = random.Random(7)
    tree: PrefixTree[int] = PrefixTree(10**9)
    keys: list[tuple[int, ...]] = []
    for i in range(200):
        base = list(rng.choice(keys)) if keys and rng.random() < 0.7 else []
        cut = rng.randint(0, len(base))
        key = tuple(base[:cut] + [rng.randint(0, 3) for _ in range(rng.randint(1, 6))])
        if key in keys:
            continue
        for gone in tree.insert(key, i, 1):  # prefixes of a new key leave the tree
            keys.remove(gone.key)
        keys.append(key)
    assert len(tree) == len(keys)
    for _ in range(500):
        probe = tuple(rng.randint(0, 3) for _ in range(rng.randint(1, 12)))
        shared = [
            next(
                (j for j, (a, b) in enumerate(zip(k, probe, strict=False)) if a != b), min(len(k), len(probe))
            )
            for k in keys
        ]
        found = tree.match(probe)
        best = max(shared)
        if best == 0:
            assert found is None
        else:
            assert found.length == best
            assert shared[keys.index(found.stored.key)] == best


def test_a_prefix_of_a_new_key_is_replaced_by_it():
    tree: PrefixTree[str] = PrefixTree(1000)
    tree.insert([1, 2, 3], "short", 10)
    gone = tree.insert([1, 2, 3, 4, 5], "long", 20)
    assert [g.value for g in gone] == ["short"]
    assert len(tree) == 1 and tree.total == 20
    gone = tree.insert([1, 2, 3, 4, 5], "again", 5)  # the same key: replaced
    assert [g.value for g in gone] == ["long"] and tree.total == 5


def test_least_recently_used_goes_first_and_the_budget_holds():
    tree: PrefixTree[str] = PrefixTree(100)
    tree.insert([1], "a", 40)
    tree.insert([2], "b", 40)
    tree.match([1, 5])  # a is used: b is now the oldest
    gone = tree.insert([3], "c", 40)
    assert [g.value for g in gone] == ["b"]
    assert tree.total == 80 <= tree.budget
    assert [s.value for s in tree.entries()] == ["a", "c"]
    assert [g.value for g in tree.insert([4], "huge", 101)] == ["huge"]  # over the budget alone
    assert [s.value for s in tree.entries()] == ["a", "c"]


def test_zero_size_entries_are_never_evicted_for_bytes():
    tree: PrefixTree[str] = PrefixTree(50)
    tree.insert([9, 9], "on disk", 0)
    tree.insert([1], "a", 40)
    gone = tree.insert([2], "b", 40)
    assert [g.value for g in gone] == ["a"]
    assert tree.match([9, 9, 1]).stored.value == "on disk"


def test_removal_prunes_and_merges_the_path():
    tree: PrefixTree[str] = PrefixTree(1000)
    tree.insert([1, 2, 3, 4], "a", 1)
    tree.insert([1, 2, 5, 6], "b", 1)
    tree.remove([1, 2, 3, 4])
    assert tree._root.children[1].edge == (1, 2, 5, 6)  # merged back into one edge
    tree.remove([1, 2, 5, 6])
    assert not tree._root.children and tree.total == 0


def _state(values: bytes) -> ctypes.Array:
    data = (ctypes.c_uint8 * len(values))()
    ctypes.memmove(data, values, len(values))
    return data


PROVENANCE = Provenance(model_sha256="ab" * 32, n_ctx=2048, llama_cpp="0.3.36")


def test_state_file_round_trip(tmp_path):
    path = tmp_path / f"x{state_file.SUFFIX}"
    state_file.write(path, PROVENANCE, [5, 6, 151645], _state(b"kv bytes" * 100))
    header, tokens = state_file.read_header(path)
    assert header.provenance == PROVENANCE and tokens == [5, 6, 151645]
    assert bytes(state_file.read_payload(path, header)) == b"kv bytes" * 100


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda raw: b"garbage" + raw, "not an edgespec state file"),
        (lambda raw: raw[:-10], "truncated"),
        (lambda raw: raw[:20] + b"{" + raw[21:], "corrupt header"),
        (lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]), "checksum"),
    ],
)
def test_damaged_state_files_are_refused_with_the_reason(tmp_path, damage, reason):
    path = tmp_path / f"x{state_file.SUFFIX}"
    state_file.write(path, PROVENANCE, [1, 2, 3], _state(bytes(range(200))))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(StateFileError, match=reason):
        header, _ = state_file.read_header(path)
        state_file.read_payload(path, header)


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_the_cache_file_writer_yields_the_cpu_to_every_other_thread(tmp_path):
    """Its checksums and writes must never take a core from a prefill (docs/sessions.md)."""
    from edgespec.runtime.prompt_cache import CacheOptions, PromptCache

    cache = PromptCache(CacheOptions(ram_bytes=1 << 20, directory=tmp_path))
    main_before = _nice(threading.get_native_id())
    gone = tmp_path / "gone.kvstate"
    gone.write_bytes(b"x")
    cache._write_later(gone, None)  # a removal: starts the writer thread
    deadline = time.monotonic() + 10
    while gone.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gone.exists()
    nice, main_nice = _nice(cache._writer.native_id), _nice(threading.get_native_id())
    assert nice == 19 and main_nice == main_before  # the writer alone, not the process
    cache.close()


def _nice(thread_id: int | None) -> int:
    """A thread's nice value, from /proc (field 19 of its stat line)."""
    stat = Path(f"/proc/self/task/{thread_id}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])
