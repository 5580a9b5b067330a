"""The /v1 pipeline-style API: POST /v1/classify (the HF text-classification pipeline's answer) and GET /v1/models.

    curl -s -H 'Content-Type: application/json' -d '{"inputs": ["great"], "top_k": 1}' 127.0.0.1:8000/v1/classify

/v1 is the default protocol (registry.py): a body refused on a route of a protocol that says nothing of its own
is told /v1's form. /v1/models carries OpenAI's list shape (object, data) beside qserve's own keys, so
OpenAI-style clients can list the models.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from qserve.problemtypes import MULTI, label_scores
from qserve.problemtypes import Threshold as Thresholds
from qserve.serve.core.answer import InferenceRequest, Origin
from qserve.serve.core.pairs import text_inputs
from qserve.serve.core.schemas import ROUTE_ERRORS, ErrorResponse, LongText, PositiveJsonInt, Text, TextPair, Threshold
from qserve.serve.core.state import ServedModel, ServeState
from qserve.serve.infra.config import ServeConfig
from qserve.serve.protocols.spec import OpenApi, ProtocolSpec, Published, Route, json_body
from qserve.textpairs import PAIR

ORIGIN = Origin("v1")


# -- bodies ------------------------------------------------------------------------------------------
class ClassifyRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"inputs": "A moving, beautifully shot film."},
                {"inputs": ["Loved it.", "A waste of two hours."], "top_k": 1},
                {"inputs": [{"text": "A man plays a guitar.", "text_pair": "Someone makes music."}]},
            ]
        },
    )

    inputs: Text | TextPair | Annotated[list[Text | TextPair], Field(min_length=1)] = Field(
        description="One text, or a list of texts; for a text-pair model (its inputs in GET /v1/models), "
        "{text, text_pair} objects instead of texts."
    )
    top_k: PositiveJsonInt | None = Field(
        default=None,
        description='Labels per input, best first; null = all labels. An integer: "2" and true are refused.',
    )
    model: Annotated[str, Field(strict=True)] | None = Field(
        default=None,
        description="Optional: the served model to use (GET /v1/models lists them); default: the "
        "first one the server was started with.",
    )
    long_text: LongText | None = Field(
        default=None,
        description="What to read of a text longer than max_length tokens: head, tail, head-tail[:H] "
        "or windows[:W[:S[:mean|max]]]; null = the server's default.",
    )
    threshold: Threshold | None = Field(
        default=None,
        description="Multi-label models only: the sigmoid score in [0, 1] at and above which a label "
        "is on; null = the server's --threshold (default 0.5).",
    )


class LabelScore(BaseModel):
    label: str = Field(description='The label; "value" for a regression model.')
    score: float = Field(
        description="Softmax probability (single-label), sigmoid score (multi-label) or the "
        "predicted value (regression)."
    )
    on: bool | None = Field(default=None, description="Multi-label models only: score >= the threshold.")


class ClassifyResponse(BaseModel):
    model: str = Field(description="Name the variant is served under.")
    model_version: str = Field(
        description="The answering model's version: its manifest's short hash (a hot swap changes it)."
    )
    model_name: str = Field(description="The fine-tuned model the variant was exported from.")
    predictions: list[list[LabelScore]] = Field(
        description="Per input, in input order: [{label, score}] sorted by score (the HF "
        "text-classification pipeline format); multi-label: every label with `on`; regression: "
        '[{"label": "value", "score": v}].'
    )
    problem_type: str = Field(description="single_label_classification, multi_label_classification or regression.")
    threshold: float | None = Field(
        default=None,
        description="Multi-label models only: the threshold applied to every label (the request's, else --threshold).",
    )
    thresholds: dict[str, float] | None = Field(
        default=None,
        description="Multi-label variants calibrated by `qserve gate`, when the request sends no "
        "threshold: label -> the threshold applied to it (fitted on held-out data).",
    )
    temperature: float | None = Field(
        default=None,
        description="Single-label variants calibrated by `qserve gate`: the scores are the softmax "
        "of the logits divided by this temperature (fitted on held-out data).",
    )
    truncated: list[bool] = Field(
        description="Per input: was part of the text unseen (longer than max_length "
        "tokens, or more windows than --max-windows)."
    )
    tokens: list[int] = Field(description="Per input: the text's token count, special tokens included.")
    windows: list[int] = Field(description="Per input: how many pieces of the text were scored (1 unless windowed).")
    long_text: str = Field(description="The long-text policy applied, written out in full.")
    max_length: int = Field(description="Most tokens the model reads at once (per window when windowed).")


# -- POST /v1/classify -------------------------------------------------------------------------------
def threshold_fields(labels: list[str], threshold: Thresholds | None) -> dict[str, object]:
    """/v1's record of the threshold applied: `threshold` (one for all), `thresholds` (label -> its own), or none."""
    if threshold is None:
        return {}
    if isinstance(threshold, tuple):
        return {"thresholds": dict(zip(labels, threshold))}
    return {"threshold": threshold}


async def classify(st: ServeState, body: ClassifyRequest, request: Request) -> dict[str, object]:
    """POST /v1/classify's answer to a validated body."""
    model = st.model(body.model, request)
    texts, pairs = text_inputs(st, model, body.inputs)  # a pair model's {text, text_pair} (pairs.py)
    rid = request.state.request_id
    req = InferenceRequest(model.name, texts, ORIGIN, request.scope, rid, pairs, body.long_text, body.threshold)
    a = await st.submit(req)
    return {
        "model": a.name,
        "model_version": a.version,
        "model_name": a.runtime.manifest.model_name,
        "predictions": label_scores(a.probs, a.labels, a.problem_type, body.top_k, a.threshold),
        "problem_type": a.problem_type,
        **threshold_fields(a.labels, a.threshold),
        **({"temperature": t} if (t := a.runtime.manifest.temperature) is not None else {}),
        "truncated": a.truncated,
        "tokens": a.tokens,
        "windows": a.windows,
        "long_text": a.policy,
        "max_length": a.max_length,
    }


def expected(cfg: ServeConfig) -> str:
    """What a body /v1/classify refuses should have been (and any route of a protocol that says nothing itself)."""
    return (
        'expected {"inputs": str | list[str], "top_k": int >= 1 | null} (a text-pair model: '
        '{"text", "text_pair"} objects in place of strings) with '
        f"1..{cfg.max_inputs} non-empty texts of at most {cfg.max_chars} characters"
    )


# -- GET /v1/models ----------------------------------------------------------------------------------
def created(model: ServedModel) -> int:
    """The manifest's creation time as Unix seconds (OpenAI's `created`); 0 when it has none."""
    try:
        return int(datetime.fromisoformat(str(model.runtime.manifest.created)).timestamp())
    except (TypeError, ValueError):
        return 0


def openai_models(st: ServeState) -> dict[str, object]:
    """OpenAI's list shape, carried beside /v1/models' own keys."""
    return {
        "object": "list",
        "data": [
            {"id": m.name, "object": "model", "created": created(m), "owned_by": "qserve"} for m in st.models.values()
        ],
    }


async def v1_models(st: ServeState, body: bytes, request: Request) -> dict:
    st.require_ready()
    # OpenAI's list shape (object, data) beside qserve's own keys, so OpenAI-style clients can list models
    return {
        "models": [m.summary() for m in st.models.values()],
        "default": st.default,
        **(await st.engine_info()),
        **openai_models(st),
    }


# -- the OpenAPI document ----------------------------------------------------------------------------
def publish(comps: dict[str, Any], published: Published) -> None:
    """ClassifyRequest narrowed to the default model: a `threshold` only a multi-label model takes (null for the
    others), and only the input forms it takes (a one-text model's document has no {text, text_pair}, a pair
    model's no lone texts), so a schema-valid request is one it accepts. No readable manifest: every form stays."""
    answers = published.answers
    threshold = ((comps.get("ClassifyRequest") or {}).get("properties") or {}).get("threshold")
    if answers is not None and answers.problem != MULTI and isinstance(threshold, dict) and "anyOf" in threshold:
        threshold["anyOf"] = [alt for alt in threshold["anyOf"] if alt.get("type") == "null"]
    manifest = published.manifest
    if manifest is None:
        return
    pair = manifest.takes == PAIR

    def keep(alts: list[Any]) -> list[Any]:
        is_pair = [("TextPair" in a.get("$ref", "")) for a in alts]
        return [a for a, p in zip(alts, is_pair) if p == pair] if any(is_pair) else alts

    request = comps.get("ClassifyRequest") or {}
    if isinstance(request.get("examples"), list):  # examples are requests too: only the model's own form
        request["examples"] = [
            e
            for e in request["examples"]
            if pair
            == any(
                isinstance(x, dict)
                for x in (e.get("inputs") if isinstance(e.get("inputs"), list) else [e.get("inputs")])
            )
        ]
    inputs = (request.get("properties") or {}).get("inputs") or {}
    if "anyOf" in inputs:
        inputs["anyOf"] = keep(inputs["anyOf"])
        for alt in inputs["anyOf"]:
            if isinstance(alt.get("items"), dict) and "anyOf" in alt["items"]:
                alt["items"]["anyOf"] = keep(alt["items"]["anyOf"])


V1 = ProtocolSpec(
    name="v1",
    metrics_label="v1",
    expected=expected,
    hint="POST /v1/classify",
    openapi=OpenApi(texts=("ClassifyRequest", "TextPair"), long_text=("ClassifyRequest",), publish=publish),
    routes=(
        Route(
            "GET",
            "/v1/models",
            v1_models,
            dict(
                tags=["v1"],
                summary="Every served model: manifest summary, version, shadow agreement",
                responses={code: {"model": ErrorResponse} for code in (401, 503)},
            ),
        ),
        Route(
            "POST",
            "/v1/classify",
            classify,
            dict(
                tags=["v1"],
                response_model=ClassifyResponse,
                responses=ROUTE_ERRORS,
                summary="Classify one text or a list; [{label, score}] per input, best first",
            ),
            body=json_body(ClassifyRequest),
            inference=True,
        ),
    ),
)
