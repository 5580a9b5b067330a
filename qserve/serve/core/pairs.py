"""Text pairs on the wire: which inputs a served model takes, and the checks every protocol applies.

    curl -s -H 'Content-Type: application/json' 127.0.0.1:8000/v1/classify \\
      -d '{"inputs": [{"text": "A man plays a guitar.", "text_pair": "Someone makes music."}]}'

Strict both ways (a pair model refuses a lone text, a one-text model a pair: 422 naming the input), so no answer
is silently about an input the model was not trained on; a pair counts once against --max-inputs.
"""

from __future__ import annotations

from typing import Protocol

from qserve.runtime.contract import ModelRuntime
from qserve.serve.core.schemas import TextPair
from qserve.serve.core.served_model import ServedModel
from qserve.serve.core.texts import check_texts
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.errors import ApiError
from qserve.textpairs import PAIR, TEXT, TEXT_PAIR

PAIR_FORM = '{"text": "...", "text_pair": "..."}'


class Serving(Protocol):
    """What these checks need of the serving state (state.ServeState, which imports this module)."""

    @property
    def config(self) -> ServeConfig: ...


def takes_pairs(runtime: ModelRuntime) -> bool:
    return runtime.inputs == PAIR


def text_inputs(
    st: Serving, model: ServedModel, inputs: str | TextPair | list[str | TextPair], where: str = "inputs"
) -> tuple[list[str], list[str] | None]:
    """The HF pipeline's `inputs` (a text, a {"text", "text_pair"} object, or a list of either), named `where` in
    errors -> (texts, pairs or None), checked against what `model` takes and the server's limits."""
    single = not isinstance(inputs, list)
    items = [inputs] if single else list(inputs)
    pair_model = takes_pairs(model.runtime)
    for i, item in enumerate(items):
        name = where if single else f"{where}[{i}]"
        is_pair = not isinstance(item, str)
        if is_pair and not pair_model:
            raise ApiError(
                422,
                f"{name} is a text pair, but model {model.name!r} takes one text per input "
                f"(its inputs: {TEXT}); send a string",
            )
        if pair_model and not is_pair:
            raise ApiError(
                422,
                f"{name} is a single text, but model {model.name!r} takes text pairs (its inputs: "
                f"{TEXT}, {TEXT_PAIR}); send {PAIR_FORM}",
            )
    if not pair_model:
        check_texts(st.config, items, where)
        return [it for it in items if isinstance(it, str)], None
    texts = [it.text for it in items if isinstance(it, TextPair)]
    pairs = [it.text_pair for it in items if isinstance(it, TextPair)]
    check_texts(st.config, texts, where, TEXT)
    check_texts(st.config, pairs, where, TEXT_PAIR)
    return texts, pairs


def check_same_inputs(model: ServedModel, pairs: list[str] | None) -> None:
    """After a hot swap between a route's checks and the queue: the model now serving must take the same inputs."""
    if takes_pairs(model.runtime) != (pairs is not None):
        what = f"{TEXT}, {TEXT_PAIR}" if takes_pairs(model.runtime) else TEXT
        raise ApiError(
            422,
            f"model {model.name!r} was just replaced by a version whose inputs are {what}; "
            "send the request again in that form",
        )
