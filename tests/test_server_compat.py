"""`encoderlab serve` speaks OpenAI's embeddings API, TEI's routes and Prometheus' /metrics: tested with the real
clients (openai, langchain-openai, prometheus_client's parser) against a real uvicorn server on loopback, and every
answer against the pipelines' own."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from encoderlab import EncoderConfig
from encoderlab.checkpoint import save_pretrained
from encoderlab.infer.pipelines import pipeline
from encoderlab.infer.server import Limits, create_app, load_pipelines
from encoderlab.nn.model import SequenceClassifier
from encoderlab.tokenizer import Tokenizer
from test_server import SENTENCES, running, task_folders  # noqa: F401 (task_folders: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py
KEY = "compat-test-key"


@pytest.fixture(scope="module")
def minilm(minilm_path):
    """minilm's pipelines, loaded once for every server of this file."""
    return load_pipelines(str(minilm_path), tasks=["embed"])


@pytest.fixture(scope="module")
def url(minilm) -> Iterator[str]:
    with running(create_app(minilm[0], Limits(batch_wait_ms=20), model="minilm", unavailable=minilm[1])) as base:
        yield base


@pytest.fixture(scope="module")
def embedder(minilm):
    """The Embed pipeline the server runs: what `encoderlab embed` computes for a text."""
    return minilm[0]["embed"]


@pytest.fixture(scope="module")
def client(url) -> openai.OpenAI:
    import openai  # here, not at the top: openai and langchain-openai cost 3 CPU s in every xdist worker's collection

    return openai.OpenAI(base_url=f"{url}/v1", api_key="anything", max_retries=0)


def cosines(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return (got * expected).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(expected, axis=-1)


def vectors(response) -> np.ndarray:
    return np.array([item.embedding for item in sorted(response.data, key=lambda item: item.index)])


# ---- OpenAI ---------------------------------------------------------------------------------------------------
def test_openai_client_embeds_a_string_and_a_list_as_the_pipeline_does(client, embedder):
    one = client.embeddings.create(model="text-embedding-3-small", input=SENTENCES[0])  # base64, decoded by the client
    many = client.embeddings.create(model="minilm", input=SENTENCES, encoding_format="float")
    assert one.model == "minilm" and many.model == "minilm"  # any name is accepted; the served model answers
    assert cosines(vectors(one), embedder.embed(SENTENCES[:1])).min() >= 0.9999
    np.testing.assert_allclose(vectors(many), embedder.embed(SENTENCES), atol=1e-6)
    expected_tokens = sum(len(ids) for ids in (embedder.tokenizer.encode(t, max_length=None) for t in SENTENCES))
    assert many.usage.prompt_tokens == many.usage.total_tokens == expected_tokens


def test_base64_is_little_endian_float32_of_the_float_vectors(url, embedder):
    body = {"model": "minilm", "input": SENTENCES[:2]}
    floats = httpx.post(f"{url}/v1/embeddings", json=body | {"encoding_format": "float"}, timeout=60).json()
    packed = httpx.post(f"{url}/v1/embeddings", json=body | {"encoding_format": "base64"}, timeout=60).json()
    assert packed["object"] == "list" and [item["object"] for item in packed["data"]] == ["embedding"] * 2
    decoded = [np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in packed["data"]]
    np.testing.assert_array_equal(np.array(decoded), np.array([item["embedding"] for item in floats["data"]],
                                                              dtype=np.float32))


def test_token_ids_embed_as_their_text(client, embedder):
    import openai

    ids = [embedder.tokenizer.encode(text, max_length=None) for text in SENTENCES[:3]]
    several = client.embeddings.create(model="minilm", input=ids)
    one = client.embeddings.create(model="minilm", input=ids[0])
    assert cosines(vectors(several), embedder.embed(SENTENCES[:3])).min() >= 0.9999
    assert cosines(vectors(one), embedder.embed(SENTENCES[:1])).min() >= 0.9999
    with pytest.raises(openai.BadRequestError, match="outside this model's vocabulary"):
        client.embeddings.create(model="minilm", input=[[1, 2, 10**7]])


def test_dimensions_cut_and_renormalise_and_are_refused_past_the_width(client, embedder):
    import openai

    got = vectors(client.embeddings.create(model="minilm", input=SENTENCES[:2], dimensions=128))
    full = embedder.embed(SENTENCES[:2])
    assert got.shape == (2, 128)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(got, full[:, :128] / np.linalg.norm(full[:, :128], axis=-1, keepdims=True), atol=1e-5)
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="minilm", input="a cat", dimensions=385)
    error = refused.value.body  # the client hands back the "error" object of OpenAI's shape
    assert refused.value.status_code == 400 and error["param"] == "dimensions"
    assert error["type"] == "invalid_request_error" and "384" in error["message"]


@pytest.mark.parametrize("body, needle", [({"input": []}, "at least 1 item"), ({"input": ["a", " "]}, "input[1]"),
                                          ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
                                          ({"model": "minilm"}, "input")])
def test_bad_openai_requests_get_400_in_openai_shape(url, body, needle):
    response = httpx.post(f"{url}/v1/embeddings", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"} and set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert needle in response.json()["error"]["message"], response.text


def test_models_lists_the_served_model(client):
    listed = client.models.list().data
    assert [(m.id, m.object, m.owned_by) for m in listed] == [("minilm", "model", "encoderlab")]
    assert listed[0].created > 0


def test_the_api_key_is_taken_as_a_bearer_token(minilm, embedder):
    import openai

    with running(create_app(minilm[0], Limits(), model="minilm", api_key=KEY)) as base:
        good = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
        wrong = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY + "x", max_retries=0)
        answer = good.embeddings.create(model="minilm", input="a cat")
        with pytest.raises(openai.AuthenticationError) as refused:
            wrong.embeddings.create(model="minilm", input="a cat")
        raw = httpx.post(f"{base}/v1/embeddings", json={"input": "a"}, headers={"authorization": "Bearer nope"})
        ours = httpx.post(f"{base}/embed", json={"texts": ["a"]}, headers={"x-api-key": KEY})
        scraped = httpx.get(f"{base}/metrics")  # no key: counts for a scraper
    assert cosines(vectors(answer), embedder.embed(["a cat"])).min() >= 0.9999
    assert refused.value.status_code == 401 and refused.value.body["code"] == "invalid_api_key"
    assert raw.status_code == 401 and raw.json()["error"]["type"] == "invalid_request_error"
    assert ours.status_code == 200 and scraped.status_code == 200


def test_langchain_openai_embeddings_equal_the_pipeline(url, embedder):
    from langchain_openai import OpenAIEmbeddings

    lc = OpenAIEmbeddings(base_url=f"{url}/v1", api_key="anything", model="minilm", check_embedding_ctx_length=False,
                          max_retries=0)
    documents = np.array(lc.embed_documents(SENTENCES))
    query = np.array(lc.embed_query("where does anna live?"))
    assert cosines(documents, embedder.embed(SENTENCES)).min() >= 0.9999
    assert cosines(query[None], embedder.embed(["where does anna live?"])).min() >= 0.9999


def test_a_long_text_is_cut_to_the_window_and_counted_as_read(client, embedder):
    long = " ".join(SENTENCES * 40)  # about 1,000 tokens; minilm reads 256
    response = client.embeddings.create(model="minilm", input=long)
    assert cosines(vectors(response), embedder.embed([long])).min() >= 0.9999
    assert response.usage.prompt_tokens == embedder.max_length


# ---- TEI --------------------------------------------------------------------------------------------------------
def test_tei_embed_takes_inputs_on_our_path_and_ours_is_unchanged(url, embedder):
    one = httpx.post(f"{url}/embed", json={"inputs": SENTENCES[0]}, timeout=60)
    many = httpx.post(f"{url}/embed", json={"inputs": SENTENCES}, timeout=60)
    raw = httpx.post(f"{url}/embed", json={"inputs": SENTENCES, "normalize": False}, timeout=60)
    cut = httpx.post(f"{url}/embed", json={"inputs": SENTENCES, "dimensions": 64}, timeout=60)
    ours = httpx.post(f"{url}/embed", json={"texts": SENTENCES}, timeout=60)
    assert np.array(one.json()).shape == (1, 384)  # TEI's answer: a bare list of vectors
    np.testing.assert_allclose(np.array(many.json()), embedder.embed(SENTENCES), atol=1e-6)
    unnormalised = embedder.embed(SENTENCES, normalize=False)
    assert np.linalg.norm(unnormalised, axis=-1).min() > 1.5  # minilm's pooled vectors, before normalising
    np.testing.assert_allclose(np.array(raw.json()), unnormalised, atol=1e-5)
    np.testing.assert_allclose(np.array(cut.json()), embedder.embed(SENTENCES, dimensions=64), atol=1e-6)
    assert list(ours.json()) == ["results"]
    np.testing.assert_allclose([r["embedding"] for r in ours.json()["results"]], many.json(), atol=1e-6)


def test_tei_refuses_a_text_past_the_window_unless_told_to_truncate(url, embedder):
    long = " ".join(SENTENCES * 40)
    refused = httpx.post(f"{url}/embed", json={"inputs": [SENTENCES[0], long]}, timeout=60)
    cut = httpx.post(f"{url}/embed", json={"inputs": [long], "truncate": True}, timeout=60)
    assert refused.status_code == 413 and refused.json()["error_type"] == "Validation"
    assert "input 1" in refused.json()["error"] and "Given:" in refused.json()["error"]
    np.testing.assert_allclose(np.array(cut.json()), embedder.embed([long]), atol=1e-6)
    mixed = httpx.post(f"{url}/embed", json={"inputs": ["a"], "texts": ["b"]}, timeout=60)
    assert mixed.status_code == 422  # one schema or the other: TEI's has no "texts"


def test_tei_tokenize_gives_the_tokenizers_ids_and_offsets(url, embedder):
    texts = ["Anna lives in Paris.", "a cat"]
    tokens = httpx.post(f"{url}/tokenize", json={"inputs": texts}, timeout=30).json()
    bare = httpx.post(f"{url}/tokenize", json={"inputs": texts[0], "add_special_tokens": False}, timeout=30).json()
    for text, listed in zip(texts, tokens):
        assert [t["id"] for t in listed] == embedder.tokenizer.encode(text, max_length=None)
        assert listed[0] == {"id": embedder.tokenizer.cls_id, "text": "[CLS]", "special": True, "start": None,
                             "stop": None}
        assert all(t["text"] == text[t["start"]:t["stop"]] for t in listed if not t["special"])
    assert [t["id"] for t in bare[0]] == [t["id"] for t in tokens[0] if not t["special"]]


def test_tei_info_describes_the_served_model(url, embedder):
    info = httpx.get(f"{url}/info", timeout=30).json()
    assert info["model_id"] == "minilm" and info["model_dtype"] == "float32"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == embedder.max_length and info["max_client_batch_size"] == 64
    assert {"max_concurrent_requests", "max_batch_tokens", "tokenization_workers", "version"} <= set(info)


def test_tei_predict_and_openai_404_on_a_classifier(task_folders):
    pipelines, reasons = load_pipelines(str(task_folders["classify"]))
    classify = pipeline("classify", task_folders["classify"])
    texts, pair = ["anna lives in paris", "the movie was good", "he went to rome"], ["the movie", "was good"]
    with running(create_app(pipelines, Limits(), model="classify", unavailable=reasons)) as base:
        one = httpx.post(f"{base}/predict", json={"inputs": texts[0]}, timeout=30).json()
        paired = httpx.post(f"{base}/predict", json={"inputs": pair}, timeout=30).json()
        batch = httpx.post(f"{base}/predict", json={"inputs": texts}, timeout=30).json()
        info = httpx.get(f"{base}/info").json()
        missing = httpx.post(f"{base}/v1/embeddings", json={"input": "a"}, timeout=30)

    def as_tei(result: dict) -> list[dict]:
        return sorted(({"label": k, "score": v} for k, v in result["scores"].items()), key=lambda r: -r["score"])

    assert one == as_tei(classify(texts[:1])[0]) and paired == as_tei(classify([pair])[0])
    assert batch == [as_tei(result) for result in classify(texts)]
    assert info["model_type"] == {"classifier": {"id2label": {"0": "neg", "1": "pos"},
                                                 "label2id": {"neg": 0, "pos": 1}}}
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


@pytest.fixture(scope="module")
def reranker(task_folders, tmp_path_factory) -> Path:
    """A random tiny one-logit cross-encoder (a rerank checkpoint's shape) with the task folders' vocabulary."""
    tokenizer = Tokenizer.from_pretrained(task_folders["classify"])
    config = EncoderConfig.from_preset("bert-tiny", hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2,
                                       vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
    torch.manual_seed(1)
    classifier = SequenceClassifier(config, num_labels=1, multilabel=True)
    folder = tmp_path_factory.mktemp("reranker")
    save_pretrained(classifier.eval(), folder, tokenizer)
    return folder


def test_tei_rerank_takes_query_and_texts_on_our_path(reranker):
    pipelines, reasons = load_pipelines(str(reranker), tasks=["rerank"])
    rerank = pipeline("rerank", reranker)
    query, texts = "where does anna live", ["anna lives in paris", "the movie was good", "john went to rome"]
    expected = rerank([{"query": query, "passages": texts}])[0]["ranking"]
    raw = rerank([{"query": query, "passages": texts}], raw_scores=True)[0]["ranking"]
    with running(create_app(pipelines, Limits(), model="rerank", unavailable=reasons)) as base:
        tei = httpx.post(f"{base}/rerank", json={"query": query, "texts": texts, "return_text": True}, timeout=30)
        logits = httpx.post(f"{base}/rerank", json={"query": query, "texts": texts, "raw_scores": True}, timeout=30)
        ours = httpx.post(f"{base}/rerank", json={"items": [{"query": query, "passages": texts}]}, timeout=30)
        info = httpx.get(f"{base}/info").json()
    assert tei.json() == [{"index": r["index"], "score": r["score"], "text": r["passage"]} for r in expected]
    assert logits.json() == [{"index": r["index"], "score": r["score"]} for r in raw]
    assert ours.json() == {"results": [{"ranking": expected}]}  # our schema, unchanged
    np.testing.assert_allclose(torch.tensor([r["score"] for r in raw]).sigmoid(), [r["score"] for r in expected],
                               atol=1e-5)
    assert "reranker" in info["model_type"]


# ---- all three schemas share forward passes; /metrics counts them ------------------------------------------------
def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, parsed by prometheus_client: (name, sorted labels) -> value."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_schemas_batch_together_and_metrics_count_them(url):
    before, stats = scrape(url), httpx.get(f"{url}/health").json()["stats"]["embed"]
    calls = [("/embed", {"texts": [t]}) for t in SENTENCES] + [("/embed", {"inputs": t}) for t in SENTENCES] + \
        [("/v1/embeddings", {"input": t, "model": "minilm"}) for t in SENTENCES]
    with ThreadPoolExecutor(len(calls)) as pool:
        codes = list(pool.map(lambda call: httpx.post(url + call[0], json=call[1], timeout=60).status_code, calls))
    refused = httpx.post(f"{url}/v1/embeddings", json={"input": []}, timeout=30).status_code
    after, done = scrape(url), httpx.get(f"{url}/health").json()["stats"]["embed"]
    assert codes == [200] * len(calls) and refused == 400
    assert done["requests"] - stats["requests"] == len(calls)
    assert done["batches"] - stats["batches"] < len(calls)  # requests of the three schemas shared forward passes

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("encoderlab_requests_total", route="/v1/embeddings", status="200") == len(SENTENCES)
    assert delta("encoderlab_requests_total", route="/embed", status="200") == 2 * len(SENTENCES)
    assert delta("encoderlab_requests_total", route="/v1/embeddings", status="400") == 1
    assert delta("encoderlab_request_seconds_count", route="/v1/embeddings") == len(SENTENCES) + 1
    assert delta("encoderlab_batch_size_count", task="embed") == done["batches"] - stats["batches"] > 0
    assert delta("encoderlab_batch_size_sum", task="embed") == len(calls)
    assert after[("encoderlab_queue_depth", (("task", "embed"),))] == 0


def test_each_app_counts_in_its_own_registry(minilm):
    apps = [create_app(minilm[0], Limits(), model="minilm") for _ in range(2)]
    with running(apps[0]) as first, running(apps[1]) as second:
        httpx.get(f"{first}/v1/models")
        counts = [scrape(base).get(("encoderlab_requests_total", (("route", "/v1/models"), ("status", "200"))), 0.0)
                  for base in (first, second)]
    assert counts == [1.0, 0.0]


def test_openapi_keeps_our_schema_and_names_teis_on_shared_paths(url):
    schema = httpx.get(f"{url}/openapi.json").json()
    body = schema["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"$ref": "#/components/schemas/EmbedRequest"} in body["oneOf"]
    assert json.dumps(body).count("TEIEmbedRequest") == 1
