"""Models in the app, tried as a person would in real headless Chromium against ``app.py``
in its own process: a model picked from the list that is not on disk downloads from the
hub (the real HTTP stand-in of ``test_hub.py``, serving the real SmolLM2 GGUF), its
progress shown, then answers, and the app never restarted; and a chat store overwritten
with garbage is set aside with one line while the app starts and works."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_hub
from test_hub import Repo, blob_of_file

from edgespec.models import catalog, store
from tests.app_process import AppProcess
from tests.test_app_browser import CHROMIUM, CHROMIUM_ARGS, OUTPUT_DIR, unfold
from tests.test_app_keeps import TIMEOUT_MS, ask, open_page

pytestmark = [pytest.mark.slow, pytest.mark.needs_models]

fake_hub = test_hub.fake_hub
FILE = "smol-q4_1.gguf"
# Every text the model panel's status showed, as the page drew it.
WATCH_STATUS_JS = """() => {
    window.statusSeen = [];
    const status = document.querySelector('#model-status');
    new MutationObserver(() => window.statusSeen.push(status.innerText))
        .observe(status, {childList: true, subtree: true, characterData: true});
}"""


@pytest.fixture
def hub_model(fake_hub, smol_path: Path, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A catalog entry of the test's own, served by the stand-in hub and not on disk; the
    app's environment. The downloaded copy is removed afterwards."""
    tag = uuid.uuid4().hex[:8]  # a model no earlier run left on disk
    name, repo = f"smol-picked-{tag}", f"apptest/Smol-{tag}"
    fake_hub.repos[repo] = Repo({FILE: blob_of_file(smol_path)})
    entry = (
        f'\n[models."{name}"]\ndescription = "SmolLM2-135M from the hub"\nrole = "any"\n'
        f'tokenizer = "llama-bpe-smollm2"\nvocab = 49152\nkv_cache_mib = 90\nmemory_gib = 0.7\n\n'
        f'[models."{name}".hub]\nrepo = "{repo}"\nfile = "{FILE}"\nchecked = false\n'
    )
    catalog_file = tmp_path / "catalog.toml"
    catalog_file.write_text(catalog.catalog_path().read_text() + entry)
    env = {"HF_ENDPOINT": fake_hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "",
           "HF_HUB_OFFLINE": "", "EDGESPEC_CATALOG": str(catalog_file)}  # fmt: skip
    yield name, env
    shutil.rmtree(store.hub_download_dir(repo), ignore_errors=True)
    for left in store.models_dir().glob(f"{name}.gguf*"):
        left.unlink()


def test_a_model_picked_in_the_app_downloads_with_progress_and_answers(
    hub_model, target_path: Path, draft_path: Path, tmp_path: Path
):
    from playwright.sync_api import expect, sync_playwright

    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (make test installs it)")
    name, env = hub_model
    pair = ("--target", str(target_path), "--draft", str(draft_path))
    app = AppProcess(tmp_path / "data", tmp_path / "cache", *pair, env=env).start()
    try:
        pid = app.process.pid
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = open_page(browser, app.url)
                unfold(page, "#model-panel", "#model-picker")
                page.click("#model-picker input")
                option = page.locator(f"ul[role=listbox] li:has-text('{name}')")
                expect(option).to_contain_text("to download")
                option.click()
                page.evaluate(WATCH_STATUS_JS)
                page.click("#use-model")
                expect(page.locator("#model-status")).to_contain_text(
                    f"now answering with {name}", timeout=TIMEOUT_MS
                )
                seen = page.evaluate("window.statusSeen")
                assert any("Downloading" in text and "%" in text for text in seen), seen
                assert any("sha256 matched" in text for text in seen), seen
                expect(page.locator("#header")).to_contain_text(name)
                ask(page, "Say hello.")
                assert page.locator("#chatbot .bot-row").count() >= 1
                page.screenshot(path=str(OUTPUT_DIR / "app_model_picked.png"))
            finally:
                browser.close()
        assert app.process.pid == pid and app.process.poll() is None, "the app did not restart"
    finally:
        app.kill()


def test_a_garbage_store_is_set_aside_with_one_line_and_the_app_works(tmp_path: Path):
    from playwright.sync_api import expect, sync_playwright

    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (make test installs it)")
    data = tmp_path / "data"
    data.mkdir()
    (data / "chats.sqlite3").write_bytes(b"this is not a database" * 100)
    app = AppProcess(data, tmp_path / "cache").start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = open_page(browser, app.url)
                notice = page.locator("#store-notice")
                expect(notice).to_contain_text("set aside")
                assert len(notice.inner_text().strip().splitlines()) == 1
                ask(page, "Name one primary colour, one word.")
                expect(page.locator("#chats label")).to_have_count(1)
            finally:
                browser.close()
    finally:
        app.stop()
    aside = [p for p in data.iterdir() if "set-aside" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not a database")
    assert "set aside" in app.output() and "Traceback" not in app.output()
