"""Runtime for OpenVINO variants (ov-fp32, ov-bf16, ov-int8): one compiled model per process, CPU only.

    python -c "from qserve.runtime import load_runtime; \\
print(load_runtime('models/minilm-l6-distilbert-imdb/variants/ov-int8', 'cpu').predict(['fine']))"

The variant fixes its precision hint (checked by ov_probe); multi-row batches run one stream per row worker on a
second compiled model. Compiled models are shared; each calling thread gets its own InferRequests (docs/export.md).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from qserve import QserveError
from qserve.artifact import VariantError
from qserve.backends.openvino import OV_FP32, openvino_precision
from qserve.devices import usable_cores
from qserve.extras import require
from qserve.runtime.base import Runtime
from qserve.runtime.ov_probe import require_precision

if TYPE_CHECKING:
    from qserve.artifact import Manifest

MODEL_FILE = "openvino_model.xml"
WEIGHTS_FILE = "openvino_model.bin"

_compiled: dict[tuple, Any] = {}
_compiled_lock = threading.Lock()


def inference_precision(manifest: Manifest) -> str:
    """f32 or bf16: what the variant's spec says its graph computes in (int8 layers aside)."""
    spec = manifest.spec
    return openvino_precision(spec, spec.options.get("inference_precision"))


def compile_config(precision: str, threads: int | None, streams: int = 1) -> dict[str, Any]:
    """The compile_model properties every qserve OpenVINO model runs with (bench, serve, the exporter's checks).

    streams=1: one stream on every thread, a lone row's latency. streams=N: N streams of one thread each
    (INFERENCE_NUM_THREADS = N), what a batch's shares run on side by side."""
    cfg: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": precision,
        "PERFORMANCE_HINT": "LATENCY" if streams == 1 else "THROUGHPUT",
        "NUM_STREAMS": str(streams),
        # pinned workers cannot leave a core another process is using, which
        # stalls them on a shared machine
        "ENABLE_CPU_PINNING": False,
    }
    if streams > 1:
        cfg["INFERENCE_NUM_THREADS"] = int(streams)
    elif threads:
        cfg["INFERENCE_NUM_THREADS"] = int(threads)
    return cfg


def compiled_model(variant_dir, manifest: Manifest, precision: str, threads: int | None, streams: int = 1):
    """The process-wide compiled model for this IR (by content hash), precision, thread and stream count."""
    import openvino as ov

    xml, weights = manifest.files.get(MODEL_FILE), manifest.files.get(WEIGHTS_FILE)
    key = (xml.sha256 if xml else None, weights.sha256 if weights else None, precision, threads, streams)
    with _compiled_lock:
        if key[0] is None or key not in _compiled:
            core = ov.Core()
            model = core.read_model(str(variant_dir / MODEL_FILE))
            compiled = core.compile_model(model, "CPU", compile_config(precision, threads, streams))
            if key[0] is None:  # no hash to key on (a manifest-less check): do not share it
                return compiled
            _compiled[key] = compiled
        return _compiled[key]


def fixed_length(manifest: Manifest) -> bool:
    """Whether every batch runs padded to max_length: ov-int8's way to one text, one answer.

    ov-int8's answers move with the padded length (a last-bit fp32 change can cross an int8 rounding boundary), so each
    text runs at a length set by itself alone: its bucket (qserve.runtime.buckets), or max_length with buckets off.
    """
    spec = manifest.spec
    return bool(spec.options.get("fixed_length", spec.dtype == "int8"))


class OpenVINORuntime(Runtime):
    def _load(self) -> None:
        if not self.device.startswith("cpu"):
            raise QserveError(
                f"{self.name} runs on OpenVINO's CPU plugin only; load it with --device cpu (got {self.device})"
            )
        require("openvino", self.name)
        path = self.variant_dir / MODEL_FILE
        if not path.is_file():
            raise VariantError(f"{path} is missing: {self.variant_dir} is not an OpenVINO variant")
        self.precision = inference_precision(self.manifest)
        int8 = self.manifest.spec.dtype == "int8"
        require_precision("int8" if int8 and self.precision == OV_FP32 else self.precision, self.name)
        self.compiled = compiled_model(self.variant_dir, self.manifest, self.precision, self.options.threads)
        self.row_workers = self._side_by_side()
        self.input_names = [p.any_name for p in self.compiled.inputs]
        outputs = [o.any_name for o in self.compiled.outputs]
        self.output_index = outputs.index("logits") if "logits" in outputs else 0
        self.fixed_length = fixed_length(self.manifest)
        # The base runtime pads each text to its length bucket (qserve.runtime.buckets; --length-buckets off:
        # max_length, the one length of before), so forward() gets batches already at a fixed length.
        self.fixed_shapes = self.fixed_length
        self._local = threading.local()

    def _side_by_side(self) -> int:
        """Row workers: the streams a batch's shares run on (the plugin gives at most one per core), or 1."""
        workers = min(self.options.side_by_side(), usable_cores())
        return workers if workers >= 2 else 1

    def can_narrow(self) -> bool:
        return self.row_workers >= 2

    def _request(self):
        req = getattr(self._local, "request", None)
        if req is None:
            req = self._local.request = self.compiled.create_infer_request()
        return req

    def _side_requests(self) -> list[Any]:
        """This thread's requests on the streams model, compiled on the first batch of several rows (serve's
        warm-up runs one), so a process that only ever runs lone rows (the bench's b1 loops) never pays for it."""
        reqs = getattr(self._local, "side", None)
        if reqs is None:
            side = self._streams_model()
            reqs = self._local.side = [side.create_infer_request() for _ in range(self.row_workers)]
        return reqs

    def _lane_request(self):
        """This (lane) thread's one request on the streams model: the plugin runs it on a free stream."""
        req = getattr(self._local, "lane", None)
        if req is None:
            req = self._local.lane = self._streams_model().create_infer_request()
        return req

    def _streams_model(self) -> Any:
        """The model compiled with one stream per row worker (compiled_model caches it per process)."""
        return compiled_model(
            self.variant_dir, self.manifest, self.precision, self.options.threads, streams=self.row_workers
        )

    def forward(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        feed = self.graph_feed(batch, self.input_names, MODEL_FILE)
        n = len(feed["input_ids"])
        if self.narrowed():  # a lane: the whole batch on this thread's request on one single-threaded stream
            req = self._lane_request()
            req.infer(feed)
            return np.array(req.get_output_tensor(self.output_index).data, dtype=np.float32, copy=True)
        if self.row_workers < 2 or n < 2:
            result = self._request().infer(feed)
            # The request reuses its output buffer on the next call: copy before handing it out.
            return np.array(result[self.output_index], dtype=np.float32, copy=True)
        # Contiguous shares, one per stream, started together; each request's output is copied once it is done.
        bounds = np.linspace(0, n, min(n, self.row_workers) + 1).astype(int)
        reqs = self._side_requests()[: len(bounds) - 1]
        for req, lo, hi in zip(reqs, bounds[:-1], bounds[1:]):
            req.start_async({k: v[lo:hi] for k, v in feed.items()})
        out = []
        for req in reqs:
            req.wait()
            out.append(np.array(req.get_output_tensor(self.output_index).data, dtype=np.float32, copy=True))
        return np.concatenate(out)

    def close(self) -> None:
        self._local = threading.local()
