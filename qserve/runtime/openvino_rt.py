"""Runtime for OpenVINO variants (ov-fp32, ov-bf16, ov-int8): one compiled model per process, CPU only.

    python -c "from qserve.runtime import load_runtime; print(load_runtime('models/minilm-l6-distilbert-imdb/variants/ov-int8', 'cpu').predict(['fine']))"

The variant holds an OpenVINO IR (openvino_model.xml/.bin, dynamic batch and sequence
axes) plus config.json, so `optimum.intel.OVModelForSequenceClassification.from_pretrained(dir)`
loads it unchanged. The precision it runs in is part of the variant, not left to the
plugin: on AMX / avx512_bf16 CPUs OpenVINO's CPU plugin silently computes fp32 models in
bf16 unless told otherwise, so ov-fp32 and ov-int8 compile with INFERENCE_PRECISION_HINT
f32 and ov-bf16 with bf16 (refused on a CPU whose plugin reports no BF16).

Before compiling, `ov_probe.require` checks in a child process that OpenVINO works on this
CPU at that precision: a plugin crash there becomes an "unavailable on this CPU" error
instead of taking the server, bench child or test run down.

Async-safety: the compiled model is shared (compiling twice would double memory and load
time) and each calling thread gets its own InferRequest, since one InferRequest must not
run on two threads at once. serve's inference thread and a Ray replica's thread can
therefore both call predict().
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from qserve import QserveError
from qserve.runtime.base import Runtime

if TYPE_CHECKING:
    from qserve.artifact import Manifest

MODEL_FILE = "openvino_model.xml"
WEIGHTS_FILE = "openvino_model.bin"
HINT = "pip install 'qserve[openvino]'"

_compiled: dict[tuple, Any] = {}
_compiled_lock = threading.Lock()


def inference_precision(manifest: Manifest) -> str:
    """f32 or bf16: what the variant's spec says its graph computes in (int8 layers aside)."""
    spec = manifest.spec
    return str(spec.options.get("inference_precision") or ("bf16" if spec.dtype == "bf16" else "f32"))


def compile_config(precision: str, threads: int | None) -> dict[str, Any]:
    """The compile_model properties every qserve OpenVINO model runs with (bench, serve, the exporter's checks)."""
    cfg: dict[str, Any] = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY",
                           # one stream: requests are batched by the server, and a second stream would
                           # split the cores that one forward pass should use
                           "NUM_STREAMS": "1",
                           # pinned workers cannot leave a core another process is using, which
                           # stalls them on a shared machine
                           "ENABLE_CPU_PINNING": False}
    if threads:
        cfg["INFERENCE_NUM_THREADS"] = int(threads)
    return cfg


def compiled_model(variant_dir, manifest: Manifest, precision: str, threads: int | None):
    """The process-wide compiled model for this IR (by content hash), precision and thread count."""
    import openvino as ov

    xml, weights = manifest.files.get(MODEL_FILE), manifest.files.get(WEIGHTS_FILE)
    key = (xml.sha256 if xml else None, weights.sha256 if weights else None, precision, threads)
    with _compiled_lock:
        if key[0] is None or key not in _compiled:
            core = ov.Core()
            model = core.read_model(str(variant_dir / MODEL_FILE))
            compiled = core.compile_model(model, "CPU", compile_config(precision, threads))
            if key[0] is None:  # no hash to key on (a manifest-less check): do not share it
                return compiled
            _compiled[key] = compiled
        return _compiled[key]


def fixed_length(manifest: Manifest) -> bool:
    """Whether every batch runs padded to max_length: ov-int8's way to one text, one answer.

    OpenVINO's answers do not depend on a text's batchmates at a given padded length, but its
    fp32 reductions over the sequence round slightly differently at different lengths, and in
    ov-int8 such a last-bit change can tip an activation across an int8 rounding boundary
    downstream. Running each text at a length that depends on the text alone (its length bucket,
    qserve.runtime.buckets) removes the batch from the computation; padding every text to
    max_length, as before buckets (--length-buckets off), cost short texts the work of max_length tokens.
    """
    spec = manifest.spec
    return bool(spec.options.get("fixed_length", spec.dtype == "int8"))


class OpenVINORuntime(Runtime):
    def _load(self) -> None:
        from qserve.runtime.ov_probe import require

        if not self.device.startswith("cpu"):
            raise QserveError(f"{self.name} runs on OpenVINO's CPU plugin only; load it with --device cpu "
                              f"(got {self.device})")
        try:
            import openvino  # noqa: F401
        except ImportError as e:
            raise QserveError(f"{self.name} needs OpenVINO: {HINT} ({e})") from e
        path = self.variant_dir / MODEL_FILE
        if not path.is_file():
            from qserve.artifact import VariantError

            raise VariantError(f"{path} is missing: {self.variant_dir} is not an OpenVINO variant")
        self.precision = inference_precision(self.manifest)
        int8 = self.manifest.spec.dtype == "int8"
        require("int8" if int8 and self.precision == "f32" else self.precision, self.name)
        self.compiled = compiled_model(self.variant_dir, self.manifest, self.precision, self.options.threads)
        self.input_names = [p.any_name for p in self.compiled.inputs]
        outputs = [o.any_name for o in self.compiled.outputs]
        self.output_index = outputs.index("logits") if "logits" in outputs else 0
        self.fixed_length = fixed_length(self.manifest)
        # The base runtime pads each text to its length bucket (qserve.runtime.buckets; --length-buckets off:
        # max_length, the one length of before), so forward() gets batches already at a fixed length.
        self.fixed_shapes = self.fixed_length
        self._local = threading.local()

    def _request(self):
        req = getattr(self._local, "request", None)
        if req is None:
            req = self._local.request = self.compiled.create_infer_request()
        return req

    def forward(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        feed = self.graph_feed(batch, self.input_names, MODEL_FILE)
        result = self._request().infer(feed)
        # The request reuses its output buffer on the next call: copy before handing it out.
        return np.array(result[self.output_index], dtype=np.float32, copy=True)

    def close(self) -> None:
        self._local = threading.local()
