"""The order in which ``make test``'s workers take up their work (pytest-xdist, ``--dist
loadgroup``): the longest first, by what each module took the last time it ran.

xdist hands out its work units (a module, or the modules that share a costly fixture) one
at a time as workers run dry, by default in order of how many tests each holds. Many quick
tests then go first, and a unit of a few long model tests may start last while the other
workers have nothing left to do: the run lasts as long as its last unit. Longest first
leaves only short units at the end to even the workers out. A module never timed (a fresh
clone) is weighed by its tests that load a model."""

from __future__ import annotations

from collections import defaultdict

import pytest

KEY = "edgespec/module-seconds"
UNTIMED_MODEL_TEST_S = 10.0  # a guess for a test that loads a model, until it is timed
UNTIMED_TEST_S = 0.1


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


class ModuleSeconds:
    """On the controlling process: what each module's tests took (set-up, call and
    tear-down, so a module fixture counts), kept in pytest's cache at the end of a run."""

    def __init__(self, cache: pytest.Cache) -> None:
        self.cache = cache
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        if self.seconds:
            # A partial run (-k, one module) updates only the modules it ran.
            self.cache.set(KEY, {**self.cache.get(KEY, {}), **self.seconds})


def _cache(config: pytest.Config) -> pytest.Cache | None:
    return getattr(config, "cache", None)  # none under -p no:cacheprovider


def configure(config: pytest.Config) -> None:
    if not hasattr(config.option, "loadscopereorder") or _cache(config) is None:
        return  # no xdist, or no cache to learn from
    config.option.loadscopereorder = False  # the order given below, not by count of tests
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(ModuleSeconds(config.cache), "edgespec-module-seconds")


def longest_first(config: pytest.Config, items: list[pytest.Item], group_of: dict[str, str]) -> None:
    """Sort ``items`` by the time their work unit (``group_of[module]``) took, the longest
    first, keeping the order within a unit. Every worker sorts alike: they read one cache."""
    cache = _cache(config)
    known: dict[str, float] = cache.get(KEY, {}) if cache is not None else {}
    untimed: dict[str, float] = defaultdict(float)
    for item in items:
        models = item.get_closest_marker("needs_models") is not None
        untimed[module_of(item.nodeid)] += UNTIMED_MODEL_TEST_S if models else UNTIMED_TEST_S
    weight: dict[str, float] = defaultdict(float)
    for module, group in group_of.items():
        weight[group] += known.get(module, untimed[module])

    def unit(item: pytest.Item) -> str:
        return group_of[module_of(item.nodeid)]

    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(unit(item), i)
    items.sort(key=lambda item: (-weight[unit(item)], first[unit(item)]))
