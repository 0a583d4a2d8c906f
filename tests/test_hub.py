"""Hugging Face hub references, end to end through the real `edgespec` command against a
real HTTP server on 127.0.0.1 that speaks the hub's protocol as ``huggingface_hub`` uses
it: the ``/api/models/{repo}/revision/{rev}`` listing with LFS sha256 and sizes, and the
``resolve`` endpoint (HEAD and GET) with ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag``,
``X-Linked-Size``, HTTP ranges, and the hub's error headers (``X-Error-Code``).

The server serves the real SmolLM2 GGUF, and a real two-part split of it written here in
llama.cpp's split layout (what gguf-split writes: the first part keeps every key and adds
``split.no``, ``split.count``, ``split.tensors.count``; the others carry only those), so
the split test loads the parts in llama.cpp. Each test has its own EDGESPEC_HOME and
HF_HOME: the real cache is never touched."""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from conftest import run_cli
from test_models_cli import one_error_line

from edgespec.models import hubref

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKEN = "hf_test_token"


@dataclass
class Blob:
    path: Path | None = None  # a file on disk, served in chunks
    data: bytes = b""  # or bytes (listed files that are never downloaded)
    sha256: str = ""  # what the hub says; a lie for the checksum test
    size: int = 0


@dataclass
class Repo:
    files: dict[str, Blob]
    gated: bool = False


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    cut_first_get_after: dict[str, int] = field(default_factory=dict)  # file path -> bytes
    log: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, Range
    url: str = ""


def blob_of_file(path: Path, lie: str = "") -> Blob:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return Blob(path=path, sha256=lie or digest, size=path.stat().st_size)


def blob_of_bytes(data: bytes) -> Blob:
    return Blob(data=data, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def make_handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args) -> None:
            pass

        def error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def repo_for(self, name: str) -> Repo | None:
            repo = hub.repos.get(name)
            if repo is None:
                # The hub answers 401 for a repository it does not show to this caller.
                self.error(401, "RepoNotFound", "Repository not found")
                return None
            if repo.gated and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.error(401, "GatedRepo", f"Access to model {name} is restricted")
                return None
            return repo

        def do_HEAD(self) -> None:
            self.route()

        def do_GET(self) -> None:
            self.route()

        def route(self) -> None:
            path = unquote(urlparse(self.path).path)
            hub.log.append((self.command, path, self.headers.get("Range", "")))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
                return self.listing("/".join(parts[2:4]))
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve_file("/".join(parts[:2]), "/".join(parts[4:]))
            self.error(404, "NotFound", "no such endpoint")

        def listing(self, name: str) -> None:
            repo = self.repo_for(name)
            if repo is None:
                return
            siblings = [
                {
                    "rfilename": p,
                    "size": b.size,
                    "blobId": hashlib.sha1(p.encode()).hexdigest(),
                    "lfs": {"sha256": b.sha256, "size": b.size, "pointerSize": 134},
                }
                for p, b in repo.files.items()
            ]
            body = json.dumps({"id": name, "sha": COMMIT, "siblings": siblings}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def resolve_file(self, name: str, file: str) -> None:
            repo = self.repo_for(name)
            if repo is None:
                return
            blob = repo.files.get(file)
            if blob is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes="):
                start = int(ranged[6:].split("-")[0])
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{blob.sha256}"')
            self.send_header("X-Linked-Etag", f'"{blob.sha256}"')
            self.send_header("X-Linked-Size", str(blob.size))
            self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header("Content-Range", f"bytes {start}-{blob.size - 1}/{blob.size}")
            self.send_header("Content-Length", str(blob.size - start))
            self.end_headers()
            if self.command == "HEAD":
                return
            cut = hub.cut_first_get_after.pop(file, None)
            self.send_bytes(blob, start, cut)

        def send_bytes(self, blob: Blob, start: int, cut: int | None) -> None:
            sent = 0
            if blob.path is None:
                chunks = iter([blob.data[start:]])
            else:
                fh = blob.path.open("rb")
                fh.seek(start)
                chunks = iter(lambda: fh.read(1 << 20), b"")
            for chunk in chunks:
                if cut is not None and sent + len(chunk) >= cut:
                    self.wfile.write(chunk[: cut - sent])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)  # the connection drops mid-file
                    return
                self.wfile.write(chunk)
                sent += len(chunk)

    return Handler


@pytest.fixture()
def fake_hub():
    hub = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(hub))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield hub
    server.shutdown()
    server.server_close()


@pytest.fixture()
def hub_env(tmp_path, fake_hub) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    return {
        "HF_ENDPOINT": fake_hub.url,
        "EDGESPEC_HOME": str(tmp_path / "home"),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_TOKEN": "",
        "HF_HUB_OFFLINE": "",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_ETAG_TIMEOUT": "5",
    }


def gguf_files(home: Path) -> list[Path]:
    return sorted(
        p for p in home.rglob("*") if p.is_file() and ".gguf" in p.name and not p.name.endswith(".json")
    )


def ok(result) -> None:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)


# --- references and file names (no network, no models) ---------------------------------


def test_reference_forms():
    assert hubref.parse("Qwen/Qwen3-8B-GGUF:Q4_K_M") == hubref.HubRef(
        "Qwen/Qwen3-8B-GGUF", quant="Q4_K_M", text="Qwen/Qwen3-8B-GGUF:Q4_K_M"
    )
    ref = hubref.parse("hf://ggml-org/gemma-3-1b-it-GGUF/gemma-3-1b-it-Q4_K_M.gguf")
    assert (ref.repo, ref.file) == ("ggml-org/gemma-3-1b-it-GGUF", "gemma-3-1b-it-Q4_K_M.gguf")
    ref = hubref.parse("owner/repo/sub/dir/model-Q8_0.gguf")
    assert (ref.repo, ref.file) == ("owner/repo", "sub/dir/model-Q8_0.gguf")
    assert hubref.parse("hf://owner/repo") == hubref.HubRef("owner/repo", text="hf://owner/repo")
    for not_hub in [
        "qwen2.5-coder-1.5b",
        "./a/b/c.gguf",
        "/abs/a/b.gguf",
        "a/b.gguf",
        "owner/repo",
        "~/m/x/y.gguf",
    ]:
        assert hubref.parse(not_hub) is None, not_hub


def test_quantization_names_and_split_parts():
    assert hubref.quant_of("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert hubref.quant_of("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf") == "Q4_K_M"
    assert hubref.quant_of(SMOL_FILE) == "Q4_1"
    assert hubref.quant_of("gemma-3-12b-it-qat-q4_0.gguf") == "Q4_0"
    assert hubref.quant_of("model-UD-Q4_K_XL.gguf") == "UD-Q4_K_XL"
    assert not hubref.matches_quant("model-Q4_K_M.gguf", "Q4_K")
    assert hubref.split_parts("d/x-q8_0-00001-of-00003.gguf") == [
        "d/x-q8_0-00001-of-00003.gguf",
        "d/x-q8_0-00002-of-00003.gguf",
        "d/x-q8_0-00003-of-00003.gguf",
    ]
    files = [
        "README.md",
        "m-Q4_K_M.gguf",
        "m-q8_0-00001-of-00002.gguf",
        "m-q8_0-00002-of-00002.gguf",
        "mmproj-m-f16.gguf",
    ]
    pick, _ = hubref.select(hubref.HubRef("o/r", quant="Q8_0"), files)
    assert pick.files == ("m-q8_0-00001-of-00002.gguf", "m-q8_0-00002-of-00002.gguf")
    none, why = hubref.select(hubref.HubRef("o/r", quant="Q5_K_M"), files)
    assert none is None and why == "o/r has no Q5_K_M GGUF; its quantizations: Q4_K_M, Q8_0"
    _, why = hubref.select(hubref.HubRef("o/r", quant="Q4_K_M"), [*files, "m-v2-Q4_K_M.gguf"])
    assert "ambiguous (m-Q4_K_M.gguf, m-v2-Q4_K_M.gguf)" in why
    _, why = hubref.select(hubref.HubRef("o/r", file="m-q8_0-00002-of-00002.gguf"), files)
    assert "not the first part" in why


# --- a real split GGUF --------------------------------------------------------------------


def _string(buf: bytes, pos: int) -> tuple[bytes, int]:
    n = struct.unpack_from("<Q", buf, pos)[0]
    return buf[pos + 8 : pos + 8 + n], pos + 8 + n


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if vtype in sizes:
        return pos + sizes[vtype]
    if vtype == 8:
        return _string(buf, pos)[1]
    item, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    for _ in range(count):
        pos = _skip_value(buf, pos, item)
    return pos


def _kv(key: str, vtype: int, fmt: str, value) -> bytes:
    name = key.encode()
    return struct.pack("<Q", len(name)) + name + struct.pack("<I", vtype) + struct.pack("<" + fmt, value)


def split_gguf(src: Path, out: Path, stem: str) -> list[Path]:
    """Write ``src`` as two GGUFs in gguf-split's layout (tensors halved by count)."""
    buf = src.read_bytes()
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos = 24
    for _ in range(n_kv):
        _, pos = _string(buf, pos)
        pos = _skip_value(buf, pos + 4, struct.unpack_from("<I", buf, pos)[0])
    kv_raw = buf[24:pos]
    tensors = []
    for _ in range(n_tensors):
        name, pos = _string(buf, pos)
        n_dims = struct.unpack_from("<I", buf, pos)[0]
        dims = buf[pos + 4 : pos + 4 + 8 * n_dims]
        ggml_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        tensors.append((name, n_dims, dims, ggml_type, offset))
        pos += 4 + 8 * n_dims + 12
    align = 32
    data_start = -(-pos // align) * align
    ends = [*sorted(t[4] for t in tensors)[1:], len(buf) - data_start]
    span = dict(zip(sorted(t[4] for t in tensors), ends, strict=True))
    halves = [tensors[: n_tensors // 2], tensors[n_tensors // 2 :]]
    paths = []
    for number, half in enumerate(halves):
        split_keys = (
            _kv("split.no", 2, "H", number)
            + _kv("split.count", 2, "H", 2)
            + _kv("split.tensors.count", 5, "i", n_tensors)
        )
        keys = (kv_raw if number == 0 else b"") + split_keys
        infos, data, offset = b"", b"", 0
        for name, n_dims, dims, ggml_type, old in half:
            infos += struct.pack("<Q", len(name)) + name + struct.pack("<I", n_dims) + dims
            infos += struct.pack("<IQ", ggml_type, offset)
            chunk = buf[data_start + old : data_start + span[old]]
            data += chunk
            offset += len(chunk)
        head = (
            b"GGUF" + struct.pack("<IQQ", version, len(half), n_kv + 3 if number == 0 else 3) + keys + infos
        )
        head += b"\0" * (-len(head) % align)
        path = out / hubref.part_name(stem, number + 1, 2)
        path.write_bytes(head + data)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def smol_split(tmp_path_factory, smol_path) -> list[Path]:
    return split_gguf(smol_path, tmp_path_factory.mktemp("split"), "smol-q4_1")


# --- pulls --------------------------------------------------------------------------------


@pytest.mark.needs_models
def test_pull_by_quantization_then_offline(fake_hub, hub_env, smol_path):
    real = blob_of_file(smol_path)
    fake_hub.repos["hubtest/SmolLM2-GGUF"] = Repo(
        {
            SMOL_FILE: real,
            "SmolLM2-135M-Instruct.Q8_0.gguf": blob_of_bytes(b"never fetched"),
            "README.md": blob_of_bytes(b"hi"),
        }
    )
    result = run_cli("models", "pull", "hubtest/SmolLM2-GGUF:q4_1", env=hub_env)
    ok(result)
    home = Path(hub_env["EDGESPEC_HOME"])
    cached = home / "hub" / "hubtest" / "SmolLM2-GGUF" / SMOL_FILE
    assert gguf_files(home) == [cached]
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == real.sha256
    assert json.loads(cached.with_name(SMOL_FILE + ".json").read_text())["sha256"] == real.sha256
    assert [m for m, p, _ in fake_hub.log if p.endswith(SMOL_FILE) and m == "GET"] == ["GET"]

    # Cached: resolved without the hub, by the quantization or by the file.
    offline = {**hub_env, "HF_HUB_OFFLINE": "1"}
    for ref in ("hubtest/SmolLM2-GGUF:Q4_1", f"hf://hubtest/SmolLM2-GGUF/{SMOL_FILE}"):
        result = run_cli("models", "path", ref, env=offline)
        ok(result)
        assert result.stdout.strip() == str(cached)
    ok(run_cli("models", "verify", "hubtest/SmolLM2-GGUF:Q4_1", env=offline))

    line = one_error_line(run_cli("models", "pull", "hubtest/SmolLM2-GGUF:Q5_K_M", env=hub_env))
    assert line.endswith("hubtest/SmolLM2-GGUF has no Q5_K_M GGUF; its quantizations: Q4_1, Q8_0")
    one_error_line(
        run_cli("models", "pull", "hubtest/SmolLM2-GGUF/missing.gguf", env=hub_env),
        "has no file missing.gguf",
    )
    one_error_line(
        run_cli("models", "pull", "hubtest/Nothing-GGUF:Q4_1", env=hub_env),
        "no Hugging Face repository hubtest/Nothing-GGUF",
    )


@pytest.mark.needs_models
def test_split_model_pulled_whole_and_loaded_from_its_first_part(fake_hub, hub_env, smol_split, smol_path):
    fake_hub.repos["hubtest/Split-GGUF"] = Repo({p.name: blob_of_file(p) for p in smol_split})
    result = run_cli("models", "pull", "hubtest/Split-GGUF:Q4_1", env=hub_env)
    ok(result)
    home = Path(hub_env["EDGESPEC_HOME"])
    base = home / "hub" / "hubtest" / "Split-GGUF"
    assert gguf_files(home) == [base / p.name for p in smol_split]
    assert str(base / smol_split[0].name) in result.stdout
    # llama.cpp loads the parts from the first one: the same greedy text as the whole file.
    # Target alone, no drafting: nothing measured, only the load and six greedy tokens.
    args = ("generate", "--drafter", "none", "--gamma", "0", "--prompt", "The capital of France is")
    args += ("--max-tokens", "6", "--json")
    split_run = run_cli(*args, "--target", "hubtest/Split-GGUF:Q4_1", env={**hub_env, "HF_HUB_OFFLINE": "1"})
    whole_run = run_cli(*args, "--target", str(smol_path), env=hub_env)
    ok(split_run)
    ok(whole_run)
    split_text = json.loads(split_run.stdout.strip().splitlines()[-1])["text"]
    assert split_text and split_text == json.loads(whole_run.stdout.strip().splitlines()[-1])["text"]


@pytest.mark.needs_models
def test_catalog_split_hub_source(fake_hub, hub_env, smol_split, tmp_path):
    """A catalog model whose hub file is split: every part cached under the catalog's
    name in llama.cpp's part naming, verified against the hub's LFS sha256 of each."""
    fake_hub.repos["hubtest/Split-GGUF"] = Repo({p.name: blob_of_file(p) for p in smol_split})
    cat = tmp_path / "catalog.toml"
    cat.write_text(
        '[models."smol-split"]\ndescription = "SmolLM2 in two parts"\nrole = "any"\n'
        'tokenizer = "llama-bpe-smollm2"\nvocab = 49152\n\n[models."smol-split".hub]\n'
        f'repo = "hubtest/Split-GGUF"\nfile = "{smol_split[0].name}"\nchecked = false\n'
    )
    env = {**hub_env, "EDGESPEC_CATALOG": str(cat)}
    ok(run_cli("models", "pull", "smol-split", env=env))
    models = Path(hub_env["EDGESPEC_HOME"]) / "models"
    parts = [models / "smol-split-00001-of-00002.gguf", models / "smol-split-00002-of-00002.gguf"]
    assert gguf_files(models) == parts
    assert run_cli("models", "path", "smol-split", env=env).stdout.strip() == str(parts[0])
    ok(run_cli("models", "verify", "smol-split", env=env))
    with parts[1].open("r+b") as fh:
        fh.seek(1000)
        fh.write(b"\xff" * 64)
    one_error_line(run_cli("models", "verify", "smol-split", env=env), "failed verification")
    ok(run_cli("models", "pull", "smol-split", env=env))  # the bad part is fetched again
    ok(run_cli("models", "verify", "smol-split", env=env))


@pytest.mark.needs_models
def test_resume_after_the_connection_is_cut(fake_hub, hub_env, smol_path):
    real = blob_of_file(smol_path)
    fake_hub.repos["hubtest/SmolLM2-GGUF"] = Repo({SMOL_FILE: real})
    # The client keeps what it wrote in whole 10 MiB chunks: a cut at 30 MB leaves 20 MiB.
    fake_hub.cut_first_get_after[SMOL_FILE] = 30_000_000
    ok(run_cli("models", "pull", "hubtest/SmolLM2-GGUF:Q4_1", env=hub_env))
    gets = [rng for m, p, rng in fake_hub.log if m == "GET" and p.endswith(SMOL_FILE)]
    assert len(gets) == 2 and gets[0] == ""
    assert gets[1].startswith("bytes=") and 0 < int(gets[1][6:].split("-")[0]) <= 30_000_000
    cached = Path(hub_env["EDGESPEC_HOME"]) / "hub" / "hubtest" / "SmolLM2-GGUF" / SMOL_FILE
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == real.sha256


@pytest.mark.needs_models
def test_checksum_mismatch_leaves_nothing(fake_hub, hub_env, smol_path):
    fake_hub.repos["hubtest/SmolLM2-GGUF"] = Repo({SMOL_FILE: blob_of_file(smol_path, lie="ab" * 32)})
    line = one_error_line(
        run_cli("models", "pull", "hubtest/SmolLM2-GGUF:Q4_1", env=hub_env), "checksum mismatch"
    )
    assert "abababababab" in line and "nothing was installed" in line
    assert gguf_files(Path(hub_env["EDGESPEC_HOME"])) == []
    assert [m for m, p, _ in fake_hub.log if m == "GET" and p.endswith(SMOL_FILE)] == ["GET"]


def test_gated_repo_needs_a_token(fake_hub, hub_env):
    data = b"GGUF" + b"\0" * 60
    fake_hub.repos["hubtest/Gated-GGUF"] = Repo({"tiny-Q8_0.gguf": blob_of_bytes(data)}, gated=True)
    line = one_error_line(
        run_cli("models", "pull", "hubtest/Gated-GGUF:Q8_0", env=hub_env), "hubtest/Gated-GGUF is gated"
    )
    assert "set HF_TOKEN" in line
    # With the token the listing and the download go through (the tiny file is then
    # refused as a model, which shows it arrived: it passed its checksum first).
    result = run_cli("models", "pull", "hubtest/Gated-GGUF:Q8_0", env={**hub_env, "HF_TOKEN": TOKEN})
    one_error_line(result, "tiny-Q8_0.gguf")
    assert (Path(hub_env["EDGESPEC_HOME"]) / "hub" / "hubtest" / "Gated-GGUF" / "tiny-Q8_0.gguf").exists()


def test_no_network_names_the_hub_and_the_reference(hub_env):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening
        env = {**hub_env, "HF_ENDPOINT": closed}
        for args in (("models", "pull"), ("generate", "--prompt", "hi", "--target")):
            ref = "Qwen/Qwen3-8B-GGUF:Q4_K_M"
            line = one_error_line(run_cli(*args, ref, env=env))
            assert f"cannot reach the Hugging Face hub ({closed}) for {ref}:" in line
            assert "unknown model" not in line
    line = one_error_line(
        run_cli("models", "pull", "owner/repo/x.gguf", env={**hub_env, "HF_HUB_OFFLINE": "1"})
    )
    assert "for owner/repo/x.gguf: HF_HUB_OFFLINE is set" in line
    assert gguf_files(Path(hub_env["EDGESPEC_HOME"])) == []
