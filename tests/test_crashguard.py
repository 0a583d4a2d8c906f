"""The crash guard with real processes: a child that really segfaults, really exits, really
gets Ctrl-C, and a supervisor that is really killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli

SUPERVISE = "import sys; from edgespec import crashguard; sys.exit(crashguard.supervise(sys.argv[1:]))"
ARM = "from edgespec import crashguard; crashguard.arm(); "

SEGFAULT_CHILD = ARM + (
    "import os, signal\n"
    "def step():\n"
    "    crashguard.note('qwen2.5-coder-1.5b: decoding 5 tokens at position 812')\n"
    "    os.kill(os.getpid(), signal.SIGSEGV)\n"
    "step()\n"
)
NORMAL_CHILD = ARM + "import sys; print('hello from the child', flush=True); sys.exit(3)"
INTERRUPTIBLE_CHILD = ARM + (
    "import sys, time\n"
    "try:\n"
    "    print('ready', flush=True)\n"
    "    time.sleep(60)\n"
    "except KeyboardInterrupt:\n"
    "    print('child saw KeyboardInterrupt', flush=True)\n"
    "    sys.exit(130)\n"
)
ORPHAN_CHILD = ARM + "import os, sys, time; print(os.getpid(), flush=True); time.sleep(60)"


@pytest.fixture()
def guard_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "tmp").mkdir()
    return {**os.environ, "EDGESPEC_HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")}


def interruptible() -> None:
    """Start as a shell starts a foreground job, with Ctrl-C enabled: tests run from a
    background job inherit SIGINT ignored, which a started process keeps."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def background() -> None:
    """Start as a shell starts a background job (``app.py &``): SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def supervise(child_code: str, env: dict[str, str], **kwargs) -> subprocess.Popen:
    kwargs.setdefault("preexec_fn", interruptible)
    return subprocess.Popen(
        [sys.executable, "-c", SUPERVISE, sys.executable, "-c", child_code],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_segfault_is_one_line_naming_the_step_and_the_log(guard_env):
    crashes = Path(guard_env["EDGESPEC_HOME"]) / "crashes"
    crashes.mkdir(parents=True)
    for i in range(25):  # older logs: only the newest 20 are kept
        old = crashes / f"crash-2020010{i:02d}-000000-1.log"
        old.write_text("old")
        os.utime(old, (1_600_000_000 + i, 1_600_000_000 + i))
    proc = supervise(SEGFAULT_CHILD, guard_env)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGSEGV == 139
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(
        "edgespec: error: crashed (SIGSEGV) while qwen2.5-coder-1.5b: decoding 5 tokens at position 812; "
    ), line
    assert line.endswith("; run: edgespec doctor")
    log = Path(line.split("details: ", 1)[1].split("; run:", 1)[0])
    assert log.parent == Path(guard_env["EDGESPEC_HOME"]) / "crashes"
    dump = log.read_text()
    assert "Segmentation fault" in dump
    assert 'File "<string>", line 4 in step' in dump  # the Python stack of the crashing thread
    assert not list(Path(guard_env["TMPDIR"]).iterdir()), "the supervisor's work files were left behind"
    kept = sorted(crashes.glob("crash-*.log"))
    assert len(kept) == 20 and log in kept


def test_normal_exit_passes_through_and_leaves_no_log(guard_env):
    proc = supervise(NORMAL_CHILD, guard_env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert out == "hello from the child\n"
    assert err == ""
    assert not (Path(guard_env["EDGESPEC_HOME"]) / "crashes").exists()
    assert not list(Path(guard_env["TMPDIR"]).iterdir())


def test_sigint_to_the_supervisor_reaches_the_child(guard_env):
    proc = supervise(INTERRUPTIBLE_CHILD, guard_env)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert out == "child saw KeyboardInterrupt\n"
    assert "crashed" not in err


def test_kill_int_stops_a_background_job_too(guard_env):
    proc = supervise(INTERRUPTIBLE_CHILD, guard_env, preexec_fn=background)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert out == "child saw KeyboardInterrupt\n"


def test_sigterm_is_forwarded_and_not_a_crash(guard_env):
    proc = supervise(INTERRUPTIBLE_CHILD, guard_env)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err == ""


def test_killing_the_supervisor_kills_the_child(guard_env):
    proc = supervise(ORPHAN_CHILD, guard_env)
    child = int(proc.stdout.readline())
    assert alive(child)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while alive(child):
        assert time.monotonic() < deadline, "the child outlived its killed supervisor"
        time.sleep(0.05)


def test_note_is_cheap_and_inert_when_unarmed(tmp_path):
    code = (
        "import time; from edgespec import crashguard\n"
        "assert not crashguard.is_armed()\n"
        "crashguard.note('ignored')\n"
        "import os; f = os.open(os.environ['STEP'], os.O_RDWR | os.O_CREAT); crashguard._step_fd = f\n"
        "t = time.perf_counter()\n"
        "for i in range(20000): crashguard.note(f'model: decoding 1 tokens at position {i}')\n"
        "print((time.perf_counter() - t) / 20000 * 1e6)\n"
    )
    step = tmp_path / "step"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "STEP": str(step)}, cwd=REPO, capture_output=True
    )
    assert out.returncode == 0, out.stderr
    per_call_us = float(out.stdout)
    assert per_call_us < 100, per_call_us  # a few µs on an idle core; generous for a busy one
    assert step.read_bytes().rstrip(b"\0") == b"model: decoding 1 tokens at position 19999"


def test_the_edgespec_command_runs_supervised(tmp_path):
    """`python -m edgespec` passes output and exit codes of the real command through."""
    env = {"EDGESPEC_HOME": str(tmp_path / "home")}
    ok = run_cli("--version", env=env)
    assert ok.returncode == 0 and ok.stdout.startswith("edgespec ")
    bad = run_cli("no-such-command", env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("edgespec: error: ")
    assert not (tmp_path / "home" / "crashes").exists()
