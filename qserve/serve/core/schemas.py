"""Request/response bodies: the HF pipeline-style /v1 API and the KServe V2 (Open Inference) API.

    curl -s 127.0.0.1:8000/openapi.json | python -m json.tool | less

Pydantic checks only types here; limits that depend on the server's settings
(inputs per request, characters per text) are checked in app.py so the error can
quote the configured values.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from qserve.longtext import pattern as long_text_pattern
from qserve.serve.core.texts import VISIBLE_PATTERN

# A text: a real JSON string (no coercion), non-empty, with a visible character. The pattern is
# published for clients; the server checks the same rule in code (texts.py) to name the input.
Text = Annotated[str, Field(strict=True, min_length=1, json_schema_extra={"pattern": VISIBLE_PATTERN})]
V2_OUTPUTS = ("probabilities", "label", "value", "truncated")
"""Every V2 output name; a model has those of its problem type (qserve/serve/core/outputs.py)."""
# A long-text policy string; app.py publishes the bounds of the served model's max_length in its place.
LongText = Annotated[str, Field(strict=True, json_schema_extra={"pattern": long_text_pattern()})]


def _json_int(v: Any) -> Any:  # Any: a before-validator sees any JSON value
    """JSON has one number type: 2.0 is the integer 2 (as JSON Schema says), but "2" and true are not."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


# Integers as JSON means them: no strings, no booleans, no fractions (2.0 is 2); each spelled out, as a type
# checker reads an annotation, not a call that makes one.
PositiveJsonInt = Annotated[int, Field(strict=True, ge=1), BeforeValidator(_json_int)]
NonNegativeJsonInt = Annotated[int, Field(strict=True, ge=0), BeforeValidator(_json_int)]
# A token id (an unsigned 32-bit integer) and a truncation length (-1: the model's own max_length)
TokenIdJsonInt = Annotated[int, Field(strict=True, ge=0, le=2**32 - 1), BeforeValidator(_json_int)]
TruncationJsonInt = Annotated[int, Field(strict=True, ge=-1), BeforeValidator(_json_int)]


def _json_form(schema: dict[str, Any]) -> None:
    """The published input schema is the plain JSON form (data required, not null); the binary tensor
    data extension, which replaces data by parameters.binary_data_size and bytes after the JSON header,
    cannot be validated as JSON and is described in the infer operation instead."""
    props = schema["properties"]
    props["data"]["anyOf"] = [s for s in props["data"]["anyOf"] if s.get("type") != "null"]
    props["parameters"] = {"anyOf": [{"type": "object"}, {"type": "null"}],
                           "description": "Tensor parameters; with the binary tensor data extension, "
                                          "binary_data_size (bytes after the JSON header) replaces data."}
    schema["required"] = sorted(set(schema.get("required", [])) | {"data"})


def _threshold(v: Any) -> Any:  # Any: a before-validator sees any JSON value
    """A multi-label threshold: a JSON number in [0, 1] (no strings, no booleans)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise ValueError(f"must be a number in [0, 1] (got {v!r})")
    return float(v)


Threshold = Annotated[float, BeforeValidator(_threshold), Field(json_schema_extra={"minimum": 0, "maximum": 1})]


class TextPair(BaseModel):
    """One input of a text-pair model (NLI, cross-encoder, reranker): the HF pipeline's dict form."""

    model_config = ConfigDict(extra="forbid")
    text: Text
    text_pair: Text


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"inputs": "A moving, beautifully shot film."},
                     {"inputs": ["Loved it.", "A waste of two hours."], "top_k": 1},
                     {"inputs": [{"text": "A man plays a guitar.", "text_pair": "Someone makes music."}]}]})

    inputs: Text | TextPair | Annotated[list[Text | TextPair], Field(min_length=1)] = Field(
        description="One text, or a list of texts; for a text-pair model (its inputs in GET /v1/models), "
                    "{text, text_pair} objects instead of texts.")
    top_k: PositiveJsonInt | None = Field(
        default=None, description="Labels per input, best first; null = all labels. An integer: \"2\" and "
                                  "true are refused.")
    model: Annotated[str, Field(strict=True)] | None = Field(
        default=None, description="Optional: the served model to use (GET /v1/models lists them); default: the "
                                  "first one the server was started with.")
    long_text: LongText | None = Field(
        default=None, description="What to read of a text longer than max_length tokens: head, tail, head-tail[:H] "
                                  "or windows[:W[:S[:mean|max]]]; null = the server's default.")
    threshold: Threshold | None = Field(
        default=None, description="Multi-label models only: the sigmoid score in [0, 1] at and above which a label "
                                  "is on; null = the server's --threshold (default 0.5).")


class LabelScore(BaseModel):
    label: str = Field(description='The label; "value" for a regression model.')
    score: float = Field(description="Softmax probability (single-label), sigmoid score (multi-label) or the "
                                     "predicted value (regression).")
    on: bool | None = Field(default=None, description="Multi-label models only: score >= the threshold.")


class ClassifyResponse(BaseModel):
    model: str = Field(description="Name the variant is served under.")
    model_version: str = Field(description="The answering model's version: its manifest's short hash (a hot "
                                           "swap changes it).")
    model_name: str = Field(description="The fine-tuned model the variant was exported from.")
    predictions: list[list[LabelScore]] = Field(
        description="Per input, in input order: [{label, score}] sorted by score (the HF "
                    "text-classification pipeline format); multi-label: every label with `on`; regression: "
                    '[{"label": "value", "score": v}].')
    problem_type: str = Field(description="single_label_classification, multi_label_classification or regression.")
    threshold: float | None = Field(default=None, description="Multi-label models only: the threshold applied to "
                                                              "every label (the request's, else --threshold).")
    thresholds: dict[str, float] | None = Field(
        default=None, description="Multi-label variants calibrated by `qserve gate`, when the request sends no "
                                  "threshold: label -> the threshold applied to it (fitted on held-out data).")
    temperature: float | None = Field(
        default=None, description="Single-label variants calibrated by `qserve gate`: the scores are the softmax "
                                  "of the logits divided by this temperature (fitted on held-out data).")
    truncated: list[bool] = Field(description="Per input: was part of the text unseen (longer than max_length "
                                              "tokens, or more windows than --max-windows).")
    tokens: list[int] = Field(description="Per input: the text's token count, special tokens included.")
    windows: list[int] = Field(description="Per input: how many pieces of the text were scored (1 unless windowed).")
    long_text: str = Field(description="The long-text policy applied, written out in full.")
    max_length: int = Field(description="Most tokens the model reads at once (per window when windowed).")


class ErrorResponse(BaseModel):
    error: str
    request_id: str | None = None


# Every status a classification route can answer (401 only with --api-key; 404 when `model` names another model):
# the OpenAPI `responses` of the classification routes that answer in this error shape.
ROUTE_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse}
                                                 for code in (400, 401, 404, 413, 415, 422, 429, 500, 503, 504)}


class V2Tensor(BaseModel):
    """An output tensor in the Open Inference Protocol's JSON form (data row-major), or, with the
    binary tensor data extension, parameters.binary_data_size bytes after the JSON header."""

    model_config = ConfigDict(extra="allow")
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class V2InputParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    binary_data_size: NonNegativeJsonInt | None = Field(
        default=None, description="Binary tensor data extension: the tensor's bytes follow the JSON header "
                                  "(each BYTES element as a 4-byte little-endian length + UTF-8 bytes).")


class V2InputTensor(BaseModel):
    """An input: n UTF-8 texts as a BYTES tensor of shape [n] or [n, 1], in `data` (flat or nested)
    or as binary data after the JSON header (Inference-Header-Content-Length). `text`, and for a
    text-pair model also `text_pair` (same shape)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_json_form)
    name: Literal["text", "text_pair"] = Field(description="The model's input name, from GET /v2/models/{name}: "
                                                           "text, and text_pair for a text-pair model.")
    shape: Annotated[list[PositiveJsonInt], Field(min_length=1, max_length=2)]
    datatype: Literal["BYTES"]
    parameters: V2InputParameters | None = None
    data: Annotated[list[Text], Field(min_length=1)] | Annotated[
        list[Annotated[list[Text], Field(min_length=1, max_length=1)]], Field(min_length=1)] | None = None


class V2OutputParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    binary_data: Annotated[bool, Field(strict=True)] | None = Field(
        default=None, description="Return this output as binary data after the JSON header.")


class V2RequestedOutput(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Literal["probabilities", "label", "value", "truncated"]
    parameters: V2OutputParameters | None = None


class V2RequestParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    binary_data_output: Annotated[bool, Field(strict=True)] | None = Field(
        default=None, description="Return every output as binary data (Triton's binary tensor data extension).")
    long_text: LongText | None = Field(
        default=None, description="What to read of a text longer than max_length tokens: head, tail, head-tail[:H] "
                                  "or windows[:W[:S[:mean|max]]]; null = the server's default.")


class V2InferRequest(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={
        "examples": [{"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                                  "data": ["Loved it.", "A waste of two hours."]}]}]})
    id: Annotated[str, Field(strict=True)] | None = None
    parameters: V2RequestParameters | None = None
    inputs: Annotated[list[V2InputTensor], Field(min_length=1, max_length=2)]
    outputs: Annotated[list[V2RequestedOutput], Field(min_length=1)] | None = None


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
