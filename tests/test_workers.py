"""How ``make test`` shares the tests among its workers (``tests/conftest.py``)."""

from __future__ import annotations

import os

import pytest


def test_a_module_is_one_work_unit(request: pytest.FixtureRequest) -> None:
    """Under ``--dist loadgroup`` a test's id ends with its work unit, which is what keeps
    a module on one worker (its servers and kept prefills made once). pytest-xdist 3.8
    on pytest 9.2 drops it without a word (pytest-dev/pytest-xdist#1386): each test then
    went to any worker, and a module's fixtures were made on each."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("only under xdist's --dist loadgroup (make test)")
    assert request.node.nodeid.endswith("@tests/test_workers.py"), request.node.nodeid
