"""A target split over this machine and a worker (llama.cpp's RPC backend), on loopback.

Real ``edgespec worker`` processes, real sockets, the real shipped GGUFs: the split pair
answers greedy text as its own ``--drafter none`` does with every drafter it has; a worker
that is down, silent, of another protocol version or killed mid-answer is one line and exit
code 2; a worker on a public address warns. The layer arithmetic is checked on its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NEAR_TIE, REPO, run_cli

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.bootstrap import llama_cpp_source
from edgespec.decoding.drafters import REGISTRY
from edgespec.decoding.events import Done, Token
from edgespec.errors import EdgespecError
from edgespec.runtime import rpc

pytestmark = pytest.mark.skipif(
    not rpc.available(), reason=f"this llama.cpp build has no RPC backend: {rpc.unavailable_reason()}"
)

STARTUP_S = 60.0  # a worker process's start, on a busy machine
COMPARED = 24  # greedy tokens compared per drafter
# An edit, as a completion: the answer copies its prompt from its first token on, so the
# lookups draft and their drafts are accepted.
EDIT = (
    "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\nprint(add(3, 4))\n\n\n"
    "# The same code with add renamed to total:\n"
)
DRAFTED = 4  # γ of the fixed drafters: every step verifies a batch over the network
JSON_PROMPT = "Describe a cat named Tom, aged 3, as a JSON object with the keys name and age."


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


# -- what the user gives, and where the layers go ----------------------------------------------


def test_endpoints_are_checked() -> None:
    assert rpc.parse_endpoints("10.0.0.2:50052, mac-studio.local:50053") == (
        "10.0.0.2:50052",
        "mac-studio.local:50053",
    )
    for bad in ("", "10.0.0.2", "10.0.0.2:", ":50052", "10.0.0.2:0", "10.0.0.2:70000", "[::1]:50052",
                "::1:50052", "a b:1", "10.0.0.2:50052,10.0.0.2:50052"):  # fmt: skip
        with pytest.raises(EdgespecError, match="--rpc"):
            rpc.parse_endpoints(bad)


def test_split_is_checked() -> None:
    assert rpc.parse_split("1,3") == (1.0, 3.0)
    assert rpc.parse_split("0, 0.5") == (0.0, 0.5)
    for bad in ("", "1,,2", "a,b", "-1,2", "0,0", "inf,1", "nan,1"):
        with pytest.raises(EdgespecError, match="--tensor-split"):
            rpc.parse_split(bad)


def test_layers_split_as_llama_cpp_assigns_them() -> None:
    worker = [("10.0.0.2:50052", "RPC0")]
    even = rpc.plan(28, (1.0, 1.0), worker, [])
    assert [(s.where, s.first, s.last) for s in even.spans] == [("here", 0, 13), ("10.0.0.2:50052", 14, 27)]
    # llama.cpp's count of offloaded layers includes the output layer, after the last one.
    assert even.n_gpu_layers == 15 and even.device_shares == (1.0,)
    quarter = rpc.plan(28, (1.0, 3.0), worker, [])
    assert [(s.first, s.last) for s in quarter.spans] == [(0, 6), (7, 27)]
    # Shared by the devices, the output layer counts as one more: the last device's share.
    two = rpc.plan(24, (2.0, 1.0, 1.0), [*worker, ("10.0.0.3:50052", "RPC1")], [])
    assert [(s.device, s.first, s.last) for s in two.spans] == [
        ("CPU", 0, 11),
        ("RPC0", 12, 18),
        ("RPC1", 19, 23),
    ]
    # A GPU here: the workers' devices first, this machine's GPU the last layers, none on the CPU.
    gpu = rpc.plan(28, (1.0, 1.0), worker, ["Metal"])
    assert [(s.where, s.device, s.first, s.last) for s in gpu.spans] == [
        ("10.0.0.2:50052", "RPC0", 0, 14),
        ("here", "Metal", 15, 27),
    ]
    assert gpu.n_gpu_layers == 29 and gpu.device_shares == (1.0, 1.0)


def test_a_split_that_leaves_the_workers_nothing_is_refused() -> None:
    worker = [("10.0.0.2:50052", "RPC0")]
    with pytest.raises(EdgespecError, match="no layer on the workers"):
        rpc.plan(28, (1.0, 0.0), worker, [])
    with pytest.raises(EdgespecError, match="takes 2 proportions"):
        rpc.plan(28, (1.0, 1.0, 1.0), worker, [])


def test_a_split_target_has_a_profile_key_of_its_own() -> None:
    from edgespec.decoding.costs import profile_facts_for, profile_path_for

    local = profile_facts_for("t", "d")
    split = profile_facts_for("t", "d", rpc.layout_key(("10.0.0.2:50052",), ()))
    assert "layout" not in local and split["layout"] == "rpc 10.0.0.2:50052; split by free memory"
    assert profile_path_for(local, "t", "d") != profile_path_for(split, "t", "d")
    assert rpc.layout_key((), ()) == ""


def test_protocol_version_is_the_vendored_one() -> None:
    header = llama_cpp_source() / "ggml" / "include" / "ggml-rpc.h"
    if not header.is_file():
        pytest.skip(f"llama.cpp's sources are not unpacked ({header}); make setup-test unpacks them")
    text = header.read_text()
    found = tuple(
        int(re.search(rf"RPC_PROTO_{part}_VERSION\s+(\d+)", text)[1]) for part in ("MAJOR", "MINOR", "PATCH")
    )
    assert found == rpc.PROTOCOL


# -- workers that are not right: one line, before any model loads ---------------------------


def test_rpc_to_a_closed_port_is_one_line_and_exit_2() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    done = run_cli("generate", "--rpc", endpoint, "--max-tokens", "4", "hello", timeout=120)
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert line.startswith("edgespec: error:") and endpoint in line and "edgespec worker" in line


@contextlib.contextmanager
def fake_worker(answer: bytes | None) -> Iterator[str]:
    """A loopback server that reads a greeting and answers ``answer`` (None: nothing)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(64)
            if answer is not None:
                conn.sendall(answer)
            stop.wait(30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()


def test_a_worker_of_another_protocol_version_is_refused_in_one_line() -> None:
    older = struct.pack("<Q", 28) + bytes([6, 1, 0, 0]) + bytes(24)
    with fake_worker(older) as endpoint:
        done = run_cli("generate", "--rpc", endpoint, "hello", timeout=120)
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert endpoint in line and "protocol 6.1.0" in line and "same edgespec version" in line


def test_a_silent_worker_is_named_within_the_greeting_timeout() -> None:
    with fake_worker(None) as endpoint:
        started = time.monotonic()
        with pytest.raises(
            EdgespecError, match=f"worker {endpoint} accepted the connection but did not answer"
        ):
            rpc.check_worker(endpoint)
    assert time.monotonic() - started < rpc.GREETING_TIMEOUT_S + 5


# -- the worker itself ----------------------------------------------------------------------------


def start_worker(port: int, *extra: str) -> subprocess.Popen:
    """``edgespec worker`` on ``port``, returned once it greets like one."""
    process = subprocess.Popen(
        [sys.executable, "-m", "edgespec", "worker", "--port", str(port), "--threads", "1", *extra],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + STARTUP_S
    while True:
        try:
            rpc.check_worker(f"127.0.0.1:{port}", timeout=1)
            return process
        except EdgespecError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"the worker did not start: {process.communicate()[1]}") from None
            time.sleep(0.2)


def stop_worker(process: subprocess.Popen) -> tuple[int, str]:
    """Ctrl-C, as a user stops it: the exit code and what it wrote on stderr."""
    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return process.returncode, stderr


def test_a_worker_on_every_interface_warns_and_stops_on_ctrl_c() -> None:
    worker = start_worker(free_port(), "--host", "0.0.0.0")
    code, stderr = stop_worker(worker)
    warnings = [line for line in stderr.splitlines() if line.startswith("edgespec: warning:")]
    assert len(warnings) == 1 and "no authentication" in warnings[0] and "trust" in warnings[0], stderr
    assert code == 130 and stderr.rstrip().endswith("edgespec worker: stopped"), stderr
    assert "Traceback" not in stderr


def test_a_worker_on_loopback_does_not_warn() -> None:
    code, stderr = stop_worker(start_worker(free_port()))
    assert code == 130 and "warning" not in stderr, stderr


def test_a_taken_port_is_one_line_and_exit_2() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = run_cli("worker", "--port", str(port), timeout=60)
    assert done.returncode == 2
    assert f"127.0.0.1:{port}" in one_line(done.stderr)


# -- the split pair ----------------------------------------------------------------------------------

# A port of its own, kept from run to run: the split pair's cost profile is keyed by its
# worker's address, and is measured once rather than at every run.
SPLIT_PORT = 50873


@pytest.fixture(scope="module")
def worker() -> Iterator[str]:
    port = SPLIT_PORT
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            port = free_port()  # taken: a fresh port (and a fresh profile)
    process = start_worker(port)
    yield f"127.0.0.1:{port}"
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def split(worker: str, target_path: Path, draft_path: Path) -> Iterator[EdgeSpec]:
    options = RuntimeOptions(n_ctx=1024, max_gamma=16, threads=1, rpc=(worker,), tensor_split=(1.0, 1.0))
    lm = EdgeSpec(str(target_path), str(draft_path), options, quiet=True)
    yield lm
    lm.close()


def test_the_target_is_split_and_the_draft_stays_here(split: EdgeSpec, worker: str) -> None:
    placement = split.target.placement
    assert placement is not None and [s.where for s in placement.plan.spans] == ["here", worker]
    assert any(name.startswith("RPC") and worker in name for name in split.target.buffers), (
        split.target.buffers
    )
    assert split.draft is not None and split.draft.placement is None
    assert not any(name.startswith("RPC") for name in split.draft.buffers), split.draft.buffers


def greedy(lm: EdgeSpec, drafter: str, **constraint) -> tuple[list[int], list[float], int]:
    """The answer's token ids, per token the margin of the target's best logit over the
    second (with ``--drafter none``; empty otherwise), and how many tokens were accepted
    from drafts."""
    tokens, gaps, accepted = [], [], 0
    asked = (
        {"logprobs": 2, "gamma": 0}
        if drafter == "none"
        else {"gamma": "auto" if drafter == "auto" else DRAFTED}
    )
    prompt, chat = (JSON_PROMPT, True) if constraint else (EDIT, False)
    for event in lm.stream(prompt, chat=chat, max_tokens=COMPARED, drafter=drafter, **asked, **constraint):
        if isinstance(event, Token):
            tokens.append(event.token)
            if event.top_logprobs:
                (_, best), (_, second) = event.top_logprobs[:2]
                gaps.append(best - second)
        elif isinstance(event, Done):
            assert event.stop_reason in ("max_tokens", "eos")
            accepted = event.stats.accepted
    return tokens, gaps, accepted


def assert_same(reference: tuple, answer: list[int], drafter: str) -> None:
    """Identical, or parted only where the target's two best tokens are a near-tie (llama.cpp's
    batched kernels round otherwise than its one-token ones)."""
    ref, gaps, _ = reference
    split = next((i for i, (a, b) in enumerate(zip(ref, answer, strict=False)) if a != b), None)
    if split is None:
        assert answer == ref, drafter
    else:
        assert gaps[split] < NEAR_TIE, (
            f"{drafter} parted from none at a clear choice (margin {gaps[split]:.2f})"
        )


def test_every_drafter_answers_the_split_target_as_none_does(split: EdgeSpec) -> None:
    drafters = [d for d in split.engine.drafters if not REGISTRY[d].needs_grammar]
    assert "model" in drafters and "ngram" in drafters
    reference = greedy(split, "none")
    assert len(reference[0]) >= 8
    accepted = {}
    for drafter in [*drafters, "auto"]:
        tokens, _, accepted[drafter] = greedy(split, drafter)
        assert_same(reference, tokens, drafter)
    # Drafts were verified over the network, not only plain steps: the edit copies its prompt.
    assert accepted["model"] > 0 and accepted["ngram"] > 0 and accepted["copy"] > 0, accepted
    constrained = [d for d in split.engine.drafters if REGISTRY[d].needs_grammar]
    if constrained:
        reference = greedy(split, "none", json_object=True)
        for drafter in constrained:
            assert_same(reference, greedy(split, drafter, json_object=True)[0], drafter)


def test_a_worker_killed_mid_answer_ends_the_answer_with_one_line(target_path: Path) -> None:
    port = free_port()
    worker = start_worker(port)
    answer = subprocess.Popen(
        [sys.executable, "-m", "edgespec", "generate", "--target", str(target_path), "--draft", "none",
         "--drafter", "none", "--rpc", f"127.0.0.1:{port}", "--threads", "1", "--ctx", "512",
         "--max-tokens", "400", "Write a long story about a cat."],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
    )  # fmt: skip
    try:
        assert answer.stdout is not None
        answer.stdout.read(16)  # it is answering
        worker.kill()
        worker.wait()
        killed = time.monotonic()
        _, stderr = answer.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        answer.kill()
        worker.kill()
    assert answer.returncode == 2, stderr
    line = one_line(stderr)
    assert line.startswith("edgespec: error: lost the connection to") and f"127.0.0.1:{port}" in line
    assert took < 30
