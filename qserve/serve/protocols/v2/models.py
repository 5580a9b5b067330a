"""KServe V2's view of a served model, for HTTP and gRPC alike: the model a request names, its version, its
metadata and its Triton-style configuration.

    python -c "import tritonclient.http as t; c = t.InferenceServerClient('127.0.0.1:8000'); \\
print(c.get_model_metadata('onnx-int8'), c.get_model_config('onnx-int8'))"

A version is its manifest's short hash; a request naming one is answered only by that version (404 for any other).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from qserve.artifact import Manifest
from qserve.serve.core.served_model import gate_summary
from qserve.serve.core.state import ServedModel, ServeState
from qserve.serve.infra.errors import ApiError
from qserve.serve.protocols.v2.tensors import config_inputs, config_outputs, metadata_inputs, metadata_outputs

EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository"]


def served(st: ServeState, name: str | None, version: str | None, scope: MutableMapping[str, Any]) -> ServedModel:
    """The model `name` names (None or "": the default) at `version` (None or "": whichever serves now): 503 while
    not ready, 404 for a name not served or another version. The request's metrics (`scope`'s state) carry it."""
    model = st.model(name or None)
    scope.setdefault("state", {})["qserve_model"] = model.name
    if version:
        check_version(model, version)
    return model


def check_version(model: ServedModel, version: str) -> None:
    """404 unless `version` is the one `model` serves now (HTTP /versions/{version}/..., gRPC model_version)."""
    if version != model.version:
        raise ApiError(
            404,
            f"unknown model version {version!r} of {model.name!r}; it serves version "
            f"{model.version!r} (GET /v2/models/{model.name}), or leave the version out",
        )


def model_config(st: ServeState, model: ServedModel) -> dict[str, Any]:
    """Triton's model configuration shape (what tritonclient's get_model_config returns)."""
    rt = model.runtime
    cfg, k = st.config, len(rt.labels)
    return {
        "name": model.name,
        "platform": f"qserve_{rt.manifest.backend}",
        "backend": "qserve",
        "version_policy": {"specific": {"versions": [model.version]}},
        "max_batch_size": 0,  # shapes below include the batch dimension (-1 = n texts)
        "input": config_inputs(rt),
        "output": config_outputs(rt.problem_type, k),
        "dynamic_batching": {
            "max_queue_delay_microseconds": int(cfg.wait_ms * 1000),
            "preferred_batch_size": [cfg.batch_size],
        },
        "parameters": {
            "labels": {"string_value": ",".join(rt.labels)},
            "problem_type": {"string_value": rt.problem_type},
            "max_length": {"string_value": str(rt.max_length)},
            "max_inputs": {"string_value": str(cfg.max_inputs)},
            "max_chars": {"string_value": str(cfg.max_chars)},
        },
    }


def model_metadata(model: ServedModel) -> dict[str, Any]:
    """The model metadata (HTTP GET /v2/models/{name}; gRPC ModelMetadata)."""
    rt = model.runtime
    k = len(rt.labels)
    return {
        "name": model.name,
        "versions": [model.version],
        "platform": f"qserve_{rt.manifest.backend}",
        "inputs": metadata_inputs(rt),
        "outputs": metadata_outputs(rt.problem_type, k),
        "parameters": {
            "labels": ",".join(rt.labels),
            "problem_type": rt.problem_type,
            "max_length": rt.max_length,
            "long_text": str(rt.long_text),
            "model_name": rt.manifest.model_name,
            **gate_parameters(rt.manifest, str(rt.long_text)),
        },
    }


def gate_parameters(manifest: Manifest, policy: str | None = None) -> dict[str, str]:
    """The release gate's verdict and the calibration as metadata parameters, only for a gated or calibrated
    variant (another answers exactly as before): gate = passed|failed|ungated (for the served long-text policy),
    gate_agreement_lower_bound, gate_bar, gate_n, and temperature or thresholds."""
    out: dict[str, str] = {}
    g = gate_summary(manifest, policy)
    if g is not None:
        out.update(
            {
                "gate": g["verdict"],
                "gate_agreement_lower_bound": f"{g['agreement_lower_bound']:.6f}",
                "gate_bar": str(g["bar"]),
                "gate_n": str(g["n"]),
            }
        )
    if manifest.temperature is not None:
        out["temperature"] = str(manifest.temperature)
    if manifest.thresholds is not None:
        out["thresholds"] = ",".join(f"{t:g}" for t in manifest.thresholds)
    return out
