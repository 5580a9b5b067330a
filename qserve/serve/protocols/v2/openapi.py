"""KServe V2's part of the OpenAPI document: its schemas narrowed to this server.

    curl -s 127.0.0.1:8000/openapi.json | \\
python -c "import json, sys; print(json.load(sys.stdin)['components']['schemas']['V2InputTensor'])"

`publish` narrows V2's schemas to this server and the model it serves by default (spec.Published), so that a
schema-valid request is one it accepts: the output names of the model's problem type, the inputs it takes (a
one-text model's one `text`, a pair model's two), and every shape/data pairing up to --max-inputs.
"""

from __future__ import annotations

from typing import Any

from qserve.serve.protocols.spec import OpenApi, Published
from qserve.serve.protocols.v2.tensors import output_names
from qserve.textpairs import PAIR, TEXT

MAX_SHAPE_BRANCHES = 256  # above this --max-inputs, the shape/data pairing is stated in prose only


def publish(comps: dict[str, Any], published: Published) -> None:
    """V2's schemas narrowed to this server and its default model: the output names, the inputs, the shapes."""
    answers = published.answers
    if answers is not None:  # no readable manifest (several models, a model dir, a repository): every name stays
        name = ((comps.get("V2RequestedOutput") or {}).get("properties") or {}).get("name")
        if isinstance(name, dict) and "enum" in name:
            name["enum"] = list(output_names(answers.problem))
    manifest = published.manifest
    if manifest is not None:  # a text-pair model's two inputs only where the model takes them
        tensors = ((comps.get("V2InferRequest") or {}).get("properties") or {}).get("inputs") or {}
        input_name = ((comps.get("V2InputTensor") or {}).get("properties") or {}).get("name") or {}
        if manifest.takes == PAIR:
            tensors["minItems"] = 2
        else:
            tensors["maxItems"] = 1
            if "enum" in input_name:
                input_name["enum"] = [TEXT]
    # JSON Schema cannot say "shape matches len(data)", but it can list every valid pairing
    tensor = comps.get("V2InputTensor")
    config = published.config
    if tensor is not None and config.max_inputs <= MAX_SHAPE_BRANCHES:
        tensor["anyOf"] = [
            {"properties": {"shape": {"enum": [[n], [n, 1]]}, "data": {"minItems": n, "maxItems": n}}}
            for n in range(1, config.max_inputs + 1)
        ]


OPENAPI = OpenApi(texts=("V2InputTensor",), long_text=("V2RequestParameters",), publish=publish)
