"""``edgespec serve --ui``: the chat app at "/" and the API beside it, one engine."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.server_fixtures import Server, serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serve("--ui") as running:
        yield running


def test_chat_app_and_api_share_the_port(server: Server) -> None:
    page = httpx.get(f"{server.url}/", timeout=60)
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    answer = server.client().chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
    )
    assert answer.choices[0].message.content


def test_unknown_api_path_is_an_openai_404_not_the_apps(server: Server) -> None:
    response = httpx.get(f"{server.base_url}/nothing")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
