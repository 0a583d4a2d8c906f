"""Every example in README.md runs as written.

The tests extract every fenced ```python and ```sh block of README.md.

**Python blocks** run, each in its own subprocess, with the virtual environment's python
(``.venv/bin/python``; the running interpreter where there is no ``.venv``), from the
repository root. A block that talks to the server at ``127.0.0.1:8080`` runs against a real
``edgespec serve`` that this module starts on a free loopback port: the one change made to
a block is that port. A block fails the test when it exits non-zero.

**Shell blocks**: each command (a line, with ``\\`` continuations joined; blank lines and
comment lines dropped) runs in ``bash`` with ``set -eo pipefail``, from the repository root,
with the virtual environment's ``bin/`` first on ``PATH``. Every command must match one of
``RULES`` (first match wins); a command that matches none fails
``test_every_shell_command_is_classified``, so each new example is classified on purpose:

* ``cheap``: ``edgespec --help``, ``edgespec COMMAND --help``, ``edgespec --version``,
  ``edgespec models list``, activating the virtual environment. No model is read: they run
  without the models.
* ``models``: ``edgespec generate``, ``edgespec doctor``, ``edgespec costs show``,
  ``edgespec models path|verify``. They read or load the cached GGUFs (``needs_models``).
  Keep their ``--max-tokens`` small: each runs in seconds.
* ``server``: ``curl … 127.0.0.1:8080 …``, run against this module's server
  (``needs_models``). A non-zero exit or an OpenAI error body in the answer fails.
* ``skip``, never run here: ``make …`` (set-up, the app, the whole suite), ``edgespec
  serve`` and ``edgespec worker`` (servers), ``python app.py`` (the app), ``edgespec
  chat`` (waits for input),
  ``edgespec bench``, ``edgespec costs measure``, ``edgespec models pull`` and
  ``python -m edgespec.bench…`` (minutes of work, or downloads).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
VENV_BIN = REPO / ".venv" / "bin"
SERVER_ADDRESS = "127.0.0.1:8080"  # what the README's server examples talk to
MAX_LINES = 300  # a README for users; measurements and notes live in docs/
COMMAND_TIMEOUT_S = 600  # a first use may measure the cost profile (a minute on 2 cores)

# (class, pattern searched in the command's words joined by single spaces), first match wins.
RULES: tuple[tuple[str, str], ...] = (
    ("cheap", r"^(\.|source) \.venv/bin/activate$"),
    ("cheap", r"^edgespec( [a-z-]+)* (--help|-h)$"),
    ("cheap", r"^edgespec --version$"),
    ("cheap", r"^edgespec models (list|recommend)$"),
    ("skip", r"^(\w+=\S* )*make\b"),
    ("skip", r"\bedgespec (serve|chat|bench|worker)\b"),
    ("skip", r"\bedgespec costs measure\b"),
    ("skip", r"\bedgespec models pull\b"),
    ("skip", r"\bapp\.py\b"),
    ("skip", r"-m edgespec\.bench\b"),
    ("server", r"^curl .*" + re.escape(SERVER_ADDRESS)),
    ("models", r"\bedgespec (generate|doctor)\b"),
    ("models", r"\bedgespec costs show\b"),
    ("models", r"\bedgespec models (path|verify)\b"),
)


@dataclass(frozen=True)
class Block:
    language: str
    line: int  # README line of the opening fence
    text: str


@dataclass(frozen=True)
class Command:
    line: int  # README line where the command starts
    text: str  # as written (continuations joined)
    kind: str | None  # the rule's class; None: no rule matches

    @property
    def id(self) -> str:
        return f"L{self.line}"


def blocks(language: str) -> list[Block]:
    found = []
    for match in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL):
        if match.group(1) == language:
            line = README.read_text()[: match.start()].count("\n") + 1
            found.append(Block(language, line, match.group(2)))
    return found


def classify(text: str) -> str | None:
    words = " ".join(shlex.split(text, comments=True))
    for kind, pattern in RULES:
        if re.search(pattern, words):
            return kind
    return None


def shell_commands() -> list[Command]:
    commands = []
    for block in blocks("sh"):
        pending, start = "", 0
        for offset, raw in enumerate(block.text.splitlines(), start=block.line + 1):
            if not pending:
                start = offset
                if not raw.strip() or raw.lstrip().startswith("#"):
                    continue
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            text = pending + raw
            pending = ""
            commands.append(Command(start, text.strip(), classify(text)))
    return commands


def commands_of(kind: str) -> list[Command]:
    return [c for c in shell_commands() if c.kind == kind]


def bin_dir() -> Path:
    return VENV_BIN if (VENV_BIN / "python").exists() else Path(sys.executable).parent


def run_shell(text: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        ["bash", "-c", f"set -eo pipefail\n{text}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def explain(what: str, result: subprocess.CompletedProcess) -> str:
    out, err = result.stdout[-3000:], result.stderr[-3000:]
    return f"{what} exited with {result.returncode}\nstdout:\n{out}\nstderr:\n{err}"


# -- the README itself -------------------------------------------------------------------


def test_readme_has_examples_of_each_kind() -> None:
    # If the fences change style, extraction finds nothing and every other test passes
    # vacuously: this one fails instead.
    assert blocks("python"), "README.md has no ```python block"
    kinds = {c.kind for c in shell_commands()}
    assert {"cheap", "models", "server", "skip"} <= kinds, kinds


def test_every_shell_command_is_classified() -> None:
    unclassified = [f"README.md:{c.line}: {c.text}" for c in shell_commands() if c.kind is None]
    assert not unclassified, "classify these in tests/test_readme.py RULES:\n" + "\n".join(unclassified)


def test_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move details to docs/"


def test_readme_links_point_to_files() -> None:
    text = README.read_text()
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path = target.split("#", 1)[0]
        if path and not (REPO / path).exists():
            missing.append(target)
    assert not missing, f"README.md links to files that do not exist: {missing}"


# -- shell examples -----------------------------------------------------------------------


@pytest.mark.parametrize("command", commands_of("cheap"), ids=lambda c: c.id)
def test_cheap_shell_example_runs(command: Command) -> None:
    if "activate" in command.text and not (VENV_BIN / "activate").exists():
        pytest.skip("no .venv here (the README's set-up makes one)")
    result = run_shell(command.text)
    assert result.returncode == 0, explain(f"README.md:{command.line}: {command.text}", result)
    if "--help" in command.text or "models list" in command.text:
        assert result.stdout.strip(), f"README.md:{command.line}: no output"


@pytest.mark.needs_models
@pytest.mark.parametrize("command", commands_of("models"), ids=lambda c: c.id)
def test_model_shell_example_runs(command: Command) -> None:
    result = run_shell(command.text)
    assert result.returncode == 0, explain(f"README.md:{command.line}: {command.text}", result)
    if "--json" in command.text:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
        assert answer["text"] and answer["stats"]["tokens"] > 0, answer


@pytest.fixture(scope="module")
def readme_server(default_server):
    return default_server


def on_server(text: str, server) -> str:
    return text.replace(SERVER_ADDRESS, f"127.0.0.1:{server.port}")


@pytest.mark.needs_models
@pytest.mark.parametrize("command", commands_of("server"), ids=lambda c: c.id)
def test_server_shell_example_runs(command: Command, readme_server) -> None:
    result = run_shell(on_server(command.text, readme_server))
    assert result.returncode == 0, explain(f"README.md:{command.line}: {command.text}", result)
    try:
        body = json.loads(result.stdout)
    except json.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        assert "error" not in body, f"README.md:{command.line}: {body['error']}"
        # An answer: OpenAI's choices, or Anthropic's content blocks.
        assert body.get("choices") or body.get("content"), body
    else:
        assert '"error"' not in result.stdout, result.stdout[-3000:]


# -- Python examples ----------------------------------------------------------------------


@pytest.mark.needs_models
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("block", blocks("python"), ids=lambda b: f"L{b.line}")
def test_python_example_runs(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    code = block.text
    if SERVER_ADDRESS in code:
        code = on_server(code, request.getfixturevalue("readme_server"))
    script = tmp_path / f"readme_line_{block.line}.py"
    script.write_text(code)
    result = subprocess.run(
        [str(bin_dir() / "python"), str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S + 300,
    )
    assert result.returncode == 0, explain(f"README.md:{block.line} (python block)", result)
