"""The prompt cache on the real pair: a conversation that comes back is restored from
host memory or from disk, bit for bit, for both models; files that cannot be trusted are
named once and never loaded."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.runtime.prompt_cache import GIB, CacheOptions, provenance_of

pytestmark = pytest.mark.needs_models

FILE_A = "\n".join(f"def step_{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(3))
FILE_B = "\n".join(f"Line {i}: the quick brown fox {i} jumps over lazy dog {i * 3}." for i in range(3))


def conversation(text: str, question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{text}\n\n{question}"}]


A = conversation(FILE_A, "What does step_2 return for x = 2? Answer in one sentence.")
B = conversation(FILE_B, "Which line mentions fox 1? Answer in one sentence.")


def ask(lm: EdgeSpec, messages, drafter: str = "model"):
    return lm.generate(messages, drafter=drafter, gamma=3, max_tokens=12)


def load(directory, ram_bytes: int = GIB) -> EdgeSpec:
    cache = CacheOptions(ram_bytes=ram_bytes, directory=directory)
    return EdgeSpec(options=RuntimeOptions(n_ctx=2048, cache=cache), quiet=True)


def test_a_returning_conversation_is_restored_exactly_from_memory_and_disk(tmp_path):
    lm = load(tmp_path)
    try:
        ask(lm, A)
        before = ask(lm, A)  # the reference: the prompt's last token decoded on A's own state
        assert before.stats.reused_tokens == before.stats.prompt_tokens - 1
        ask(lm, B)  # another conversation: A's state (both models) goes to the cache
        restored = ask(lm, A)
        assert restored.stats.reused_tokens == before.stats.prompt_tokens - 1
        assert restored.token_ids == before.token_ids
        assert lm.prompt_cache.hits >= 2  # the target's state and the draft's
    finally:
        lm.close()  # what the models hold goes to disk
    again = load(tmp_path)  # a restart: the same states, read back from their files
    try:
        assert again.prompt_cache.warm.wait(60)
        assert again.prompt_cache.describe()["ram_used_mib"] > 0  # read in before any request
        warm = ask(again, A)
        assert warm.stats.reused_tokens == before.stats.prompt_tokens - 1
        assert warm.token_ids == before.token_ids
    finally:
        again.close()


def test_a_state_pushed_out_of_memory_comes_back_from_its_file(tmp_path):
    # Room for A's target state (about 3 MB), not for its draft state (1.2 MB) too.
    lm = load(tmp_path, ram_bytes=7 << 19)
    try:
        ask(lm, A)
        before = ask(lm, A)
        ask(lm, B)  # A's target state is stored, then pushed out of memory by its draft state
        assert lm.prompt_cache.describe()["ram_used_mib"] <= 3.5
        again = ask(lm, A)
        assert again.stats.reused_tokens == before.stats.prompt_tokens - 1
        assert again.token_ids == before.token_ids
    finally:
        lm.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """Two conversations answered once, their states written to a folder each test copies."""
    directory = tmp_path_factory.mktemp("states")
    lm = load(directory)
    try:
        ask(lm, A, drafter="none")
        ask(lm, B, drafter="none")
        assert provenance_of(lm.target).n_ctx == 2048
    finally:
        lm.close()
    return directory


def write_states(directory: Path, written: Path) -> None:
    shutil.copytree(written, directory, dirs_exist_ok=True)


def test_a_restart_reads_the_newest_states_in_within_the_budget(tmp_path, written):
    write_states(tmp_path, written)
    # A's state (3.0 MB) was written before B's (2.9 MB); room for one of them.
    again = load(tmp_path, ram_bytes=4 << 20)
    try:
        assert again.prompt_cache.warm.wait(60)
        kept = again.prompt_cache.describe()["ram_used_mib"]
        assert 2 < kept < 3
        answer = ask(again, B, drafter="none")
        assert answer.stats.reused_tokens == answer.stats.prompt_tokens - 1
        assert again.prompt_cache.describe()["ram_used_mib"] == kept  # B's was in memory already
    finally:
        again.close()


def test_untrusted_cache_files_are_named_once_and_never_loaded(tmp_path, caplog, written):
    write_states(tmp_path, written)
    files = sorted(tmp_path.glob("*.kvstate"))
    assert files
    corrupt = files[0]
    raw = bytearray(corrupt.read_bytes())
    raw[-5] ^= 0xFF  # one flipped bit of the state: only the checksum can tell
    corrupt.write_bytes(bytes(raw))
    (tmp_path / "junk.kvstate").write_bytes(b"not a state at all")
    caplog.set_level(logging.WARNING, logger="edgespec.cache")
    again = load(tmp_path)
    try:
        for conversation_ in (A, B):
            ask(again, conversation_, drafter="none")  # one of them hits the corrupt file
        warnings = [r.getMessage() for r in caplog.records if r.name == "edgespec.cache"]
        assert sum("junk.kvstate" in w for w in warnings) == 1
        assert sum(corrupt.name in w and "checksum" in w for w in warnings) == 1
    finally:
        again.close()


def test_a_state_of_other_settings_is_refused(tmp_path, caplog, written):
    write_states(tmp_path, written)
    caplog.set_level(logging.WARNING, logger="edgespec.cache")
    other = EdgeSpec(
        options=RuntimeOptions(n_ctx=1024, cache=CacheOptions(ram_bytes=GIB, directory=tmp_path)), quiet=True
    )
    try:
        answer = ask(other, A, drafter="none")
        assert answer.stats.reused_tokens == 0
        assert any(
            "other settings" in r.getMessage() and "n_ctx 2048" in r.getMessage() for r in caplog.records
        )
    finally:
        other.close()
