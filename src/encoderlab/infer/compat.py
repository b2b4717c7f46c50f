"""The interfaces users' tools already speak, served beside our own schema by `encoderlab serve`:

- OpenAI's embeddings API: POST /v1/embeddings, GET /v1/models, errors as {"error": {"message", "type", "param",
  "code"}}; the `openai` client and langchain's OpenAIEmbeddings work unchanged (base_url=http://HOST:PORT/v1).
- Hugging Face Text Embeddings Inference (TEI): POST /embed with {"inputs": ...} and POST /rerank with {"query",
  "texts"} (the same paths as ours, told apart by those keys), POST /predict, POST /tokenize, GET /info; errors
  as {"error", "error_type"}.

Every vector comes from embed_vectors, which submits to the embed batcher with the key our own /embed uses for the
same options: requests of all three schemas share forward passes, and a text gets the same vector whichever way
it asks. Choices where the others' APIs leave room (docs/inference.md says the same):
- `model` may be any string (OpenAI clients always send one); the answer names the served model.
- token ids in `input` are decoded by the model's tokenizer (special tokens dropped) and embedded as that text: a
  text and its ids give one vector, and a request of ids batches with requests of text.
- a text past the model's window is cut to it on /v1/embeddings (tools chunk for OpenAI's 8,191 tokens, far past
  a BERT's 512; refusing would fail them); `usage` counts the tokens the model read, special tokens included. TEI's
  routes refuse it with 413 unless "truncate": true, as TEI does.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, WrapValidator, create_model
from pydantic_core import PydanticCustomError

from encoderlab import __version__
from encoderlab.errors import InputError
from encoderlab.infer.batching import Batcher, Failed, submit
from encoderlab.infer.limits import Limits

OPENAI = "/v1/"  # every path under it answers errors in OpenAI's shape
OWNER = "encoderlab"
OPENAI_TAG, TEI_TAG = "OpenAI-compatible", "Text Embeddings Inference"  # their sections in /docs
TEI_MAX_CONCURRENT = 512  # /info's max_concurrent_requests: serve queues without a cap; TEI's default is shown
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}
Result = TypeVar("Result")
KIND_ERRORS = ("string_type", "int_type", "int_parsing", "list_type")  # pydantic's "not this kind of value"


# ---- errors -----------------------------------------------------------------------------------------------------
class APIError(Exception):
    """A refusal with its status and whole JSON body, in the shape of the API the route speaks."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status, body)
        self.status, self.body = status, body


def openai_body(status: int, detail: Any, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body for our detail (a message, or validation errors whose first names the `param`)."""
    param = None
    if not isinstance(detail, str):
        param = next((e["loc"][1] for e in detail if len(e.get("loc", ())) > 1 and isinstance(e["loc"][1], str)),
                     None)
        detail = "; ".join(f"{'.'.join(map(str, e['loc'][1:])) or 'body'}: {e['msg']}" for e in detail)
    kind = "server_error" if status >= 500 else "invalid_request_error"
    code = code or ("invalid_api_key" if status == 401 else None)
    return {"error": {"message": detail, "type": kind, "param": param, "code": code}}


def openai_error(status: int, message: str, code: str | None = None) -> APIError:
    """A refusal in OpenAI's shape; a 422 of ours is OpenAI's 400."""
    status = 400 if status == 422 else status
    return APIError(status, openai_body(status, message, code))


def tei_error(status: int, message: str) -> APIError:
    """A refusal in TEI's shape; its error_type as TEI maps it to the status (Validation is TEI's 413)."""
    kind = {413: "Validation", 422: "Tokenizer", 404: "Validation"}.get(status, "Backend")
    return APIError(status, {"error": message, "error_type": kind})


def ours(status: int, message: str) -> APIError:
    """A refusal in our own shape, {"detail": message}."""
    return APIError(status, {"detail": message})


async def answered(work: Awaitable[Result], refuse: Callable[[int, str], APIError], refused: int = 422) -> Result:
    """work's result; a pipeline's InputError becomes refuse(refused, its message), a failure refuse(500, ...)."""
    try:
        return await work
    except InputError as err:
        raise refuse(refused, str(err)) from err
    except Failed as err:
        raise refuse(500, str(err)) from err


# ---- the one way to vectors -------------------------------------------------------------------------------------
async def embed_vectors(batcher: Batcher, texts: list[str], dimensions: int | None = None,
                        normalize: bool | None = None) -> list[list[float]]:
    """The texts' vectors through the embed batcher, in order; normalize None: as the model says. The key is /embed's
    own for the same options, so our requests, OpenAI's and TEI's share forward passes."""
    options = (("dimensions", dimensions),) + ((("normalize", normalize),) if normalize is not None else ())
    results = await submit(batcher, "embed", texts, (options, ("str",)))
    return [result["embedding"] for result in results]


def token_counts(pipe: Any, texts: list[str], pairs: list[str] | None = None) -> list[int]:
    """Each text's (or pair's) length in the model's tokens, special tokens included, before any cut."""
    rows, _ = pipe.tokenizer.encode_rows(texts, pairs, max_length=None, truncation=False)
    return [len(row.input_ids) for row in rows]


def check_window(pipe: Any, texts: list[str], pairs: list[str] | None, truncate: bool) -> None:
    """TEI's refusal (413) of an input past the model's window, unless asked to truncate."""
    if truncate:
        return
    for i, count in enumerate(token_counts(pipe, texts, pairs)):
        if count > pipe.max_length:
            raise tei_error(413, f"input {i}: `inputs` must have less than {pipe.max_length + 1} tokens. Given: "
                                 f"{count} (send \"truncate\": true to cut it to the window)")


# ---- OpenAI -----------------------------------------------------------------------------------------------------
def openai_request(text: Any, limits: Limits, width: int | None) -> type[BaseModel]:
    """POST /v1/embeddings' body; fields OpenAI has and we do not use (user) are accepted and ignored."""
    ids = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=limits.max_text_chars)]
    many = Field(min_length=1, max_length=limits.max_batch)
    return create_model(
        "OpenAIEmbeddingRequest", __config__=ConfigDict(extra="ignore"),
        input=(Annotated[text | Annotated[list[text], many] | ids | Annotated[list[ids], many],
                         WrapValidator(one_reason)], ...),
        model=(str, Field("", description="any name: the served model answers")),
        encoding_format=(Literal["float", "base64"], "float"),
        dimensions=(int | None, Field(None, ge=1, le=width, description="keep the first N dimensions (Matryoshka), "
                                                                        "normalised again where the model normalises")),
        user=(str | None, None))


def one_reason(value: Any, handler: Callable[[Any], Any]) -> Any:
    """`input` validated, or one error: what it may be, and the most specific reason among the union's branches."""
    try:
        return handler(value)
    except ValidationError as err:
        # a branch that failed on a value's kind (a list read as a text) says least; of the rest, the deepest most
        deepest = max(err.errors(), key=lambda e: (e["type"] not in KIND_ERRORS, len(e["loc"])))
        where = "".join(f"[{part}]" for part in deepest["loc"] if isinstance(part, int))
        raise PydanticCustomError("input_invalid", "expected a non-blank text, a list of them, a list of token ids "
                                  "or a list of such lists; input{where}: {reason}",
                                  {"where": where, "reason": deepest["msg"]}) from None


def openai_texts(given: Any, tokenizer: Any) -> list[str]:
    """`input` as texts: a text, texts, one list of token ids or several (decoded by the model's tokenizer)."""
    if isinstance(given, str):
        return [given]
    if isinstance(given[0], int):
        given = [given]
    return [item if isinstance(item, str) else decode_ids(tokenizer, item, i) for i, item in enumerate(given)]


def decode_ids(tokenizer: Any, ids: list[int], index: int) -> str:
    """The text of one input's token ids; a 400 for an id outside the vocabulary or ids that decode to nothing."""
    outside = next((i for i in ids if i >= tokenizer.vocab_size), None)
    if outside is not None:
        raise openai_error(400, f"input {index}: token id {outside} is outside this model's vocabulary (0 to "
                                f"{tokenizer.vocab_size - 1})")
    text = tokenizer.decode(ids)
    if not text.strip():
        raise openai_error(400, f"input {index}: the token ids decode to no text (special tokens only?)")
    return text


def openai_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    """A vector as floats, or as OpenAI's base64: the bytes of little-endian float32 values."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def add_openai_routes(app: FastAPI, batchers: dict[str, Batcher], pipelines: dict[str, Any], model: str,
                      text: Any, limits: Limits) -> None:
    """POST /v1/embeddings and GET /v1/models, under their own tag in /docs."""
    pipe, created = pipelines.get("embed"), int(time.time())

    async def embeddings(body: BaseModel) -> JSONResponse:
        if pipe is None:
            raise openai_error(404, f"this server's model ({model}) has no embed endpoint", "model_not_found")
        texts = openai_texts(body.input, pipe.tokenizer)
        tokens = sum(min(count, pipe.max_length) for count in token_counts(pipe, texts))
        vectors = await answered(embed_vectors(batchers["embed"], texts, body.dimensions), openai_error)
        data = [{"object": "embedding", "index": i, "embedding": openai_vector(vector, body.encoding_format)}
                for i, vector in enumerate(vectors)]
        # a JSONResponse: json.dumps in C, where FastAPI's jsonable_encoder would walk every float in Python
        return JSONResponse({"object": "list", "data": data, "model": model,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    embeddings.__annotations__["body"] = openai_request(text, limits, getattr(pipe, "hidden_size", None))
    app.post("/v1/embeddings", tags=[OPENAI_TAG], summary="OpenAI-compatible embeddings")(embeddings)
    listing = {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": OWNER}]}
    app.get("/v1/models", tags=[OPENAI_TAG], summary="the served model, as OpenAI lists models")(lambda: listing)


# ---- TEI: /embed and /rerank with TEI's bodies ------------------------------------------------------------------
def tei_embed_request(text: Any, limits: Limits, pipe: Any) -> type[BaseModel]:
    """TEI's POST /embed body."""
    return strict("TEIEmbedRequest", inputs=(text | Annotated[list[text], many(limits)], ...),
                  normalize=(bool, True), truncate=(bool, False), dimensions=(int | None, Field(
                      None, ge=1, le=getattr(pipe, "hidden_size", None))))


async def tei_embed(body: BaseModel, batcher: Batcher, pipe: Any) -> list[list[float]]:
    """TEI's /embed: a bare list of vectors; normalize false gives them as pooled."""
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    check_window(pipe, texts, None, body.truncate)
    normalize = None if body.normalize == getattr(pipe, "normalize", None) else body.normalize
    return await answered(embed_vectors(batcher, texts, body.dimensions, normalize), tei_error, 413)


def tei_rerank_request(text: Any, limits: Limits, pipe: Any) -> type[BaseModel]:
    """TEI's POST /rerank body."""
    return strict("TEIRerankRequest", query=(text, ...), texts=(list[text], many(limits)),
                  return_text=(bool, False), raw_scores=(bool, False), truncate=(bool, False))


async def tei_rerank(body: BaseModel, batcher: Batcher, pipe: Any) -> list[dict[str, Any]]:
    """TEI's /rerank: [{"index", "score", "text"?}], best first; raw_scores: the logits."""
    check_window(pipe, [body.query] * len(body.texts), body.texts, body.truncate)
    options = (("top_k", None),) + ((("raw_scores", True),) if body.raw_scores else ())
    items = [{"query": body.query, "passages": body.texts}]
    results = await answered(submit(batcher, "rerank", items, (options, ("dict",))), tei_error, 413)
    return [{"index": row["index"], "score": row["score"]} | ({"text": row["passage"]} if body.return_text else {})
            for row in results[0]["ranking"]]


TEI_BODIES = {  # task: (the key that marks TEI's body, its model, its answer) on a path shared with ours
    "embed": ("inputs", tei_embed_request, tei_embed),
    "rerank": ("query", tei_rerank_request, tei_rerank),
}


def either(task: str, request: type[BaseModel], text: Any, limits: Limits, pipe: Any) -> Any:
    """Our body or TEI's for a shared path, told apart by TEI's key; validation errors name ours as before (the
    union's tags are dropped from their locations by the server's handler)."""
    key, build, _ = TEI_BODIES[task]
    return Annotated[Annotated[request, Tag("ours")] | Annotated[build(text, limits, pipe), Tag("tei")],
                     Discriminator(lambda value: "tei" if isinstance(value, dict) and key in value else "ours")]


SCHEMA_TAGS = ("ours", "tei")


def strict(name: str, **fields: Any) -> type[BaseModel]:
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


def many(limits: Limits) -> Any:
    return Field(min_length=1, max_length=limits.max_batch)


# ---- TEI: /predict, /tokenize, /info ----------------------------------------------------------------------------
def add_tei_routes(app: FastAPI, batchers: dict[str, Batcher], pipelines: dict[str, Any], model: str,
                   text: Any, limits: Limits, more_info: dict[str, Any] | None = None) -> None:
    """POST /predict (a classifier), POST /tokenize and GET /info, under TEI's tag in /docs; more_info: keys /info
    adds to TEI's (the served index)."""
    pair = Annotated[list[text], Field(min_length=2, max_length=2)]
    predict_request = strict("TEIPredictRequest", truncate=(bool, False), inputs=(Annotated[
        text | pair | Annotated[list[text | pair], many(limits)], Field(union_mode="left_to_right")], ...))
    tokenize_request = strict("TEITokenizeRequest", inputs=(text | Annotated[list[text], many(limits)], ...),
                              add_special_tokens=(bool, True))
    tokenizing = next((p for p in pipelines.values() if hasattr(p, "tokenizer")), None)

    async def predict(body: BaseModel) -> list:
        if "classify" not in pipelines:
            raise tei_error(404, f"this server's model ({model}) is not a classifier: no /predict")
        return await tei_predict(body, batchers["classify"], pipelines["classify"])

    async def tokenize(body: BaseModel) -> list[list[dict[str, Any]]]:
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        return tei_tokens(tokenizing.tokenizer, texts, body.add_special_tokens)

    predict.__annotations__["body"], tokenize.__annotations__["body"] = predict_request, tokenize_request
    app.post("/predict", tags=[TEI_TAG], summary="TEI: every label's probability")(predict)
    if tokenizing is not None:
        app.post("/tokenize", tags=[TEI_TAG], summary="TEI: the tokens of texts")(tokenize)
    app.get("/info", tags=[TEI_TAG], summary="TEI: the model and the server's limits")(
        lambda: tei_info(pipelines, model, limits) | (more_info or {}))


async def tei_predict(body: BaseModel, batcher: Batcher, pipe: Any) -> list:
    """Every label with its probability, best first: one list for one input (a text or a [text, pair]), a list of
    them for a list of inputs."""
    # TEI reads a list of two texts as one [text, pair] input (its Sequence::Pair), not as two inputs
    single = isinstance(body.inputs, str) or len(body.inputs) == 2 and all(isinstance(i, str) for i in body.inputs)
    inputs = [body.inputs] if single else body.inputs
    texts = [item if isinstance(item, str) else item[0] for item in inputs]
    pairs = None if all(isinstance(item, str) for item in inputs) else [item[1] for item in inputs]
    check_window(pipe, texts, pairs, body.truncate)
    kinds = tuple(sorted({type(item).__name__ for item in inputs}))
    results = await answered(submit(batcher, "classify", inputs, ((), kinds)), tei_error, 413)
    labelled = [tei_labels(result) for result in results]
    return labelled[0] if single else labelled


def tei_labels(result: dict[str, Any]) -> list[dict[str, Any]]:
    """A classify result as TEI's [{"label", "score"}], best first (a regression model: its one score)."""
    scores = result.get("scores") or {"LABEL_0": result["score"]}
    return [{"label": label, "score": score} for label, score in sorted(scores.items(), key=lambda kv: -kv[1])]


def tei_tokens(tokenizer: Any, texts: list[str], add_special_tokens: bool) -> list[list[dict[str, Any]]]:
    """Each text's tokens as TEI lists them: id, text, special; start and stop (character offsets; null for a
    special token)."""
    rows, _ = tokenizer.encode_rows(texts, max_length=None, truncation=False)
    out = []
    for text, row in zip(texts, rows):
        tokens = []
        for token_id, (start, stop), seq in zip(row.input_ids, row.offsets, row.sequence_ids):
            special = seq is None
            if special and not add_special_tokens:
                continue
            tokens.append({"id": token_id, "text": tokenizer.id_to_token(token_id) if special else text[start:stop],
                           "special": special, "start": None if special else start, "stop": None if special else stop})
        out.append(tokens)
    return out


def tei_info(pipelines: dict[str, Any], model: str, limits: Limits) -> dict[str, Any]:
    """TEI's GET /info for this server: the model's kind (a reranker, else a classifier, else an embedder)."""
    task = next((t for t in ("rerank", "classify", "embed") if t in pipelines), next(iter(pipelines)))
    pipe = pipelines[task]
    window = getattr(pipe, "max_length", 512)
    return {"model_id": model, "model_sha": None, "model_dtype": DTYPES.get(pipe.precision, pipe.precision),
            "model_type": model_type(task, pipe), "max_concurrent_requests": TEI_MAX_CONCURRENT,
            "max_input_length": window, "max_batch_tokens": limits.max_batch * window,
            "max_batch_requests": None, "max_client_batch_size": limits.max_batch, "auto_truncate": False,
            "tokenization_workers": 1, "version": __version__, "sha": None, "docker_label": None}


def model_type(task: str, pipe: Any) -> dict[str, Any]:
    """TEI's model_type: {"embedding": {"pooling"}}, or {"classifier"|"reranker": {"id2label", "label2id"}}."""
    if task == "embed":
        return {"embedding": {"pooling": getattr(pipe, "pooling", "mean")}}
    labels = getattr(pipe, "labels", None) or ["LABEL_0"]
    labels = {"id2label": {str(i): name for i, name in enumerate(labels)},
              "label2id": {name: i for i, name in enumerate(labels)}}
    return {"reranker" if task == "rerank" else "classifier": labels}
