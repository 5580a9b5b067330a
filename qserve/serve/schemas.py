"""Request/response bodies: the HF pipeline-style /v1 API and the KServe V2 (Open Inference) API.

    curl -s 127.0.0.1:8000/openapi.json | python -m json.tool | less

Pydantic checks only types here; limits that depend on the server's settings
(inputs per request, characters per text) are checked in app.py so the error can
quote the configured values.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"inputs": "A moving, beautifully shot film."},
                     {"inputs": ["Loved it.", "A waste of two hours."], "top_k": 1}]})

    inputs: str | list[str] = Field(description="One text, or a list of texts.")
    top_k: int | None = Field(default=None, ge=1,
                              description="Labels per input, best first; null = all labels.")
    model: str | None = Field(default=None, description="Optional: must equal the served model's name.")


class LabelScore(BaseModel):
    label: str
    score: float


class ClassifyResponse(BaseModel):
    model: str = Field(description="Name the variant is served under.")
    model_name: str = Field(description="The fine-tuned model the variant was exported from.")
    predictions: list[list[LabelScore]] = Field(
        description="Per input, in input order: [{label, score}] sorted by score (the HF "
                    "text-classification pipeline format).")
    truncated: list[bool] = Field(description="Per input: was the text longer than max_length tokens and cut.")
    max_length: int = Field(description="Token limit each text was truncated to.")


class ErrorResponse(BaseModel):
    error: str
    request_id: str | None = None


class V2Tensor(BaseModel):
    """A tensor in the Open Inference Protocol's JSON form (data row-major; may be nested)."""

    model_config = ConfigDict(extra="allow")
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any]


class V2RequestedOutput(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    parameters: dict[str, Any] | None = None


class V2InferRequest(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={
        "examples": [{"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                                  "data": ["Loved it.", "A waste of two hours."]}]}]})
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[V2Tensor]
    outputs: list[V2RequestedOutput] | None = None


class V2InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str
    parameters: dict[str, Any] | None = None
    outputs: list[V2Tensor]


class V2TensorMeta(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class V2ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[V2TensorMeta]
    outputs: list[V2TensorMeta]
    parameters: dict[str, Any] | None = None


def flatten(data: list[Any]) -> list[Any]:
    """V2 clients send data flat or nested by shape; both mean the same row-major tensor."""
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out
