"""What counts as a text the server will classify: valid Unicode with at least one visible character, and
within the request limits (check_texts: --max-inputs, --max-chars).

    python -c "from qserve.serve.core.texts import text_problem; print(text_problem('\\u200b\\u200b'))"

Checked per text, before anything is queued; VISIBLE_PATTERN is the same rule as a regular expression, published
in the OpenAPI schema (why these rules: docs/protocols.md, "Hostile input").
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.errors import ApiError

# Characters that show nothing: whitespace (\s), C0/C1 controls, soft hyphen, combining grapheme
# joiner, Hangul fillers, Mongolian and variation selectors, zero-width and bidi controls,
# word joiner .. invisible operators, BOM. (Surrogates are refused before this rule applies.)
_INVISIBLE = (
    r"\s\u0000-\u001f\u007f-\u009f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f"
    r"\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb"
)
VISIBLE_PATTERN = f"[^{_INVISIBLE}]"
_VISIBLE = re.compile(VISIBLE_PATTERN)


def unicode_problem(text: str) -> str | None:
    """Why `text` is not valid Unicode (a lone surrogate), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (
            f"is not valid Unicode: lone surrogate U+{ord(text[e.start]):04X} at character {e.start} "
            "(a \\uD800-\\uDFFF escape must be half of a high-low pair); send UTF-8 text"
        )
    return None


def text_problem(text: str) -> str | None:
    """Why the server will not classify `text` (invalid Unicode, nothing visible), or None."""
    problem = unicode_problem(text)
    if problem:
        return problem
    if not _VISIBLE.search(text):
        return (
            "has no visible character (only whitespace, control or zero-width characters); every text "
            "needs at least one"
        )
    return None


def check_texts(config: ServeConfig, texts: Sequence[object], where: str, field: str | None = None) -> None:
    """A request's texts (named `where` in the error; each `where[i].field` when `field` is given: a text of a
    /v1 pair) against the server's limits (--max-inputs, --max-chars) and text_problem: each failure a 422
    naming the field, the index and the flag that sets the limit."""
    max_inputs, max_chars = config.max_inputs, config.max_chars
    if not texts:
        raise ApiError(422, f"{where} is empty; send 1..{max_inputs} texts")
    if len(texts) > max_inputs:
        raise ApiError(
            422, f"{where} has {len(texts)} texts; at most {max_inputs} per request (--max-inputs); split the request"
        )
    for i, t in enumerate(texts):
        name = f"{where}[{i}].{field}" if field else f"{where}[{i}]"
        if not isinstance(t, str):
            raise ApiError(422, f"{name} is {type(t).__name__}; every input must be a string")
        problem = text_problem(t)
        if problem:
            raise ApiError(422, f"{name} {problem}")
        if len(t) > max_chars:
            raise ApiError(
                422,
                f"{name} has {len(t)} characters; at most {max_chars} "
                "(--max-chars). Texts over the model's token limit are cut by the long-text "
                "policy, but the character limit bounds the work per request",
            )
