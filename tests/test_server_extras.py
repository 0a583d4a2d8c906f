"""The extra routes against a real ``edgespec serve``: llama-server's ``/tokenize``,
``/detokenize``, ``/props`` and ``/metrics``, and OpenAI's ``/v1/embeddings`` through the
``openai`` client and by hand."""

from __future__ import annotations

import base64
import threading

import httpx
import numpy as np
import pytest
from conftest import SERVER_KEY

from tests.server_fixtures import Server, ask, sse_events
from tests.test_server_metrics import Family, parse_exposition

pytestmark = [pytest.mark.slow, pytest.mark.needs_models]  # every test here has the served pair

KEY = SERVER_KEY
TEXT = "Hello, world! Ünïcödé text, a 🙂, and\ttabs\nand new lines."


@pytest.fixture(scope="module")
def server(keyed_server: Server) -> Server:
    return keyed_server


def post(server: Server, path: str, body: object) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=server.headers(), timeout=300)


def get(server: Server, path: str) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", headers=server.headers(), timeout=60)


def assert_error(response: httpx.Response, status: int, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param


def vectors(server: Server, inputs: object, **fields: object) -> list[np.ndarray]:
    response = post(server, "/v1/embeddings", {"model": "any-name", "input": inputs, **fields})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    assert [item["index"] for item in body["data"]] == list(range(len(body["data"])))
    if fields.get("encoding_format") == "base64":
        return [np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in body["data"]]
    return [np.asarray(item["embedding"], dtype=np.float64) for item in body["data"]]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


# -- tokenize / detokenize ----------------------------------------------------------------------


def test_tokenize_detokenize_round_trip(server: Server) -> None:
    tokens = post(server, "/tokenize", {"content": TEXT}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert post(server, "/detokenize", {"tokens": tokens}).json() == {"content": TEXT}


def test_tokenize_add_special(server: Server) -> None:
    plain = post(server, "/tokenize", {"content": TEXT}).json()["tokens"]
    special = post(server, "/tokenize", {"content": TEXT, "add_special": True}).json()["tokens"]
    # The model's start marker, where its vocabulary adds one, comes first; the text follows.
    assert special[len(special) - len(plain) :] == plain


def test_tokenize_with_pieces(server: Server) -> None:
    found = post(server, "/tokenize", {"content": TEXT, "with_pieces": True}).json()["tokens"]
    assert all(set(item) == {"id", "piece"} for item in found)
    whole = b"".join(
        item["piece"].encode() if isinstance(item["piece"], str) else bytes(item["piece"]) for item in found
    )
    assert whole.decode() == TEXT
    ids = post(server, "/tokenize", {"content": TEXT}).json()["tokens"]
    assert [item["id"] for item in found] == ids


def test_tokenize_and_detokenize_refusals(server: Server) -> None:
    n_vocab = get(server, "/props").json()["edgespec"]["target"]["n_vocab"]
    assert_error(post(server, "/tokenize", {"content": 5}), 400, "content")
    assert_error(post(server, "/tokenize", {"content": "a", "add_special": "yes"}), 400, "add_special")
    assert_error(post(server, "/detokenize", {"tokens": [0, n_vocab]}), 400, "tokens")
    assert_error(post(server, "/detokenize", {"tokens": [-1]}), 400, "tokens")
    assert_error(post(server, "/detokenize", {"tokens": "1 2"}), 400, "tokens")
    broken = httpx.post(
        f"{server.url}/tokenize",
        content=b'{"content": ',
        headers={**server.headers(), "Content-Type": "application/json"},
    )
    assert_error(broken, 400, None)


def test_extras_need_the_key(server: Server) -> None:
    for path in ("/props", "/metrics"):
        assert httpx.get(f"{server.url}{path}").status_code == 401
    assert httpx.post(f"{server.url}/tokenize", json={"content": "a"}).status_code == 401
    assert httpx.post(f"{server.url}/v1/embeddings", json={"input": "a"}).status_code == 401


# -- /props -------------------------------------------------------------------------------------


def test_props(server: Server) -> None:
    props = get(server, "/props").json()
    models = server.client().models.list().data
    target = props["edgespec"]["target"]
    assert props["model_alias"] == target["name"] == models[0].id
    assert props["model_path"] == target["path"] and target["path"].endswith(".gguf")
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == target["n_ctx"] == 2048  # the fixture's --ctx
    assert settings["params"]["temperature"] == 0 and settings["params"]["top_p"] == 1
    assert props["total_slots"] == props["edgespec"]["parallel"] >= 1
    assert isinstance(props["chat_template"], str) and props["chat_template"]
    assert props["build_info"].startswith("llama-cpp-python ")
    assert props["modalities"] == {"vision": False}
    assert target["n_vocab"] > 1000 and target["n_ctx_train"] >= target["n_ctx"]
    draft = props["edgespec"]["draft"]
    assert draft is None or draft["n_vocab"] > 1000
    drafters = props["edgespec"]["drafters"]
    assert "ngram" in drafters and ("model" in drafters) == (draft is not None)
    cache = props["edgespec"]["prompt_cache"]
    assert cache is None or {"ram_gib", "states"} <= set(cache)


# -- /metrics -----------------------------------------------------------------------------------


def _count(families: dict[str, Family], name: str, **labels: str) -> float:
    """One sample's value; a histogram's ``_count`` and ``_sum`` live in its family."""
    family = families.get(name) or families[name.removesuffix("_count").removesuffix("_sum")]
    found = [v for sample, got, v in family.samples if sample == name and got == labels]
    return found[0] if found else 0.0


def test_metrics_count_a_chat(server: Server) -> None:
    endpoint = {"endpoint": "/v1/chat/completions", "status": "200"}
    before = parse_exposition(get(server, "/metrics").text)
    assert ask(server, "Name a colour.", max_tokens=8)
    response = get(server, "/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    after = parse_exposition(response.text)
    assert (
        _count(after, "edgespec_requests_total", **endpoint)
        == _count(before, "edgespec_requests_total", **endpoint) + 1
    )
    for name in ("edgespec_generated_tokens_total", "llamacpp:tokens_predicted_total"):
        assert _count(after, name) > _count(before, name)
    ttft = "edgespec_time_to_first_token_seconds"
    assert _count(after, ttft + "_count") == _count(before, ttft + "_count") + 1
    assert (
        _count(after, "edgespec_prompt_tokens_total") + _count(after, "edgespec_prompt_tokens_cached_total")
        > 0
    )
    assert _count(after, "edgespec_slots_capacity") == get(server, "/props").json()["total_slots"]


# -- /v1/embeddings -----------------------------------------------------------------------------


def test_embeddings_through_the_openai_client(server: Server) -> None:
    client = server.client()
    one = client.embeddings.create(model="text-embedding-3-small", input="The cat sat on the mat.")
    assert len(one.data) == 1 and one.usage.prompt_tokens > 0
    assert one.usage.total_tokens == one.usage.prompt_tokens
    size = len(one.data[0].embedding)
    assert size > 0
    texts = ["First sentence.", "A second, longer sentence than the first.", "Third."]
    many = client.embeddings.create(model="anything", input=texts)
    assert [item.index for item in many.data] == [0, 1, 2]
    assert all(len(item.embedding) == size for item in many.data)
    assert get(server, "/props").json()["edgespec"]["embeddings"]["n_embd"] == size


def test_embeddings_are_unit_length_and_deterministic(server: Server) -> None:
    first, second = vectors(server, ["A quiet morning by the lake.", "Quarterly tax filing rules."])
    for vector in (first, second):
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)
    again = vectors(server, "A quiet morning by the lake.")[0]
    np.testing.assert_allclose(again, first, atol=1e-6)  # alone or in a list: the same


def test_paraphrases_are_closer_than_unrelated_sentences(server: Server) -> None:
    cat, kitten, tax = vectors(
        server,
        [
            "The cat is sleeping on the warm windowsill.",
            "A kitten naps on the sunny window ledge.",
            "The central bank raised interest rates by half a percent.",
        ],
    )
    assert cosine(cat, kitten) > cosine(cat, tax)
    assert cosine(cat, kitten) > cosine(kitten, tax)


def test_base64_decodes_to_the_same_floats(server: Server) -> None:
    text = "Speculative decoding drafts tokens and verifies them."
    floats = vectors(server, text)[0]
    packed = vectors(server, text, encoding_format="base64")[0]
    assert packed.dtype == np.dtype("<f4") and packed.shape == floats.shape
    np.testing.assert_array_equal(packed.astype(np.float64), floats)


def test_token_ids_embed_as_their_text(server: Server) -> None:
    text = "Tokens in, vectors out."
    ids = post(server, "/tokenize", {"content": text, "add_special": True, "parse_special": False}).json()
    from_ids, from_lists = vectors(server, ids["tokens"])[0], vectors(server, [ids["tokens"]])[0]
    np.testing.assert_allclose(from_ids, vectors(server, text)[0], atol=1e-6)
    np.testing.assert_allclose(from_lists, from_ids, atol=1e-6)


def test_embedding_refusals(server: Server) -> None:
    def refused(body: dict, param: str) -> None:
        assert_error(post(server, "/v1/embeddings", {"model": "m", **body}), 400, param)

    refused({"input": ""}, "input")
    refused({"input": []}, "input")
    refused({"input": ["ok", ""]}, "input")
    refused({"input": [[]]}, "input")
    refused({"input": {"text": "a"}}, "input")
    refused({"input": [10**9]}, "input")  # not a token id of this vocabulary
    refused({"input": "word " * 5000}, "input")  # longer than the embedding context
    refused({"input": "a", "encoding_format": "hex"}, "encoding_format")
    size = len(vectors(server, "a")[0])
    refused({"input": "a", "dimensions": size + 1}, "dimensions")
    assert len(vectors(server, "a", dimensions=size)[0]) == size


def test_embeddings_do_not_disturb_answers(server: Server) -> None:
    """An embedding computed while an answer streams equals one computed alone, and the
    answers before and after are the same: the two contexts never mix."""
    alone = vectors(server, "Lighthouses guide ships at night.")[0]
    reference = ask(server, "Count from one to five.", max_tokens=16)
    streamed: list[object] = []

    def stream() -> None:
        body = {
            "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 96,
            "stream": True,
        }
        with httpx.stream(
            "POST", f"{server.base_url}/chat/completions", json=body, headers=server.headers(), timeout=300
        ) as response:
            streamed.extend(sse_events(response))

    worker = threading.Thread(target=stream)
    worker.start()
    during = vectors(server, "Lighthouses guide ships at night.")[0]
    worker.join()
    assert streamed[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in streamed)
    np.testing.assert_allclose(during, alone, atol=1e-6)
    assert ask(server, "Count from one to five.", max_tokens=16) == reference


def test_an_embedding_model_of_its_own(smol_path) -> None:
    """``serve --embedding-model REF``: the embeddings come from that GGUF (SmolLM2 here,
    576 dimensions), which the embedder loads and owns."""
    from edgespec.runtime.embedding import Embedder

    embedder = Embedder.load(smol_path, n_ctx=256)
    try:
        cat, kitten, tax = (
            np.asarray(v)
            for v in embedder.embed(
                [
                    "The cat sleeps on the sofa.",
                    "A kitten is asleep on the couch.",
                    "Quarterly tax filing rules.",
                ]
            )
        )
    finally:
        embedder.close()
    assert cat.shape == (576,) and np.linalg.norm(cat) == pytest.approx(1.0, abs=1e-5)
    assert cosine(cat, kitten) > cosine(cat, tax)
