"""The models already on this computer (``models/local.py``) and how the picker offers them
(``models/choices.py``, ``ui/picker.py``): LM Studio's, Ollama's, Jan's, the Hugging Face
cache's, llama.cpp's cache's and a person's own folders, built under a temporary home
around the real GGUFs by links (nothing copied), with small GGUF headers written here
for the split model, the projector and the models of another vocabulary. Header reads
only: no model is loaded, and nothing touches the network."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import struct
from pathlib import Path

import pytest

from edgespec.errors import EdgespecError
from edgespec.models import choices, recommend, speed, store
from edgespec.models.choices import ModelChoice, model_choices
from edgespec.models.local import LocalFolders, find_local_models

REPO = Path(__file__).resolve().parent.parent
BIG = recommend.Machine(24 * recommend.GIB, ("cpu",), False)
CALIBRATED = speed.probe_speed(speed.calibration().probe_bytes_per_second)
QWEN_HUB = "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"
# A small vocabulary of llama.cpp's "llama" tokenizer: nothing like Qwen's or SmolLM2's.
TOY_VOCAB = {
    "general.architecture": "llama",
    "tokenizer.ggml.model": "llama",
    "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a", "b", "c", "d", "e"],
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.ggml.add_bos_token": True,
}
PROJECTOR = {"general.architecture": "clip", "clip.has_vision_encoder": True}
MODEL_LAYER = "application/vnd.ollama.image.model"
SETTINGS = ("OLLAMA_MODELS", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "LLAMA_CACHE")


# -- small GGUF headers --------------------------------------------------------------------


def _text(value: str) -> bytes:
    raw = value.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(value: object) -> bytes:
    if isinstance(value, bool):
        return struct.pack("<I?", 7, value)
    if isinstance(value, int):
        return struct.pack("<Ii", 5, value)
    if isinstance(value, str):
        return struct.pack("<I", 8) + _text(value)
    assert isinstance(value, list)
    return struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_text(item) for item in value)


def write_gguf(path: Path, metadata: dict[str, object], pad: int = 0) -> Path:
    """A GGUF of no tensors: a header llama.cpp's reader accepts, ``pad`` bytes after it."""
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata))
    body += b"".join(_text(key) + _value(value) for key, value in metadata.items())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body + b"\0" * (-len(body) % 32 + pad))
    return path


def link(path: Path, target: Path | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


def ollama_manifest(root: Path, name: str, layers: list[tuple[str, str]]) -> Path:
    """A manifest as ``ollama pull`` writes it: (media type, digest) per layer."""
    manifest = root / "manifests" / "registry.ollama.ai" / name.replace(":", "/")
    manifest.parent.mkdir(parents=True, exist_ok=True)
    listed = [{"mediaType": kind, "digest": digest, "size": 1} for kind, digest in layers]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": listed}))
    return manifest


def ollama_blob(root: Path, digit: str, target: Path) -> tuple[str, Path]:
    digest = "sha256:" + digit * 64
    return digest, link(root / "blobs" / digest.replace(":", "-"), target)


# -- a home as those programs leave it ------------------------------------------------------


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty home and verified cache: only what a test puts there is found."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "edgespec"))
    for name in (*SETTINGS, "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_network(*_args, **_kwargs):
        raise AssertionError("finding local models must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(choices, "_probed_speed", lambda: None)
    return home


@pytest.fixture()
def shelf(home: Path, target_path: Path, draft_path: Path, smol_path: Path) -> dict[str, Path]:
    """Every program's folder stocked: the real Qwen pair and SmolLM2 by links, a copy
    reached twice, projectors, a split model, and files that cannot be used."""
    lms = home / ".lmstudio" / "models" / "Qwen" / "Qwen2.5-Coder-1.5B-Instruct-GGUF"
    old_lms = home / ".cache" / "lm-studio" / "models" / "someone" / "Vision-GGUF"
    ollama = home / ".ollama" / "models"
    smol_digest, smol_blob = ollama_blob(ollama, "1", smol_path)
    projector_digest, _ = ollama_blob(ollama, "2", write_gguf(home / "p.gguf", PROJECTOR))
    repo = home / ".cache" / "huggingface" / "hub" / f"models--{QWEN_HUB.replace('/', '--')}"
    jan_data = home / ".local" / "share" / "Jan" / "data" / "llamacpp" / "models"
    jan_mac = home / "Library" / "Application Support" / "Jan" / "data" / "llamacpp" / "models"
    llama = home / ".cache" / "llama.cpp"
    (llama / "broken.gguf").parent.mkdir(parents=True)
    (llama / "broken.gguf").write_bytes(bytes(range(256)) * 16)  # no magic: not a GGUF
    ollama_manifest(ollama, "library/notes:latest", [("application/vnd.ollama.image.license", "sha256:x")])
    ollama_manifest(ollama, "someone/custom:latest", [(MODEL_LAYER, "sha256:" + "0" * 64)])
    smol_layers = [(MODEL_LAYER, smol_digest), ("application/vnd.ollama.image.projector", projector_digest)]
    snapshot = repo / "snapshots" / "abc123"
    return {
        "target": link(lms / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", target_path),
        "mmproj": write_gguf(lms / "mmproj-Qwen2.5-Coder-1.5B-f16.gguf", PROJECTOR),
        "vision": write_gguf(old_lms / "vision-encoder-f16.gguf", PROJECTOR),  # a projector by its header
        "smol": smol_blob,
        "smol-manifest": ollama_manifest(ollama, "library/smollm2:135m", smol_layers),
        "custom-manifest": ollama / "manifests" / "registry.ollama.ai" / "someone" / "custom" / "latest",
        "draft": link(snapshot / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "../../blobs/f00d"),
        "draft-blob": link(repo / "blobs" / "f00d", draft_path),
        "copy": link(home / "jan" / "models" / "qwen-copy" / "model.gguf", target_path),
        "split": write_gguf(jan_data / "toy-split" / "toy-split-00001-of-00003.gguf", TOY_VOCAB, pad=3000),
        "split-2": write_gguf(jan_data / "toy-split" / "toy-split-00002-of-00003.gguf", {}, pad=3000),
        "split-3": write_gguf(jan_data / "toy-split" / "toy-split-00003-of-00003.gguf", {}, pad=3000),
        "handmade": write_gguf(jan_mac / "handmade" / "model.gguf", TOY_VOCAB),
        "broken": llama / "broken.gguf",
        "gone": link(llama / "gone.gguf", home / "deleted.gguf"),
        "half": write_gguf(llama / "half-00001-of-00002.gguf", TOY_VOCAB),
    }


def missing_blob(home: Path) -> str:
    return f"its weights (blob sha256:{'0' * 12}…) are missing from {home / '.ollama' / 'models' / 'blobs'}"


def gone(home: Path) -> str:
    return f"the file is gone: it links to {home / 'deleted.gguf'}, which is not there"


def listing(extra_dirs: list[Path] | None = None) -> list[tuple[str, str, str | None]]:
    return [(m.name, m.where, m.problem) for m in find_local_models(extra_dirs or [])]


def local_choices(**kwargs) -> dict[str, ModelChoice]:
    found = [c for c in model_choices(CALIBRATED, BIG, **kwargs) if c.key.startswith("file:")]
    assert len({c.key for c in found}) == len(found)
    return {c.key: c for c in found}


# -- what is found, and what is not --------------------------------------------------------


def test_every_programs_models_are_found_once_by_the_name_people_know(shelf, home):
    assert listing() == [
        ("qwen2.5-coder-1.5b-instruct-q4_k_m", "LM Studio", None),
        ("smollm2:135m", "Ollama", None),
        ("someone/custom:latest", "Ollama", missing_blob(home)),
        ("toy-split", "Jan", None),
        ("handmade", "Jan", None),
        (f"{QWEN_HUB}/qwen2.5-coder-0.5b-instruct-q4_k_m", "Hugging Face", None),
        ("broken", "llama.cpp", "not a GGUF model file (wrong magic bytes)"),
        ("gone", "llama.cpp", gone(home)),
        ("half", "llama.cpp", "part 2 of 2 is missing (half-00002-of-00002.gguf)"),
    ]
    found = {m.name: m for m in find_local_models()}
    # Used where they are: the path as found, an Ollama model's blob, a split's first part.
    assert found["qwen2.5-coder-1.5b-instruct-q4_k_m"].path == shelf["target"]
    assert found["smollm2:135m"].path == shelf["smol"]
    assert found[f"{QWEN_HUB}/qwen2.5-coder-0.5b-instruct-q4_k_m"].path == shelf["draft"]
    assert found["toy-split"].path == shelf["split"]
    parts = ("split", "split-2", "split-3")
    assert found["toy-split"].size_bytes == sum(shelf[k].stat().st_size for k in parts)
    assert found["smollm2:135m"].size_bytes == shelf["smol"].stat().st_size
    assert all(m.path.is_absolute() for m in found.values())


def test_the_settings_that_move_the_folders_are_followed(shelf, home, tmp_path, monkeypatch, draft_path):
    """OLLAMA_MODELS, HF_HUB_CACHE (else HF_HOME/hub) and LLAMA_CACHE replace the
    default folders: what stays in those is no longer looked at."""
    elsewhere = tmp_path / "elsewhere"
    digest, _ = ollama_blob(elsewhere / "ollama", "3", draft_path)
    ollama_manifest(elsewhere / "ollama", "library/qwen2.5-coder:0.5b", [(MODEL_LAYER, digest)])
    write_gguf(elsewhere / "llama" / "ggml-org_toy_toy-Q8_0.gguf", TOY_VOCAB)
    write_gguf(
        elsewhere / "hf" / "hub" / "models--a--b" / "snapshots" / "1" / "sub" / "b-F16.gguf", TOY_VOCAB
    )
    monkeypatch.setenv("OLLAMA_MODELS", str(elsewhere / "ollama"))
    monkeypatch.setenv("LLAMA_CACHE", str(elsewhere / "llama"))
    monkeypatch.setenv("HF_HOME", str(elsewhere / "hf"))
    names = [(name, where) for name, where, _ in listing()]
    assert names == [
        ("qwen2.5-coder-1.5b-instruct-q4_k_m", "LM Studio"),
        ("qwen2.5-coder:0.5b", "Ollama"),
        ("toy-split", "Jan"),
        ("handmade", "Jan"),
        ("a/b/sub/b-F16", "Hugging Face"),
        ("ggml-org_toy_toy-Q8_0", "llama.cpp"),
    ]
    write_gguf(elsewhere / "hub2" / "models--c--d" / "snapshots" / "2" / "d-Q2_K.gguf", TOY_VOCAB)
    monkeypatch.setenv("HF_HUB_CACHE", str(elsewhere / "hub2"))  # before HF_HOME
    assert [name for name, where, _ in listing() if where == "Hugging Face"] == ["c/d/d-Q2_K"]


def test_macos_folders_and_a_persons_folders(home, tmp_path):
    write_gguf(home / "Library" / "Caches" / "llama.cpp" / "mac-Q4_0.gguf", TOY_VOCAB)
    mine = write_gguf(home / "models" / "deep" / "mine-Q8_0.gguf", TOY_VOCAB)
    outside = write_gguf(tmp_path / "disk" / "far-Q8_0.gguf", TOY_VOCAB)
    folders = LocalFolders([home / "models"])
    folders.add(str(tmp_path / "disk"))
    folders.add(home / "models")  # once only
    assert folders.dirs == [home / "models", tmp_path / "disk"]
    assert listing(folders.dirs) == [
        ("mac-Q4_0", "llama.cpp", None),
        ("mine-Q8_0", "~/models", None),
        ("far-Q8_0", str(tmp_path / "disk"), None),
    ]
    assert [m.path for m in find_local_models(folders.dirs)][1:] == [mine, outside]
    for bad, why in (("", "name a folder"), (str(mine), "not a folder"), (str(home / "no"), "not a folder")):
        with pytest.raises(EdgespecError, match=why):
            folders.add(bad)
    assert folders.dirs == [home / "models", tmp_path / "disk"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_an_unreadable_file_says_so(home):
    locked = write_gguf(home / "models" / "locked.gguf", TOY_VOCAB)
    locked.chmod(0)
    assert listing([home / "models"]) == [
        ("locked", "~/models", "model file is not readable (permission denied)")
    ]


# -- as the picker offers them -------------------------------------------------------------


def test_models_of_one_vocabulary_are_offered_as_pairs(shelf, target_path, draft_path, smol_path):
    found = local_choices()
    target = found[f"file:{shelf['target']}"]
    # SmolLM2 is smaller still, but of another vocabulary: the 0.5B drafts.
    assert (target.target, target.draft) == (str(shelf["target"]), str(shelf["draft"]))
    assert target.size_bytes == target_path.stat().st_size + draft_path.stat().st_size
    assert target.label.startswith(
        "qwen2.5-coder-1.5b-instruct-q4_k_m (LM Studio) + 0.5b-instruct-q4_k_m draft · 1.6 GB · on disk · ~"
    )
    assert target.fits and target.on_disk and target.download_bytes == 0 and target.problem is None
    assert not target.rate_measured and target.rate and "tok/s (estimated)" in target.label
    assert target.memory_bytes > target.size_bytes
    smol = found[f"file:{shelf['smol']}"]
    assert smol.draft is None and smol.label.startswith("smollm2:135m (Ollama) alone · ")
    assert smol.size_bytes == smol_path.stat().st_size
    draft = found[f"file:{shelf['draft']}"]
    assert draft.draft is None
    assert draft.label.startswith(f"{QWEN_HUB}/qwen2.5-coder-0.5b-instruct-q4_k_m (Hugging Face) alone")
    split = found[f"file:{shelf['split']}"]  # the toy models share their vocabulary
    assert split.draft == str(shelf["handmade"])
    assert split.label.startswith("toy-split (Jan) + handmade draft")
    assert found[f"file:{shelf['handmade']}"].draft is None


def test_what_cannot_be_used_is_listed_last_with_its_reason(shelf, home):
    listed = model_choices(CALIBRATED, BIG)
    unusable = [c for c in listed if c.problem is not None]
    assert listed[-len(unusable) :] == unusable
    labels = {c.target: c.label for c in unusable}
    assert labels == {
        str(
            shelf["custom-manifest"]
        ): f"someone/custom:latest (Ollama) · cannot be used: {missing_blob(home)}",
        str(shelf["broken"]): "broken (llama.cpp) · 1 MB · cannot be used: "
        + "not a GGUF model file (wrong magic bytes)",
        str(shelf["gone"]): f"gone (llama.cpp) · cannot be used: {gone(home)}",
        str(shelf["half"]): "half (llama.cpp) · 1 MB · cannot be used: "
        + "part 2 of 2 is missing (half-00002-of-00002.gguf)",
    }
    assert not any(c.fits or c.draft or c.rate for c in unusable)
    targets = {c.target for c in listed}
    for left_out in ("mmproj", "vision", "copy", "split-2", "split-3", "smol-manifest"):
        assert str(shelf[left_out]) not in targets, left_out


def test_a_file_the_verified_cache_lists_is_not_listed_again(home):
    kept = write_gguf(store.hub_file("someone/Toy-GGUF", "toy-Q4_K_M.gguf"), TOY_VOCAB)
    store.write_stamp(kept, "ab" * 32, "hub")
    link(home / ".cache" / "llama.cpp" / "someone_Toy-GGUF_toy-Q4_K_M.gguf", kept)
    assert [c.key for c in local_choices().values()] == [f"file:{kept}"]
    assert listing() == [("someone_Toy-GGUF_toy-Q4_K_M", "llama.cpp", None)]  # found, but listed once


def test_the_picker_lists_a_persons_folders_and_refuses_what_cannot_be_used(shelf, home, monkeypatch):
    from edgespec.decoding import costs
    from edgespec.ui.pair import PairHolder
    from edgespec.ui.picker import Picker

    monkeypatch.setattr(costs, "measured_speed", lambda: None)
    mine = write_gguf(home / "models" / "mine-Q8_0.gguf", TOY_VOCAB)
    picker = Picker(PairHolder(None, "not loaded", loader=lambda choice: None), models_dirs=[home / "models"])
    keys = [key for _, key in picker.choices()]
    assert f"file:{mine}" in keys and f"file:{shelf['target']}" in keys
    said = list(picker.use(f"file:{shelf['broken']}"))
    assert [line for line, *_ in said] == [
        f"**Cannot use {shelf['broken']}:** not a GGUF model file (wrong magic bytes)"
    ]
    status, _ = picker.add_models_dir(str(home / "nowhere"))
    assert status == f"**Not added:** not a folder: {home / 'nowhere'}"
    later = write_gguf(home / "later" / "later-Q4_0.gguf", TOY_VOCAB)
    status, update = picker.add_models_dir(f" {home / 'later'} ")
    assert status == f"Looking in {home / 'later'} too."
    assert any(label.startswith("later-Q4_0 (~/later) alone · ") for label, _ in update["choices"])
    assert f"file:{later}" in [key for _, key in update["choices"]]


def test_the_app_takes_models_dirs(tmp_path):
    spec = importlib.util.spec_from_file_location("edgespec_app_script", REPO / "app.py")
    assert spec is not None and spec.loader is not None
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    args = app.parse_args(["--models-dir", str(tmp_path / "a"), "--models-dir", str(tmp_path / "b")])
    assert args.models_dir == [tmp_path / "a", tmp_path / "b"]
    assert app.parse_args([]).models_dir is None
    with pytest.raises(SystemExit):
        app.parse_args(["--models-dir", str(tmp_path / "missing")])
