"""Runtime for torch and bitsandbytes variants (both are HF checkpoints on disk).

    python -c "from qserve.runtime import load_runtime; \\
print(load_runtime('models/minilm-imdb-variants/torch-bf16').predict(['fine']))"

On CUDA a torch variant replays CUDA graphs captured per (batch, length) bucket (--cuda-graphs, graphs.py); `auto`
keeps them where a measurement at load finds them faster, and `execution` records why. On CPU: eager, unpadded.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from qserve import QserveError
from qserve.artifact import Manifest, VariantError
from qserve.backends.bnb import BnbOptions
from qserve.devices import capabilities
from qserve.modeling import model_inputs
from qserve.runtime import graphs
from qserve.runtime.base import Runtime
from qserve.runtime.buckets import bucket_for, fit_rows
from qserve.runtime.options import RuntimeOptions
from qserve.variants import VariantSpec

GPU_LANES = 2
"""Batches a busy server keeps in flight on one GPU (serve/core/batcher.py lanes): one tokenizing on its lane
thread while the other's forward holds the GPU, so the tokenizer's time overlaps the device's."""
WARMUP = 2
"""Eager forwards of a shape on a side stream before its capture (cuBLAS handles, workspaces, lazy modules)."""
PROBE = (
    "A short text to check the captured graphs against the eager forward and to time them, "
    "as a review would read: the acting was fine, the ending was not."
)
TIMED = 15
"""Timed calls per shape and mode in auto's measurement (after 3 untimed ones)."""
_CAPTURE_LOCK = threading.Lock()
"""One capture at a time in a process (CUDA's rule): two models loading at once take turns."""
_DEVICE_LOCKS: dict[str, threading.RLock] = {}
"""One lock per CUDA device, shared by every torch runtime on it: a forward (eager or replay) and a capture never
overlap, so a model loading (capturing) beside one serving (a hot swap, a shadow) cannot launch into the legacy
default stream while a capture is under way, which would invalidate the capture."""


def device_lock(device: str) -> threading.RLock:
    """The lock of `device` ("cuda" and "cuda:0" are one device; a CPU runtime gets a lock of its own)."""
    if not device.startswith("cuda"):
        return threading.RLock()
    key = device if ":" in device else "cuda:0"
    return _DEVICE_LOCKS.setdefault(key, threading.RLock())


class TorchRuntime(Runtime):
    execution: dict[str, Any] | None = None
    _graphs: graphs.Graphs | None = None
    _bypass = False

    def __init__(self, variant_dir: Path, manifest: Manifest, device: str, options: RuntimeOptions):
        super().__init__(variant_dir, manifest, device, options)
        self._set_up_execution()

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        if self.options.threads:
            torch.set_num_threads(self.options.threads)
        spec = self.manifest.spec
        kwargs = {}
        if spec.backend == "bnb":
            kwargs = _bnb_load_kwargs(self.variant_dir, self.name, self.device)
        else:
            kwargs["dtype"] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[spec.dtype]
        self.model = AutoModelForSequenceClassification.from_pretrained(self.variant_dir, **kwargs).eval()
        if spec.backend == "torch":
            self.model.to(self.device)
            if (
                spec.dtype == "bf16"
                and not self.device.startswith("cuda")
                and capabilities(with_cuda=False).has("bf16") is False
            ):
                # Emulated bf16 GEMMs round partial sums in an order set by the batch's shape, so a row's answer
                # moves with its batchmates (labels flip): without native bf16, each text runs alone.
                self.batch_invariant = False
        else:
            _bnb_prepare(self.model, self.device)
            self.batch_invariant = not _llm_int8_picks_outliers_per_batch(self.model, spec, self.device)
        self._torch = torch

        self.input_names = model_inputs(self.model)
        # A forward at a time on the device: a graph's static buffers are shared by its replays, a busy server's
        # lanes call forward from two threads, and no forward may launch while a capture is under way.
        self._gpu_lock = device_lock(self.device)
        asked = self.options.cuda_graphs
        blocked = self._graphs_blocked() or (f"{graphs.FLAG} off" if asked == graphs.OFF else None)
        self.execution = {"asked": asked, "mode": graphs.EAGER, "why": blocked or f"{graphs.FLAG} {asked}"}
        # Graphs need fixed shapes: each text runs at its own length bucket (base.py resolves the buckets next).
        self.fixed_shapes = blocked is None

    # -- execution: eager, graphs or compile ------------------------------------------------------
    def _graphs_blocked(self) -> str | None:
        """Why this runtime runs eager whatever --cuda-graphs asks: its device or its kernels (None: graphs may)."""
        if not self.device.startswith("cuda"):
            return f"{self.device}: eager (CUDA graphs need a CUDA device)"
        if not self.batch_invariant:
            return "eager: this variant runs row by row (its kernels let a row see its batchmates)"
        return None

    def _graph_inputs(self) -> list[str]:
        """The batch inputs a graph takes, in its static block's order (the model's own inputs decide)."""
        names = ["input_ids", "attention_mask"] + (["token_type_ids"] if self.segments else [])
        return [n for n in names if n in self.input_names]

    def _set_up_execution(self) -> None:
        """Capture the graphs (or compile), check them against eager, and for `auto` measure both and keep the
        faster; anything that fails leaves the runtime eager, unpadded, as before, with the reason recorded."""
        if not self.fixed_shapes or not self.buckets:
            return
        asked = self.options.cuda_graphs
        lazy = asked == graphs.COMPILE
        started = time.perf_counter()
        try:
            with self._gpu_lock:  # no other forward on this device while capturing, checking and timing
                capture = self._compiled_capture() if lazy else self._graph_capture()
                self._graphs = graphs.Graphs(
                    capture,
                    self._graph_inputs(),
                    self.pad_id,
                    self.buckets,
                    graphs.batch_buckets(self.options.max_rows or graphs.DEFAULT_BATCH_CAP),
                    self.options.max_graphs,
                    self.options.graph_memory_mb,
                    lazy=lazy,
                )
                if not lazy:
                    self._graphs.prepare()
                ok, delta = self._check()
                if not self._graphs.graphs:
                    first = next(iter(self._graphs.refused.values()), "nothing was declared")
                    raise QserveError(f"no shape could be captured ({first})")
                if not ok:
                    raise QserveError(
                        f"a replay differs from the eager forward by |Δlogit| {delta:.3g} (the "
                        "captured kernels depend on their data)"
                    )
                timings = self._timings() if asked == graphs.AUTO else {}
        except Exception as e:  # a variant whose kernels cannot be captured (bitsandbytes, say) runs eager
            summary = self._graphs.summary() if self._graphs is not None else None
            self._use_eager(
                f"eager: {'compile' if lazy else 'capture'} failed ({type(e).__name__}: {e})"[:500],
                {"graphs": summary} if summary else {},
            )
            return
        mode, why = graphs.choose(asked, timings)
        record: dict[str, Any] = {
            "check_max_abs_dlogit": delta,
            "graphs": self._graphs.summary(),
            "setup_s": round(time.perf_counter() - started, 3),
        }
        if timings:
            record["measured_ms"] = timings
        if mode == graphs.EAGER:
            self._use_eager(why, record)
            return
        self.execution = {"asked": asked, "mode": mode, "why": why, **record}

    def _use_eager(self, why: str, record: dict[str, Any] | None = None) -> None:
        """Back to the eager forward of before: no graphs, no length buckets (texts run unpadded)."""
        self._graphs = None
        self.fixed_shapes = False
        self.buckets = None
        self.execution = {"asked": self.options.cuda_graphs, "mode": graphs.EAGER, "why": why, **(record or {})}
        if self.device.startswith("cuda"):
            self._torch.cuda.empty_cache()

    def _graph_capture(self) -> graphs.Capture:
        pool = self._torch.cuda.graph_pool_handle()  # one pool: the graphs never replay at once (the GPU lock)
        return functools.partial(
            _CudaGraph, self._torch, self.model, self._graph_inputs(), device=self.device, pool=pool, pad_id=self.pad_id
        )

    def _compiled_capture(self) -> graphs.Capture:
        import torch._dynamo as dynamo

        torch = self._torch
        # dynamic=False compiles each (batch, length) bucket once; allow as many as there may be graphs.
        dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, self.options.max_graphs)
        compiled = torch.compile(self.model, mode="reduce-overhead", dynamic=False)
        return functools.partial(
            _Compiled, torch, compiled, self._graph_inputs(), device=self.device, pad_id=self.pad_id
        )

    def _probe(self, rows: int, tokens: int | None = None) -> dict[str, np.ndarray]:
        """`rows` copies of a real sentence's ids, cut or repeated to `tokens` (None: as it tokenizes), padded as
        served (unpadded: every row the same length)."""
        ids = self.split([PROBE]).ids[0]
        if tokens is not None:
            body = ids[1:-1] or ids
            ids = [ids[0], *(body[i % len(body)] for i in range(max(0, tokens - 2))), ids[-1]][:tokens]
        return self.pad([list(ids)] * rows)

    def _bucketed(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n, width = batch["input_ids"].shape
        return fit_rows(batch, range(n), bucket_for(width, self.buckets or ()), self.pad_id)

    def _check(self) -> tuple[bool, float]:
        """A replay against the eager forward of the same padded block (a real sentence at batch 1)."""
        block = self._bucketed(self._probe(1))
        assert self._graphs is not None
        return graphs.check_close(self._graphs.run(block, self._eager), self._eager(block))

    def _timings(self) -> dict[str, dict[str, float]]:
        """auto's measurement: the median ms of the served eager forward (unpadded) and of the graphs (the same
        rows at their bucket) for a sentence alone and for a batch of full-length rows."""
        g = self._graphs
        assert g is not None
        out: dict[str, dict[str, float]] = {}
        for rows, tokens in ((1, None), (min(32, max(g.batches)), self.max_length)):
            batch = self._probe(rows, tokens)
            block = self._bucketed(batch)
            runs: dict[str, Callable[[], object]] = {
                "eager": functools.partial(self._eager, batch),
                "graphs": functools.partial(g.run, block, self._eager),
            }
            key = f"{rows}x{block['input_ids'].shape[1]}"
            out[key] = {}
            for name, fn in runs.items():
                for _ in range(3):
                    fn()
                ms = []
                for _ in range(TIMED):
                    t0 = time.perf_counter()
                    fn()
                    ms.append((time.perf_counter() - t0) * 1e3)
                out[key][name] = round(statistics.median(ms), 4)
        return out

    @contextlib.contextmanager
    def eager_only(self) -> Iterator[None]:
        """Within this block forwards run eager on the same padded shapes (the bench's eager-vs-graphs rows)."""
        self._bypass = True
        try:
            yield
        finally:
            self._bypass = False

    @property
    def lanes(self) -> int:
        """On CUDA, GPU_LANES batches in flight (one tokenizes while the other runs); on CPU one, as before."""
        return GPU_LANES if self.device.startswith("cuda") else 1

    # -- forward -----------------------------------------------------------------------------------
    def forward(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        with self._gpu_lock:
            if self._graphs is not None and not self._bypass:
                return self._graphs.run(batch, self._eager)
            return self._eager(batch)

    def _eager(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        torch = self._torch
        # The model's own inputs decide: token_type_ids reach BERT-layout models, not DistilBERT or ModernBERT.
        feed = {k: torch.from_numpy(v).to(self.device) for k, v in batch.items() if k in self.input_names}
        with torch.inference_mode():
            logits = self.model(**feed).logits
        return logits.float().cpu().numpy()

    def synchronize(self) -> None:
        if self.device.startswith("cuda"):
            self._torch.cuda.synchronize()

    def close(self) -> None:
        self._graphs = None
        self.model = None
        if self.device.startswith("cuda"):
            self._torch.cuda.empty_cache()


# -- CUDA graphs (CUDA only: the bucket logic they serve is qserve/runtime/graphs.py) ------------------


class _CudaGraph:
    """One forward captured as a CUDA graph at (batch, length): a pinned host block, its static device copy, the
    graph, and its static float32 logits. Capture as the torch docs prescribe: warm-up forwards on a side stream,
    then torch.cuda.graph (its own side stream) into the runtime's shared memory pool."""

    def __init__(
        self, torch: Any, model: Any, names: list[str], shape: graphs.Shape, device: str, pool: Any, pad_id: int
    ):
        b, n = shape
        empty = {k: np.zeros((0, n), dtype=np.int64) for k in names}
        with torch.cuda.device(device), torch.inference_mode():
            # Every row a filler row: the mask has padding, so the warm-up runs the masked attention the capture
            # records (transformers materializes the mask while a stream captures: masking_utils' is_tracing).
            self.host = torch.from_numpy(graphs.stage(empty, names, 0, 0, b, pad_id)).pin_memory()
            self.staging: np.ndarray | None = self.host.numpy()  # Graphs.run stages each block straight into it
            self.static = self.host.to(device)
            feed = {k: self.static[i] for i, k in enumerate(names)}
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    model(**feed)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # what torch.cuda.graph frees on entry anyway, so `before` is what stays
            before = torch.cuda.memory_reserved()
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA work (the model being swapped out, a shadow) may go on meanwhile
            with _CAPTURE_LOCK, torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
                self.out = model(**feed).logits.float()
            torch.cuda.synchronize()
            # the pool's growth (shared: a later capture reuses what an earlier one left), plus the static inputs
            self.nbytes = max(0, int(torch.cuda.memory_reserved() - before)) + self.static.numel() * 8
        self._torch = torch

    def __call__(self, block: np.ndarray, rows: int) -> np.ndarray:
        with self._torch.inference_mode():
            if block is not self.staging:
                self.host.numpy()[...] = block
            self.static.copy_(self.host, non_blocking=True)  # the last call's .cpu() synced: the host block is free
            self.graph.replay()
            return self.out[:rows].cpu().numpy()  # a copy, synchronous: the replay is done


class _Compiled:
    """One (batch, length) bucket of torch.compile(mode="reduce-overhead"): compiled and recorded as a CUDA graph
    by its first calls (torch's cudagraph trees), then replayed; each call copies its block in and its rows out."""

    def __init__(self, torch: Any, compiled: Any, names: list[str], shape: graphs.Shape, device: str, pad_id: int):
        b, n = shape
        self._torch, self.compiled, self.names, self.device = torch, compiled, names, device
        self.staging: np.ndarray | None = None
        before = torch.cuda.memory_reserved(device)
        filler = graphs.stage({k: np.zeros((0, n), dtype=np.int64) for k in names}, names, 0, 0, b, pad_id)
        for _ in range(3):  # compile, record, replay
            self(filler, 1)
        torch.cuda.synchronize(device)
        self.nbytes = max(0, int(torch.cuda.memory_reserved(device) - before))

    def __call__(self, block: np.ndarray, rows: int) -> np.ndarray:
        torch = self._torch
        x = torch.from_numpy(block).to(self.device)
        with torch.inference_mode():
            torch.compiler.cudagraph_mark_step_begin()  # its outputs are read (copied out) before the next call
            logits = self.compiled(**{k: x[i] for i, k in enumerate(self.names)}).logits
            return logits[:rows].float().cpu().numpy()


# -- bitsandbytes ---------------------------------------------------------------------


def _llm_int8_picks_outliers_per_batch(model, spec: VariantSpec, device: str) -> bool:
    """LLM.int8 computes in 16-bit every input column where any row of the batch exceeds the threshold,
    so a row's result depends on its batchmates (the runtime then runs rows alone); threshold 0 turns
    that outlier path off."""
    if spec.dtype != "int8":
        return False
    qc = getattr(model.config, "quantization_config", None)
    unset = BnbOptions.defaults("bnb-int8")["llm_int8_threshold"]  # the declared default the exporter writes
    threshold = (
        qc.get("llm_int8_threshold", unset) if isinstance(qc, dict) else getattr(qc, "llm_int8_threshold", unset)
    )
    return float(threshold or 0.0) > 0.0


def _bnb_load_kwargs(variant_dir, name: str, device: str) -> dict:
    """from_pretrained kwargs for a bnb variant: its config.json carries the quantization_config,
    and the safetensors hold the already-quantized weights, so no source checkpoint is needed."""
    cfg = json.loads((variant_dir / "config.json").read_text(encoding="utf-8"))
    if (cfg.get("quantization_config") or {}).get("quant_method") != "bitsandbytes":
        # Without it transformers would silently load the tensors as a plain model.
        raise VariantError(
            f"{variant_dir}/config.json has no bitsandbytes quantization_config; "
            "the variant is damaged or not a bnb export, re-run `qserve export`"
        )
    # LLM.int8 quantizes activations from fp16 by design, and bitsandbytes logs that at WARNING
    # on every int8 matmul (12 lines per request for a 6-layer model): drop just that message.
    bnb_log = logging.getLogger("bitsandbytes.autograd._functions")
    if not any(isinstance(f, _DropInt8CastWarning) for f in bnb_log.filters):
        bnb_log.addFilter(_DropInt8CastWarning())
    # dtype "auto" = the dtype config.json records for the unquantized modules (fp32 from our
    # exporter); without it transformers' bnb loader would cast them to fp16.
    return {"device_map": {"": device}, "dtype": "auto"}


class _DropInt8CastWarning:
    def filter(self, record) -> bool:
        return not str(record.msg).startswith("MatMul8bitLt: inputs will be cast")


def _bnb_prepare(model, device: str) -> None:
    """Work around two bitsandbytes 0.50.2 CPU bugs for 4-bit layers of narrow shapes (the tests' tiny models).

    Layers its AVX512-BF16 repack would crash on (out_features % 32 or in_features % blocksize != 0) take the generic
    path; where in_features % blocksize != 0 that path dequantizes wrongly, so they dequantize the flat blocks instead.
    """
    if not device.startswith("cpu"):
        return
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            if hasattr(module, "support_avx512bf16_for_cpu") and (
                module.out_features % 32 or module.in_features % state.blocksize
            ):
                module.support_avx512bf16_for_cpu = False
            if module.in_features % state.blocksize:
                module.forward = _flat_dequantized_forward(module)


def _flat_dequantized_forward(module):
    """A Linear4bit forward that dequantizes the weight as stored (flat blocks), then runs a plain linear."""
    import bitsandbytes.functional as F
    import torch

    state = copy.copy(module.weight.quant_state)
    shape = state.shape
    state.shape = torch.Size([shape.numel()])

    def forward(x):
        dtype = module.compute_dtype or x.dtype
        w = F.dequantize_4bit(module.weight.data.reshape(-1), state).reshape(shape).to(dtype)
        bias = None if module.bias is None else module.bias.to(dtype)
        return torch.nn.functional.linear(x.to(dtype), w, bias).to(x.dtype)

    return forward
