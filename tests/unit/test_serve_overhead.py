"""The serving-overhead benchmark's pieces: the wrk script it generates (run by the real wrk), its summary and report.

python -m pytest tests/unit/test_serve_overhead.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks import serve_protocol_cost as spc
from benchmarks.harness import parse_wrk, run_wrk
from benchmarks.serve_overhead import __main__ as so
from benchmarks.serve_overhead import bare_server as bfl
from benchmarks.serve_overhead import steps as serve_steps

TRICKY = ['a "quoted" review \\ with a backslash', "two\nlines\r and a tab\t", "café — naïve ☃", "plain"]


def _wrk_on_loopback(script: str) -> tuple[dict, list[dict]]:
    """Run the real wrk with a generated Lua `script` for 1 s against a loopback server that records every
    request: (wrk's parsed summary, [{path, type, body}] in arrival order)."""
    wrk = shutil.which("wrk")
    if wrk is None:  # make test installs it as root (CI); a skip there would hide the benchmark's client
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("wrk is not installed under CI (make test installs it with apt-get as root)")
        pytest.skip("wrk is not installed (apt-get install wrk)")
    got: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append({"path": self.path, "type": self.headers["Content-Type"], "body": json.loads(body)})
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as d:
            lua = Path(d) / "r.lua"
            lua.write_text(script, encoding="utf-8")
            summary = run_wrk(wrk, f"http://127.0.0.1:{srv.server_address[1]}", lua, 1, 1)  # the benchmarks' runner
    finally:
        srv.shutdown()
    return summary, got


def _in_turn(sent: list[str]) -> None:
    # in turn (wrk builds one request at start-up, so the turn may begin past the first review)
    start = TRICKY.index(sent[0])
    assert sent == [TRICKY[(start + k) % len(TRICKY)] for k in range(len(sent))]


def test_wrk_posts_each_review_as_its_own_json_body():
    """The generated Lua, run by the real wrk against a loopback server, sends exactly the reviews' bodies."""
    summary, got = _wrk_on_loopback(so.wrk_script(TRICKY))
    assert summary["requests"] >= len(TRICKY) and summary["errors"] == 0 and summary["p50_us"] > 0
    _in_turn([g["body"]["inputs"][0] for g in got])
    assert {g["path"] for g in got} == {"/v1/classify"} and {g["type"] for g in got} == {"application/json"}


@pytest.mark.parametrize("route", ["v1", "tei", "hf", "vllm", "v2"])
def test_each_protocols_script_posts_its_clients_body_to_its_route(route):
    """serve_protocol_cost's Lua per route: each review in turn, in the body that protocol's client sends,
    to that route's path (InferenceClient's form always carries `parameters`)."""
    path = spc.PATHS[route].format(model="m")
    summary, got = _wrk_on_loopback(spc.lua(route, path, TRICKY))
    assert summary["requests"] >= len(TRICKY) and summary["errors"] == 0
    assert {g["path"] for g in got} == {path} and {g["type"] for g in got} == {"application/json"}
    sent = [_text_of(route, g["body"]) for g in got]
    assert [g["body"] for g in got] == [spc.body(route, t) for t in sent]  # exactly that client's body, no more
    _in_turn(sent)
    if route == "hf":
        assert all(set(g["body"]["parameters"]) == {"function_to_apply", "top_k"} for g in got)


def _text_of(route: str, body: dict) -> str:
    """The review a protocol's body carries (vLLM: input; TEI, InferenceClient: inputs; /v1: inputs[0]; V2: data)."""
    if route == "vllm":
        return body["input"]
    inputs = body["inputs"]
    return inputs if isinstance(inputs, str) else inputs[0]["data"][0] if route == "v2" else inputs[0]


def test_parse_wrk_names_a_missing_summary():
    with pytest.raises(RuntimeError, match="no summary"):
        parse_wrk("Running 1s test\nconnection refused")


def _level(p50: float, req_s: float, cpu: float) -> dict:
    return {
        "requests": 100,
        "errors": 0,
        "p50_ms": p50,
        "p99_ms": p50 * 2,
        "req_s": req_s,
        "server_cpu_ms_per_req": cpu,
        "client_cpu_ms_per_req": 0.05,
    }


def test_summary_and_render_hold_the_targets():
    inproc = {
        "b1": {"p50_ms": 8.0, "calls": 10, "cpu_ms_per_call": 9.0},
        "b32": {"texts_per_s": 140.0, "cpu_ms_per_text": 13.0, "texts": 300},
    }
    good = {
        "answers_max_abs_diff": 0.0,
        "label_flips": 0,
        "levels": {"1": _level(8.6, 110, 9.4), "32": _level(30, 136.0, 14.0)},
    }
    bad = {
        "answers_max_abs_diff": 0.0,
        "label_flips": 0,
        "levels": {"1": _level(12.0, 80, 14.0), "32": _level(40, 120.0, 16.0)},
    }
    s = so.summarize(inproc, good)
    assert s["overhead_ms"] == pytest.approx(0.6) and s["overhead_ok"]
    assert s["throughput_ratio"] == pytest.approx(136 / 140) and s["throughput_ok"]
    assert s["server_cpu_ms_over_model_c1"] == pytest.approx(0.4)
    sb = so.summarize(inproc, bad)
    assert not sb["overhead_ok"] and not sb["throughput_ok"]
    # the median over rounds, key by key; flips and errors keep their worst round
    m = so._median(
        [
            {"in_process": inproc, "served": good},
            {"in_process": inproc, "served": bad},
            {"in_process": inproc, "served": {**good, "label_flips": 3}},
        ]
    )
    assert m["served"]["levels"]["1"]["p50_ms"] == 8.6 and m["served"]["label_flips"] == 3
    rep = {
        "created": "now",
        "environment": {"cpu": {"model": "Some CPU", "flags": ["amx_int8"]}, "cpu_count": 2},
        "settings": {
            "threads": 2,
            "long_text": "head",
            "texts": 4,
            "mean_chars": 1170.0,
            "duration_s": 1,
            "rounds": 1,
            "log_level": "info",
            "baseline_ref": "b7b3591",
            "load_generator": "wrk -t1",
            "targets": {"overhead_ms": 1.0, "throughput_ratio": 0.95},
        },
        "variants": [
            {
                "name": "onnx-int8",
                "codes": {
                    "before": {"in_process": inproc, "served": bad, "summary": sb},
                    "after": {"in_process": inproc, "served": good, "summary": s},
                },
            }
        ],
    }
    md = so.render(rep)
    assert "Some CPU, AMX (amx_int8)" in md and "`b7b3591`" in md
    assert "| onnx-int8 | before |" in md and "**4.00** ✗" in md and "**0.60** ✓" in md
    assert not so.failed(rep)
    rep["variants"][0]["codes"]["after"]["summary"] = sb
    assert so.failed(rep)


def test_onnx_sessions_spin_inside_a_run_and_stop_when_it_returns():
    """Spinning pool threads took the event loop's core between a server's requests, and not spinning made each
    parallel section of a b1 forward wait for a wake-up (benchmarks/serve_overhead/): spin, stopped at run()'s end."""
    import onnxruntime as ort

    from qserve.runtime.onnx_rt import session_options

    so_ = session_options(ort, 2)
    assert so_.intra_op_num_threads == 2
    assert so_.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert so_.get_session_config_entry("session.force_spinning_stop") == "1"
    assert so_.get_session_config_entry("session.inter_op.allow_spinning") == "0"


def test_steps_read_back_from_the_console_exporter():
    """serve_steps parses what the real OpenTelemetry console exporter prints for qserve's own RequestTrace:
    each step's microseconds as the trace recorded them, the hop back as the gap before respond."""
    import io

    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    from qserve.serve.infra.tracing import Tracing

    out = io.StringIO()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out)))
    tracing = Tracing(provider)
    for k in range(2):
        trace = tracing.begin("POST /v1/classify", {})
        t0 = trace.start_ns
        trace.queued_ns = t0 + 300_000  # receive 300 us
        trace.phases = [
            ("tokenize", t0 + 500_000, t0 + 900_000, {}),  # queue wait 200, tokenize 400
            ("inference", t0 + 900_000, t0 + 9_900_000 + k * 1000, {}),
        ]  # inference 9000 (+1 for k=1)
        trace.answered_ns = t0 + 10_150_000  # hop back 250 (249 for k=1)
        trace.finish(200)
    text = "INFO: some log line {not json}\n" + out.getvalue() + "INFO: shutdown\n"
    rows = serve_steps.per_request(serve_steps.spans(text))
    assert len(rows) == 2
    r = rows[0]
    one_us = pytest.approx  # the exporter prints times via float seconds: each to the nearest microsecond
    assert [r[k] for k in ("receive", "queue wait", "tokenize", "inference", "hop back")] == one_us(
        [300, 200, 400, 9000, 250], abs=1.01
    )
    assert [rows[1][k] for k in ("inference", "hop back")] == one_us([9001, 249], abs=1.01)
    assert r["server span"] >= r["respond"] + 10_150 - 1  # the root covers every step


def _same_process(over: float, ratios: list[float]) -> dict:
    rounds = [
        {
            "in_process_p50_ms": 10.0,
            "served_c1_p50_ms": 10.0 + over,
            "overhead_ms": over,
            "requests": 50,
            "errors": 0,
            "in_process_b32_texts_per_s": [120.0, 118.0],
            "served_c32_req_s": 119.0 * r,
            "c32_ratio": r,
            "c32_requests": 500,
            "c32_errors": 0,
        }
        for r in ratios
    ]
    return {**so._median(rounds), "rounds": rounds}


def test_the_one_process_readings_decide_the_targets_when_taken():
    """failed() judges the drift-free one-process readings (c1 overhead, c32 over the bracketing b32 runs) where
    the report has them, whatever the two-process table says; render lists every round's c32 reading."""
    inproc = {
        "b1": {"p50_ms": 8.0, "calls": 10, "cpu_ms_per_call": 9.0},
        "b32": {"texts_per_s": 140.0, "cpu_ms_per_text": 13.0, "texts": 300},
    }
    missed = {
        "answers_max_abs_diff": 0.0,
        "label_flips": 0,
        "levels": {"1": _level(12.0, 80, 14.0), "32": _level(40, 100.0, 16.0)},
    }
    floor = {"in_process_p50_ms": 10.0, "served_c1_p50_ms": 10.1, "overhead_ms": 0.1, "requests": 50, "errors": 0}

    def rep(same: dict | None) -> dict:
        v = {
            "name": "ov-int8",
            "codes": {"after": {"in_process": inproc, "served": missed, "summary": so.summarize(inproc, missed)}},
        }
        if same is not None:
            v |= {"floor": floor, "same_process": same}
        return {"variants": [v]}

    assert so.failed(rep(None))  # two-process readings only: both missed
    assert not so.failed(rep(_same_process(0.6, [0.97, 0.93, 0.96])))  # median of the rounds' ratios: 0.96
    assert so.failed(rep(_same_process(0.6, [0.97, 0.93, 0.94])))  # 0.94
    assert so.failed(rep(_same_process(1.2, [0.99])))  # the c1 overhead
    md = "\n".join(bfl.render(rep(_same_process(0.6, [0.97, 0.93, 0.94]))["variants"], 1.0, 0.95))
    assert "| ov-int8 | qserve | 10.00 | 10.60 | **0.60** ✓ | 0.50 |" in md
    assert (
        "| ov-int8 | 120.0, 118.0 -> 115.4 (0.97x); 120.0, 118.0 -> 110.7 (0.93x); 120.0, 118.0 -> 111.9 (0.94x) "
        "| **0.94x** ✗ |"
    ) in md


def test_b32_texts_per_s_runs_every_batch_in_turn():
    """The one-process child's b32 reading: consecutive batches of the reviews, texts counted as run."""
    seen: list[list[str]] = []

    class Rt:
        def predict(self, texts):
            seen.append(list(texts))

    texts = [f"review {i}" for i in range(70)]
    rate = bfl._texts_per_s(Rt(), texts, 32, 0.0)
    assert seen == [texts[:32], texts[32:64], texts[64:]] and rate > 0
