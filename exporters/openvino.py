"""ov-fp32 / ov-bf16 / ov-int8: the checkpoint as an OpenVINO IR, quantized by NNCF for int8.

    qserve export models/minilm-l6-distilbert-imdb/checkpoint --variant ov-int8

The IR comes from optimum-intel (ModernBERT: OpenVINO's conversion of qserve's fp32 ONNX graph), exported once
per checkpoint and process; ov-fp32 and ov-bf16 share it (the runtime's precision hint differs); ov-int8 is
`nncf.quantize` on training texts. Why each choice: docs/export.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import threading
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from exporters.calibration import calibration_batches, calibration_inputs, feed
from exporters.core import shared_export
from exporters.layers import Layers
from exporters.onnx import MODEL_FILE as ONNX_FILE
from exporters.onnx import export_fp32
from qserve import QserveError
from qserve.backends import listed
from qserve.backends.openvino import OV_FP32, OpenVINOOptions, openvino_precision
from qserve.extras import require
from qserve.runtime.openvino_rt import compile_config
from qserve.runtime.ov_probe import require_precision
from qserve.variants import VariantSpec

if TYPE_CHECKING:
    from exporters.core import ExportContext

MODEL_FILE = "openvino_model.xml"
WEIGHTS_FILE = "openvino_model.bin"


def build(ctx: ExportContext, out: Path, spec: VariantSpec, opts: OpenVINOOptions) -> dict[str, dict[str, Any]]:
    """Write openvino_model.xml/.bin + config.json for `spec` into `out`; return the manifest's "openvino" record."""
    precision = openvino_precision(spec, opts.inference_precision)
    # Probe first (in a child): NNCF and the parity check run OpenVINO in this process.
    probed = require_precision("int8" if spec.dtype == "int8" and precision == OV_FP32 else precision, spec.name)
    ov = require("openvino", spec.name)
    OVModelForSequenceClassification = require("optimum.intel", spec.name).OVModelForSequenceClassification
    record: dict[str, Any] = {
        "inference_precision": precision,
        "options": opts.to_json(),
        "exported_with": (
            "openvino.convert_model of exporters.onnx.export_fp32's graph"
            if ctx.info.model_type in FROM_ONNX
            else "optimum.intel.OVModelForSequenceClassification (export=True)"
        ),
        "probe": {k: probed.get(k) for k in ("version", "device")},
    }
    fp32 = fp32_ir(ctx.checkpoint, OVModelForSequenceClassification)
    if spec.dtype == "int8":
        ir = ov.Core().read_model(str(fp32 / MODEL_FILE))
        quantized, record["quantization"] = quantize_int8(ir, ctx, opts)
        ov.save_model(quantized, str(out / MODEL_FILE), compress_to_fp16=False)
    else:
        shutil.copy2(fp32 / MODEL_FILE, out / MODEL_FILE)
        shutil.copy2(fp32 / WEIGHTS_FILE, out / WEIGHTS_FILE)
    shutil.copy2(fp32 / "config.json", out / "config.json")
    ops = Counter(op.get_type_name() for op in ov.Core().read_model(str(out / MODEL_FILE)).get_ops())
    record["ops"] = dict(sorted(ops.items()))
    return {"openvino": record}


# architectures optimum-intel no longer exports: their IR is converted from qserve's own fp32 ONNX graph
FROM_ONNX = ("modernbert",)


def _ir_from_onnx(checkpoint: Path, out: Path) -> None:
    """openvino_model.xml/.bin + config.json from the checkpoint's fp32 ONNX graph, weights kept fp32."""
    import openvino as ov

    onnx_dir = out.parent / "onnx"
    export_fp32(checkpoint, onnx_dir)
    out.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov.convert_model(str(onnx_dir / ONNX_FILE)), str(out / MODEL_FILE), compress_to_fp16=False)
    shutil.copy2(checkpoint / "config.json", out / "config.json")


def fp32_ir(checkpoint: Path, exporter: Any) -> Path:
    """A directory holding the checkpoint's fp32 IR (openvino_model.xml/.bin + config.json), exported once
    per process: ov-fp32, ov-bf16 and ov-int8 all start from it."""

    def make(out: Path) -> None:
        if json.loads((checkpoint / "config.json").read_text(encoding="utf-8")).get("model_type") in FROM_ONNX:
            _ir_from_onnx(checkpoint, out)
            return
        with _quiet():
            model = exporter.from_pretrained(str(checkpoint), export=True, compile=False, local_files_only=True)
            model.save_pretrained(out)  # weights stay fp32 (save_model(compress_to_fp16=False))

    return shared_export(checkpoint, ("openvino-ir",), make)


def quantize_int8(ir, ctx: ExportContext, opts: OpenVINOOptions):
    """nncf.quantize with the transformer preset on training texts; returns (model, manifest record)."""
    import nncf

    texts, pairs, source = calibration_inputs(ctx, int(opts.calibration_samples or 0))
    # batch 1, unpadded: each sample's ranges are those of real tokens at their own length
    items = calibration_batches(ctx, texts, ctx.info.max_length, batch_size=1, pairs=pairs)
    # Every input the IR declares: a BERT-layout IR left without token_type_ids runs with a stale shape.
    names = {p.any_name for p in ir.inputs}
    items = [feed(names, b) for b in items]
    keep = listed(opts.keep_fp32)
    matmuls = [op.get_friendly_name() for op in ir.get_ops() if op.get_type_name() == "MatMul"]
    if set(keep) - set(matmuls):
        raise QserveError(
            f"option keep_fp32: {', '.join(map(repr, sorted(set(keep) - set(matmuls))))} matches no MatMul of the "
            f"IR; its names look like {', '.join(matmuls[:2])}, ... ({len(matmuls)} in all)"
        )
    with _quiet():
        kind = nncf.ModelType.TRANSFORMER
        quantized = nncf.quantize(
            ir,
            nncf.Dataset(items),
            model_type=kind,
            subset_size=len(items),
            fast_bias_correction=True,
            ignored_scope=nncf.IgnoredScope(names=keep) if keep else None,
        )
    fq = sum(1 for op in quantized.get_ops() if op.get_type_name() == "FakeQuantize")
    if fq == 0:
        raise QserveError(f"nncf.quantize inserted no FakeQuantize into {ctx.checkpoint}'s IR: nothing was quantized")
    return quantized, {
        "method": "nncf.quantize (post-training, static)",
        "model_type": "TRANSFORMER",
        "preset": "MIXED (NNCF's transformer default: symmetric per-channel int8 weights, asymmetric per-tensor "
        "int8 activations)",
        "smooth_quant": "NNCF default for TRANSFORMER (alpha 0.95 on MatMuls)",
        "bias_correction": "fast (NNCF FastBiasCorrection)",
        "calibration": source,
        "subset_size": len(items),
        "fake_quantize_ops": fq,
        "nncf": getattr(nncf, "__version__", None),
        **({"kept_fp32": keep} if keep else {}),
    }


class OpenVINOLayers(Layers):
    """ov-int8: a layer goes back as its MatMul reading the fp32 IR's weight and the activation from before NNCF's
    FakeQuantize and SmoothQuant's scale (which the fp32 weight does not carry), recompiled."""

    def open(self) -> list[str]:
        import openvino as ov

        self.core = ov.Core()
        self.quantized = self.core.read_model(str(self.variant / MODEL_FILE))
        exporter = require("optimum.intel", "ov-int8").OVModelForSequenceClassification
        fp32 = self.core.read_model(str(fp32_ir(self.checkpoint, exporter) / MODEL_FILE))
        self.fp32 = {op.get_friendly_name(): op for op in fp32.get_ops() if op.get_type_name() == "MatMul"}
        return [
            op.get_friendly_name()
            for op in self.quantized.get_ops()
            if op.get_type_name() == "MatMul"
            and op.get_friendly_name() in self.fp32
            and op.input_value(0).get_node().get_type_name() == "FakeQuantize"
        ]

    def use(self, kept: Sequence[str]) -> None:
        import openvino as ov

        model = self.quantized.clone()
        ops = {op.get_friendly_name(): op for op in model.get_ops()}
        for name in kept:
            ref = self.fp32[name]
            x, source = ops[name].input_value(0), ref.input_value(0).get_node().get_friendly_name()
            while x.get_node().get_friendly_name() != source and x.get_node().get_type_name() in (
                "FakeQuantize",
                "Multiply",
            ):
                x = x.get_node().input_value(0)
            if x.get_node().get_friendly_name() != source:
                raise QserveError(f"{self.variant}: {name} reads {x.get_node().get_friendly_name()}, not {source}")
            ops[name].input(0).replace_source_output(x)
            weight = ref.input_value(1).get_node().get_data().astype(np.float32)
            ops[name].input(1).replace_source_output(ov.op.Constant(weight).output(0))
        config = compile_config(self.rt.precision, self.threads)
        self.rt.compiled, self.rt._local = self.core.compile_model(model, "CPU", config), threading.local()


class _quiet:
    """Silence NNCF's progress bars and the exporters' tracer chatter."""

    def __enter__(self):
        self._warn = warnings.catch_warnings()
        self._warn.__enter__()
        warnings.simplefilter("ignore")
        self._levels = {n: logging.getLogger(n).level for n in ("", "nncf", "optimum", "transformers")}
        for n in self._levels:
            logging.getLogger(n).setLevel(logging.ERROR)
        with contextlib.suppress(ImportError):
            import nncf

            nncf.set_log_level(logging.ERROR)
        return self

    def __exit__(self, *exc):
        for n, level in self._levels.items():
            logging.getLogger(n).setLevel(level)
        self._warn.__exit__(*exc)
        return False
