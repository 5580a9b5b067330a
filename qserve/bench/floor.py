"""The compute floor: FLOPs per sequence from the model config over a measured peak GEMM rate.

    python -c "from qserve.bench.floor import measure_peaks; print(measure_peaks([(128, 384, 384)], 2)['peaks'])"

FLOPs per sequence of length S (embeddings excluded): 2 * linear params per layer * S * layers
+ 2 * 2 * S^2 * d * layers (attention) + 2 * (d*d + d*num_labels) (the head, on [CLS] only).
Peaks are best-of-N rates per compute type at the model's own GEMM shapes (`model_peaks`) and at larger
saturating shapes (`peaks`); floor_ms = FLOPs * batch / peak: no implementation can be faster.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any

import numpy as np

from qserve.devices import cpu_supports_bf16

# Which measured peak bounds a variant, by the spec's dtype. 4-bit weights are
# dequantized or run on integer kernels, so they are held to the fastest peak measured
# (the most demanding floor); fp16 on CPU has no fast kernel and falls back likewise.
PEAK_FOR_DTYPE = {
    "fp32": ["fp32"],
    "bf16": ["bf16", "fp32"],
    "fp16": ["fp16", "bf16", "fp32"],
    "int8": ["int8", "fp32"],
}


def model_dims(config: dict[str, Any]) -> dict[str, int]:
    """d, layers, ffn hidden, heads, labels from a DistilBERT (or BERT-layout) config.json."""
    d = config.get("dim") or config.get("hidden_size")
    layers = config.get("n_layers") or config.get("num_hidden_layers")
    hidden = config.get("hidden_dim") or config.get("intermediate_size")
    heads = config.get("n_heads") or config.get("num_attention_heads")
    labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 2))
    if not (d and layers and hidden):
        raise ValueError(
            "config.json lacks dim/n_layers/hidden_dim (or hidden_size/num_hidden_layers/"
            "intermediate_size); cannot count FLOPs"
        )
    return {"d": int(d), "layers": int(layers), "hidden": int(hidden), "heads": int(heads or 1), "labels": labels}


def flops_per_sequence(config: dict[str, Any], seq_len: int) -> dict[str, float]:
    """Forward FLOPs for one sequence of `seq_len` tokens, with the breakdown."""
    m = model_dims(config)
    d, L, h = m["d"], m["layers"], m["hidden"]
    params_linear = 4 * d * d + 2 * d * h  # per layer; biases are adds, not counted
    linear = 2.0 * params_linear * seq_len * L
    attention = 2.0 * 2.0 * seq_len * seq_len * d * L
    head = 2.0 * (d * d + d * m["labels"])
    out = {"seq_len": seq_len, "params_linear": params_linear * L, "linear": linear, "attention": attention}
    return {**out, "head": head, "total": linear + attention + head}


def gemm_shapes(config: dict[str, Any], tokens: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of the model's GEMMs at `tokens` rows, then saturating shapes (4x the rows, a 1024 cube)."""
    m = model_dims(config)
    d, h = m["d"], m["hidden"]
    model = [(tokens, d, d), (tokens, d, h), (tokens, h, d)]
    return model + [(max(512, 4 * tokens), d, h), (1024, 1024, 1024)]


GPU_SATURATING = [(4096, 4096, 4096), (8192, 8192, 8192)]
"""Cubes that saturate a data-centre GPU's tensor cores: a 1024 cube leaves most of them idle, so a GPU's peak
read from it, and the floor from that peak, would be several times too lenient (docs/bench.md, "The compute
floor on a GPU"). CPUs reach their peak at the 1024 cube already."""


def shapes_for(shapes: list[tuple[int, int, int]], device: str) -> list[tuple[int, int, int]]:
    """The shapes a peak is measured on, on `device`: the given ones (the model's, then the saturating ones of
    gemm_shapes), plus GPU_SATURATING on CUDA. The model shapes stay first (model_peaks reads them by position)."""
    if not device.startswith("cuda"):
        return list(shapes)
    return list(shapes) + [s for s in GPU_SATURATING if s not in shapes]


def peak_for(dtype: str, peaks: dict[str, Any]) -> tuple[str, float] | None:
    """(peak name, GFLOP/s) that bounds a variant of `dtype`; None when nothing was measured."""
    measured = {k: v["gflops"] for k, v in peaks.items() if isinstance(v, dict) and v.get("gflops")}
    if not measured:
        return None
    chain = PEAK_FOR_DTYPE.get(dtype)
    if chain is None:  # 4-bit and other low-bit formats: the fastest rate measured
        best = max(measured, key=lambda k: measured[k])
        return best, measured[best]
    for name in chain:
        if name in measured:
            return name, measured[name]
    return None


def floor_ms(flops: float, batch: int, gflops: float) -> float:
    return flops * batch / (gflops * 1e9) * 1e3


# -- measurement (runs in a child process) ------------------------------------------------


def _rate(fn, flops: float, budget_s: float) -> float:
    """GFLOP/s of `fn` (one GEMM of `flops`), best of timed calls within the budget."""
    fn()  # warm-up: allocation, kernel selection, weight packing
    best = float("inf")
    start = time.perf_counter()
    n = 0
    while n < 3 or (time.perf_counter() - start < budget_s and n < 1000):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        n += 1
    return flops / best / 1e9


def _torch_methods(device: str):
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def matmul(dtype, M, K, N):
        a = torch.randn(M, K, device=device).to(dtype)
        b = torch.randn(K, N, device=device).to(dtype)
        return lambda: (torch.matmul(a, b), sync())

    def int_mm(M, K, N):
        if not hasattr(torch, "_int_mm"):
            raise RuntimeError("torch._int_mm is not available in this torch")
        a = torch.randint(-128, 127, (M, K), dtype=torch.int8, device=device)
        b = torch.randint(-128, 127, (K, N), dtype=torch.int8, device=device)
        return lambda: (torch._int_mm(a, b), sync())

    out = [("fp32", "torch.matmul", functools.partial(matmul, torch.float32)), ("int8", "torch._int_mm", int_mm)]

    if device.startswith("cuda") or cpu_supports_bf16():
        out.append(("bf16", "torch.matmul", functools.partial(matmul, torch.bfloat16)))
    if device.startswith("cuda"):
        out.append(("fp16", "torch.matmul", functools.partial(matmul, torch.float16)))
    return out


def _ort_methods(threads: int | None):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    def session(node, a_type, y_type, K, N, inits):
        g = helper.make_graph(
            [node],
            "gemm",
            [helper.make_tensor_value_info("A", a_type, [None, K])],
            [helper.make_tensor_value_info("Y", y_type, [None, N])],
            inits,
        )
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = threads
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

    rng = np.random.default_rng(0)

    def matmul_integer(M, K, N):
        b = rng.integers(-128, 127, (K, N), dtype=np.int8)
        s = session(
            helper.make_node("MatMulInteger", ["A", "B", "az", "bz"], ["Y"]),
            TensorProto.UINT8,
            TensorProto.INT32,
            K,
            N,
            [
                numpy_helper.from_array(b, "B"),
                numpy_helper.from_array(np.array(128, np.uint8), "az"),
                numpy_helper.from_array(np.array(0, np.int8), "bz"),
            ],
        )
        a = rng.integers(0, 255, (M, K), dtype=np.uint8)
        return lambda: s.run(None, {"A": a})

    def matmul(M, K, N):
        w = rng.standard_normal((K, N), dtype=np.float32)
        node = helper.make_node("MatMul", ["A", "W"], ["Y"])
        s = session(node, TensorProto.FLOAT, TensorProto.FLOAT, K, N, [numpy_helper.from_array(w, "W")])
        a = rng.standard_normal((M, K), dtype=np.float32)
        return lambda: s.run(None, {"A": a})

    return [("int8", "onnxruntime MatMulInteger", matmul_integer), ("fp32", "onnxruntime MatMul", matmul)]


def measure_peaks(
    shapes: list[tuple[int, int, int]],
    threads: int | None,
    device: str = "cpu",
    budget_s: float = 1.0,
    model_shapes: int = 0,
) -> dict[str, Any]:
    """Best GFLOP/s per dtype over methods and shapes, every attempt recorded: `peaks` over every shape (the
    machine's), `model_peaks` over the first `model_shapes` (the model's own GEMMs at the headline batch)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    shapes = shapes_for(shapes, device)
    methods = _torch_methods(device)
    if not device.startswith("cuda"):
        try:
            methods += _ort_methods(threads)
        except ImportError as e:
            methods.append(("int8", "onnxruntime", None))
            print(f"floor: onnxruntime unavailable ({e})", file=sys.stderr)
    attempts: list[dict[str, Any]] = []
    peaks: dict[str, Any] = {}
    model_peaks: dict[str, Any] = {}
    for dtype, method, build in methods:
        for i, (M, K, N) in enumerate(shapes):
            rec: dict[str, Any] = {
                "dtype": dtype,
                "method": method,
                "shape": [M, K, N],
                "model_shape": i < model_shapes,
            }
            try:
                if build is None:
                    raise RuntimeError("not installed")
                rec["gflops"] = _rate(build(M, K, N), 2.0 * M * K * N, budget_s)
            except Exception as e:  # one missing kernel must not hide the others
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            attempts.append(rec)
            if rec.get("gflops") and rec["gflops"] > peaks.get(dtype, {}).get("gflops", 0):
                peaks[dtype] = {"gflops": rec["gflops"], "method": method, "shape": [M, K, N]}
            if rec["model_shape"] and rec.get("gflops") and rec["gflops"] > model_peaks.get(dtype, {}).get("gflops", 0):
                model_peaks[dtype] = {"gflops": rec["gflops"], "method": method, "shape": [M, K, N]}
    return {
        "threads": threads,
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "peaks": peaks,
        "model_peaks": model_peaks,
        "attempts": attempts,
    }
