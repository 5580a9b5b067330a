"""KServe V2's tensors, for HTTP and gRPC alike: the inputs a model takes, the outputs it answers, BYTES on the wire.

    python -c "from qserve.serve.protocols.v2.tensors import OUTPUTS; print(OUTPUTS)"

Inputs: BYTES `text` of shape [n] or [n, 1] (and `text_pair`, same shape, for a pair model); outputs by problem
type (OUTPUTS) and truncated BOOL [n]. A binary BYTES element: a 4-byte little-endian length + its UTF-8 bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from math import prod
from typing import Any

import numpy as np

from qserve import problemtypes as problems
from qserve.runtime.contract import ModelRuntime
from qserve.serve.core.answer import Answer
from qserve.serve.core.pairs import Serving, takes_pairs
from qserve.serve.core.served_model import ServedModel
from qserve.serve.core.texts import check_texts
from qserve.serve.infra.errors import ApiError
from qserve.textpairs import TEXT, TEXT_PAIR

OUTPUTS = {
    problems.SINGLE: ("probabilities", "label", "truncated"),
    problems.MULTI: ("probabilities", "truncated"),
    problems.REGRESSION: ("value", "truncated"),
}
"""Output names per problem type, in the order they are answered when a request names none."""
Values = np.ndarray | list[str] | list[bool]
"""A tensor's values: an FP32 array, BYTES strs or BOOLs."""
Tensor = tuple[dict[str, Any], Values]
"""(tensor meta {name, datatype, shape}, values)."""


def output_names(problem: str) -> tuple[str, ...]:
    return OUTPUTS[problem]


def answered_outputs(asked: list[str]) -> Callable[[ServedModel], tuple[str, ...]]:
    """The outputs a request answers, resolved against the model that runs it (ServeState.submit's `outputs`):
    those it named, in its order, else all of the model's; 422 naming the first it does not have."""

    def resolve(model: ServedModel) -> tuple[str, ...]:
        problem = model.runtime.problem_type
        have = output_names(problem)
        names = tuple(asked) or have
        for i, name in enumerate(names):
            if name not in have:
                raise ApiError(
                    422,
                    f"outputs[{i}].name is {name!r}; model {model.name!r} ({problems.short(problem)}) "
                    f"has outputs {', '.join(have)}",
                )
        return names

    return resolve


def output_values(a: Answer) -> dict[str, Tensor]:
    """Every output of the answering model's problem type by name: (tensor meta, values)."""
    scores = a.probs
    n, k = scores.shape
    out: dict[str, Tensor] = {}
    if a.problem_type == problems.REGRESSION:
        out["value"] = ({"name": "value", "datatype": "FP32", "shape": [n, k]}, scores)
    else:
        out["probabilities"] = ({"name": "probabilities", "datatype": "FP32", "shape": [n, k]}, scores)
    if a.problem_type == problems.SINGLE:
        out["label"] = (
            {"name": "label", "datatype": "BYTES", "shape": [n]},
            [a.labels[j] for j in scores.argmax(axis=1)],
        )
    out["truncated"] = ({"name": "truncated", "datatype": "BOOL", "shape": [n]}, a.truncated)
    return out


def metadata_outputs(problem: str, k: int) -> list[dict[str, Any]]:
    """The model metadata's outputs (GET /v2/models/{name}, gRPC ModelMetadata)."""
    meta = {
        "probabilities": {"datatype": "FP32", "shape": [-1, k]},
        "value": {"datatype": "FP32", "shape": [-1, k]},
        "label": {"datatype": "BYTES", "shape": [-1]},
        "truncated": {"datatype": "BOOL", "shape": [-1]},
    }
    return [{"name": name, **meta[name]} for name in output_names(problem)]


def config_outputs(problem: str, k: int) -> list[dict[str, Any]]:
    """The Triton-style model configuration's outputs (GET /v2/models/{name}/config, gRPC ModelConfig)."""
    types = {"FP32": "TYPE_FP32", "BYTES": "TYPE_STRING", "BOOL": "TYPE_BOOL"}
    return [
        {"name": o["name"], "data_type": types[o["datatype"]], "dims": o["shape"]} for o in metadata_outputs(problem, k)
    ]


def metadata_inputs(runtime: ModelRuntime) -> list[dict[str, Any]]:
    """The model metadata's inputs: text, and text_pair for a pair model."""
    return [{"name": name, "datatype": "BYTES", "shape": [-1]} for name in runtime.inputs]


def config_inputs(runtime: ModelRuntime) -> list[dict[str, Any]]:
    """The Triton model configuration's inputs."""
    return [{"name": name, "data_type": "TYPE_STRING", "dims": [-1]} for name in runtime.inputs]


def named_inputs(
    st: Serving, model: ServedModel, named: dict[str, tuple[int, list[str]]]
) -> tuple[list[str], list[str] | None]:
    """The inputs by name -> (texts, pairs or None): `named` maps each input's name to (its index in the
    request, its decoded elements). Same rules on HTTP and gRPC."""
    rule = (
        f"model {model.name!r} takes BYTES inputs {TEXT!r} and {TEXT_PAIR!r} of the same shape [n] or [n, 1]"
        if takes_pairs(model.runtime)
        else f"model {model.name!r} takes one BYTES input {TEXT!r} of shape [n] or [n, 1]"
    )
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
        raise ApiError(
            400,
            f"inputs[{j}] ({TEXT_PAIR}) has {len(pairs)} elements but inputs[{i}] ({TEXT}) has {len(texts)}; {rule}",
        )
    check_texts(st.config, pairs, f"inputs[{j}].data")
    return texts, pairs


def bytes_elements(raw: bytes, where: str) -> list[str]:
    """Decode a binary BYTES tensor: repeated (uint32 LE length, that many UTF-8 bytes)."""
    out: list[str] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise ApiError(
                400,
                f"{where}: {len(raw) - pos} trailing byte(s) where a 4-byte element length "
                "was expected; each BYTES element is a little-endian uint32 length + its bytes",
            )
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise ApiError(400, f"{where}: element {len(out)} declares {n} bytes but only {len(raw) - pos} remain")
        out.append(utf8(raw[pos : pos + n], f"{where}[{len(out)}]"))
        pos += n
    return out


def utf8(element: bytes, where: str) -> str:
    """One BYTES element as text; a 422 naming its first byte that is not UTF-8."""
    try:
        return element.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(
            422,
            f"{where} is not valid UTF-8: byte 0x{element[e.start]:02x} at offset {e.start} ({e.reason}); "
            "send UTF-8 text",
        ) from None


def shaped(i: int, shape: list[int], data: list[str]) -> list[str]:
    """inputs[i]'s texts, where its shape ([n] or [n, 1]) describes them; else a 400 naming both."""
    if not 1 <= len(shape) <= 2 or (len(shape) == 2 and shape[1] != 1) or prod(shape) != len(data):
        raise ApiError(
            400,
            f"inputs[{i}].shape {shape} does not describe its {len(data)} data elements; "
            "use [n] or [n, 1] with n = number of texts",
        )
    return data


def tensor_bytes(datatype: str, values: Values) -> bytes:
    if datatype == "FP32":
        return np.ascontiguousarray(values, dtype="<f4").tobytes()
    if datatype == "BOOL":
        return np.asarray(values, dtype=np.bool_).tobytes()
    parts = []
    for v in values:
        b = str(v).encode("utf-8")
        parts += [struct.pack("<I", len(b)), b]
    return b"".join(parts)
