"""Hugging Face text-embeddings-inference's HTTP API for a classifier, on the one serving state.

    curl -s -H 'Content-Type: application/json' -d '{"inputs": "A wonderful film.", "truncate": true}' \\
      127.0.0.1:8000/predict
    python -c "from huggingface_hub import InferenceClient as C; print(C(model='http://127.0.0.1:8000')\\
.text_classification('A wonderful film.'))"

TEI's routes, shapes and error body, on the default model; where qserve reads a field otherwise: docs/migration.md."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from qserve import __version__
from qserve import problemtypes as problems
from qserve.serve.core.answer import Answer, InferenceRequest, Origin
from qserve.serve.core.pairs import takes_pairs
from qserve.serve.core.schemas import LongText, PositiveJsonInt, Text, TokenIdJsonInt
from qserve.serve.core.state import ModelRuntime, ServedModel, ServeState
from qserve.serve.core.texts import check_texts
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.errors import ApiError
from qserve.serve.protocols.spec import ErrorShape, OpenApi, ProtocolSpec, Published, Route, json_body
from qserve.textpairs import PAIR

T = TypeVar("T")

TYPES = {400: "empty", 413: "validation", 422: "validation", 424: "backend", 429: "overloaded", 503: "unhealthy"}
STATUS_OF = {400: 422, 404: 413, 413: 413, 415: 422, 422: 413, 429: 429, 500: 424, 503: 503, 504: 424}
"""A qserve status inside a TEI route -> TEI's: a check that refused the input is TEI's Validation (413)."""
ORIGIN = Origin("tei")
Scored = dict[str, float | str]
"""One label's {label, score} (or {score, label}: TEI's order)."""
POLICY = {"Right": "head", "right": "head", "Left": "tail", "left": "tail"}


def error_body(status: int, message: str) -> dict[str, str]:
    return {"error": message, "error_type": TYPES.get(status, "validation" if status < 500 else "backend")}


def error_status(status: int, validation: bool) -> int:
    """TEI's status for a qserve answer `status`; `validation`: the body did not parse (TEI/axum: 422)."""
    return 422 if validation else (status if status in (401, 405) else STATUS_OF.get(status, 424))


def expected(cfg: ServeConfig) -> str:
    """What a body TEI's routes refuse should have been."""
    return (
        'expected TEI\'s {"inputs": str | [text] | [text, text_pair] | [[text, text_pair], ...], '
        '"truncate": bool, "truncation_direction": "Right" | "Left", "raw_scores": bool} with '
        f"1..{cfg.max_inputs} non-empty texts of at most {cfg.max_chars} characters"
    )


# -- schemas ---------------------------------------------------------------------------------------
TeiSequence = Annotated[list[Text], Field(min_length=1, max_length=2)]


class TeiPredictRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"inputs": "A moving, beautifully shot film.", "truncate": True},
                {"inputs": [["Loved it."], ["A waste of two hours."]], "raw_scores": True},
            ]
        },
    )

    inputs: Text | Annotated[list[Text], Field(min_length=1)] | Annotated[list[TeiSequence], Field(min_length=1)] = (
        Field(
            description="A string; a flat list (one text, or [text, text_pair] for a pair model; a one-text model "
            "reads several strings as a batch); or a batch of [text] / [text, text_pair] lists."
        )
    )
    truncate: Annotated[bool, Field(strict=True)] | None = Field(
        default=None,
        description="Cut a text longer than max_length tokens (null: true, as TEI's --auto-truncate); "
        "false: such a text is refused (413). With long_text, the policy applies.",
    )
    truncation_direction: Literal["Right", "Left", "right", "left"] | None = Field(
        default=None,
        description="Right keeps the start of a long text (qserve head), Left its end (tail); "
        "absent: the served model's own long-text policy, as /v1 reads the text.",
    )
    raw_scores: Annotated[bool, Field(strict=True)] = Field(default=False, description="Logits instead of scores.")
    long_text: LongText | None = Field(
        default=None,
        description="qserve extra: a long-text policy (head, tail, head-tail[:H], "
        "windows[:W[:S[:mean|max]]]) in place of truncate/truncation_direction.",
    )


class HfParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    top_k: PositiveJsonInt | None = Field(default=None, description="Labels per input, best first; null = all.")
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = Field(
        default=None, description="Applied to the logits; null = the model's own scores (softmax, sigmoid, value)."
    )


class TeiRootRequest(TeiPredictRequest):
    parameters: HfParameters | None = Field(
        default=None, description="huggingface_hub's InferenceClient form: answered [[{label, score}]] per input."
    )


class TeiPrediction(BaseModel):
    score: float
    label: str


class TeiError(BaseModel):
    error: str
    error_type: str


class TeiTokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inputs: Text | Annotated[list[Text], Field(min_length=1)]
    add_special_tokens: Annotated[bool, Field(strict=True)] = True


class TeiDecodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ids: (
        Annotated[list[TokenIdJsonInt], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenIdJsonInt], Field(min_length=1)]], Field(min_length=1)]
    )
    skip_special_tokens: Annotated[bool, Field(strict=True)] = True


# 401 with --api-key; 415 a body that is not JSON; 413 validation (and a body over --max-body-bytes)
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": TeiError} for code in (401, 413, 415, 422, 424, 429, 503)}


def publish(comps: dict[str, Any], published: Published) -> None:
    """Narrow TEI's `inputs` in the OpenAPI document to the forms the default model takes: a one-text model's
    sequences are [text] (a pair would be refused), a pair model's [text, text_pair] (a lone text would be).
    No readable manifest: every form stays."""
    manifest = published.manifest
    if manifest is None:
        return
    pair = manifest.takes == PAIR
    for name in ("TeiPredictRequest", "TeiRootRequest"):
        inputs = ((comps.get(name) or {}).get("properties") or {}).get("inputs") or {}
        alts = inputs.get("anyOf") or []
        if len(alts) != 3:
            continue
        text, flat, nested = alts
        if pair:
            flat.update(minItems=2, maxItems=2)
            nested["items"].update(minItems=2)
            inputs["anyOf"] = [flat, nested]
        else:
            nested["items"].update(maxItems=1)


# -- decoding ---------------------------------------------------------------------------------------
def sequences(
    st: ServeState, model: ServedModel, inputs: str | list[str] | list[list[str]]
) -> tuple[list[str], list[str] | None, bool]:
    """TEI `inputs` -> (texts, pairs or None, batch?), by TEI's grammar and the model's inputs (pairs.py)."""
    pair_model = takes_pairs(model.runtime)
    if isinstance(inputs, str):
        seqs, batch = [[inputs]], False
    elif inputs and isinstance(inputs[0], str):
        if pair_model or len(inputs) == 1:  # TEI: [text] is one text, [text, text_pair] one pair
            if len(inputs) > 2:
                raise ApiError(
                    422,
                    f"inputs has {len(inputs)} strings; a flat list is one sequence: [text] or "
                    "[text, text_pair]; send a batch as [[text, text_pair], ...]",
                )
            seqs, batch = [list(inputs)], False
        else:  # a one-text model cannot take a pair: several strings are a batch of texts
            seqs, batch = [[t] for t in inputs], True
    else:
        seqs, batch = [list(s) for s in inputs], True
    for i, s in enumerate(seqs):
        where = f"inputs[{i}]" if batch else "inputs"
        if len(s) == 2 and not pair_model:
            raise ApiError(
                422,
                f"{where} is a [text, text_pair] pair, but model {model.name!r} takes one text per input; send [text]",
            )
        if len(s) == 1 and pair_model:
            raise ApiError(
                422, f"{where} is a single text, but model {model.name!r} takes text pairs; send [text, text_pair]"
            )
    texts = [s[0] for s in seqs]
    check_texts(st.config, texts, "inputs")
    if not pair_model:
        return texts, None, batch
    pairs = [s[1] for s in seqs]
    check_texts(st.config, pairs, "inputs", "text_pair")
    return texts, pairs, batch


def body_error(e: ApiError) -> ApiError:
    """Mark a refusal of a field's value (not of the input): TEI answers it 422, as a body it cannot read."""
    e.body_error = True  # type: ignore[attr-defined]
    return e


def policy_of(body: TeiPredictRequest, model: ServedModel, pair: bool) -> str | None:
    """The qserve long-text policy a TEI request asks for: `long_text` when given (it replaces truncate and
    truncation_direction), else head (Right) or tail (Left), else None: the model's own, as /v1 reads it."""
    if body.long_text is not None:
        try:
            model.check_policy(body.long_text, "long_text")  # a policy the model cannot apply: 422, named
        except ApiError as e:
            raise body_error(e) from None
        return body.long_text
    if body.truncation_direction is None:
        return None
    if pair and POLICY[body.truncation_direction] == "tail":
        raise body_error(
            ApiError(
                422,
                "truncation_direction Left is not supported for text pairs: a pair is cut as "
                "its tokenizer cuts it (longest first); send Right or leave it out",
            )
        )
    return POLICY[body.truncation_direction]


# -- the one call into the serving state ---------------------------------------------------------------
async def answer(
    st: ServeState, request: Request, model: ServedModel, texts: list[str], pairs: list[str] | None, policy: str | None
) -> Answer:
    """Queue the texts on `model` (the default) under `policy`: every protocol's one call (state.py)."""
    rid = request.state.request_id
    return await st.submit(InferenceRequest(model.name, texts, ORIGIN, request.scope, rid, pairs, policy))


# -- encoding ---------------------------------------------------------------------------------------
def transform(ans: Answer, function: str | None) -> np.ndarray:
    """The scores a request asked for: the model's own (bit for bit /v1's), or `function` of the logits."""
    if function is None or (function, ans.problem_type) in (("softmax", problems.SINGLE), ("sigmoid", problems.MULTI)):
        return ans.probs
    if function == "none":
        return ans.logits
    kind = problems.SINGLE if function == "softmax" else problems.MULTI
    return np.asarray(problems.scores(ans.logits, kind), dtype=np.float32)


def predictions(scores: np.ndarray, ans: Answer, top_k: int | None = None) -> list[list[Scored]]:
    # every label sorted by score (a regression model: its value), as /v1 orders them
    problem = ans.problem_type if ans.problem_type == problems.REGRESSION else problems.SINGLE
    return [
        [{"score": p["score"], "label": p["label"]} for p in row]
        for row in problems.label_scores(scores, list(ans.labels), problem, top_k, None)
    ]


def check_length(ans: Answer, truncate: bool) -> None:
    if truncate:
        return
    for n, cut in zip(ans.tokens, ans.truncated):
        if cut:
            raise ApiError(
                413, f"Input validation error: `inputs` must have less than {ans.max_length} tokens. Given: {n}"
            )


async def predict(
    st: ServeState, body: TeiPredictRequest, request: Request, hf: HfParameters | None = None
) -> list[list[Scored]] | list[Scored]:
    model = st.model(None, request)
    texts, pairs, batch = sequences(st, model, body.inputs)
    ans = await answer(st, request, model, texts, pairs, policy_of(body, model, pairs is not None))
    check_length(ans, body.truncate is not False or body.long_text is not None)
    if hf is not None:  # the HF Inference API form (InferenceClient): one list per input, label first
        rows = predictions(transform(ans, hf.function_to_apply), ans, hf.top_k)
        return [[{"label": p["label"], "score": p["score"]} for p in row] for row in rows]
    rows = predictions(transform(ans, "none" if body.raw_scores else None), ans)
    return rows if batch else rows[0]


async def root_answer(st: ServeState, body: TeiRootRequest, request: Request) -> list[list[Scored]] | list[Scored]:
    """POST /: /predict's answer, or with `parameters` the HF Inference API form (huggingface_hub's InferenceClient)."""
    hf = (body.parameters or HfParameters()) if "parameters" in body.model_fields_set else None
    return await predict(st, body, request, hf)


async def tei_info(st: ServeState, body: bytes, request: Request) -> dict[str, object]:
    """TEI's Info for the default model."""
    model = st.model(None)
    rt, cfg = model.runtime, st.config
    labels = list(rt.labels)
    dtype = rt.manifest.spec.dtype or "fp32"
    return {
        "model_id": model.name,
        "model_sha": model.version,
        "model_dtype": {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype),
        "model_type": {
            "classifier": {
                "id2label": {str(i): x for i, x in enumerate(labels)},
                "label2id": {x: i for i, x in enumerate(labels)},
            }
        },
        "prompts": None,
        "default_prompt": None,
        "max_concurrent_requests": cfg.max_queue,
        "max_input_length": rt.max_length,
        "max_batch_tokens": cfg.max_batch_tokens or cfg.batch_size * rt.max_length,
        "max_batch_requests": cfg.batch_size,
        "max_client_batch_size": cfg.max_inputs,
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": __version__,
        "sha": None,
        "docker_label": None,
    }


def _tokenize(tokenizer: Any, texts: list[str], special: bool) -> list[list[dict[str, Any]]]:
    specials = set(tokenizer.all_special_ids)
    out = []
    for text in texts:
        enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True, truncation=False)
        pieces = tokenizer.convert_ids_to_tokens(enc["input_ids"])
        row = []
        for tid, piece, (a, b) in zip(enc["input_ids"], pieces, enc["offset_mapping"]):
            is_special = tid in specials and a == b
            row.append(
                {
                    "id": int(tid),
                    "text": piece if is_special else text[a:b],
                    "special": is_special,
                    "start": None if is_special else int(a),
                    "stop": None if is_special else int(b),
                }
            )
        out.append(row)
    return out


async def with_tokenizer(st: ServeState, rt: ModelRuntime, fn: Callable[[Any], T]) -> T:
    """`fn(the tokenizer)` on the thread that runs the model, under the runtime's tokenizer_lock: the fast tokenizer
    is not thread-safe, and a busy server's lanes tokenize on their own threads (batcher.py)."""

    def locked() -> T:
        with rt.tokenizer_lock:
            return fn(rt.tokenizer)

    return await asyncio.get_running_loop().run_in_executor(st.executor, locked)


async def tokenize(st: ServeState, body: TeiTokenizeRequest, request: Request) -> list[list[dict[str, Any]]]:
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    check_texts(st.config, texts, "inputs")
    rt = st.model(None, request).runtime
    return await with_tokenizer(st, rt, lambda tok: _tokenize(tok, texts, body.add_special_tokens))


async def decode(st: ServeState, body: TeiDecodeRequest, request: Request) -> list[str]:
    rows: list[Any] = [body.ids] if body.ids and isinstance(body.ids[0], int) else list(body.ids)  # lists of ids
    if len(rows) > st.config.max_inputs:
        raise ApiError(422, f"ids has {len(rows)} sequences; at most {st.config.max_inputs} (--max-inputs)")
    rt = st.model(None, request).runtime  # ids its tokenizer does not know decode to nothing, as in TEI
    skip = body.skip_special_tokens
    return await with_tokenizer(st, rt, lambda tok: [tok.decode(r, skip_special_tokens=skip) for r in rows])


# -- the declaration (registry.py serves it) ---------------------------------------------------------------
PREDICTION = list[TeiPrediction] | list[list[TeiPrediction]]
TEI = ProtocolSpec(
    name="tei",
    metrics_label="tei",
    errors=ErrorShape(status=error_status, body=error_body),
    expected=expected,
    openapi=OpenApi(
        texts=("TeiPredictRequest", "TeiRootRequest", "TeiTokenizeRequest"),
        long_text=("TeiPredictRequest", "TeiRootRequest"),
        publish=publish,
    ),
    routes=(
        Route(
            "POST",
            "/predict",
            predict,
            dict(
                response_model=PREDICTION,
                tags=["tei"],
                responses=ERRORS,
                summary="TEI: classify a text, a pair or a batch; [{score, label}] per input, by score",
            ),
            body=json_body(TeiPredictRequest),
            name="tei_predict",
            inference=True,
        ),
        # huggingface_hub's InferenceClient posts here; GET / beside it is the page (page.py)
        Route(
            "POST",
            "/",
            root_answer,
            dict(
                response_model=PREDICTION,
                tags=["tei"],
                responses=ERRORS,
                summary="TEI's / for a classifier (= /predict); with `parameters`, "
                "huggingface_hub's InferenceClient form, answered [[{label, score}]]",
            ),
            body=json_body(TeiRootRequest),
            name="tei_root",
            inference=True,
        ),
        Route(
            "GET",
            "/info",
            tei_info,
            dict(
                tags=["tei"],
                responses={code: {"model": TeiError} for code in (401, 503)},
                summary="TEI: the served (default) model, its labels and limits",
            ),
        ),
        Route(
            "POST",
            "/tokenize",
            tokenize,
            dict(tags=["tei"], responses=ERRORS, summary="TEI: the default model's tokens of each input"),
            body=json_body(TeiTokenizeRequest),
            name="tei_tokenize",
        ),
        Route(
            "POST",
            "/decode",
            decode,
            dict(
                tags=["tei"], responses=ERRORS, summary="TEI: token ids back to text with the default model's tokenizer"
            ),
            body=json_body(TeiDecodeRequest),
            name="tei_decode",
        ),
    ),
)
