"""Shared fixtures: the real default models, loaded once per test session.

Tests run the real llama.cpp on the real GGUF files that `make setup` pulled into the
cache (EDGESPEC_HOME). Nothing here is mocked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.models import catalog
from edgespec.models.resolve import resolve
from tests import scheduling

REPO = Path(__file__).resolve().parent.parent
# Measured bound of llama.cpp's batch-size-dependent rounding (tests/test_runtime.py): a
# speculative run may only part from target-only decoding where the target's two best
# logits are closer than this.
NEAR_TIE = 1.5

# Fixtures that load a GGUF: a test using one (directly or through another fixture) needs
# the models. Any other test that does (a subprocess running the CLI or a server, a pair or
# model built by hand) says so itself: ``pytestmark = pytest.mark.needs_models`` in its
# module, or ``@pytest.mark.needs_models`` on the test.
MODEL_FIXTURES = {
    "target_path",
    "draft_path",
    "smol_path",
    "pair",
    "replay_recordings",
    "default_server",
    "keyed_server",
}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core this process may run on, at most 4 (each worker
    loads the pair and starts its own servers)."""
    return max(1, min(4, len(_cores())))


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker runs on its own share of the cores, and so do the servers and
    commands it starts: llama.cpp sizes its threads by the cores a process may use, and
    two workers' threads on the same core would wait for each other at every barrier."""
    scheduling.configure(config)
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    cores = _cores()
    if not worker or not count or not cores:
        return
    index, count = int(worker.removeprefix("gw")), int(count)
    # More workers than cores share them one each: llama.cpp on one thread waits at no barrier.
    os.sched_setaffinity(0, cores[index::count] if count <= len(cores) else [cores[index % len(cores)]])


# Session fixtures that cost a minute or so: the modules using one share an xdist worker.
SHARED_FIXTURES = ("replay_recordings", "default_server", "keyed_server")


# First: xdist's own hook names each test's group from these marks, in the same hook.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses one of ``MODEL_FIXTURES`` ``needs_models``, so that
    ``pytest -m "not needs_models"`` runs the math, the controller on synthetic costs and
    the schemas without any set-up. With ``--dist loadgroup`` (``make test``) each module
    runs on one worker (its module fixtures and the prefills it keeps are made once), and
    the modules sharing a costly session fixture on the same one; the longest units go first
    (``tests/scheduling.py``)."""
    groups: dict[str, str] = {}
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if MODEL_FIXTURES.intersection(names):
            item.add_marker(pytest.mark.needs_models)
        module = item.nodeid.split("::")[0]
        shared = next((name for name in SHARED_FIXTURES if name in names), None)
        if shared or module not in groups:
            groups[module] = shared or groups.get(module) or module
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid.split("::")[0]]))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        scheduling.longest_first(config, items, groups)


@pytest.fixture(scope="session")
def target_path() -> Path:
    return resolve(catalog.default_name("target")).path


@pytest.fixture(scope="session")
def draft_path() -> Path:
    return resolve(catalog.default_name("draft")).path


@pytest.fixture(scope="session")
def smol_path() -> Path:
    """SmolLM2-135M: a real model with another vocabulary (pulled on first use, 98 MB)."""
    return resolve("smollm2-135m", quiet=True).path


@pytest.fixture(scope="session")
def pair() -> EdgeSpec:
    """The default target + draft, loaded once. Tests that need a cold cache call
    ``fresh(pair)`` first."""
    lm = EdgeSpec(options=RuntimeOptions(n_ctx=2048, max_gamma=64))
    yield lm
    lm.close()


# Recorded answers for replays (edgespec.bench.replay): open chat and math (where the draft
# model is the only drafter that can pay) and an edit (where copies pay even on a steep CPU);
# dev half, so nothing is tuned on the test half. Kept outside the repository as the bench keeps
# them (``cached_record``, keyed by the models, llama.cpp, the prompts and the length): recording
# takes half a minute, and ``test_replay`` checks the recording itself.
REPLAYED_PROMPTS = ("chat-explain-interest-2", "math-bakery-1", "edit-rename-py-1")
REPLAYED_TOKENS = 64


@pytest.fixture(scope="session")
def replay_recordings(pair: EdgeSpec) -> list:
    from edgespec.bench.corpus import prompt_tokens, select
    from edgespec.bench.recording import cached_record

    chosen = [(p, prompt_tokens(pair, p)) for p in select(ids=list(REPLAYED_PROMPTS))]
    return cached_record(pair.target, pair.draft, chosen, REPLAYED_TOKENS)


def fresh(lm: EdgeSpec) -> EdgeSpec:
    """Start ``lm`` as a new process would: a full prefill, no earlier answer remembered."""
    lm.start_afresh()
    return lm


def run_cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 600):
    """Run the real `edgespec` command in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "edgespec", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


@pytest.fixture(scope="session")
def default_server():
    """``edgespec serve`` with its defaults, started once for the modules that need nothing
    else of it (the README's examples, the chat endpoints, the client libraries)."""
    from tests.server_fixtures import serve

    with serve() as server:
        yield server


SERVER_KEY = "test-key-123"


@pytest.fixture(scope="session")
def keyed_server():
    """``edgespec serve --api-key SERVER_KEY``, started once for the modules that test its
    errors and its extra endpoints."""
    from tests.server_fixtures import serve

    with serve(api_key=SERVER_KEY) as server:
        yield server
