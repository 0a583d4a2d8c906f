"""The agents check's side of the agents (``python -m lab.agents``): the data
file that names them and their tasks, their npm install into a cache outside the
repository, and one run of one agent on one task, in a fresh folder with a private home,
under a time limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.errors import EdgespecError

DATA = Path(__file__).resolve().parent / "data" / "agents.toml"
CACHE = Path.home() / ".cache" / "edgespec" / "agents"
# The user's own settings for these agents must not leak into a run (a real key, another
# endpoint): every variable with these prefixes is dropped, then the data file's are set.
ISOLATED_PREFIXES = ("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_")
PLACEHOLDERS = ("proxy", "model", "key", "task", "work", "home", "answer")
INSTALL_TIMEOUT_S = 900.0
VERSION_TIMEOUT_S = 60.0
KILL_GRACE_S = 5.0
OUTPUT_TAIL_CHARS = 4000
ANSWER_CHARS = 200


@dataclass(frozen=True)
class Agent:
    """One coding agent as the data file describes it."""

    name: str
    package: str
    version: str
    bin: str
    api: str  # the path it is expected to use, for the report
    answer: str  # "json-result" or "file"
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    error_patterns: tuple[str, ...] = ()
    by_default: bool = True  # run when no --agents are named

    def install_dir(self, cache: Path = CACHE) -> Path:
        """``<cache>/<package>@<version>``: a scoped package nests under its scope."""
        return cache / f"{self.package}@{self.version}"

    def binary(self, cache: Path = CACHE) -> Path:
        return self.install_dir(cache) / "node_modules" / ".bin" / self.bin


@dataclass(frozen=True)
class Task:
    """A small task in a folder of its own, and how its outcome is judged."""

    name: str
    prompt: str
    files: dict[str, str] = field(default_factory=dict)
    answer_contains: str | None = None  # the final answer must contain this
    check_file: str | None = None  # this file must then contain and lack these
    file_contains: tuple[str, ...] = ()
    file_lacks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Spec:
    agents: dict[str, Agent]
    tasks: dict[str, Task]


def _agent(name: str, raw: dict[str, Any]) -> Agent:
    answer = raw.get("answer", "file")
    if answer not in ("json-result", "file"):
        raise EdgespecError(f"agents.toml: agent {name}: answer must be json-result or file, not {answer!r}")
    return Agent(
        name=name,
        package=raw["package"],
        version=raw["version"],
        bin=raw["bin"],
        api=raw.get("api", ""),
        answer=answer,
        args=tuple(raw["args"]),
        env=dict(raw.get("env", {})),
        files=dict(raw.get("files", {})),
        error_patterns=tuple(raw.get("error_patterns", ())),
        by_default=raw.get("default", True) is True,
    )


def _entries(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The agents' entries, one that ``extends`` another taking that one's keys first."""
    out = {}
    for name, entry in raw.items():
        base = raw[entry["extends"]] if "extends" in entry else {}
        out[name] = {**base, "default": True, **{k: v for k, v in entry.items() if k != "extends"}}
    return out


def _task(name: str, raw: dict[str, Any]) -> Task:
    return Task(
        name=name,
        prompt=raw["prompt"],
        files=dict(raw.get("files", {})),
        answer_contains=raw.get("answer_contains"),
        check_file=raw.get("check_file"),
        file_contains=tuple(raw.get("file_contains", ())),
        file_lacks=tuple(raw.get("file_lacks", ())),
    )


def load_spec(path: Path = DATA) -> Spec:
    """The agents and tasks of the data file; one line naming what is wrong otherwise."""
    try:
        raw = tomllib.loads(path.read_text())
        agents = {name: _agent(name, entry) for name, entry in _entries(raw["agents"]).items()}
        tasks = {name: _task(name, entry) for name, entry in raw["tasks"].items()}
    except OSError as e:
        raise EdgespecError(f"cannot read {path}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as e:
        raise EdgespecError(f"{path}: not a valid agents file: {type(e).__name__}: {e}") from None
    return Spec(agents, tasks)


def fill(template: str, values: dict[str, str]) -> str:
    """``template`` with each ``{name}`` of PLACEHOLDERS replaced; other braces (TOML, JSON,
    f-strings in a task's code) stay as they are, hence no ``str.format``."""
    for name in PLACEHOLDERS:
        if name in values:
            template = template.replace("{" + name + "}", values[name])
    return template


def isolated_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without the agents' own variables, HOME set to the
    run's private home (their config, caches and logs land there), then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ISOLATED_PREFIXES)}
    env["HOME"] = str(home)
    env.update(extra)
    return env


def ensure_installed(agent: Agent, cache: Path = CACHE) -> tuple[Path, str]:
    """The agent's binary, installed with npm on first use, and what its ``--version``
    prints. A marker written after a good install keeps a half-finished one from counting."""
    binary, marker = agent.binary(cache), agent.install_dir(cache) / ".edgespec-installed"
    if not (marker.exists() and binary.exists()):
        _npm_install(agent, cache)
    version = _version_of(agent, binary)
    marker.write_text(version + "\n")
    return binary, version


def _npm_install(agent: Agent, cache: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise EdgespecError("npm is not on PATH: install Node.js (with npm) to run the agents")
    prefix, spec = agent.install_dir(cache), f"{agent.package}@{agent.version}"
    prefix.mkdir(parents=True, exist_ok=True)
    print(f"installing {spec} into {prefix}", file=sys.stderr, flush=True)
    command = [npm, "install", "--prefix", str(prefix), spec, "--no-audit", "--no-fund"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise EdgespecError(f"npm install {spec} took over {INSTALL_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise EdgespecError(f"npm install {spec} failed (exit {done.returncode}): {tail}")


def _version_of(agent: Agent, binary: Path) -> str:
    """``--version``, run with a throwaway home; it must name the pinned version (a native
    binary missing from the optional dependencies shows up here, not mid-benchmark)."""
    with tempfile.TemporaryDirectory(prefix="edgespec-agent-home-") as home:
        try:
            done = subprocess.run(
                [str(binary), "--version"],
                env=isolated_env(Path(home), {}),
                capture_output=True,
                text=True,
                timeout=VERSION_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EdgespecError(f"{agent.name}: {binary} --version failed: {e}") from None
    line = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
    if done.returncode != 0 or agent.version not in line:
        raise EdgespecError(
            f"{agent.name}: {binary} --version printed {line or done.stderr.strip()[:200]!r} "
            f"(exit {done.returncode}), expected version {agent.version}"
        )
    return line


@dataclass
class RunResult:
    """One agent's run on one task, as seen from outside the server."""

    agent: str
    task: str
    exit_code: int | None  # None: killed at the time limit
    timed_out: bool
    seconds: float
    answer: str | None  # the agent's final message, shortened
    task_done: bool | None  # None: not judged (no check in the data file)
    outcome: str
    agent_errors: list[str]  # error_patterns found in its output
    output_tail: str
    folder: str | None = None  # kept for a look (--keep)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _write_files(root: Path, files: dict[str, str], values: dict[str, str] | None = None) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fill(text, values) if values is not None else text)


def _wait(process: subprocess.Popen, time_limit_s: float) -> bool:
    """Wait for the agent; at the limit SIGTERM its whole process group (it starts shells
    and helpers), then SIGKILL whatever is left, also after a normal exit or a Ctrl-C.
    True when it had to be stopped."""
    timed_out = False
    try:
        process.wait(time_limit_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _signal_group(process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(KILL_GRACE_S)
    finally:
        _signal_group(process, signal.SIGKILL)
        process.wait()
    return timed_out


def _signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def read_answer(agent: Agent, stdout: str, answer_file: Path) -> str | None:
    """The agent's final message: Claude Code's ``result`` (``--output-format json``
    prints one object, maybe after other lines), or the file it was told to write."""
    if agent.answer == "file":
        text = answer_file.read_text(errors="replace").strip() if answer_file.exists() else ""
        return text or None
    for line in reversed(stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "result" in data:
            return str(data["result"])
    return None


def judge(task: Task, work: Path, answer: str | None) -> tuple[bool | None, str]:
    """Whether the task got done, and one line saying how; reported, never required."""
    if task.answer_contains is not None:
        if answer is None:
            return False, "no answer"
        if task.answer_contains in answer:
            return True, f"answered {task.answer_contains}"
        return False, f"answer lacks {task.answer_contains}: {answer[:60]!r}"
    if task.check_file is not None:
        return _judge_file(task, work / task.check_file)
    return None, "not judged"


def _judge_file(task: Task, path: Path) -> tuple[bool, str]:
    name = task.check_file
    if not path.exists():
        return False, f"{name} is gone"
    text = path.read_text(errors="replace")
    if text == task.files.get(name):
        return False, f"{name} unchanged"
    missing = [s for s in task.file_contains if s not in text]
    left = [s for s in task.file_lacks if s in text]
    if not missing and not left:
        return True, f"{name} edited as asked"
    said = [f"lacks {s!r}" for s in missing] + [f"still has {s!r}" for s in left]
    return False, f"{name} changed but " + ", ".join(said)


def found_errors(agent: Agent, output: str) -> list[str]:
    """The agent's own protocol or connection errors: each line of its output that matches
    one of its error patterns (at most five, shortened)."""
    patterns = [re.compile(p, re.IGNORECASE) for p in agent.error_patterns]
    hits = [line.strip()[:200] for line in output.splitlines() if any(p.search(line) for p in patterns)]
    return list(dict.fromkeys(hits))[:5]


def run_agent(
    agent: Agent,
    binary: Path,
    task: Task,
    *,
    proxy_url: str,
    model: str,
    key: str,
    time_limit_s: float,
    keep: bool = False,
) -> RunResult:
    """Run ``agent`` once on ``task`` in a fresh temporary folder, pointed at
    ``proxy_url``, non-interactive, offline but for the proxy."""
    root = Path(tempfile.mkdtemp(prefix=f"edgespec-{agent.name}-{task.name}-"))
    work, home, answer_file = root / "work", root / "home", root / "answer.txt"
    work.mkdir()
    home.mkdir()
    values = {"proxy": proxy_url, "model": model, "key": key, "task": task.prompt,
              "work": str(work), "home": str(home), "answer": str(answer_file)}  # fmt: skip
    _write_files(work, task.files)
    _write_files(home, agent.files, values)
    command = [str(binary), *(fill(arg, values) for arg in agent.args)]
    env = isolated_env(home, {name: fill(value, values) for name, value in agent.env.items()})
    try:
        return _run(agent, task, command, env, root, answer_file, time_limit_s, keep)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _run(
    agent: Agent,
    task: Task,
    command: list[str],
    env: dict[str, str],
    root: Path,
    answer_file: Path,
    time_limit_s: float,
    keep: bool,
) -> RunResult:
    work = root / "work"
    started = time.perf_counter()
    # Files, not pipes: a chatty agent must never block on a full pipe. Its own session
    # (process group), so that the time limit can stop everything it started.
    with open(root / "stdout.txt", "wb") as out, open(root / "stderr.txt", "wb") as err:
        try:
            process = subprocess.Popen(
                command, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True,
            )  # fmt: skip
        except OSError as e:
            raise EdgespecError(f"{agent.name}: cannot start {command[0]}: {e.strerror or e}") from None
        timed_out = _wait(process, time_limit_s)
    seconds = time.perf_counter() - started
    stdout = (root / "stdout.txt").read_text(errors="replace")
    stderr = (root / "stderr.txt").read_text(errors="replace")
    answer = read_answer(agent, stdout, answer_file)
    done, outcome = judge(task, work, answer)
    output = stdout + "\n" + stderr
    # Claude Code's stdout is one long JSON line: its error, if any, is in the answer.
    scanned = f"{answer or ''}\n{stderr}" if agent.answer == "json-result" else output
    return RunResult(
        agent=agent.name,
        task=task.name,
        exit_code=None if timed_out else process.returncode,
        timed_out=timed_out,
        seconds=seconds,
        answer=answer[:ANSWER_CHARS] if answer is not None else None,
        task_done=done,
        outcome=f"stopped at {time_limit_s:.0f} s; {outcome}" if timed_out else outcome,
        agent_errors=found_errors(agent, scanned),
        output_tail=output.strip()[-OUTPUT_TAIL_CHARS:],
        folder=str(root) if keep else None,
    )
