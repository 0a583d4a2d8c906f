"""A crash is never silent: run the real work in a child process and name what crashed.

llama.cpp is C++: a bad kernel (the AMX repack of llama.cpp issue 20824, an illegal
instruction from a wheel built for another CPU) kills the process outright, with no Python
traceback and often no message at all. So the command runs in a child:

* the supervisor (``supervise``) starts the child with the same stdin/stdout/stderr and
  forwards the signals a user sends (SIGTERM, SIGHUP, and SIGINT when it did not already
  reach the child from the terminal);
* the child (``arm``) dumps every thread's Python stack into a crash log on a fatal signal
  (``faulthandler``) and keeps a one-line breadcrumb of what it is doing (``note``), written
  in place into a small file, so the supervisor can still read it after the child died;
* when the child dies by a signal, the supervisor prints one line naming the signal and
  the breadcrumb, keeps the crash log under ``$EDGESPEC_HOME/crashes/`` and exits 128+signum.

Standard library only: it wraps processes that may be about to crash, and anyone may
import it.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgespec.host import home

ENV_LOG = "EDGESPEC_CRASH_LOG"
ENV_STEP = "EDGESPEC_CRASH_STEP"
ENV_PARENT = "EDGESPEC_CRASH_PARENT"
RECORD = 240  # bytes of breadcrumb: one line, overwritten in place
KEEP_LOGS = 20
PR_SET_PDEATHSIG = 1

# Signals a user (or a service manager) sends to stop the work: forwarding them and exiting
# with 128+signum is the expected outcome, not a crash.
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE}

_step_fd: int | None = None
_log_file = None
_inherited: dict[str, str] = {}  # the supervisor's variables, taken out of the environment


def crashes_dir() -> Path:
    return home() / "crashes"


def is_child() -> bool:
    """True in the process a supervisor started (and only there: a grandchild that
    inherited the environment has another parent)."""
    return os.environ.get(ENV_PARENT) == str(os.getppid())


def is_armed() -> bool:
    return _step_fd is not None


# --- the child -------------------------------------------------------------------------


def arm() -> None:
    """In the supervised child: dump stacks into the crash log on a fatal signal, open the
    breadcrumb, and die with the supervisor."""
    global _step_fd, _log_file
    if not is_child() or _step_fd is not None:
        return
    log, step = os.environ.get(ENV_LOG), os.environ.get(ENV_STEP)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # a background job: see supervise
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGINT, signal.default_int_handler)
    # Processes this one starts supervise themselves rather than write into our files.
    for name in (ENV_LOG, ENV_STEP, ENV_PARENT):
        value = os.environ.pop(name, None)
        if value is not None:
            _inherited[name] = value
    if sys.platform.startswith("linux"):
        parent = os.getppid()
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before the request took effect
            os._exit(128 + signal.SIGKILL)
    if log:
        with contextlib.suppress(OSError):
            _log_file = open(log, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)
            faulthandler.enable(file=_log_file, all_threads=True)
    if step:
        with contextlib.suppress(OSError):
            _step_fd = os.open(step, os.O_WRONLY)


def exec_environment() -> dict[str, str]:
    """The variables a supervised child gives the program it replaces itself with
    (``os.execv``: same process, so its supervisor keeps waiting on it) for that program
    to be the same supervised child; empty when this process is not one."""
    return dict(_inherited)


def note(text: str) -> None:
    """Record what is running now. One pwrite of a fixed-size record into an open file:
    microseconds, cheap enough for every decode; nothing at all when not supervised."""
    fd = _step_fd
    if fd is None:
        return
    data = text.encode("utf-8", errors="replace")[: RECORD - 1]
    with contextlib.suppress(OSError):
        os.pwrite(fd, data.ljust(RECORD, b"\0"), 0)


# --- the supervisor --------------------------------------------------------------------


def _read_step(path: Path) -> str:
    try:
        raw = path.read_bytes()[:RECORD]
    except OSError:
        return ""
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace").strip()


def _prune(directory: Path, keep: int = KEEP_LOGS) -> None:
    logs = sorted(directory.glob("crash-*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[: max(0, len(logs) - keep)]:
        with contextlib.suppress(OSError):
            old.unlink()


def _sigint_from_terminal() -> bool:
    """Ctrl-C at a terminal reaches the whole foreground process group, the child included:
    forwarding it would interrupt the child twice."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def supervise(argv: list[str], *, program: str = "edgespec") -> int:
    """Run ``argv`` as a supervised child and return its exit code (128+signum when a
    signal killed it, after one line on stderr naming the crash)."""
    # The breadcrumb and log start in the temporary directory: a normal run leaves nothing
    # in the cache; only a crash log is moved into $EDGESPEC_HOME/crashes/.
    work = Path(tempfile.mkdtemp(prefix="edgespec-run-"))
    log = work / "crash.log"
    step = work / "step"
    log.touch()
    step.write_bytes(b"\0" * RECORD)
    env = {**os.environ, ENV_LOG: str(log), ENV_STEP: str(step), ENV_PARENT: str(os.getpid())}
    forwarded: set[int] = set()
    try:
        child = subprocess.Popen(argv, env=env)
    except OSError as exc:
        shutil.rmtree(work, ignore_errors=True)
        print(f"{program}: error: cannot start {argv[0]}: {exc}", file=sys.stderr)
        return 127

    def forward(signum: int, _frame) -> None:
        if signum == signal.SIGINT and _sigint_from_terminal():
            return
        forwarded.add(signum)
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    # Python-level handlers, never SIG_IGN: an ignored disposition would be inherited by
    # processes started later and make them deaf to Ctrl-C.
    # A hangup this process was started ignoring (nohup) stays ignored: the child inherited
    # that too. An interrupt is always honoured: a shell starts its background jobs with
    # SIGINT ignored, yet ``kill -INT`` on one is how a user asks it to stop (the child
    # takes SIGINT back in ``arm``).
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread: leave as is
            if signum == signal.SIGINT or signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, forward)
    try:
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:  # a handler replaced by someone else: keep waiting
                continue
    finally:
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, handler)
    try:
        if code >= 0:
            return code
        signum = -code
        if signum in forwarded or signum in _STOP_SIGNALS:
            return 128 + signum
        return _report_crash(program, signum, log, step)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _report_crash(program: str, signum: int, log: Path, step: Path) -> int:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    doing = _read_step(step) or "starting up"
    kept = log
    with contextlib.suppress(OSError):
        directory = crashes_dir()
        directory.mkdir(parents=True, exist_ok=True)
        kept = directory / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        with log.open("a") as fh:
            fh.write(f"\n{program}: crashed ({name}) while {doing}\n")
        shutil.copyfile(log, kept)
        _prune(directory)
    print(
        f"{program}: error: crashed ({name}) while {doing}; details: {kept}; run: edgespec doctor",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signum
