"""KServe V2's bodies (the Open Inference Protocol's JSON): the infer request and response, the model metadata.

    python -c "from qserve.serve.protocols.v2.schemas import V2InferRequest; \\
print(V2InferRequest.model_json_schema()['required'])"

V2InferRequest is read by hand (rest.py: JSON, or a JSON header followed by binary tensor data); the document shows
it as the infer routes' body. The field types (a text, a long-text policy, JSON integers) are every protocol's
(qserve/serve/core/schemas.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from qserve.serve.core.schemas import LongText, NonNegativeJsonInt, PositiveJsonInt, Text


def _json_form(schema: dict[str, Any]) -> None:
    """The published input schema is the plain JSON form (data required, not null); the binary tensor
    data extension, which replaces data by parameters.binary_data_size and bytes after the JSON header,
    cannot be validated as JSON and is described in the infer operation instead."""
    props = schema["properties"]
    props["data"]["anyOf"] = [s for s in props["data"]["anyOf"] if s.get("type") != "null"]
    props["parameters"] = {
        "anyOf": [{"type": "object"}, {"type": "null"}],
        "description": "Tensor parameters; with the binary tensor data extension, "
        "binary_data_size (bytes after the JSON header) replaces data.",
    }
    schema["required"] = sorted(set(schema.get("required", [])) | {"data"})


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
        default=None,
        description="Binary tensor data extension: the tensor's bytes follow the JSON header "
        "(each BYTES element as a 4-byte little-endian length + UTF-8 bytes).",
    )


class V2InputTensor(BaseModel):
    """An input: n UTF-8 texts as a BYTES tensor of shape [n] or [n, 1], in `data` (flat or nested)
    or as binary data after the JSON header (Inference-Header-Content-Length). `text`, and for a
    text-pair model also `text_pair` (same shape)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_json_form)
    name: Literal["text", "text_pair"] = Field(
        description="The model's input name, from GET /v2/models/{name}: text, and text_pair for a text-pair model."
    )
    shape: Annotated[list[PositiveJsonInt], Field(min_length=1, max_length=2)]
    datatype: Literal["BYTES"]
    parameters: V2InputParameters | None = None
    data: (
        Annotated[list[Text], Field(min_length=1)]
        | Annotated[list[Annotated[list[Text], Field(min_length=1, max_length=1)]], Field(min_length=1)]
        | None
    ) = None


class V2OutputParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    binary_data: Annotated[bool, Field(strict=True)] | None = Field(
        default=None, description="Return this output as binary data after the JSON header."
    )


class V2RequestedOutput(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Literal["probabilities", "label", "value", "truncated"]
    parameters: V2OutputParameters | None = None


class V2RequestParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    binary_data_output: Annotated[bool, Field(strict=True)] | None = Field(
        default=None, description="Return every output as binary data (Triton's binary tensor data extension)."
    )
    long_text: LongText | None = Field(
        default=None,
        description="What to read of a text longer than max_length tokens: head, tail, head-tail[:H] "
        "or windows[:W[:S[:mean|max]]]; null = the server's default.",
    )


class V2InferRequest(BaseModel):
    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "inputs": [
                        {
                            "name": "text",
                            "shape": [2],
                            "datatype": "BYTES",
                            "data": ["Loved it.", "A waste of two hours."],
                        }
                    ]
                }
            ]
        },
    )
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


def flatten(data: list[str] | list[list[str]]) -> list[str]:
    """V2 clients send data flat ([n]) or nested by shape ([n, 1]); both mean the same texts."""
    return [x for row in data for x in (row if isinstance(row, list) else [row])]
