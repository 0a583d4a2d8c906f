"""llama.cpp's own speculative decoding on the same prompts, as a reference.

``llama-speculative-simple`` runs each of llama.cpp's loops (``LOOPS``): ``ngram-simple``
(its prompt lookup: a 12-token match, then a 48-token draft), ``ngram-mod`` (a rolling
hash of the last tokens over the context, drafting 48 to 64) and ``draft-simple`` (the
draft model, up to 3 tokens a step). It is built from the llama.cpp sources vendored in
the ``llama-cpp-python`` sdist, outside the repository:

    edgespec bench --llamacpp-build        # once: configures and builds it (minutes)
    edgespec bench --llamacpp BINARY ...   # runs it beside the other configurations

Its decode-phase speed (llama.cpp's "decoded N tokens in S seconds", which starts after
the prompt is encoded) is compared with ours on the same models, prompts and threads, as
the tokens asked for over those seconds: the tool keeps the whole draft its last step
accepted, up to 48 tokens past the request, which a client asking for N never receives.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgespec.bootstrap import LLAMA_CPP_VERSION, llama_cpp_source  # the sdist the runtime is built from
from edgespec.errors import EdgespecError
from edgespec.models import store
from edgespec.runtime import system

_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+) seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


@dataclass(frozen=True)
class ReferenceRun:
    tokens: int  # what llama.cpp decoded: its last step may accept a draft past the request
    decode_s: float
    drafted: int
    accepted: int
    requested: int = 0  # the tokens asked for (0: no limit)

    @property
    def delivered(self) -> int:
        """The tokens of the request: a whole accepted draft is kept past the request's
        end, but a client asked for no more (ours stops exactly there), so the rate counts
        what was asked for over the time it took to have it."""
        return min(self.tokens, self.requested) if self.requested > 0 else self.tokens

    @property
    def decode_tps(self) -> float:
        return self.delivered / self.decode_s if self.decode_s > 0 else 0.0


def runtime_cmake_args() -> list[str]:
    """The CMake arguments the runtime's own llama.cpp was built with (`make setup`'s
    record): the reference must run the same kernels, and on a CPU with AMX a native build
    would crash at its first decode (llama.cpp issue 20824)."""
    record = system.build_record() or {}
    return str(record.get("cmake_args") or "").split()


TOOLS = ("llama-speculative-simple", "llama-server", "llama-bench")  # what ``build`` can make


def default_binary(cmake_args: list[str] | None = None, tool: str = TOOLS[0]) -> Path:
    """Where ``tool`` built with ``cmake_args`` (default: the runtime's) lives: one build
    directory per set of arguments, so a change of recipe builds it anew."""
    args = runtime_cmake_args() if cmake_args is None else cmake_args
    key = hashlib.sha256(" ".join(args).encode()).hexdigest()[:10]
    build_dir = store.home() / "llama.cpp" / f"build-{LLAMA_CPP_VERSION}-{key}"
    return build_dir / "bin" / tool


def build(jobs: int | None = None, tool: str = TOOLS[0]) -> Path:
    """Download the llama-cpp-python sdist with pip, configure its vendored llama.cpp with
    the runtime build's CMake arguments, and build ``tool`` (``llama-speculative-simple``
    or ``llama-server``, the peer the sessions benchmark measures beside us)."""
    if tool not in TOOLS:
        raise EdgespecError(f"unknown llama.cpp tool {tool!r} (known: {', '.join(TOOLS)})")
    cmake_args = runtime_cmake_args()
    binary = default_binary(cmake_args, tool)
    if binary.is_file():
        return binary
    if shutil.which("cmake") is None:
        raise EdgespecError("building llama.cpp's tools needs cmake (apt-get install cmake)")
    build_dir = binary.parent.parent
    source = vendored_source()
    subprocess.run(
        ["cmake", "-S", str(source), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
         "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
         "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_SERVER=ON", *cmake_args],
        check=True,
    )  # fmt: skip
    subprocess.run(
        ["cmake", "--build", str(build_dir), "--target", tool, "-j", str(jobs or os.cpu_count() or 2)],
        check=True,
    )
    if not binary.is_file():
        raise EdgespecError(f"the llama.cpp build did not produce {binary}")
    return binary


def vendored_source() -> Path:
    """llama.cpp's sources as the llama-cpp-python sdist vendors them, unpacked once into
    the cache (kept: every tool's build directory is configured from this one tree, and the
    tests read its real chat templates)."""
    source = llama_cpp_source()
    if (source / "CMakeLists.txt").is_file():
        return source
    work = source.parent.parent.parent
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
             "-d", tmp, f"llama-cpp-python=={LLAMA_CPP_VERSION}"],
            check=True,
        )  # fmt: skip
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp, filter="data")
        unpacked = next(p for p in Path(tmp).glob("llama_cpp_python-*") if p.is_dir())
        shutil.rmtree(source.parent.parent, ignore_errors=True)
        os.replace(unpacked, source.parent.parent)
    return source


LOOPS = ("ngram-simple", "ngram-mod", "draft-simple")  # llama.cpp's --spec-type names


def run_loop(
    binary: Path,
    loop: str,
    target: Path,
    draft: Path | None,
    prompt_text: str,
    n_predict: int,
    threads: int,
    ctx: int = 4096,
) -> ReferenceRun:
    """One greedy generation with one of llama.cpp's speculative loops (``LOOPS``), each
    with llama.cpp's own defaults. ``prompt_text`` is the chat-rendered prompt (special
    tokens are parsed); ``draft`` is the draft model, which ``draft-simple`` needs."""
    if loop not in LOOPS:
        raise EdgespecError(f"unknown llama.cpp loop {loop!r} (known: {', '.join(LOOPS)})")
    # The tool stops once it has decoded more than -n tokens: asked for one less, it stops
    # as soon as it has the n_predict tokens, as a server would.
    cmd = [
        str(binary), "-m", str(target), "--spec-type", loop, "-p", prompt_text,
        "-n", str(max(n_predict - 1, 1)), "-t", str(threads), "-tb", str(threads), "-c", str(ctx),
        "--temp", "0", "--top-k", "1", "--seed", "1",
    ]  # fmt: skip
    if loop == "draft-simple":
        if draft is None:
            raise EdgespecError("llama.cpp's draft-simple loop needs a draft model")
        cmd += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    log = result.stdout + result.stderr
    decoded, drafted, accepted = _DECODED.search(log), _DRAFTED.search(log), _ACCEPTED.search(log)
    if result.returncode != 0 or decoded is None:
        tail = " | ".join(line for line in log.strip().splitlines()[-3:])
        raise EdgespecError(
            f"llama-speculative-simple --spec-type {loop} failed ({result.returncode}): {tail}"
        )
    return ReferenceRun(
        tokens=int(decoded.group(1)),
        decode_s=float(decoded.group(2)),
        drafted=int(drafted.group(1)) if drafted else 0,
        accepted=int(accepted.group(1)) if accepted else 0,
        requested=n_predict,
    )
