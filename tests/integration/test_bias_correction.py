"""onnx-int8's output bias correction: the int8 logits' mean shift against fp32 is taken out of the bias.

python -m pytest tests/integration/test_bias_correction.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

import exporters
from exporters.calibration import calibration_texts
from exporters.core import reference_logits
from qserve import QserveError
from qserve.runtime import RuntimeOptions, load_runtime


@pytest.fixture(scope="module")
def int8_pair(tiny_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("bias")
    on = exporters.export(tiny_checkpoint, "onnx-int8", root / "on").to_json()
    off = exporters.export(tiny_checkpoint, "onnx-int8", root / "off", options={"correct_bias": False}).to_json()
    return (root / "on", on), (root / "off", off)


def _logits(variant, texts):
    # The graph as calibrated (one forward per batch); served, it runs row by row
    # (tests/integration/test_invariance.py).
    rt = load_runtime(variant, device="cpu", options=RuntimeOptions(batch_dependent="batched"))
    try:
        return rt.logits(texts).astype(np.float64)
    finally:
        rt.close()


def test_corrected_int8_has_no_mean_shift_on_its_calibration_texts(tiny_checkpoint, int8_pair):
    (on_dir, on), (off_dir, off) = int8_pair
    rec = on["onnx"]["bias_correction"]
    assert rec["applied"] is True and rec["bias"] == "classifier.bias" and len(rec["shift"]) == 2
    assert "parity probe texts" in rec["calibration"]
    assert on["onnx"]["options"]["correct_bias"] is True and "bias_correction" not in off["onnx"]
    shift = np.asarray(rec["shift"])
    texts, _ = calibration_texts(tiny_checkpoint, 64)
    ref = reference_logits(tiny_checkpoint, texts, 64).astype(np.float64)
    got_off, got_on = _logits(off_dir, texts), _logits(on_dir, texts)
    # the recorded shift is what the uncorrected graph was off by, on average, on these texts ...
    assert np.abs(shift).max() > 1e-5
    np.testing.assert_allclose((got_off - ref).mean(axis=0), shift, atol=2e-4)
    # ... the corrected graph is the same graph minus exactly that shift, for every input ...
    np.testing.assert_allclose(got_on, got_off - shift, atol=1e-5)
    # ... so on the calibration texts its mean error is gone.
    np.testing.assert_allclose((got_on - ref).mean(axis=0), 0.0, atol=2e-4)


def test_correction_leaves_the_weights_alone(int8_pair):
    import onnx
    from onnx import numpy_helper

    (on_dir, _), (off_dir, _) = int8_pair
    a = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(on_dir / "model.onnx")).graph.initializer}
    b = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(off_dir / "model.onnx")).graph.initializer}
    assert a.keys() == b.keys()
    changed = [k for k in a if not np.array_equal(a[k], b[k])]
    assert changed == ["classifier.bias"]


def test_bad_correct_bias_value_is_refused(tiny_checkpoint, tmp_path):
    with pytest.raises(QserveError, match=r"correct_bias for onnx-int8 must be true or false \(got 'maybe'\)"):
        exporters.export(tiny_checkpoint, "onnx-int8", tmp_path / "v", options={"correct_bias": "maybe"})
    assert not list(tmp_path.iterdir())
