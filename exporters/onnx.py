"""onnx-fp32 / onnx-fp16 / onnx-int8 / onnx-int4: the checkpoint exported to ONNX, then converted.

    qserve export models/minilm-imdb --bits 8 --backend onnx     # -> onnx-int8 (avx512_vnni preset)

Every variant starts from one fp32 graph qserve exports itself (export_fp32), once per checkpoint and process, in
the layout optimum's ORTModelForSequenceClassification reads. fp16: ORT's float16 converter, fp32 io; int8:
dynamic u8s8 quantization after optional smoothing, then an output-bias correction; int4: MatMulNBits.
Why each choice: docs/export.md.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from packaging.version import Version

from exporters import rowwise, smoothing
from exporters.calibration import calibration_set, feed, held_out_set, rows_alone
from exporters.core import shared_export
from exporters.layers import Layers
from qserve import QserveError
from qserve.artifact import read_manifest
from qserve.backends import listed
from qserve.backends.onnx import OnnxOptions
from qserve.devices import capabilities
from qserve.modeling import model_inputs
from qserve.runtime.onnx_rt import session_options
from qserve.variants import VariantSpec

if TYPE_CHECKING:
    from exporters.core import ExportContext

MODEL_FILE = "model.onnx"


def build(ctx: ExportContext, out: Path, spec: VariantSpec, opts: OnnxOptions) -> dict[str, dict[str, Any]]:
    """Write model.onnx + config.json for `spec` into `out`; return the manifest's "onnx" record."""
    checkpoint, out = ctx.checkpoint, Path(out)

    with tempfile.TemporaryDirectory(prefix="qserve-onnx-") as scratch:
        fp32_dir = fp32_export(checkpoint, opts.opset, bool(opts.quantize_embeddings))
        src = fp32_dir / MODEL_FILE
        opset = graph_opset(src)
        dst = out / MODEL_FILE
        if spec.dtype == "fp32":
            shutil.copy2(src, dst)
            record: dict[str, Any] = {}
        elif spec.dtype == "fp16":
            record = convert_fp16(src, dst)
        elif spec.dtype == "int8":
            record = quantize_int8(src, dst, _read_config(fp32_dir), opts, Path(scratch), ctx)
        elif spec.dtype == "int4":
            record = quantize_int4(src, dst, opts)
        else:  # the declaration (qserve/backends/onnx.py) and this module disagree: a programming error
            raise QserveError(f"exporters.onnx has no conversion for dtype {spec.dtype!r}")
        shutil.copy2(fp32_dir / "config.json", out / "config.json")
    import onnx

    model = onnx.load(str(dst), load_external_data=False)
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    return {
        "onnx": {
            "opset": opsets.get("ai.onnx", opset),
            "opsets": opsets,
            "ir_version": model.ir_version,
            "options": opts.to_json(),
            "ops": sorted({n.op_type for n in model.graph.node}),
            **record,
        }
    }


def fp32_export(checkpoint: Path, opset: int | None, embeddings: bool) -> Path:
    """The checkpoint's fp32 graph dir: one export per checkpoint and opset in this process, shared by the ONNX
    variants (opset 21 for int4 embeddings: GatherBlockQuantized stores int4 data only opset 21 graphs may hold)."""
    opset = 21 if embeddings else opset
    return shared_export(checkpoint, ("onnx", opset), lambda d: export_fp32(checkpoint, d, opset=opset))


def _read_config(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text(encoding="utf-8"))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the tracer and quantizer chatter that says nothing about our model."""
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


# optimum-onnx 0.1.0's default: the graphs exported before qserve owned the export keep their operators
DEFAULT_OPSET = 18
# Where a graph's axes may vary: any batch, any sequence length (the names optimum's exports used).
_AXES = {0: "batch_size", 1: "sequence_length"}
# Two texts of different lengths: the trace runs the padding mask on a row that has padding.
_TRACE_TEXTS = ["A short review.", "A longer review, so that the first one in the batch is padded to this length."]


def graph_inputs(model: Any) -> tuple[str, ...]:
    """The graph's inputs: input_ids, attention_mask, and token_type_ids where the model reads segment ids (not
    RoBERTa's type_vocab_size 1 or DeBERTa-v3's 0)."""
    segments = int(getattr(model.config, "type_vocab_size", 0) or 0) > 1
    wanted = {n for n in model_inputs(model) if n != "token_type_ids" or segments}
    # In the forward's own order: the TorchScript exporter binds named inputs to the graph's inputs that way.
    return tuple(n for n in inspect.signature(model.forward).parameters if n in wanted)


@contextlib.contextmanager
def _traceable_masks() -> Iterator[None]:
    """While tracing: give transformers' mask builders a query length they read as one.

    transformers 5.0-5.5's mask builders index a tensor `q_length`, which a traced size fails; handed the
    cache_position that equals it, they build the same mask and the sequence axis stays dynamic. Elsewhere the
    wrappers pass everything through unchanged."""
    import torch
    import transformers

    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS as masks
    except ImportError:  # a transformers without the mask registry builds its masks inline
        yield
        return
    if Version(transformers.__version__).release >= (5, 6):  # q_length is a length again: nothing to translate
        yield
        return

    def traceable(build: Any) -> Any:
        def build_traced(*args: Any, **kwargs: Any) -> Any:
            q_length = kwargs.get("q_length")
            if isinstance(q_length, torch.Tensor) and q_length.dim() == 0:
                kwargs["q_length"] = torch.arange(q_length) + kwargs.pop("q_offset", 0)
            return build(*args, **kwargs)

        return build_traced

    originals = {k: masks[k] for k in ("sdpa", "eager") if k in masks}
    notes = logging.getLogger("transformers.masking_utils")  # its one-time note on the cache_position it is handed
    level = notes.level
    notes.setLevel(logging.ERROR)
    for k, build in originals.items():
        masks.register(k, traceable(build))
    try:
        yield
    finally:
        for k, build in originals.items():
            masks.register(k, build)
        notes.setLevel(level)


def export_fp32(checkpoint: Path, out: Path, opset: int | None = None) -> int:
    """Export a local checkpoint's classifier to `out`/model.onnx (+ its config.json); returns the opset used.

    TorchScript tracing (dynamo=False) with dynamic axes, on a batch with a padded row so the padding mask is
    traced; export_variant checks parity afterwards."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    # eager attention: the plain MatMul/Softmax graph ORT's fusion (option optimize) recognises, not SDPA's
    model = AutoModelForSequenceClassification.from_pretrained(
        checkpoint, dtype=torch.float32, local_files_only=True, attn_implementation="eager"
    ).eval()
    tok = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    names = graph_inputs(model)
    enc = tok(_TRACE_TEXTS, padding=True, return_tensors="pt")
    kwargs = {n: enc[n] if n in enc else torch.zeros_like(enc["input_ids"]) for n in names}
    opset = opset or DEFAULT_OPSET
    with _quiet(), _traceable_masks(), torch.no_grad():
        # opset 21 (int4 embeddings): opset-20 operators under its header (the warning silenced); the model itself
        # is traced, not a wrapper, so node names keep its module paths (keep_fp32 matches them)
        torch.onnx.export(
            model,
            (kwargs,),
            str(out / MODEL_FILE),
            input_names=list(names),
            output_names=["logits"],
            dynamic_axes={**{n: _AXES for n in names}, "logits": {0: "batch_size"}},
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    if any(p.name != MODEL_FILE for p in out.iterdir()):
        # Past protobuf's single-file limit: external data. Far beyond a DistilBERT; refuse, not ship half a model.
        raise QserveError(
            f"{checkpoint} exports to an ONNX model with external data (> 2 GB); "
            "qserve's ONNX variants support single-file models only"
        )
    shutil.copy2(checkpoint / "config.json", out / "config.json")
    return graph_opset(out / MODEL_FILE)


def graph_opset(path: Path) -> int:
    """The default-domain opset an ONNX file was written with."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def convert_fp16(src: Path, dst: Path) -> dict[str, Any]:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    with _quiet():
        model16 = convert_float_to_float16(model, keep_io_types=True)
    onnx.save(model16, str(dst))
    return {"conversion": {"tool": "onnxruntime.transformers.float16", "keep_io_types": True}}


def optimize_bert(src: Path, dst: Path, config: dict[str, Any]) -> dict[str, int]:
    """ORT's transformer fusions (portable python fusions + basic ORT rewrites); returns fused op counts."""
    from onnxruntime.transformers.optimizer import optimize_model

    heads = int(config.get("n_heads") or config.get("num_attention_heads") or 0)
    hidden = int(config.get("dim") or config.get("hidden_size") or 0)
    with _quiet():
        # model_type "bert" covers DistilBERT (optimum maps distilbert -> bert the same way).
        # opt_level 1 keeps the graph hardware-independent: it must load on any CPU and in ORTModel.
        optimized = optimize_model(
            str(src), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=1, use_gpu=False
        )
    optimized.save_model_to_file(str(dst))
    return {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}


def quantize_int8(
    src: Path, dst: Path, config: dict[str, Any], opts: OnnxOptions, scratch: Path, checkpoint: ExportContext | Path
) -> dict[str, Any]:
    """The int8 graph of `src` into `dst`; returns the manifest's record of how it was made.

    smooth=None measures both graphs (plain and smoothed, bias-corrected) on held-out training texts and keeps the
    one closer to fp32 (docs/export.md)."""
    record: dict[str, Any] = {}
    keep = kept_fp32(src, opts.keep_fp32 or "")  # before the slow steps: a pattern matching nothing fails at once
    batches: list[dict[str, Any]] = []
    source = ""
    if opts.smooth is not False or opts.correct_bias:
        batches, source = calibration_set(checkpoint, int(opts.calibration_samples or 0))  # read once, used by all
        if opts.calibrate_alone:
            # each text alone, as the runtime answers it (docs/measurements.md, "One text, one answer")
            batches = rows_alone(batches)
    if opts.smooth is not None:
        src_q = smooth_fp32(src, scratch / "smoothed.onnx", batches, source, record) if opts.smooth else src
        record.update(_quantize_graph(src_q, dst, src, config, opts, keep, scratch, batches, source))
        return record

    held, held_source = held_out_set(checkpoint, int(opts.calibration_samples or 0), batches, source)
    reference = _logits(src, held)
    tried: dict[str, tuple[float, dict[str, Any], Path]] = {}
    for name in ("plain", "smoothed"):
        rec: dict[str, Any] = {}
        graph = smooth_fp32(src, scratch / "smoothed.onnx", batches, source, rec) if name == "smoothed" else src
        out = scratch / f"int8-{name}.onnx"
        rec.update(_quantize_graph(graph, out, src, config, opts, keep, scratch / name, batches, source))
        tried[name] = (float(np.abs(_logits(out, held) - reference).mean()), rec, out)
    pick = "smoothed" if tried["smoothed"][0] < tried["plain"][0] else "plain"  # a tie keeps the simpler graph
    shutil.copyfile(tried[pick][2], dst)
    record.update(tried[pick][1])

    record["smoothing_choice"] = {
        "chosen": pick,
        "mean_abs_logit_error": {k: round(v[0], 6) for k, v in tried.items()},
        "measured_on": held_source,
        "cpu_class": capabilities(with_cuda=False).cpu_class,
        "why": "smooth=auto: the int8 graph, plain and smoothed, each bias-corrected, against fp32 on held-out texts",
    }
    return record


def _quantize_graph(
    src: Path,
    dst: Path,
    reference: Path,
    config: dict[str, Any],
    opts: OnnxOptions,
    keep: list[str],
    scratch: Path,
    batches: list[dict[str, Any]],
    source: str,
) -> dict[str, Any]:
    """Quantize the fp32 graph `src` (smoothed or plain) into `dst`, bias-corrected against the plain `reference`."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    record: dict[str, Any] = {}
    scratch.mkdir(parents=True, exist_ok=True)
    if opts.optimize:
        fused = scratch / "fused.onnx"
        record["fusions"] = optimize_bert(src, fused, config)
        src = fused
        keep = kept_fp32(src, opts.keep_fp32 or "")  # fusion renames some MatMuls: match on the graph quantized
    if keep:
        record["kept_fp32"] = keep
    if opts.activation_scales == "per-row":
        model, record["rowwise"] = rowwise.rewrite(onnx.load(str(src)), keep)
        onnx.save(model, str(dst))
        if opts.correct_bias:
            record["bias_correction"] = correct_logit_bias(dst, reference, batches, source)
        record["quantization"] = {
            "method": "exporters.rowwise",
            "mode": "per-row",
            "activation_scales": "per-row",
            "format": "MatMulIntegerToFloat",
            "weight_type": "QInt8",
            "activation_type": "QUInt8 (symmetric, zero point 128)",
            "per_channel": True,
            "reduce_range": False,
        }
        return record
    with _quiet():
        quantize_dynamic(
            str(src),
            str(dst),
            per_channel=opts.per_channel,
            reduce_range=opts.reduce_range,
            weight_type=QuantType.QInt8,
            # dynamic quantization turns a Gemm into a MatMul named <name>_MatMul first: excluded by that name
            nodes_to_exclude=[*keep, *(k + "_MatMul" for k in keep)],
            # shape inference cannot type fused contrib ops' outputs; every float tensor here is fp32
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    if opts.correct_bias:
        record["bias_correction"] = correct_logit_bias(dst, reference, batches, source)
    record["quantization"] = {
        # optimum's AutoQuantizationConfig.avx512_vnni(is_static=False): dynamic, QOperator, u8 activations x s8
        "preset": "avx512_vnni",
        "method": "onnxruntime.quantization.quantize_dynamic",
        "mode": "dynamic",
        "activation_scales": "per-tensor",
        "row_by_row": opts.row_by_row,
        "calibrate_alone": opts.calibrate_alone,
        "format": "QOperator",
        "weight_type": "QInt8",
        "activation_type": "QUInt8",
        "per_channel": opts.per_channel,
        "reduce_range": opts.reduce_range,
    }
    return record


def kept_fp32(src: Path, patterns: str) -> list[str]:
    """Names of the weighted() nodes matching any comma-separated part of `patterns`; each part must match."""
    parts = listed(patterns)
    if not parts:
        return []
    import onnx

    names = weighted(onnx.load(str(src), load_external_data=False).graph)
    unmatched = [p for p in parts if not any(p in n for n in names)]
    if unmatched:
        raise QserveError(
            f"option keep_fp32: {', '.join(map(repr, unmatched))} matches no MatMul, Gemm or Gather with weights; "
            f"node names look like {', '.join(names[:3])}, ... ({len(names)} in all)"
        )
    return [n for n in names if any(p in n for p in parts)]


def weighted(graph: Any) -> list[str]:
    """Names of the graph's nodes a quantizer may store in fewer bits, in graph order: MatMul / Gemm by a weight,
    Gather from a table (the embeddings: quantize_dynamic quantizes them too)."""
    inits = {i.name for i in graph.initializer}
    ops = ("MatMul", "Gemm", "Gather")
    return [n.name for n in graph.node if n.op_type in ops and n.input[n.op_type != "Gather"] in inits]


def smooth_fp32(src: Path, dst: Path, batches: list[dict[str, Any]], source: str, record: dict[str, Any]) -> Path:
    """Write the smoothed fp32 graph to `dst` (see exporters.smoothing); fill record["smoothing"]."""
    import onnx

    with _quiet():
        model, record["smoothing"] = smoothing.smooth(onnx.load(str(src)), batches)
    record["smoothing"]["calibration"] = source
    onnx.save(model, str(dst))
    return dst


def correct_logit_bias(quantized: Path, reference: Path, batches: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """Take the int8 graph's mean logit shift against fp32 on calibration texts out of its output bias (exact, free at
    run time: docs/export.md)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(quantized))
    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    output = model.graph.output[0].name
    node = producer.get(output)
    uses = [i for n in model.graph.node for i in n.input]
    bias = next((i for i in node.input if i in inits), None) if node is not None and node.op_type == "Add" else None
    if bias is None or uses.count(bias) != 1:
        return {"applied": False, "why": f"the output {output!r} is not an Add of a bias used nowhere else"}
    shift = (_logits(quantized, batches) - _logits(reference, batches)).mean(axis=0)
    b = numpy_helper.to_array(inits[bias]).astype(np.float32)
    if b.shape != shift.shape:
        return {"applied": False, "why": f"bias {bias!r} has shape {b.shape}, the logits {shift.shape}"}
    inits[bias].CopyFrom(numpy_helper.from_array((b - shift).astype(np.float32), bias))
    onnx.save(model, str(quantized))
    return {
        "applied": True,
        "method": "mean int8 - fp32 logits on the calibration texts, subtracted from the output bias",
        "bias": bias,
        "shift": [round(float(v), 6) for v in shift],
        "calibration": source,
    }


def _logits(model: Any, batches: list[dict[str, Any]]) -> Any:
    """fp64 logits of the graph at `model` (or of a session) on calibration batches."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = model if hasattr(model, "run") else ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return np.concatenate([sess.run(None, feed(names, b))[0] for b in batches]).astype(np.float64)


def quantize_int4(src: Path, dst: Path, opts: OnnxOptions) -> dict[str, Any]:
    import onnx
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    ops = ("MatMul", "Gather") if opts.quantize_embeddings else ("MatMul",)
    keep = kept_fp32(src, opts.keep_fp32 or "")
    model = onnx.load(str(src))
    with _quiet():
        quantizer = MatMulNBitsQuantizer(
            model,
            bits=4,
            block_size=opts.block_size,
            is_symmetric=opts.symmetric,
            accuracy_level=opts.accuracy_level,
            quant_format=QuantFormat.QOperator,
            op_types_to_quantize=ops,
            nodes_to_exclude=keep,
        )
        quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)
    return {
        "quantization": {
            "method": "onnxruntime MatMulNBitsQuantizer (weight-only, round-to-nearest)",
            "bits": 4,
            "block_size": opts.block_size,
            "accuracy_level": opts.accuracy_level,
            "symmetric": opts.symmetric,
            "op_types": list(ops),
            **({"kept_fp32": keep} if keep else {}),
        }
    }


class OnnxLayers(Layers):
    """onnx-int8 / onnx-int4: a layer goes back as the fp32 graph's own MatMul in place of the last node of its
    quantized subgraph (ORT's quantizers keep each output's name; smoothing leaves its input in the graph)."""

    def open(self) -> list[str]:
        import onnx

        record = read_manifest(self.variant).record("onnx")
        opts = record.get("options") or {}
        fp32 = fp32_export(self.checkpoint, opts.get("opset"), bool(opts.get("quantize_embeddings")))
        self.quantized = onnx.load(str(self.variant / MODEL_FILE))
        self.fp32 = onnx.load(str(fp32 / MODEL_FILE))
        # a bias-corrected variant: each candidate's shift measured as its export would, on the same texts
        self.bias = (record.get("bias_correction") or {}).get("bias")
        if self.bias:
            batches, _ = calibration_set(self.checkpoint, int(opts.get("calibration_samples") or 0))
            self.batches = rows_alone(batches) if opts.get("calibrate_alone") else batches
            self.ref = _logits(fp32 / MODEL_FILE, self.batches)
        made = {o: n.op_type for n in self.quantized.graph.node for o in n.output}
        self.source = {n.name: n for n in self.fp32.graph.node if n.name in weighted(self.fp32.graph)}
        return [k for k, n in self.source.items() if made.get(n.output[0]) not in (None, n.op_type)]

    def use(self, kept: Sequence[str]) -> None:
        import onnx
        import onnxruntime as ort

        model = onnx.ModelProto()
        model.CopyFrom(self.quantized)
        at = {o: i for i, n in enumerate(model.graph.node) for o in n.output}
        known = {*at, *(i.name for i in model.graph.input), *(i.name for i in model.graph.initializer)}
        weights = {i.name: i for i in self.fp32.graph.initializer}
        for name in kept:
            node = self.source[name]
            missing = [i for i in node.input if i not in known and i not in weights]
            if missing:  # a fused graph (optimize=true) renames what the fp32 MatMul reads
                raise QserveError(f"{self.variant}: {name} reads {missing}, which its quantized graph lacks")
            model.graph.node[at[node.output[0]]].CopyFrom(node)
            model.graph.node[at[node.output[0]]].name += "/fp32"  # a quantized Gather keeps the original's name
            model.graph.initializer.extend(weights[i] for i in node.input if i in weights and i not in known)
            known |= set(node.input)
        if kept and self.bias:  # fp32's bias, and the shift the export would take out of it taken out of the logits
            next(i for i in model.graph.initializer if i.name == self.bias).CopyFrom(weights[self.bias])
        so = session_options(ort, self.threads)
        self.rt.session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.shift = (_logits(self.rt.session, self.batches) - self.ref).mean(axis=0) if kept and self.bias else 0.0
