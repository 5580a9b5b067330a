"""onnx-int8 with per-row activation scales: each token row quantized on its own, so no row sees another.

    qserve export models/minilm-l6-distilbert-imdb/checkpoint --variant onnx-int8 --activation-scales per-row

Each row of a MatMul's input gets its own symmetric scale (max|x_row| / 127, zero point 128) in ONNX ops before
MatMulIntegerToFloat, so a row's output depends on that row alone; MatMuls sharing an input share one
quantization. What it costs: docs/measurements.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exporters.smoothing import weight_groups


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column symmetric int8 (the same grid as ORT's per-channel QInt8 weights): (int8 weights, scales)."""
    scale = np.abs(w).max(axis=0) / 127.0
    scale[scale == 0] = 1.0
    return np.clip(np.round(w / scale), -127, 127).astype(np.int8), scale.astype(np.float32)


def rewrite(model: Any, exclude: list[str] | tuple[str, ...] = ()) -> tuple[Any, dict[str, Any]]:
    """Replace every constant-weight MatMul (except those named in `exclude`) by the per-row int8 form."""
    from onnx import helper, numpy_helper

    inits, groups = weight_groups(model)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    consts = {
        "rw_127": np.array(127.0, np.float32),
        "rw_inv127": np.array(1 / 127.0, np.float32),
        "rw_one": np.array(1.0, np.float32),
        "rw_eps": np.array(1e-12, np.float32),
        "rw_zp": np.array(128, np.uint8),
        "rw_axes": np.array([-1], np.int64),
    }
    new_inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    replace: dict[int, list[Any]] = {}
    drop: set[int] = set()
    converted = 0
    for gi, (x, consumers) in enumerate(groups.items()):
        consumers = [c for c in consumers if c.name not in exclude]
        ws = [numpy_helper.to_array(inits[c.input[1]]).astype(np.float32) for c in consumers]
        if not ws or not all(w.ndim == 2 and w.shape[0] == ws[0].shape[0] for w in ws):
            continue
        p = f"rowwise{gi}"
        amax = (
            [helper.make_node("ReduceMax", [f"{p}_abs", "rw_axes"], [f"{p}_amax0"], keepdims=1)]
            if opset >= 18
            else [helper.make_node("ReduceMax", [f"{p}_abs"], [f"{p}_amax0"], axes=[-1], keepdims=1)]
        )
        nodes = [
            helper.make_node("Abs", [x], [f"{p}_abs"]),
            *amax,
            # An all-zero row gets a tiny scale instead of a division by zero (it quantizes to 0 either way).
            helper.make_node("Max", [f"{p}_amax0", "rw_eps"], [f"{p}_amax"]),
            helper.make_node("Div", ["rw_127", f"{p}_amax"], [f"{p}_inv"]),
            helper.make_node("Mul", [x, f"{p}_inv"], [f"{p}_xs"]),
            # round half to even, + 128, saturate, cast to uint8: one op (|x * 127 / max|x|| <= 127)
            helper.make_node("QuantizeLinear", [f"{p}_xs", "rw_one", "rw_zp"], [f"{p}_xq"]),
            helper.make_node("Mul", [f"{p}_amax", "rw_inv127"], [f"{p}_srow"]),
        ]
        wq, scale = quantize_weight(np.concatenate(ws, axis=1))
        new_inits += [numpy_helper.from_array(wq, f"{p}_w"), numpy_helper.from_array(scale, f"{p}_wscale")]
        joint = f"{p}_y" if len(consumers) > 1 else consumers[0].output[0]
        # int32 product (exact) times the per-column weight scale in one kernel (a_scale 1: the per-row
        # scale is applied after, as the kernel takes only a per-tensor A scale)
        nodes += [
            helper.make_node(
                "MatMulIntegerToFloat",
                [f"{p}_xq", f"{p}_w", "rw_one", f"{p}_wscale", "rw_zp"],
                [f"{p}_y0"],
                domain="com.microsoft",
            ),
            helper.make_node("Mul", [f"{p}_y0", f"{p}_srow"], [joint]),
        ]
        if len(consumers) > 1:
            sizes = np.array([w.shape[1] for w in ws], np.int64)
            new_inits.append(numpy_helper.from_array(sizes, f"{p}_split"))
            nodes.append(
                helper.make_node("Split", [joint, f"{p}_split"], [c.output[0] for c in consumers], axis=-1)
                if opset >= 13
                else helper.make_node("Split", [joint], [c.output[0] for c in consumers], axis=-1, split=sizes.tolist())
            )
        # the new nodes go where the group's first consumer was (they read only x and constants)
        positions = {id(n): i for i, n in enumerate(model.graph.node)}
        first = min(consumers, key=lambda c: positions[id(c)])
        replace[id(first)] = nodes
        drop.update(id(c) for c in consumers if c is not first)
        converted += len(consumers)
    out = []
    for n in model.graph.node:
        if id(n) in drop:
            continue
        out.extend(replace.get(id(n), [n]))
    del model.graph.node[:]
    model.graph.node.extend(out)
    used = {i for n in model.graph.node for i in n.input}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept + [t for t in new_inits if t.name in used])
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model, {"matmuls": converted, "groups": len(replace)}
