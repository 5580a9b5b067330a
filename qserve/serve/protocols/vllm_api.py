"""vLLM's pooling API for a classifier: POST /classify.

    curl -s -H 'Content-Type: application/json' -d '{"model": "onnx-int8", "input": ["great", "awful"]}' \\
      127.0.0.1:8000/classify

vLLM's answer shape (data: index, label, probs, num_classes; usage); `model` selects a served model. A long text is
read by the model's policy, not refused; truncate_prompt_tokens -1 is qserve's `tail` (docs/migration.md).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from qserve.serve.core.answer import Answer, InferenceRequest, Origin
from qserve.serve.core.pairs import text_inputs
from qserve.serve.core.schemas import ROUTE_ERRORS, LongText, Text, TextPair, TruncationJsonInt
from qserve.serve.core.state import ServedModel, ServeState
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.errors import ApiError
from qserve.serve.protocols.spec import OpenApi, ProtocolSpec, Published, Route, json_body

ORIGIN = Origin("vllm")


class VllmClassifyRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"input": "A moving, beautifully shot film."},
                {"model": None, "input": ["Loved it.", "Dreadful."]},
            ]
        },
    )

    model: Annotated[str, Field(strict=True)] | None = Field(
        default=None, description="The served model (GET /v1/models); null = the default."
    )
    input: Text | Annotated[list[Text], Field(min_length=1)] = Field(description="A text or a list of texts.")
    truncate_prompt_tokens: TruncationJsonInt | None = Field(
        default=None,
        description="-1 (or >= max_length): keep the last max_length tokens of a long text "
        "(vLLM's left truncation); null: the model's long-text policy.",
    )
    user: Annotated[str, Field(strict=True)] | None = Field(default=None, description="Accepted, unused (OpenAI).")
    long_text: LongText | None = Field(
        default=None,
        description="qserve extra: a long-text policy (head, tail, head-tail[:H], "
        "windows[:W[:S[:mean|max]]]); when given, it replaces truncate_prompt_tokens.",
    )


class VllmClassification(BaseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class VllmUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None


class VllmClassifyResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[VllmClassification]
    usage: VllmUsage


def expected(cfg: ServeConfig) -> str:
    """What a body /classify refuses should have been."""
    return (
        'expected vLLM\'s {"model": str | null, "input": str | list[str], "truncate_prompt_tokens": '
        f"int | null}} with 1..{cfg.max_inputs} non-empty texts of at most {cfg.max_chars} characters"
    )


def publish(comps: dict[str, Any], published: Published) -> None:
    """In the OpenAPI document, the truncate_prompt_tokens this server takes: -1, or max_length and more (no
    readable manifest: any)."""
    manifest = published.manifest
    if manifest is None:
        return
    max_length = manifest.max_length
    prop = ((comps.get("VllmClassifyRequest") or {}).get("properties") or {}).get("truncate_prompt_tokens") or {}
    if "anyOf" in prop:
        prop["anyOf"] = [
            {"type": "integer", "enum": [-1]},
            {"type": "integer", "minimum": max_length},
            {"type": "null"},
        ]


def policy_of(body: VllmClassifyRequest, max_length: int) -> str | None:
    """The qserve long-text policy a /classify request asks for (None: the model's default)."""
    k = body.truncate_prompt_tokens
    if k is not None and 0 <= k < max_length:
        raise ApiError(
            422,
            f"truncate_prompt_tokens {k}: qserve reads {max_length} tokens of a text (the model's "
            "max_length); send -1 (keep the last max_length tokens) or leave it out",
        )
    if k is None or body.long_text is not None:  # long_text, qserve's own, replaces truncate_prompt_tokens
        return body.long_text
    return "tail"


# -- the one call into the serving state -----------------------------------------------------------------
async def answer(st: ServeState, request: Request, model: ServedModel, texts: list[str], policy: str | None) -> Answer:
    """Queue the texts on `model` under `policy` (None: its default): every protocol's one call (state.py)."""
    rid = request.state.request_id
    return await st.submit(InferenceRequest(model.name, texts, ORIGIN, request.scope, rid, long_text=policy))


def encode(ans: Answer) -> dict[str, object]:
    labels = list(ans.labels)
    rows = np.asarray(ans.probs)
    data = []
    for i, row in enumerate(rows):
        j = int(np.argmax(row))
        data.append(
            {
                "index": i,
                "label": labels[j] if j < len(labels) else str(j),
                "probs": [float(x) for x in row],
                "num_classes": int(row.shape[0]),
            }
        )
    n = int(sum(ans.tokens))
    return {
        "id": f"classify-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": ans.name,
        "data": data,
        "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0, "prompt_tokens_details": None},
    }


async def classify(st: ServeState, body: VllmClassifyRequest, request: Request) -> dict[str, object]:
    """POST /classify's answer to a validated body."""
    model = st.model(body.model, request)
    inputs: str | list[str | TextPair] = body.input if isinstance(body.input, str) else list(body.input)
    texts, _ = text_inputs(st, model, inputs, "input")  # a pair model refuses lone texts (pairs.py)
    return encode(await answer(st, request, model, texts, policy_of(body, model.runtime.max_length)))


VLLM = ProtocolSpec(
    name="vllm",
    metrics_label="vllm",
    expected=expected,
    openapi=OpenApi(texts=("VllmClassifyRequest",), long_text=("VllmClassifyRequest",), publish=publish),
    routes=(
        Route(
            "POST",
            "/classify",
            classify,
            dict(
                tags=["vllm"],
                response_model=VllmClassifyResponse,
                responses=ROUTE_ERRORS,
                summary="vLLM: classify a text or a list; per input its label, probs and num_classes",
            ),
            body=json_body(VllmClassifyRequest),
            name="vllm_classify",
            inference=True,
        ),
    ),
)
