"""The playground in a real browser: headless Chromium (Debian's `chromium` package) driven by Playwright's Python
package with executable_path at the system Chromium (`playwright install` would need the network). Each test types
into a panel, reads what the page rendered and checks it against the Python API on the same input, then saves a
screenshot of the panel: into $ENCODERLAB_SCREENSHOTS where set (the committed ones:
ENCODERLAB_SCREENSHOTS=docs/playground), else into a temporary folder, so that a test run leaves the checkout as it
was (the tiny random models' outputs, and so their pictures, change from run to run: `tokenizers` orders a trained
vocabulary differently each time).

One server for the module, on loopback: the shipped fill-mask model, MiniLM for /embed, and tiny random
classify / NER / QA models (test_server.task_folders), so every panel is live."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from test_rerank import reranker  # noqa: F401 (a fixture)
from test_server import ROOT, Stub, running, task_folders  # noqa: F401 (task_folders: a fixture)

from encoderlab.infer.pipelines import pipeline
from encoderlab.infer.server import Limits, create_app, load_pipelines
from encoderlab.retrieval.index import Index
from encoderlab.retrieval.serving import IndexRoutes
from encoderlab.viz.attention import attention_maps

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)"),
              pytest.mark.usefixtures("one_thread")]
FILL_MASK_MODEL = ROOT / "models" / "encoderlab-fill-mask"


@pytest.fixture(scope="module")
def pipelines(task_folders, minilm_path) -> dict:
    """Every endpoint: real models where we ship them, tiny random ones for the three fine-tuned tasks."""
    if not (FILL_MASK_MODEL / "model.safetensors").exists():
        pytest.skip(f"the shipped fill-mask model is absent: {FILL_MASK_MODEL}")
    return {"embed": pipeline("embed", minilm_path), "fill-mask": pipeline("fill-mask", FILL_MASK_MODEL),
            "classify": pipeline("classify", task_folders["classify"]), "ner": pipeline("ner", task_folders["ner"]),
            "qa": pipeline("qa", task_folders["qa"])}


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def page(pipelines, browser) -> Iterator:
    """The playground of the all-panels server, loaded and connected."""
    with running(create_app(pipelines, Limits(), model="playground-test")) as url:
        tab = browser.new_page(viewport={"width": 1300, "height": 1000})
        tab.goto(url)
        tab.wait_for_selector("body[data-ready=yes]", timeout=20_000)
        yield tab
        tab.close()


def submit(page, panel: str) -> None:
    """Press the panel's button and wait until its answer (or error) is rendered."""
    done = int(page.get_attribute(f"#{panel}", "data-done") or 0)
    page.click(f"#{panel} button")
    page.wait_for_function(f"document.getElementById('{panel}').dataset.done === '{done + 1}'", timeout=30_000)
    assert page.query_selector(f"#{panel} .error") is None, page.inner_text(f"#{panel} .out")


def rows(where, selector: str = "") -> list[tuple[str, float]]:
    """(label, score) of each probability bar under `selector` of a page (or in an element), as rendered."""
    return [(row.get_attribute("data-label"), float(row.get_attribute("data-score")))
            for row in where.query_selector_all(f"{selector} .row")]


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where the panels' screenshots go."""
    folder = Path(os.environ["ENCODERLAB_SCREENSHOTS"]) if os.environ.get("ENCODERLAB_SCREENSHOTS") else (
        tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shoot(page, folder: Path, panel: str, name: str) -> None:
    """A PNG of one panel, as the browser drew it."""
    page.mouse.move(0, 0)  # no hover outline in the picture
    page.locator(f"#{panel}").screenshot(path=str(folder / f"{name}.png"))
    assert (folder / f"{name}.png").stat().st_size > 2000  # a drawn panel, not an empty box


def test_fill_mask_panel_shows_the_pipelines_predictions(page, pipelines, shots):
    text = "Paris is the [MASK] of France. It is a very [MASK] city."
    page.fill("#panel-fill-mask input[name=text]", text)
    page.fill("#panel-fill-mask input[name=top_k]", "5")
    submit(page, "panel-fill-mask")
    expected = pipeline("fill-mask", FILL_MASK_MODEL)([text], top_k=5)[0]
    shown = [rows(mask) for mask in page.query_selector_all("#panel-fill-mask .mask")]
    assert len(expected["masks"]) == len(shown) == 2
    for mask, got in zip(expected["masks"], shown):
        assert [token for token, _ in got] == [p["token"] for p in mask["predictions"]]
        np.testing.assert_allclose([s for _, s in got], [p["score"] for p in mask["predictions"]], atol=1e-6)
    assert page.inner_text("#panel-fill-mask .filled") == expected["filled"]
    shoot(page, shots, "panel-fill-mask", "fill-mask")


def test_similarity_panel_ranks_as_the_embeddings_do(page, minilm_path, shots):
    query, sentences = "A man is playing a guitar.", ["Someone plays an instrument.", "A woman is slicing an onion.",
                                                      "The stock market fell sharply today.",
                                                      "A person strums a guitar on stage."]
    page.fill("#panel-similarity input[name=query]", query)
    page.fill("#panel-similarity textarea[name=sentences]", "\n".join(sentences))
    submit(page, "panel-similarity")
    vectors = np.array([r["embedding"] for r in pipeline("embed", minilm_path)([query, *sentences])], dtype=np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    cosines = vectors[1:] @ vectors[0]
    got = rows(page, "#panel-similarity")
    assert [label for label, _ in got] == [sentences[i] for i in np.argsort(-cosines)]
    np.testing.assert_allclose([s for _, s in got], np.sort(cosines)[::-1], atol=1e-5)
    assert {label for label, _ in got[:2]} == {sentences[0], sentences[3]}  # a real sentence embedder at work
    shoot(page, shots, "panel-similarity", "similarity")


def test_attention_panel_draws_every_head_then_one_heads_strongest_links(page, pipelines, shots):
    text = "The cat sat on the mat because it was tired."
    page.fill("#panel-attention input[name=text]", text)
    page.select_option("#panel-attention select[name=task]", "fill-mask")
    submit(page, "panel-attention")  # every head of the last layer, as thumbnails
    pipe = pipelines["fill-mask"]
    maps = attention_maps(pipe.model, pipe.tokenizer, text)
    assert len(page.query_selector_all("#panel-attention .heads canvas")) == maps.num_heads
    shoot(page, shots, "panel-attention", "attention-heads")
    assert len(page.query_selector_all("#panel-attention select[name=layer] option")) == maps.num_layers
    page.select_option("#panel-attention select[name=layer]", "2")
    page.select_option("#panel-attention select[name=head]", "5")
    submit(page, "panel-attention")
    head = maps.select(2, 5).clone()  # (T, T)
    last = head.shape[0] - 1
    head.fill_diagonal_(0)
    head[[0, last], :] = head[:, [0, last]] = 0  # the page leaves these out of its links by default
    links = [(int(li.get_attribute("data-query")), int(li.get_attribute("data-key")),
              float(li.get_attribute("data-score"))) for li in page.query_selector_all("#panel-attention ol li")]
    assert len(links) == 12
    twelfth = head.flatten().topk(12).values[-1].item()
    for query, key, score in links:  # the page's values rounded to 4 decimals: ties may swap places, nothing more
        assert abs(score - head[query, key].item()) < 6e-5 and score >= twelfth - 1e-4
    assert abs(links[0][2] - head.max().item()) < 6e-5
    assert page.inner_text("#panel-attention h3").startswith("layer 2 of 0..5, head 5")
    canvas = page.query_selector("#panel-attention .out > canvas")
    assert canvas is not None and canvas.bounding_box()["width"] > 200
    shoot(page, shots, "panel-attention", "attention")


def test_ner_panel_highlights_the_pipelines_entities(page, task_folders, shots):
    text = "anna lives in paris and john went to rome"
    page.fill("#panel-ner textarea[name=text]", text)
    submit(page, "panel-ner")
    entities = pipeline("ner", task_folders["ner"])([text])[0]["entities"]
    assert entities, "the tiny random model tags nothing: the highlighting would go untested"
    marks = page.query_selector_all("#panel-ner mark")
    assert [(int(m.get_attribute("data-start")), int(m.get_attribute("data-end")), m.get_attribute("data-tag"),
             m.evaluate("m => m.firstChild.textContent")) for m in marks] == [
        (e["start"], e["end"], e["entity"], text[e["start"]:e["end"]]) for e in entities]
    assert page.evaluate("document.querySelector('#panel-ner .text').firstChild.textContent") == text[
        :entities[0]["start"]]  # the text before the first entity, as typed
    shoot(page, shots, "panel-ner", "ner")


def test_qa_panel_highlights_the_answer_span(page, task_folders, shots):
    question, context = "where does anna live ?", "anna lives in paris . john went to rome ."
    page.fill("#panel-qa input[name=question]", question)
    page.fill("#panel-qa textarea[name=context]", context)
    submit(page, "panel-qa")
    expected = pipeline("qa", task_folders["qa"])([{"question": question, "context": context}])[0]
    mark = page.query_selector("#panel-qa mark.answer")
    if expected["answer"]:
        assert (int(mark.get_attribute("data-start")), int(mark.get_attribute("data-end"))) == (expected["start"],
                                                                                               expected["end"])
        assert mark.inner_text() == context[expected["start"]:expected["end"]] == expected["answer"]
        assert page.inner_text("#panel-qa .answer-text") == expected["answer"]
    else:
        assert mark is None
    shoot(page, shots, "panel-qa", "qa")


def test_classify_panel_shows_the_class_probabilities(page, task_folders, shots):
    text, pair = "the movie was very good", "anna saw it in rome"
    page.fill("#panel-classify textarea[name=text]", text)
    page.fill("#panel-classify input[name=pair]", pair)
    submit(page, "panel-classify")
    expected = pipeline("classify", task_folders["classify"])([[text, pair]])[0]["scores"]
    got = rows(page, "#panel-classify")
    assert [label for label, _ in got] == sorted(expected, key=expected.get, reverse=True)
    np.testing.assert_allclose([s for _, s in got], sorted(expected.values(), reverse=True), atol=1e-6)
    shoot(page, shots, "panel-classify", "classify")


@pytest.mark.slow  # its reranker is fine-tuned for the module (test_rerank.reranker): not for make test-fast
def test_rerank_panel_ranks_as_the_reranker_does_and_classification_stands_aside(reranker, browser, shots):
    """A `finetune rerank` folder loads as /classify too (a one-score classifier; TEI's /predict asks it there): the
    page offers its Rerank panel, not a Classification panel of one unnamed class."""
    folder, _ = reranker
    query = "where does anna live ?"
    passages = ["peter lives in rome", "anna lives in paris", "maria lives in oslo", "john lives in berlin"]
    pipelines, reasons = load_pipelines(str(folder / "run"), tasks=["classify", "rerank"])
    assert set(pipelines) == {"classify", "rerank"}
    with running(create_app(pipelines, Limits(), model="rerank-test", unavailable=reasons)) as url:
        tab = browser.new_page(viewport={"width": 1300, "height": 1000})
        tab.goto(url)
        tab.wait_for_selector("body[data-ready=yes]", timeout=20_000)
        assert not tab.is_visible("#panel-classify form")
        assert "reranker" in tab.inner_text("#panel-classify .missing")
        tab.fill("#panel-rerank input[name=query]", query)
        tab.fill("#panel-rerank textarea[name=passages]", "\n".join(passages))
        submit(tab, "panel-rerank")
        expected = pipelines["rerank"]([{"query": query, "passages": passages}])[0]["ranking"]
        shown = ranking(tab)
        assert shown == [(r["passage"], r["index"], r["score"]) for r in expected]
        assert shown[0][0] == "anna lives in paris"  # a trained reranker at work
        assert [tab.inner_text(f"#panel-rerank .row:nth-child({i + 1}) .num") for i in range(len(expected))] == [
            f"{r['score']:.3f}" for r in expected]
        shoot(tab, shots, "panel-rerank", "rerank")
        tab.fill("#panel-rerank textarea[name=passages]", "\n".join([*passages[:2], "  ", *passages[2:], ""]))
        submit(tab, "panel-rerank")
        assert ranking(tab) == shown  # blank lines are no passages
        tab.close()


def ranking(page) -> list[tuple[str, int, float]]:
    """(passage, its index in the request, score) of each row of the Rerank panel, as rendered."""
    return [(row.get_attribute("data-label"), int(row.get_attribute("data-index")),
             float(row.get_attribute("data-score"))) for row in page.query_selector_all("#panel-rerank .row")]


@pytest.fixture(scope="module")
def index(pipelines, minilm_path, tmp_path_factory):
    """examples/corpus.jsonl indexed by MiniLM (the page's /embed pipeline), with BM25."""
    return Index.build(minilm_path, ROOT / "examples" / "corpus.jsonl", tmp_path_factory.mktemp("index") / "idx",
                       embedder=pipelines["embed"], bm25=True, progress=False)


def test_search_panel_shows_the_indexs_hits(index, pipelines, browser, page, shots):
    """Offered only by a server with an index: a query typed in, its hits as Index.search gives them (title, a
    snippet, id and score), in each mode the index has; no rerank box without a reranker."""
    assert not page.is_visible("#panel-search")  # the all-panels server has no index
    served = {"embed": pipelines["embed"]}
    with running(create_app(served, Limits(), model="search-test", index=IndexRoutes(index.folder, served))) as url:
        tab = browser.new_page(viewport={"width": 1300, "height": 1000})
        tab.goto(url)
        tab.wait_for_selector("body[data-ready=yes]", timeout=20_000)
        assert tab.is_visible("#panel-search form") and not tab.is_visible("#panel-search .rerank-option")
        for mode, query in (("dense", "who discovered antibiotics?"), ("hybrid", "gravity bends light")):
            tab.fill("#panel-search input[name=query]", query)
            tab.select_option("#panel-search select[name=mode]", mode)
            tab.fill("#panel-search input[name=top_k]", "3")
            submit(tab, "panel-search")
            expected = index.search(query, top_k=3, mode=mode)[0]
            hits = tab.query_selector_all("#panel-search .hit")
            assert [h.get_attribute("data-id") for h in hits] == [h["id"] for h in expected]
            assert [float(h.get_attribute("data-score")) for h in hits] == pytest.approx(
                [h["score"] for h in expected], abs=1e-5)
            assert [h.query_selector(".title").inner_text() for h in hits] == [h["title"] for h in expected]
            assert [h.query_selector(".snippet").inner_text() for h in hits] == [e["text"][:200] for e in expected]
        assert tab.query_selector("#panel-search .hit .id").inner_text() == expected[0]["id"]
        assert tab.evaluate("snippet('a  long\\ntext '.repeat(50))") == ("a long text " * 50)[:200] + "…"
        tab.fill("#panel-search input[name=query]", "who discovered antibiotics?")
        tab.select_option("#panel-search select[name=mode]", "dense")
        submit(tab, "panel-search")
        assert tab.get_attribute("#panel-search .hit", "data-id") == "penicillin"  # MiniLM at work
        shoot(tab, shots, "panel-search", "search")
        tab.close()


def test_panels_without_a_model_say_so_and_the_key_is_asked_for(browser):
    reasons = {"ner": "not asked for (--tasks)", "fill-mask": "stub has no masked-LM head"}
    app = create_app({"embed": Stub()}, Limits(), model="stub", unavailable=reasons, api_key="k3y")
    with running(app) as url:
        tab = browser.new_page()
        tab.goto(url)
        tab.wait_for_selector("body[data-ready=error]", timeout=20_000)
        assert "needs an API key" in tab.inner_text("#status")
        assert "needed" in tab.get_attribute("#key-form", "class")
        tab.fill("#api-key", "k3y")
        tab.click("#key-form button")
        tab.wait_for_selector("body[data-ready=yes]", timeout=20_000)
        assert tab.inner_text("#panel-ner .missing") == "Not loaded on this server: not asked for (--tasks)"
        assert "stub has no masked-LM head" in tab.inner_text("#panel-fill-mask .missing")
        assert not tab.is_visible("#panel-ner form") and tab.is_visible("#panel-similarity form")
        tab.close()


@pytest.mark.parametrize("path, operation", [("/docs", ".opblock-summary-path"), ("/redoc", "[data-section-id]")])
def test_api_docs_render_every_operation_with_the_network_blocked(pipelines, browser, path, operation):
    """/docs (Swagger UI) and /redoc load their scripts from the server itself (fastapi-offline's copies), not a
    CDN, and ask nothing of any other machine (ReDoc's script, as fastapi-offline ships it, fetches its footer's
    logo from cdn.redoc.ly: /redoc serves a copy without it): every request the page makes is recorded, and one to
    another origin would be aborted (the page still lists each endpoint) and fails the test."""
    with running(create_app(pipelines, Limits(), model="docs-test")) as url:
        tab = browser.new_page()
        requested: list[str] = []
        tab.on("request", lambda request: requested.append(request.url))
        tab.route("**/*", lambda route: route.continue_() if route.request.url.startswith(url + "/") else route.abort())
        tab.goto(url + path)
        tab.wait_for_selector(operation, timeout=20_000)
        tab.wait_for_load_state("networkidle")  # a footer's image is asked for after the operations are drawn
        shown = tab.inner_text("body")
        tab.close()
    outside = [u for u in requested if not u.startswith((url + "/", "data:", "blob:"))]
    assert not outside, f"{path} asked for files from elsewhere: {outside}"
    assert url + path in requested and len(requested) > 2  # the recording saw the page and its files
    for endpoint in ("/embed", "/classify", "/fill-mask", "/ner", "/qa", "/health"):
        assert endpoint in shown, f"{path} does not list {endpoint}"
