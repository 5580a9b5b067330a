"""Can OpenVINO run on this CPU? Asked in a child process, because a broken CPU plugin kills its caller.

    python -m qserve.runtime.ov_probe          # prints one JSON line; exit 0 = the probe ran

A crash (a signal, uncatchable in-process) or refusal becomes `OpenVINOUnavailable`, which callers report and step
over; the result is cached per process, a pass also on disk. `QSERVE_OV_PROBE_FAULT=SIGFPE` (any signal name, or
`refuse`) makes the child fail that way. Why: docs/export.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from qserve import QserveError
from qserve.files import with_root_on_path
from qserve.variants import UnsupportedVariant

FAULT_ENV = "QSERVE_OV_PROBE_FAULT"
"""Test hook: a signal name (SIGFPE, SIGSEGV, ...) kills the probe child with it; `refuse` makes it exit 3."""
TIMEOUT_S = 180.0
PRECISIONS = ("f32", "int8", "bf16")

_lock = threading.Lock()
_result: dict[str, Any] | None = None


class OpenVINOUnavailable(UnsupportedVariant):
    """OpenVINO cannot run here (not installed, crashed in the probe, or the CPU lacks what a variant needs): the
    variant is skipped where several are exported, as one its checkpoint's architecture rules out is."""


def _cpu_key() -> str:
    """CPU model + flags: what decides whether the CPU plugin works (a disk-cache key, not shown)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "vendor_id"))][:3]
    except OSError:
        lines = [platform.processor(), platform.machine()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _cache_path(version: str) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qserve"
    return root / f"ov-probe-{version}-{_cpu_key()}.json"


def _run_child() -> dict[str, Any]:
    env = with_root_on_path(dict(os.environ))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "qserve.runtime.ov_probe"],
            capture_output=True,
            text=True,
            env=env,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "reason": f"the OpenVINO probe hung for {TIMEOUT_S:g} s compiling a test model"}
    out = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    data = json.loads(out) if out else {}
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        stage = data.get("stage", "start-up")
        return {
            "ok": False,
            "reason": f"OpenVINO's CPU plugin died with {name} in {stage} of a probe "
            f"child process (OpenVINO {data.get('version', '?')})",
        }
    if proc.returncode != 0 or not data.get("ok"):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {
            "ok": False,
            "reason": data.get("reason") or f"the OpenVINO probe exited with code {proc.returncode}: {tail}",
        }
    return data


def probe() -> dict[str, Any]:
    """{"ok", "reason", "precisions": {f32|int8|bf16: reason or None}, "version", "device"}; one child per process."""
    global _result
    with _lock:
        if _result is not None:
            return _result
        faulty = bool(os.environ.get(FAULT_ENV))
        try:
            ov_version = version("openvino")
        except PackageNotFoundError:
            _result = {"ok": False, "reason": "openvino is not installed: pip install 'qserve[openvino]'"}
            return _result
        cache = _cache_path(ov_version)
        if not faulty and cache.is_file():
            with contextlib.suppress(ValueError):
                _result = json.loads(cache.read_text(encoding="utf-8"))
                return _result
        _result = _run_child()
        if _result.get("ok") and not faulty:  # only successes are cached: a failure is re-probed next time
            with contextlib.suppress(OSError):
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps(_result), encoding="utf-8")
        return _result


def reset() -> None:
    """Forget this process's probe result (tests that change FAULT_ENV call it)."""
    global _result
    with _lock:
        _result = None


def require_precision(precision: str, what: str) -> dict[str, Any]:
    """Raise OpenVINOUnavailable("<what> unavailable on this CPU: <reason>") unless `precision` runs here."""
    if precision not in PRECISIONS:
        raise QserveError(
            f"{what}: OpenVINO inference precision must be one of {', '.join(PRECISIONS)} (got {precision!r})"
        )
    res = probe()
    if not res.get("ok"):
        raise OpenVINOUnavailable(f"{what} unavailable on this CPU: {res.get('reason')}")
    why = (res.get("precisions") or {}).get(precision, "the probe did not test it")
    if why:
        raise OpenVINOUnavailable(f"{what} unavailable on this CPU: {why}")
    return res


# -- the child ----------------------------------------------------------------------------------
def _graph(ov, int8: bool):
    """x[?, ?, 32] -> (FakeQuantize) MatMul + bias -> MVN -> MatMul(x, x^T) -> Softmax: a transformer's op mix."""
    from openvino import opset13 as ops

    rng = np.random.default_rng(0)
    x = ops.parameter([-1, -1, 32], np.float32, name="x")
    src = x
    if int8:  # the pattern NNCF writes in front of every quantized MatMul
        lo, hi = ops.constant(np.float32(-4.0)), ops.constant(np.float32(4.0))
        src = ops.fake_quantize(x, lo, hi, lo, hi, 256)
    w = ops.constant(rng.standard_normal((32, 32)).astype(np.float32))
    h = ops.add(ops.matmul(src, w, False, True), ops.constant(rng.standard_normal(32).astype(np.float32)))
    h = ops.mvn(h, ops.constant(np.array([-1], dtype=np.int64)), True, 1e-5, "inside_sqrt")
    att = ops.softmax(ops.matmul(h, h, False, True), -1)
    return ov.Model([ops.matmul(att, h, False, False)], [x], "qserve-probe")


def _child() -> int:
    def say(data: dict[str, Any]) -> None:
        print(json.dumps(data), flush=True)

    fault = os.environ.get(FAULT_ENV, "")
    import openvino as ov

    core = ov.Core()
    caps = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    say({"stage": "start-up", "version": ov.get_version()})
    info = {"version": ov.get_version(), "device": core.get_property("CPU", "FULL_DEVICE_NAME"), "caps": caps}
    precisions: dict[str, str | None] = {}
    x = np.random.default_rng(1).standard_normal((2, 7, 32)).astype(np.float32)
    for precision in PRECISIONS:
        if precision == "bf16" and "BF16" not in caps:
            precisions[precision] = (
                f"the CPU plugin reports no BF16 support (it needs avx512_bf16 or AMX; capabilities: {', '.join(caps)})"
            )
            continue
        say({"stage": f"compile_model ({precision})", "version": ov.get_version()})  # the parent names it on a crash
        if fault:
            if fault == "refuse":
                say({"ok": False, "reason": f"simulated refusal ({FAULT_ENV}=refuse)"})
                return 3
            os.kill(os.getpid(), getattr(signal, fault))
        hint = "bf16" if precision == "bf16" else "f32"
        compiled = core.compile_model(
            _graph(ov, precision == "int8"), "CPU", {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": 1}
        )
        out = compiled(x)[0]
        precisions[precision] = (
            None if np.all(np.isfinite(out)) else f"the {precision} test graph gave non-finite output"
        )
    say({"ok": True, "reason": None, "precisions": precisions, **info})
    return 0


if __name__ == "__main__":
    sys.exit(_child())
