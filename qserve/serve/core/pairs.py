"""Text pairs on the wire: which inputs a served model takes, and the checks every protocol applies.

    curl -s -H 'Content-Type: application/json' 127.0.0.1:8000/v1/classify \\
      -d '{"inputs": [{"text": "A man plays a guitar.", "text_pair": "Someone makes music."}]}'

A pair model (manifest `inputs: ["text", "text_pair"]`, qserve/textpairs.py) takes a pair per input: on
/v1 the HF pipeline's dict form {"text", "text_pair"}, on V2 (HTTP and gRPC) a second BYTES input
`text_pair` of the same shape as `text`. The rule is strict both ways, so that no answer is silently
about something else: a pair model refuses a lone text (its scores would be about an input it was never
trained on) and a one-text model refuses a pair (422 / gRPC INVALID_ARGUMENT naming the input and what
the model takes). An input counts once against --max-inputs; --max-chars holds for each of its texts.
"""

from __future__ import annotations

from typing import Any, Protocol

from qserve.artifact import Manifest
from qserve.runtime.contract import ModelRuntime
from qserve.serve.core.errors import ApiError
from qserve.serve.core.schemas import TextPair
from qserve.serve.core.served_model import ServedModel
from qserve.serve.core.texts import check_texts
from qserve.serve.infra.config import ServeConfig
from qserve.textpairs import PAIR, TEXT, TEXT_PAIR

PAIR_FORM = '{"text": "...", "text_pair": "..."}'


class Serving(Protocol):
    """What these checks need of the serving state (state.ServeState, which imports this module)."""

    @property
    def config(self) -> ServeConfig: ...


def takes_pairs(runtime: ModelRuntime) -> bool:
    return runtime.inputs == PAIR


def v1_inputs(st: Serving, model: ServedModel, inputs: str | TextPair | list[str | TextPair],
              where: str = "inputs") -> tuple[list[str], list[str] | None]:
    """/v1 `inputs` (a text, a {"text", "text_pair"} object, or a list of either) -> (texts, pairs or None),
    checked against what `model` takes and against the server's limits."""
    single = not isinstance(inputs, list)
    items = [inputs] if single else list(inputs)
    pair_model = takes_pairs(model.runtime)
    for i, item in enumerate(items):
        name = where if single else f"{where}[{i}]"
        is_pair = not isinstance(item, str)
        if is_pair and not pair_model:
            raise ApiError(422, f"{name} is a text pair, but model {model.name!r} takes one text per input "
                                f"(its inputs: {TEXT}); send a string")
        if pair_model and not is_pair:
            raise ApiError(422, f"{name} is a single text, but model {model.name!r} takes text pairs (its inputs: "
                                f"{TEXT}, {TEXT_PAIR}); send {PAIR_FORM}")
    if not pair_model:
        check_texts(st.config, items, where)
        return [it for it in items if isinstance(it, str)], None
    texts = [it.text for it in items if isinstance(it, TextPair)]
    pairs = [it.text_pair for it in items if isinstance(it, TextPair)]
    check_texts(st.config, texts, where, TEXT)
    check_texts(st.config, pairs, where, TEXT_PAIR)
    return texts, pairs


def v2_inputs(st: Serving, model: ServedModel,
              named: dict[str, tuple[int, list[str]]]) -> tuple[list[str], list[str] | None]:
    """V2 inputs by name -> (texts, pairs or None): `named` maps each input's name to (its index in the
    request, its decoded elements). Same rules on HTTP and gRPC."""
    rule = (f"model {model.name!r} takes BYTES inputs {TEXT!r} and {TEXT_PAIR!r} of the same shape [n] or [n, 1]"
            if takes_pairs(model.runtime) else
            f"model {model.name!r} takes one BYTES input {TEXT!r} of shape [n] or [n, 1]")
    if TEXT not in named:
        raise ApiError(422, f"no input named {TEXT!r}; {rule} (GET the model metadata)")
    if TEXT_PAIR in named and not takes_pairs(model.runtime):
        raise ApiError(422, f"inputs[{named[TEXT_PAIR][0]}] is {TEXT_PAIR!r}, but {rule}: it is not a pair model")
    if TEXT_PAIR not in named and takes_pairs(model.runtime):
        raise ApiError(422, f"no input named {TEXT_PAIR!r}; {rule}")
    i, texts = named[TEXT]
    check_texts(st.config, texts, f"inputs[{i}].data")
    if TEXT_PAIR not in named:
        return texts, None
    j, pairs = named[TEXT_PAIR]
    if len(pairs) != len(texts):
        raise ApiError(400, f"inputs[{j}] ({TEXT_PAIR}) has {len(pairs)} elements but inputs[{i}] ({TEXT}) has "
                            f"{len(texts)}; {rule}")
    check_texts(st.config, pairs, f"inputs[{j}].data")
    return texts, pairs


def check_same_inputs(model: ServedModel, pairs: list[str] | None) -> None:
    """After a hot swap between a route's checks and the queue: the model now serving must take the same inputs."""
    if takes_pairs(model.runtime) != (pairs is not None):
        what = f"{TEXT}, {TEXT_PAIR}" if takes_pairs(model.runtime) else TEXT
        raise ApiError(422, f"model {model.name!r} was just replaced by a version whose inputs are {what}; "
                            "send the request again in that form")


def metadata_inputs(runtime: ModelRuntime) -> list[dict[str, Any]]:
    """The V2 metadata inputs of a served model: text, and text_pair for a pair model."""
    return [{"name": name, "datatype": "BYTES", "shape": [-1]} for name in runtime.inputs]


def config_inputs(runtime: ModelRuntime) -> list[dict[str, Any]]:
    """Triton model-config inputs of a served model."""
    return [{"name": name, "data_type": "TYPE_STRING", "dims": [-1]} for name in runtime.inputs]


def publish_inputs(comps: dict[str, Any], manifest: Manifest | None) -> None:
    """Narrow the request schemas to what the default model (its manifest `inputs`) takes, so a schema-valid
    request is one it accepts: a one-text model's document has no {text, text_pair} and no `text_pair` input,
    a pair model's no lone texts and two V2 inputs. No readable manifest: both forms stay."""
    if manifest is None:
        return
    pair = manifest.takes == PAIR

    def keep(alts: list[Any]) -> list[Any]:
        is_pair = [("TextPair" in a.get("$ref", "")) for a in alts]
        return [a for a, p in zip(alts, is_pair) if p == pair] if any(is_pair) else alts

    request = comps.get("ClassifyRequest") or {}
    if isinstance(request.get("examples"), list):  # examples are requests too: only the model's own form
        request["examples"] = [e for e in request["examples"]
                               if pair == any(isinstance(x, dict) for x in (e.get("inputs") if isinstance(
                                   e.get("inputs"), list) else [e.get("inputs")]))]
    inputs = (request.get("properties") or {}).get("inputs") or {}
    if "anyOf" in inputs:
        inputs["anyOf"] = keep(inputs["anyOf"])
        for alt in inputs["anyOf"]:
            if isinstance(alt.get("items"), dict) and "anyOf" in alt["items"]:
                alt["items"]["anyOf"] = keep(alt["items"]["anyOf"])
    tensors = ((comps.get("V2InferRequest") or {}).get("properties") or {}).get("inputs") or {}
    name = ((comps.get("V2InputTensor") or {}).get("properties") or {}).get("name") or {}
    if pair:
        tensors["minItems"] = 2
    else:
        tensors["maxItems"] = 1
        if "enum" in name:
            name["enum"] = [TEXT]
