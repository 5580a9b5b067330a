"""Runtime for ONNX variants: one onnxruntime InferenceSession on the variant's model.onnx.

    python -c "from qserve.runtime import load_runtime; \\
print(load_runtime('models/minilm-imdb-variants/onnx-int8', 'cpu').predict(['fine']))"

CPU runs on CPUExecutionProvider; `cuda[:N]` asks for CUDAExecutionProvider, which
only the onnxruntime-gpu wheel ships (`pip install 'qserve[gpu]'`).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from qserve import QserveError
from qserve.artifact import VariantError
from qserve.backends.onnx import BACKEND
from qserve.extras import require
from qserve.runtime.base import Runtime
from qserve.runtime.threadnames import named

if TYPE_CHECKING:
    from qserve.artifact import Manifest

MODEL_FILE = "model.onnx"
GPU_HINT = BACKEND.cuda_install


def session_options(ort, threads: int | None):
    """The SessionOptions every qserve ONNX session runs with (the bench, the server, the breakdown script)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        so.intra_op_num_threads = int(threads)
    # Spin inside a run, never after it. ORT's pool threads busy-wait for more work by default, within a run
    # (between one operator's parallel section and the next) and after run() returns. After the run, that spin
    # takes the core the event loop needs to parse the next request and write the answer; with no spinning at
    # all, each of a b1 forward's parallel sections waits for the worker to wake (a context switch each).
    # force_spinning_stop keeps the spin inside run() and stops it when run() returns: the fastest and the
    # cheapest in CPU of the three, measured in docs/measurements.md ("Serving overhead").
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")  # sequential execution: no inter-op pool
    so.log_severity_level = 3  # errors only: ORT's warnings about unused initializers are noise here
    return so


def disabled_optimizers(device: str) -> list[str]:
    """ORT graph rewrites this runtime turns off on `device` (also used by benchmarks/studies/int8_breakdown.py)."""
    if device.startswith("cuda"):
        return []  # the fused CUDA kernel is the fast one there
    # On CPU, ORT's fused SkipLayerNormalization is slower than the Add + LayerNormalization it
    # replaces in the int8 graphs, and no faster in the others (profiled by benchmarks/studies/int8_breakdown.py).
    return ["SkipLayerNormFusion"]


def per_batch_activation_scales(manifest: Manifest) -> bool:
    """Whether the variant's graph quantizes activations with one scale per input tensor (ORT's dynamic
    quantization: DynamicQuantizeLinear / DynamicQuantizeMatMul), i.e. one scale per batch, so a row's
    result depends on its batchmates and their padding."""
    quant = manifest.record("onnx").get("quantization") or {}
    return quant.get("mode") == "dynamic"


class OnnxRuntime(Runtime):
    def _load(self) -> None:
        self.batch_invariant = not per_batch_activation_scales(self.manifest)
        quant = self.manifest.record("onnx").get("quantization") or {}
        self.default_batch_dependent = "rows" if quant.get("row_by_row", True) else "batched"
        ort = require("onnxruntime", self.name)
        path = self.variant_dir / MODEL_FILE
        if not path.is_file():
            raise VariantError(f"{path} is missing: {self.variant_dir} is not an ONNX variant")
        providers = self._providers(ort)
        self.session = ort.InferenceSession(
            str(path),
            sess_options=session_options(ort, self.options.threads),
            providers=providers,
            disabled_optimizers=disabled_optimizers(self.device),
        )
        if self.device.startswith("cuda") and "CUDAExecutionProvider" not in self.session.get_providers():
            # ORT falls back to CPU silently when CUDA/cuDNN libraries fail to load; a CUDA
            # benchmark that quietly ran on CPU would be a lie, so refuse.
            raise QserveError(
                f"{self.name}: CUDAExecutionProvider failed to initialise (CUDA/cuDNN libraries "
                f"not found?); install a matching CUDA runtime with {GPU_HINT}, or use --device cpu"
            )
        self.row_workers, self.row_session, self.row_pool = self._row_runner(ort, path, providers)
        self.input_names = [i.name for i in self.session.get_inputs()]
        outputs = [o.name for o in self.session.get_outputs()]
        self.output_name = "logits" if "logits" in outputs else outputs[0]

    def _row_runner(self, ort, path, providers):
        """A second, single-threaded session and a pool to run a row-by-row batch's rows side by side.

        On CPU a lone short row keeps two intra-op threads only partly busy, so each row runs whole on one core;
        ORT sessions are safe to run from several threads (run() releases the GIL). One-row batches keep the pool.
        """
        workers = self.options.side_by_side()
        if not self.row_by_row or workers < 2 or self.device.startswith("cuda"):
            return 1, None, None

        session = ort.InferenceSession(
            str(path),
            sess_options=session_options(ort, 1),
            providers=providers,
            disabled_optimizers=disabled_optimizers(self.device),
        )
        return (
            workers,
            session,
            ThreadPoolExecutor(workers, thread_name_prefix="qserve-rows", initializer=named("qserve-rows")),
        )

    def can_narrow(self) -> bool:
        return self.row_session is not None

    def forward_rows(self, rows: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        if self.row_session is not None and self.narrowed():  # a lane: every row here, on one thread
            return self._rows_on(self.row_session, rows)
        if self.row_pool is None or len(rows) < 2:
            return super().forward_rows(rows)
        n = self.row_workers
        # Interleaved shares (rows i, i+n, ...) so long and short rows spread over the workers.
        shares = [self.row_pool.submit(self._rows_on, self.row_session, rows[k::n]) for k in range(min(n, len(rows)))]
        out: list[np.ndarray] = [None] * len(rows)  # type: ignore[list-item]
        for k, fut in enumerate(shares):
            out[k::n] = fut.result()
        return out

    def _rows_on(self, session, rows: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        return [self._run(session, r) for r in rows]

    def _providers(self, ort) -> list:
        if not self.device.startswith("cuda"):
            return ["CPUExecutionProvider"]
        if not self.manifest.spec.cuda:
            raise QserveError(f"{self.name} has no CUDA kernels in ONNX Runtime; load it with --device cpu")
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise QserveError(
                f"{self.name} on {self.device} needs onnxruntime-gpu (this onnxruntime offers "
                f"{', '.join(ort.get_available_providers())}): {GPU_HINT}"
            )
        # onnxruntime-gpu finds the CUDA/cuDNN libraries of the pip nvidia-* packages only once they are
        # preloaded (or torch was imported first, which a bench child of an ONNX variant never does);
        # otherwise the session falls back to CPU and _load refuses it. Best effort: the check in _load
        # still names the failure.
        if hasattr(ort, "preload_dlls"):
            with contextlib.suppress(Exception):
                ort.preload_dlls()
        device_id = int(self.device.split(":", 1)[1]) if ":" in self.device else 0
        return [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]

    def forward(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        if self.row_session is not None and self.narrowed():
            return self._run(self.row_session, batch)
        return self._run(self.session, batch)

    def _run(self, session, batch: dict[str, np.ndarray]) -> np.ndarray:
        (logits,) = session.run([self.output_name], self.graph_feed(batch, self.input_names, MODEL_FILE))
        return np.asarray(logits, dtype=np.float32)

    def close(self) -> None:
        if self.row_pool is not None:
            self.row_pool.shutdown(wait=True)
        self.session = self.row_session = self.row_pool = None
