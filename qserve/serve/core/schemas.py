"""The field types and bodies every protocol's request and response models are built from.

    curl -s 127.0.0.1:8000/openapi.json | python -m json.tool | less

Pydantic checks only types here; limits that depend on the server's settings are checked in code (texts.py), so
the error can quote the configured values, and the OpenAPI document carries them (app.py).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from qserve.longtext import pattern as long_text_pattern
from qserve.serve.core.texts import VISIBLE_PATTERN

# A text: a real JSON string (no coercion), non-empty, with a visible character. The pattern is
# published for clients; the server checks the same rule in code (texts.py) to name the input.
Text = Annotated[str, Field(strict=True, min_length=1, json_schema_extra={"pattern": VISIBLE_PATTERN})]
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


class ErrorResponse(BaseModel):
    error: str
    request_id: str | None = None


# Every status a classification route can answer (401 only with --api-key; 404 when `model` names another model):
# the OpenAPI `responses` of the classification routes that answer in this error shape.
ROUTE_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 422, 429, 500, 503, 504)
}
